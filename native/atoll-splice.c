/*
 * The relay's circuits joined in the kernel (src/adapters/tunnel/splice-native.ts loads this, from libatoll-dp.so, with
 * koffi): two connected TCP sockets spliced to each other both ways, each direction through a pipe of its own
 * (splice(2): the pages move from one socket's receive queue to the other's send queue), so the bytes never enter
 * user space and JavaScript does nothing per chunk.
 *
 * Who moves the bytes: a few worker threads (one per online CPU, at most MAX_WORKERS), started on the first join and
 * shared by every join of the process. Each has an epoll set; a join belongs to one worker (round robin), which watches
 * both its sockets edge-triggered. A socket that became readable moves the direction that reads it, one that became
 * writable the direction that writes to it, until it would block: a socket with nothing to read (its EPOLLIN edge comes
 * back) or a socket that takes no more (its EPOLLOUT edge). A direction that moved TURN_BYTES in one turn yields, so
 * one busy circuit cannot starve the others of its worker. The thread count stays fixed however many circuits there are
 * (two threads per circuit before: a relay with thousands of circuits hit the pod's PID limit, and every blocked thread
 * held a stack).
 *
 * A join works on duplicates of the two descriptors it is given (the caller closes its own); the sockets stay
 * non-blocking, as Node made them. Bytes the caller had read already go first. When either direction ends (end of
 * stream, an error, or atoll_splice_free), both sockets are shut down and the join is done: its worker drops it and
 * writes one byte to the join's notify descriptor; the caller then collects it with atoll_splice_free. The bytes
 * carried are counted atomically and readable at any time.
 *
 * Ownership: the calling thread (Node's main thread) creates a join and hands it to its worker through the worker's
 * mutex; from then on only that worker touches the join's state, until it publishes `done` (under the same mutex).
 * Only then does the caller free it. A join is in the worker's ready list only while not ended, so a published join
 * is in no list of the worker's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
/*
 * Each direction's pipe starts at the kernel's default (64 KiB: 16 slots) and grows to 1 MiB (the default
 * fs.pipe-max-size: a TCP receive queue's worth per call) once one read brings GROW_AT: a 1 MiB pipe's 256 slots
 * take 16 KiB of kernel memory (charged to the relay's cgroup) even while idle, and most circuits carry little.
 */
#define PIPE_BYTES (1 << 20)
#define GROW_AT (32 * 1024)
/* A direction that moved this much in one turn lets the worker's other joins go first. */
#define TURN_BYTES (4 << 20)
#define MAX_WORKERS 8
#define MAX_EVENTS 64
#define STACK_BYTES (64 * 1024)

typedef struct join join;
typedef struct worker worker;

typedef struct {
  int from, to;
  int pipe[2];
  size_t pending; /* bytes in the pipe not yet passed on to `to` */
  uint8_t *early;
  size_t early_len, early_off;
  int grown; /* the pipe is PIPE_BYTES (or tried to be) */
} way;

struct join {
  way ways[2];
  int fds[2];
  int notify;
  worker *w;
  uint64_t bytes; /* atomic */
  int done;       /* atomic; set under w->mu */
  /* under w->mu: */
  int stop_asked;
  join *next_add, *next_stop;
  /* the worker's alone: */
  int ended, queued;
  join *next_ready, *next_retired;
};

struct worker {
  pthread_t thread;
  int ep, wake;
  pthread_mutex_t mu;
  pthread_cond_t cond;
  join *adds, *stops; /* under mu */
  join *ready, *retired;
};

static worker workers[MAX_WORKERS];
static int n_workers;
static int start_errno;
static unsigned next_worker;
static pthread_once_t started = PTHREAD_ONCE_INIT;

static void wake(worker *w) {
  uint64_t one = 1;
  while (write(w->wake, &one, sizeof one) < 0 && errno == EINTR) {}
}

/* Ends a join (the worker's): out of its epoll set, both sockets shut down, onto the retired list. */
static void end(worker *w, join *j) {
  j->ended = 1;
  for (int i = 0; i < 2; i++) {
    epoll_ctl(w->ep, EPOLL_CTL_DEL, j->fds[i], NULL); /* ENOENT when registering it had failed */
    shutdown(j->fds[i], SHUT_RDWR);
  }
  j->next_retired = w->retired;
  w->retired = j;
}

/*
 * Moves one direction until it would block (0), it moved TURN_BYTES (1: more may be waiting, and no edge will say
 * so), or it ended (-1: end of stream or an error on either socket).
 */
