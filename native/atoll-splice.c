/*
 * The relay's circuits joined in the kernel (src/adapters/splice-native.ts loads this, from libatoll-dp.so, with
 * koffi): two connected TCP sockets spliced to each other both ways, each direction by a thread of its own through a
 * pipe (splice(2): the pages move from one socket's receive queue to the other's send queue), so the bytes never
 * enter user space and JavaScript does nothing per chunk.
 *
 * A join works on duplicates of the two descriptors it is given (the caller closes its own), made blocking. Bytes
 * the caller had read already go first. When either direction ends (end of stream, an error, or atoll_splice_free)
 * both sockets are shut down, which ends the other direction too; the last thread to finish writes one byte to the
 * join's notify descriptor, and the caller then collects the join with atoll_splice_free (it joins the threads and
 * closes the duplicates). The bytes carried are counted atomically and readable at any time.
 *
 * Unlike atoll-dp.c, this part is called from the main thread and runs threads of its own; they touch only their
 * join, and the main thread only its atomic fields until the join is done or freed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
/* Each direction's pipe: 1 MiB (the default fs.pipe-max-size) moves a TCP receive queue's worth per call. */
#define PIPE_BYTES (1 << 20)
#define STACK_BYTES (64 * 1024)

typedef struct join join;

typedef struct {
  join *j;
  int from, to;
  uint8_t *early;
  size_t early_len;
  pthread_t thread;
  int started;
} way;

struct join {
  way ways[2];
  int fds[2];
  int notify;
  uint64_t bytes;
  int running;
};

static void end_both(join *j) {
  shutdown(j->fds[0], SHUT_RDWR);
  shutdown(j->fds[1], SHUT_RDWR);
}

static int write_all(int fd, const uint8_t *b, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, b, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    b += w;
    n -= (size_t)w;
  }
  return 0;
}

/* One thread's end: the last one tells the caller (a full notify pipe already holds a byte that will). */
static void finished(join *j) {
  end_both(j);
  if (__atomic_sub_fetch(&j->running, 1, __ATOMIC_ACQ_REL) == 0) {
    uint8_t one = 1;
    while (write(j->notify, &one, 1) < 0 && errno == EINTR) {}
  }
}

static void *pump(void *arg) {
  way *w = arg;
  join *j = w->j;
  int p[2] = {-1, -1};
  if (w->early_len > 0) {
    if (write_all(w->to, w->early, w->early_len) < 0) goto out;
    __atomic_add_fetch(&j->bytes, w->early_len, __ATOMIC_RELAXED);
  }
  if (pipe2(p, O_CLOEXEC) < 0) goto out;
  (void)fcntl(p[1], F_SETPIPE_SZ, PIPE_BYTES); /* best effort: a 64 KiB pipe works too, in more calls */
  for (;;) {
    ssize_t n = splice(w->from, NULL, p[1], NULL, PIPE_BYTES, SPLICE_F_MOVE);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    while (n > 0) {
      ssize_t m = splice(p[0], NULL, w->to, NULL, (size_t)n, SPLICE_F_MOVE);
      if (m < 0 && errno == EINTR) continue;
      if (m <= 0) goto out;
      n -= m;
      __atomic_add_fetch(&j->bytes, (uint64_t)m, __ATOMIC_RELAXED);
    }
  }
out:
  if (p[0] >= 0) {
    close(p[0]);
    close(p[1]);
  }
  finished(j);
  return NULL;
}

static int blocking_dup(int fd) {
  int d = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (d < 0) return -1;
  int fl = fcntl(d, F_GETFL);
  if (fl < 0 || fcntl(d, F_SETFL, fl & ~O_NONBLOCK) < 0) {
    close(d);
    return -1;
  }
  return d;
}

/*
 * Joins the TCP sockets `a` and `b` (duplicated: the caller still closes its descriptors). `early_a` (`len_a` bytes)
 * was read from `a` already and goes to `b` first; `early_b` likewise. `notify`: a non-blocking descriptor that gets
 * one byte when the join is done. Returns NULL with errno set when it could not start (nothing is left running).
 */
EXPORT void *atoll_splice_join(int a, int b, int notify, const uint8_t *early_a, uint32_t len_a, const uint8_t *early_b, uint32_t len_b) {
  join *j = calloc(1, sizeof *j);
  if (!j) return NULL;
  j->fds[0] = blocking_dup(a);
  j->fds[1] = j->fds[0] < 0 ? -1 : blocking_dup(b);
  j->notify = notify;
  const uint8_t *early[2] = {early_a, early_b};
  uint32_t len[2] = {len_a, len_b};
  int ok = j->fds[1] >= 0;
  for (int i = 0; ok && i < 2; i++) {
    way *w = &j->ways[i];
    w->j = j;
    w->from = j->fds[i];
    w->to = j->fds[1 - i];
    if (len[i] > 0) {
      w->early = malloc(len[i]);
      if (!w->early) ok = 0;
      else memcpy(w->early, early[i], len[i]);
      w->early_len = len[i];
    }
  }
  if (!ok) {
    int e = errno;
    for (int i = 0; i < 2; i++) {
      if (j->fds[i] >= 0) close(j->fds[i]);
      free(j->ways[i].early);
    }
    free(j);
    errno = e;
    return NULL;
  }
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, STACK_BYTES);
  j->running = 2;
  for (int i = 0; i < 2; i++) {
    way *w = &j->ways[i];
    w->started = pthread_create(&w->thread, &attr, pump, w) == 0;
    if (!w->started) finished(j); /* counts as a direction that ended: the other one stops too */
  }
  pthread_attr_destroy(&attr);
  return j;
}

/* Bytes carried so far, both directions. */
EXPORT double atoll_splice_bytes(void *p) {
  join *j = p;
  return (double)__atomic_load_n(&j->bytes, __ATOMIC_RELAXED);
}

/* 1 when both directions ended (the notify byte was written), else 0. */
EXPORT int atoll_splice_done(void *p) {
  join *j = p;
  return __atomic_load_n(&j->running, __ATOMIC_ACQUIRE) == 0;
}

/* Ends the join if it still runs, waits for its threads, closes its descriptors and frees it. Returns the bytes it
 * carried. */
EXPORT double atoll_splice_free(void *p) {
  join *j = p;
  end_both(j);
  for (int i = 0; i < 2; i++) {
    if (j->ways[i].started) pthread_join(j->ways[i].thread, NULL);
    free(j->ways[i].early);
  }
  close(j->fds[0]);
  close(j->fds[1]);
  double bytes = (double)j->bytes;
  free(j);
  return bytes;
}

/* A pipe for a broker's notifications: out[0] to read (non-blocking, for the event loop), out[1] to write
 * (non-blocking: a full pipe already holds a byte that wakes the reader). Returns 0 or -errno. */
EXPORT int atoll_splice_notifier(int *out) {
  return pipe2(out, O_CLOEXEC | O_NONBLOCK) < 0 ? -errno : 0;
}

/* Closes a descriptor of ours (the notifier's write end). */
EXPORT void atoll_splice_close(int fd) { close(fd); }
