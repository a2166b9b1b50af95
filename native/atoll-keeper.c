/*
 * atoll-keeper: holds the tunnel's data plane for the agent across the agent's restarts: the TUN device, the UDP
 * socket and the memfd of the kept keys (native/atoll-dp.c). A TUN device lives as long as one descriptor of it, a
 * bound socket keeps its port (and so the NAT mapping peers know) and queues what arrives, and the keys' counters and
 * replay windows are in the memfd's pages; while this process holds them, an agent that dies (even by SIGKILL) and
 * starts again takes them back and goes on: packets wait in the device's and the socket's queues meanwhile.
 *
 *   atoll-keeper SOCKET COUNT GRACE_MS      the COUNT descriptors to hold are 3 .. 3 + COUNT - 1
 *
 * It listens on the unix socket SOCKET (SOCK_SEQPACKET, mode 0600, any file there replaced). Each connection from a
 * process of its own uid gets one message at once: "ATKEEP1\0", this process's pid and the number of descriptors it
 * holds (int32 each, host order), with the descriptors (SCM_RIGHTS). A connection stays open while its agent lives.
 * On it the agent may send "ATHOLD1\0" and a count with descriptors (SCM_RIGHTS): the keeper holds those instead of
 * what it held; or a byte 'q': the agent wants a new set.
 *
 * Two modes. Started by the agent with COUNT descriptors (a node without an orchestrator), the keeper exits at 'q' or
 * when no agent was connected for GRACE_MS, giving up the device, the port and the keys: an agent that does not come
 * back does not leave them held for ever. Started with COUNT 0 (a standing keeper: on Kubernetes a DaemonSet of its
 * own, so a roll of the agent's DaemonSet, which ends every process of the agent's pod, does not end it), it holds
 * what an agent hands it and, at 'q' or after GRACE_MS without an agent, lets go of it and stays. A standing keeper
 * that finds a keeper at SOCKET when it starts (the agent came first and started its own) takes over what that one
 * holds and asks it to go. Neither takes SOCKET from a keeper that answers there (a file nobody answers on is replaced):
 * one the agent started exits with status 3 instead, and the agent hands the data plane to the keeper there. Both exit
 * at SIGTERM and remove SOCKET when it is still their own.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "keeper-protocol.h"

#define MAX_HELD FD_PASSING_MAX
#define MAX_CLIENTS 8

static volatile sig_atomic_t stopping;
static void on_term(int sig) {
  (void)sig;
  stopping = 1;
}

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int usage(const char *why) {
  fprintf(stderr, "atoll-keeper: %s\nusage: atoll-keeper SOCKET COUNT GRACE_MS (the COUNT descriptors to hold are 3 .. 3 + COUNT - 1)\n", why);
  return 2;
}

static int held[MAX_HELD];
static int count;

/* Lets go of what is held. */
static void drop_held(void) {
  for (int i = 0; i < count; i++) close(held[i]);
  count = 0;
}

/*
 * Reads one message from connection c: 'q' (returns 'q'), a hold ("ATHOLD1\0", a count and that many descriptors:
 * held instead of what was; returns 'h'), anything else is ignored (0). -1 when the connection ended.
 */
static int read_message(int c) {
  struct {
    char magic[8];
    int32_t count;
  } msg;
  memset(&msg, 0, sizeof msg);
  int fds[MAX_HELD], n;
  ssize_t got = recv_fds(c, &msg, sizeof msg, fds, &n, MSG_DONTWAIT);
  if (got == -EAGAIN || got == -EINTR || got == -EPROTO) return 0;
  if (got <= 0) return -1;
  if (got == 1 && msg.magic[0] == 'q' && n == 0) return 'q';
  if (got == (ssize_t)sizeof msg && memcmp(msg.magic, "ATHOLD1", 8) == 0 && msg.count == n) {
    drop_held();
    memcpy(held, fds, sizeof(int) * (size_t)n);
    count = n;
    return 'h';
  }
  for (int i = 0; i < n; i++) close(fds[i]);
  return 0;
}

/* A standing keeper's start: takes over what a keeper already at `addr` holds (into held/count) and asks it to go. */
static void take_over(const struct sockaddr_un *addr) {
  struct keeper_greeting hello;
  int fds[MAX_HELD], n;
  int c = keeper_greeted(addr, &hello, fds, &n);
  if (c < 0) return;
  drop_held();
  memcpy(held, fds, sizeof(int) * (size_t)n);
  count = n;
  char q = 'q';
  (void)!send(c, &q, 1, MSG_NOSIGNAL);
  fprintf(stderr, "atoll-keeper: took over %d descriptors from keeper %d\n", n, hello.pid);
  close(c);
}

/*
 * Binds l to `addr` unless a live keeper listens there: a socket file nobody answers on (a keeper that was killed) is
 * replaced, a live one never. Unlinking first let two keepers starting at once (the agent's own, and the chart's
 * standing one coming up) each take the path from the other: one of them then listened on a name nobody could reach,
 * holding the data plane out of the agent's reach, or holding nothing while the agent's next process found none.
 * @returns 0, -EEXIST when a keeper answers at `addr`, or -errno.
 */