static int advance(join *j, way *d) {
  while (d->early_off < d->early_len) {
    ssize_t n = write(d->to, d->early + d->early_off, d->early_len - d->early_off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return 0;
    if (n <= 0) return -1;
    d->early_off += (size_t)n;
    __atomic_add_fetch(&j->bytes, (uint64_t)n, __ATOMIC_RELAXED);
  }
  size_t moved = 0;
  for (;;) {
    if (d->pending > 0) {
      ssize_t n = splice(d->pipe[0], NULL, d->to, NULL, d->pending, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) return 0;
      if (n <= 0) return -1;
      d->pending -= (size_t)n;
      moved += (size_t)n;
      __atomic_add_fetch(&j->bytes, (uint64_t)n, __ATOMIC_RELAXED);
      continue;
    }
    if (moved >= TURN_BYTES) return 1;
    ssize_t n = splice(d->from, NULL, d->pipe[1], NULL, PIPE_BYTES, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return 0;
    if (n <= 0) return -1;
    d->pending = (size_t)n;
    if (!d->grown && (size_t)n >= GROW_AT) {
      d->grown = 1;
      (void)fcntl(d->pipe[1], F_SETPIPE_SZ, PIPE_BYTES); /* best effort: a 64 KiB pipe works too, in more calls */
    }
  }
}

/* One turn of a join: the directions in `ways` (bit i: way i); queued again when one had more to move. */
static void turn(worker *w, join *j, unsigned ways) {
  int more = 0;
  for (int i = 0; i < 2; i++) {
    if (!(ways & (1u << i))) continue;
    int r = advance(j, &j->ways[i]);
    if (r < 0) {
      end(w, j);
      return;
    }
    more |= r;
  }
  if (more && !j->queued) {
    j->queued = 1;
    j->next_ready = w->ready;
    w->ready = j;
  }
}

/*
 * The worker's exchange with the callers, once per loop: takes new joins (their sockets into the epoll set; the
 * events of sockets already readable or writable come at the next wait) and stop requests, then publishes every
 * join that ended. Under the mutex, so a caller waiting in atoll_splice_free sees its join published only after its
 * stop request was taken and the join left the ready list.
 */
static void settle(worker *w) {
  pthread_mutex_lock(&w->mu);
  for (join *j = w->adds; j; j = j->next_add) {
    int ok = 1;
    for (uintptr_t i = 0; ok && i < 2; i++) {
      struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, .data.u64 = (uintptr_t)j | i};
      ok = epoll_ctl(w->ep, EPOLL_CTL_ADD, j->fds[i], &ev) == 0;
    }
    if (!ok) end(w, j);
  }
  w->adds = NULL;
  if (w->stops) {
    for (join *j = w->stops; j; j = j->next_stop)
      if (!j->ended) end(w, j);
    w->stops = NULL;
    join **p = &w->ready;
    while (*p) {
      if ((*p)->ended) *p = (*p)->next_ready;
      else p = &(*p)->next_ready;
    }
  }
  if (w->retired) {
    for (join *j = w->retired; j; j = j->next_retired) {
      __atomic_store_n(&j->done, 1, __ATOMIC_RELEASE);
      uint8_t one = 1; /* a full notify pipe already holds a byte that wakes the reader */
      while (write(j->notify, &one, 1) < 0 && errno == EINTR) {}
    }
    w->retired = NULL;
    pthread_cond_broadcast(&w->cond);
  }
  pthread_mutex_unlock(&w->mu);
}

static void *work(void *arg) {
  worker *w = arg;
  struct epoll_event ev[MAX_EVENTS];
  for (;;) {
    int n = epoll_wait(w->ep, ev, MAX_EVENTS, w->ready ? 0 : -1);
    for (int i = 0; i < n; i++) {
      join *j = (join *)(uintptr_t)(ev[i].data.u64 & ~(uint64_t)1);
      if (!j) {
        uint64_t count;
        while (read(w->wake, &count, sizeof count) < 0 && errno == EINTR) {}
        continue;
      }
      if (j->ended) continue;
      /* socket `side` readable: the way that reads it; writable: the way that writes to it */
      unsigned side = (unsigned)(ev[i].data.u64 & 1), e = ev[i].events, ways = 0;
      if (e & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) ways |= 1u << side;
      if (e & (EPOLLOUT | EPOLLHUP | EPOLLERR)) ways |= 1u << (1 - side);
      turn(w, j, ways);
    }
    join *r = w->ready;
    w->ready = NULL;
    while (r) {
      join *next = r->next_ready;
      r->queued = 0;
      if (!r->ended) turn(w, r, 3);
      r = next;
    }
    settle(w);
  }
  return NULL;
}

/* Starts the workers, with every signal blocked in them (Node's handlers run on its own threads). */
static void start(void) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  int want = cpus < 1 ? 1 : cpus > MAX_WORKERS ? MAX_WORKERS : (int)cpus;
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, STACK_BYTES);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  for (int i = 0; i < want; i++) {
    worker *w = &workers[n_workers];
    w->ep = epoll_create1(EPOLL_CLOEXEC);
    w->wake = w->ep < 0 ? -1 : eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 0};
    int err = w->wake < 0 || epoll_ctl(w->ep, EPOLL_CTL_ADD, w->wake, &ev) < 0 ? errno : 0;
    if (!err) {
      pthread_mutex_init(&w->mu, NULL);
      pthread_cond_init(&w->cond, NULL);
      err = pthread_create(&w->thread, &attr, work, w);
    }
    if (err) {
      if (w->wake >= 0) close(w->wake);
      if (w->ep >= 0) close(w->ep);
      start_errno = err;
      break;
    }
    n_workers++;
  }
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
}

