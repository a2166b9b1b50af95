/*
 * The tunnel keeper's protocol (native/atoll-keeper.c, and the agent's side in native/atoll-dp.c): messages of a few
 * bytes with up to FD_PASSING_MAX descriptors (SCM_RIGHTS) on a unix SOCK_SEQPACKET socket. The keeper greets each
 * connection with "ATKEEP1\0", its pid and the descriptors it holds; an agent may answer "ATHOLD1\0" and a count with
 * descriptors (hold these instead), or one byte 'q' (let go).
 */
#ifndef ATOLL_KEEPER_PROTOCOL_H
#define ATOLL_KEEPER_PROTOCOL_H

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define FD_PASSING_MAX 8

/* Sends `len` bytes of `head` with fds[0..n) on connection c. @returns 0 or -errno. */
static inline int send_fds(int c, const void *head, size_t len, const int *fds, int n) {
  if (n < 0 || n > FD_PASSING_MAX) return -EINVAL;
  struct iovec iov = {.iov_base = (void *)head, .iov_len = len};
  union {
    char buf[CMSG_SPACE(sizeof(int) * FD_PASSING_MAX)];
    struct cmsghdr align;
  } control;
  memset(&control, 0, sizeof control);
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
  if (n > 0) {
    m.msg_control = control.buf;
    m.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)n);
    struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)n);
    memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)n);
  }
  return sendmsg(c, &m, MSG_NOSIGNAL) < 0 ? -errno : 0;
}

/*
 * Receives one message on c: up to `cap` bytes into head, its descriptors (close-on-exec) into fds and their number
 * into *n. `flags` as recvmsg's (MSG_DONTWAIT). @returns the bytes received (0: the connection ended), or -errno;
 * -EPROTO, with every descriptor closed, when they did not all fit.
 */
static inline ssize_t recv_fds(int c, void *head, size_t cap, int fds[FD_PASSING_MAX], int *n, int flags) {
  struct iovec iov = {.iov_base = head, .iov_len = cap};
  union {
    char buf[CMSG_SPACE(sizeof(int) * FD_PASSING_MAX)];
    struct cmsghdr align;
  } control;
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf, .msg_controllen = sizeof control.buf};
  ssize_t got;
  do got = recvmsg(c, &m, flags | MSG_CMSG_CLOEXEC);
  while (got < 0 && errno == EINTR);
  *n = 0;
  if (got < 0) return -errno;
  for (struct cmsghdr *cm = CMSG_FIRSTHDR(&m); cm; cm = CMSG_NXTHDR(&m, cm)) {
    if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
    int k = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
    int in[FD_PASSING_MAX];
    memcpy(in, CMSG_DATA(cm), sizeof(int) * (size_t)k);
    for (int i = 0; i < k; i++) {
      if (*n < FD_PASSING_MAX) fds[(*n)++] = in[i];
      else close(in[i]);
    }
  }
  if (m.msg_flags & MSG_CTRUNC) {
    for (int i = 0; i < *n; i++) close(fds[i]);
    *n = 0;
    return -EPROTO;
  }
  return got;
}

/* The keeper's greeting. */
struct keeper_greeting {
  char magic[8];
  int32_t pid, count;
};

/*
 * Connects to the keeper at addr and reads its greeting and the descriptors that come with it (close-on-exec).
 * @returns the connection, or -errno; -EPROTO, nothing left open, when it is not a keeper's greeting.
 */
static inline int keeper_greeted(const struct sockaddr_un *addr, struct keeper_greeting *g, int fds[FD_PASSING_MAX], int *n) {
  *n = 0;
  int c = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (c < 0) return -errno;
  if (connect(c, (const struct sockaddr *)addr, sizeof *addr) != 0) {
    int e = errno;
    close(c);
    return -e;
  }
  ssize_t got = recv_fds(c, g, sizeof *g, fds, n, 0);
  if (got != (ssize_t)sizeof *g || memcmp(g->magic, "ATKEEP1", 8) != 0 || g->count != *n) {
    for (int i = 0; i < *n; i++) close(fds[i]);
    *n = 0;
    close(c);
    return got < 0 ? (int)got : -EPROTO;
  }
  return c;
}

#endif
