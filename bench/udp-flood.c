/*
 * Bad input for the tunnel's datagram port, for bench/tunnel.ts's flood part: what an attacker on the path could send
 * to an agent's UDP port while an established flow runs. Only ever run inside the benchmark's own lab namespaces;
 * every run is bounded in rate and time.
 *
 *   udp-flood sniff PORT SECONDS
 *       prints the first 16 bytes (hex) of the first data or keepalive datagram (type 1 or 2) seen arriving for UDP port PORT in this
 *       network namespace (a packet socket, as tcpdump reads), then exits 0; exits 1 after SECONDS without one.
 *   udp-flood send KIND HOST PORT RATE SECONDS [HEADER]
 *       sends RATE datagrams per second to HOST:PORT for SECONDS (at most 60 s, at most 1,000,000 per second), in
 *       batches of 64 (sendmmsg), and prints what it sent (also when stopped early by SIGINT or SIGTERM). KIND:
 *         garbage      1400 random bytes                             (dropped as badType, before any cryptography)
 *         short        3 bytes                                       (truncated)
 *         unknown-key  a data header with a random key id, 1400 B   (unknownKey)
 *         forged       HEADER's key id (a live key, as sniffed), counters far ahead of it, 1400 random bytes: each one
 *                      costs the receiver a full AES-GCM open before its tag fails (badTag)
 *         hello        a hello (type 3, 184 B) from a random key     (helloUnknownPeer, before any signature check)
 *
 *   cc -O2 -Wall -Wextra -Werror -o udp-flood bench/udp-flood.c
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <netinet/udp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BATCH 64
#define BIG 1400
#define HELLO_LEN 184
#define MAX_SECONDS 60
#define MAX_RATE 1000000

static volatile sig_atomic_t stopping;

static void stop(int sig) {
  (void)sig;
  stopping = 1;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int usage(void) {
  fprintf(stderr, "usage: udp-flood sniff PORT SECONDS | udp-flood send garbage|short|unknown-key|forged|hello HOST PORT RATE SECONDS [HEADER]\n");
  return 2;
}

static void put_u32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24);
  p[1] = (uint8_t)(v >> 16);
  p[2] = (uint8_t)(v >> 8);
  p[3] = (uint8_t)v;
}

static int sniff(int port, double seconds) {
  int fd = socket(AF_PACKET, SOCK_DGRAM, htons(ETH_P_IP));
  if (fd < 0) {
    perror("udp-flood: packet socket");
    return 1;
  }
  struct timeval tv = {0, 200000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  static uint8_t buf[65536];
  double end = now() + seconds;
  while (now() < end) {
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n < (ssize_t)sizeof(struct iphdr)) continue;
    const struct iphdr *ip = (const struct iphdr *)buf;
    size_t ihl = (size_t)ip->ihl * 4;
    if (ip->protocol != IPPROTO_UDP || (size_t)n < ihl + sizeof(struct udphdr) + 16) continue;
    const struct udphdr *udp = (const struct udphdr *)(buf + ihl);
    const uint8_t *d = buf + ihl + sizeof(struct udphdr);
    if (ntohs(udp->dest) != port || (d[0] != 1 && d[0] != 2)) continue;
    for (int i = 0; i < 16; i++) printf("%02x", d[i]);
    printf("\n");
    return 0;
  }
  fprintf(stderr, "udp-flood: no data datagram for port %d within %.0f s\n", port, seconds);
  return 1;
}

static int parse_header(const char *hex, uint8_t out[16]) {
  if (strlen(hex) != 32) return -1;
  for (int i = 0; i < 16; i++) {
    unsigned v;
    if (sscanf(hex + 2 * i, "%2x", &v) != 1) return -1;
    out[i] = (uint8_t)v;
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "sniff") == 0) return sniff(atoi(argv[2]), atof(argv[3]));
  if (argc < 7 || strcmp(argv[1], "send") != 0) return usage();
  const char *kind = argv[2];
  struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[4]))};
  long rate = atol(argv[5]);
  double seconds = atof(argv[6]);
  if (inet_pton(AF_INET, argv[3], &to.sin_addr) != 1 || rate <= 0 || rate > MAX_RATE || seconds <= 0 || seconds > MAX_SECONDS) return usage();
  uint8_t header[16] = {0};
  int forged = strcmp(kind, "forged") == 0;
  if (forged && (argc < 8 || parse_header(argv[7], header) != 0)) {
    fprintf(stderr, "udp-flood: forged needs the 16-byte header of a real datagram, in hex\n");
    return 2;
  }
  size_t len;
  if (strcmp(kind, "garbage") == 0 || strcmp(kind, "unknown-key") == 0 || forged) len = BIG;
  else if (strcmp(kind, "short") == 0) len = 3;
  else if (strcmp(kind, "hello") == 0) len = HELLO_LEN;
  else return usage();

  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || connect(fd, (struct sockaddr *)&to, sizeof to) != 0) {
    perror("udp-flood: socket");
    return 1;
  }
  static uint8_t bufs[BATCH][BIG];
  struct mmsghdr msgs[BATCH];
  struct iovec iov[BATCH];
  memset(msgs, 0, sizeof msgs);
  for (int i = 0; i < BATCH; i++) {
    iov[i].iov_base = bufs[i];
    iov[i].iov_len = len;
    msgs[i].msg_hdr.msg_iov = &iov[i];
    msgs[i].msg_hdr.msg_iovlen = 1;
  }
  // the forged counters start far ahead of the live one, so none is a replay and each reaches the cipher
  uint64_t counter = 100000000ULL;
  for (int i = 8; i < 16; i++) counter += (uint64_t)header[i] << (8 * (15 - i));
  signal(SIGINT, stop);
  signal(SIGTERM, stop);
  long sent = 0, failed = 0;
  double t0 = now(), end = t0 + seconds;
  while (!stopping && now() < end) {
    for (int i = 0; i < BATCH; i++) {
      uint8_t *b = bufs[i];
      // random bytes once, then the first 32 of each datagram afresh: the kernel's random source is the cost otherwise
      if (getrandom(b, sent == 0 ? len : 32, 0) < 0) return 1;
      if (strcmp(kind, "garbage") == 0) {
        b[0] = (uint8_t)(4 + b[0] % 250); // never one of our types
      } else if (strcmp(kind, "unknown-key") == 0) {
        b[0] = 1;
        b[1] = b[2] = b[3] = 0;
        memset(b + 8, 0, 4);
      } else if (forged) {
        memcpy(b, header, 8);
        put_u32(b + 8, (uint32_t)(counter >> 32));
        put_u32(b + 12, (uint32_t)counter);
        counter++;
      } else if (strcmp(kind, "hello") == 0) {
        b[0] = 3;
        b[1] = 0;
        b[2] = b[3] = 0;
        memset(b + 4, 0, 4); // a small generation
      }
    }
    int n = sendmmsg(fd, msgs, BATCH, 0);
    if (n > 0) {
      sent += n;
    } else {
      failed++; // e.g. ECONNREFUSED from an ICMP error: wait a little rather than spin
      usleep(1000);
    }
    // paced: the next batch is due when RATE says so
    double due = t0 + (double)sent / (double)rate;
    double wait = due - now();
    if (wait > 0) usleep((useconds_t)(wait * 1e6));
  }
  printf("%s: %ld datagrams of %zu B in %.1f s (%.0f per second), %ld failed sends\n", kind, sent, len, now() - t0, (double)sent / (now() - t0), failed);
  return 0;
}