static void close_join_fds(join *j) {
  for (int i = 0; i < 2; i++) {
    if (j->fds[i] >= 0) close(j->fds[i]);
    for (int k = 0; k < 2; k++)
      if (j->ways[i].pipe[k] >= 0) close(j->ways[i].pipe[k]);
    free(j->ways[i].early);
  }
}

/*
 * Joins the TCP sockets `a` and `b` (duplicated: the caller still closes its descriptors). `early_a` (`len_a` bytes)
 * was read from `a` already and goes to `b` first; `early_b` likewise. `notify`: a non-blocking descriptor that gets
 * one byte when the join is done. Returns NULL with errno set when it could not start (nothing is left running).
 */
EXPORT void *atoll_splice_join(int a, int b, int notify, const uint8_t *early_a, uint32_t len_a, const uint8_t *early_b, uint32_t len_b) {
  pthread_once(&started, start);
  if (n_workers == 0) {
    errno = start_errno;
    return NULL;
  }
  join *j = calloc(1, sizeof *j);
  if (!j) return NULL;
  for (int i = 0; i < 2; i++) j->ways[i].pipe[0] = j->ways[i].pipe[1] = -1;
  j->fds[0] = fcntl(a, F_DUPFD_CLOEXEC, 0);
  j->fds[1] = j->fds[0] < 0 ? -1 : fcntl(b, F_DUPFD_CLOEXEC, 0);
  int ok = j->fds[1] >= 0;
  const uint8_t *early[2] = {early_a, early_b};
  uint32_t len[2] = {len_a, len_b};
  for (int i = 0; ok && i < 2; i++) {
    way *d = &j->ways[i];
    d->from = j->fds[i];
    d->to = j->fds[1 - i];
    int fl = fcntl(d->from, F_GETFL);
    ok = fl >= 0 && fcntl(d->from, F_SETFL, fl | O_NONBLOCK) == 0 && pipe2(d->pipe, O_CLOEXEC | O_NONBLOCK) == 0;
    if (!ok) break;
    if (len[i] > 0) {
      d->early = malloc(len[i]);
      ok = d->early != NULL;
      if (ok) memcpy(d->early, early[i], len[i]);
      d->early_len = len[i];
    }
  }
  if (!ok) {
    int e = errno;
    close_join_fds(j);
    free(j);
    errno = e;
    return NULL;
  }
  j->notify = notify;
  worker *w = &workers[__atomic_fetch_add(&next_worker, 1, __ATOMIC_RELAXED) % (unsigned)n_workers];
  j->w = w;
  pthread_mutex_lock(&w->mu);
  j->next_add = w->adds;
  w->adds = j;
  wake(w);
  pthread_mutex_unlock(&w->mu);
  return j;
}

/* Bytes carried so far, both directions. */
EXPORT double atoll_splice_bytes(void *p) {
  join *j = p;
  return (double)__atomic_load_n(&j->bytes, __ATOMIC_RELAXED);
}

/* 1 when the join is done (its worker dropped it and wrote the notify byte), else 0. */
EXPORT int atoll_splice_done(void *p) {
  join *j = p;
  return __atomic_load_n(&j->done, __ATOMIC_ACQUIRE);
}

/* Ends the join if it still runs, waits until its worker dropped it, closes its descriptors and frees it. Returns
 * the bytes it carried. */
EXPORT double atoll_splice_free(void *p) {
  join *j = p;
  worker *w = j->w;
  pthread_mutex_lock(&w->mu);
  if (!__atomic_load_n(&j->done, __ATOMIC_ACQUIRE) && !j->stop_asked) {
    j->stop_asked = 1;
    j->next_stop = w->stops;
    w->stops = j;
    wake(w);
  }
  while (!__atomic_load_n(&j->done, __ATOMIC_ACQUIRE)) pthread_cond_wait(&w->cond, &w->mu);
  pthread_mutex_unlock(&w->mu);
  double bytes = (double)j->bytes;
  close_join_fds(j);
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