static int bind_unless_live(int l, const struct sockaddr_un *addr) {
  for (int tries = 0; tries < 3; tries++) {
    if (bind(l, (const struct sockaddr *)addr, sizeof *addr) == 0) return 0;
    if (errno != EADDRINUSE) return -errno;
    int probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (probe < 0) return -errno;
    int live = connect(probe, (const struct sockaddr *)addr, sizeof *addr) == 0;
    close(probe);
    if (live) return -EEXIST;
    unlink(addr->sun_path);
  }
  return -EADDRINUSE;
}

/* Sends the greeting and the held descriptors on connection c. */
static int hand_over(int c) {
  struct keeper_greeting hello;
  memcpy(hello.magic, "ATKEEP1", 8);
  hello.pid = (int32_t)getpid();
  hello.count = count;
  return send_fds(c, &hello, sizeof hello, held, count);
}

int main(int argc, char **argv) {
  if (argc != 4) return usage("three arguments");
  const char *path = argv[1];
  char *end;
  long given = strtol(argv[2], &end, 10);
  if (*end || given < 0 || given > MAX_HELD) return usage("COUNT must be 0 to 8");
  int standing = given == 0;
  long grace = strtol(argv[3], &end, 10);
  if (*end || grace < 0) return usage("GRACE_MS must be a number of milliseconds");
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof addr.sun_path) return usage("SOCKET path too long");
  strcpy(addr.sun_path, path);
  for (int i = 0; i < given; i++) {
    held[i] = 3 + i;
    if (fcntl(held[i], F_GETFD) < 0) {
      fprintf(stderr, "atoll-keeper: descriptor %d is not open\n", held[i]);
      return 2;
    }
  }
  count = (int)given;
  signal(SIGPIPE, SIG_IGN);
  signal(SIGHUP, SIG_IGN);
  signal(SIGINT, SIG_IGN);
  struct sigaction sa = {.sa_handler = on_term};
  sigaction(SIGTERM, &sa, NULL);

  int l = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (l < 0) {
    perror("atoll-keeper: socket");
    return 1;
  }
  /* a standing keeper takes over a keeper it finds (the agent's own, which then goes) until the path is free; one the
     agent started leaves a live keeper be (status 3: the agent hands the data plane to that one) */
  mode_t old = umask(077);
  int rc = -EEXIST;
  for (int tries = 0; rc == -EEXIST && tries < 50; tries++) {
    if (standing) take_over(&addr);
    rc = bind_unless_live(l, &addr);
    if (rc == -EEXIST && !standing) break;
    if (rc == -EEXIST) usleep(20000);
  }
  umask(old);
  if (rc == -EEXIST && !standing) {
    fprintf(stderr, "atoll-keeper: another keeper listens on %s\n", path);
    return 3;
  }
  struct stat mine;
  if (rc != 0 || listen(l, MAX_CLIENTS) != 0 || stat(path, &mine) != 0) {
    fprintf(stderr, "atoll-keeper: cannot listen on %s: %s\n", path, rc != 0 ? strerror(-rc) : strerror(errno));
    return 1;
  }

  struct pollfd fds[1 + MAX_CLIENTS];
  int clients = 0;
  long long alone_since = now_ms();
  while (!stopping) {
    fds[0] = (struct pollfd){.fd = l, .events = POLLIN};
    int timeout = -1;
    if (clients == 0 && (count > 0 || !standing)) {
      long long left = alone_since + grace - now_ms();
      if (left <= 0) {
        if (!standing) break;
        drop_held();
        continue;
      }
      timeout = left > 60000 ? 60000 : (int)left;
    }
    int n = poll(fds, (nfds_t)(1 + clients), timeout);
    if (n < 0 && errno != EINTR) break;
    if (n <= 0) continue;
    for (int i = clients; i >= 1; i--) {
      if (!fds[i].revents) continue;
      int what = (fds[i].revents & POLLIN) ? read_message(fds[i].fd) : -1;
      if (what == 'q') {
        if (!standing) stopping = 1;
        drop_held();
      }
      if (what >= 0) continue;
      close(fds[i].fd);
      fds[i] = fds[clients--];
      if (clients == 0) alone_since = now_ms();
    }
    if (stopping) break; /* asked to go: hand nothing more to anyone */
    if (fds[0].revents & POLLIN) {
      int c = accept4(l, NULL, NULL, SOCK_CLOEXEC);
      if (c < 0) continue;
      struct ucred cred;
      socklen_t len = sizeof cred;
      if (clients == MAX_CLIENTS || getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.uid != geteuid() || hand_over(c) != 0) {
        close(c);
        continue;
      }
      fds[++clients] = (struct pollfd){.fd = c, .events = POLLIN};
    }
  }
  struct stat now;
  if (stat(path, &now) == 0 && now.st_ino == mine.st_ino && now.st_dev == mine.st_dev) unlink(path);
  return 0;
}
