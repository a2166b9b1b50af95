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
 * process of its own uid gets one message at once: "ATKEEP1\0", this process's pid and COUNT (int32 each, host
 * order), with the descriptors (SCM_RIGHTS). A connection stays open while its agent lives; a byte 'q' on it makes
 * the keeper exit (the agent wants a new set). With no connection for GRACE_MS the keeper exits, and so gives up the
 * device, the port and the keys: an agent that does not come back does not leave them held for ever. It exits at
 * SIGTERM too, and removes SOCKET when it is still its own.
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

#define MAX_HELD 8
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

/* Sends the greeting and the held descriptors on connection c. */
static int hand_over(int c, const int *held, int count) {
  struct {
    char magic[8];
    int32_t pid, count;
  } hello;
  memcpy(hello.magic, "ATKEEP1", 8);
  hello.pid = (int32_t)getpid();
  hello.count = count;
  struct iovec iov = {.iov_base = &hello, .iov_len = sizeof hello};
  union {
    char buf[CMSG_SPACE(sizeof(int) * MAX_HELD)];
    struct cmsghdr align;
  } control;
  memset(&control, 0, sizeof control);
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf, .msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)count)};
  struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)count);
  memcpy(CMSG_DATA(cm), held, sizeof(int) * (size_t)count);
  return sendmsg(c, &m, MSG_NOSIGNAL) < 0 ? -1 : 0;
}

int main(int argc, char **argv) {
  if (argc != 4) return usage("three arguments");
  const char *path = argv[1];
  char *end;
  long count = strtol(argv[2], &end, 10);
  if (*end || count < 1 || count > MAX_HELD) return usage("COUNT must be 1 to 8");
  long grace = strtol(argv[3], &end, 10);
  if (*end || grace < 0) return usage("GRACE_MS must be a number of milliseconds");
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof addr.sun_path) return usage("SOCKET path too long");
  strcpy(addr.sun_path, path);
  int held[MAX_HELD];
  for (int i = 0; i < count; i++) {
    held[i] = 3 + i;
    if (fcntl(held[i], F_GETFD) < 0) {
      fprintf(stderr, "atoll-keeper: descriptor %d is not open\n", held[i]);
      return 2;
    }
  }
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
  unlink(path);
  mode_t old = umask(077);
  int rc = bind(l, (struct sockaddr *)&addr, sizeof addr);
  umask(old);
  struct stat mine;
  if (rc != 0 || listen(l, MAX_CLIENTS) != 0 || stat(path, &mine) != 0) {
    fprintf(stderr, "atoll-keeper: cannot listen on %s: %s\n", path, strerror(errno));
    return 1;
  }

  struct pollfd fds[1 + MAX_CLIENTS];
  int clients = 0;
  long long alone_since = now_ms();
  while (!stopping) {
    fds[0] = (struct pollfd){.fd = l, .events = POLLIN};
    int timeout = -1;
    if (clients == 0) {
      long long left = alone_since + grace - now_ms();
      if (left <= 0) break;
      timeout = left > 60000 ? 60000 : (int)left;
    }
    int n = poll(fds, (nfds_t)(1 + clients), timeout);
    if (n < 0 && errno != EINTR) break;
    if (n <= 0) continue;
    for (int i = clients; i >= 1; i--) {
      if (!fds[i].revents) continue;
      char b = 0;
      ssize_t got = (fds[i].revents & POLLIN) ? recv(fds[i].fd, &b, 1, MSG_DONTWAIT) : 0;
      if (got > 0 && b == 'q') stopping = 1;
      if (got > 0 || (got < 0 && (errno == EAGAIN || errno == EINTR))) continue;
      close(fds[i].fd);
      fds[i] = fds[clients--];
      if (clients == 0) alone_since = now_ms();
    }
    if (fds[0].revents & POLLIN) {
      int c = accept4(l, NULL, NULL, SOCK_CLOEXEC);
      if (c < 0) continue;
      struct ucred cred;
      socklen_t len = sizeof cred;
      if (clients == MAX_CLIENTS || getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.uid != geteuid() || hand_over(c, held, (int)count) != 0) {
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
