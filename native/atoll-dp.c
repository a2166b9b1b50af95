/*
 * libatoll-dp.so: the datagram path's per-datagram work (src/adapters/tunnel/datagram-native.ts loads it with koffi), so
 * that JavaScript makes one call per packet sent and one per receive ring, not several per datagram.
 *
 *   send: a TUN packet (or a TCP/IPv4 superpacket: cut into segments as the kernel's own segmentation does), each
 *         segment sealed with AES-256-GCM into a datagram, laid out back to back in a run of equal-sized datagrams to
 *         one address and sent with one sendmsg and UDP_SEGMENT (UDP GSO) when the run ends;
 *   receive: a recvmmsg ring's messages (each one datagram or a UDP_GRO run of them) cut into datagrams, the key found
 *         by its id in a table of our own, the counter checked against the key's replay window, the datagram opened in
 *         place and the counter recorded once the tag verified; consecutive TCP segments of one flow from one peer and
 *         address merged back, in place, into a superpacket for the TUN device (as the kernel's GRO does); one result
 *         per packet for JavaScript.
 *
 * The wire format is src/core/tunnel/datagram.ts's:
 *   type (1) | flags (1) | 0 (2) | key id (4, BE) | counter (8, BE) | sealed payload | tag (16)
 * the first 16 bytes as additional data, the nonce 4 zero bytes and the counter; flags only on data (FLAG_COPY).
 *
 * libcrypto: this library links none. Its EVP calls bind, when Node loads it, to the OpenSSL inside Node, which Node
 * exports for addons (3.5 with Node 24): its AES-GCM uses VAES and AVX-512 where the CPU has them, 2.4 times faster
 * per 1440-byte datagram on the machine this was measured on than the system's OpenSSL 3.0, and no second libcrypto
 * is loaded. OpenSSL 3 keeps its ABI within the major version, so the 3.0 headers it is built against serve.
 * atoll_dp_crypto_origin() says which object the calls bind to (a test checks it). Keys are freed with
 * EVP_CIPHER_CTX_free (which cleanses the key schedule) and our copies are cleansed too.
 *
 * Keys kept across restarts: a key's bytes and what changes per datagram (a sending key's counter, a receiving key's
 * replay window) live in a record. With a region attached (atoll_dp_keep_create/attach: a memfd that the node's
 * keeper process, native/atoll-keeper.c, holds) the records are slots of that shared mapping and outlive the agent's
 * process, even a SIGKILL: a restarted agent takes its keys back with their counters, so no nonce is used twice, and
 * with their windows. Without a region they are on the heap.
 *
 * Not thread-safe: every call comes from the agent's main thread.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "keeper-protocol.h"

#define HDR 16
#define TAG 16
#define VNET 10
#define TYPE_DATA 1
#define TYPE_KEEPALIVE 2
/* Header byte 1 of a data datagram: a second copy of the datagram whose counter is one less (atoll_dp_send). */
#define FLAG_COPY 1
#define HELLO_TYPE 3
/* A hello (src/core/tunnel/hello.ts): its length, its flag, where the sender's public key (SPKI DER) lies */
#define HELLO_LEN 184
#define HELLO_DERIVED 1
#define HELLO_SPKI_AT 12
#define HELLO_SPKI_LEN 44
#define PIN 32
#define MAX_COUNTER (1ULL << 48)
#define WINDOW 2048
#define GSO_MAX_BYTES 65000
#define GSO_MAX_SEGMENTS 64
#define SOL_UDP_ 17
#define UDP_SEGMENT_ 103
#define UDP_GRO_ 104

#define EXPORT __attribute__((visibility("default")))

/* Drop reasons, in the order of DROP_REASONS in src/adapters/tunnel/datagram-native.ts. */
enum { DROP_TRUNCATED, DROP_BAD_TYPE, DROP_UNKNOWN_KEY, DROP_REPLAYED, DROP_BAD_TAG, DROP_HELLO_MALFORMED, DROP_HELLO_UNKNOWN, DROPS };
/* Result kinds (>= 0) for a datagram handed to JavaScript. */
enum { KIND_SPARE = 0, KIND_DATA = TYPE_DATA, KIND_KEEPALIVE = TYPE_KEEPALIVE, KIND_HELLO = HELLO_TYPE };
/* Per result: kind, peer tag, message index, offset of the plaintext (or the hello) from the ring's start, length,
 * datagrams merged into it, and their plaintexts' bytes (a packet not merged: 1 and its length). */
#define RESULT_INTS 7
#define IP4 20
#define TCP_FIN 0x01
#define TCP_SYN 0x02
#define TCP_RST 0x04
#define TCP_PSH 0x08
#define TCP_ACK 0x10
#define TCP_CWR 0x80
/* TCP flags that never merge: FIN, SYN, RST, URG, ECE, CWR. */
#define TCP_NO_MERGE (TCP_FIN | TCP_SYN | TCP_RST | 0x20 | 0x40 | TCP_CWR)
#define MAX_IP 65535

static uint32_t rd32(const uint8_t *b) { return ((uint32_t)b[0] << 24) | ((uint32_t)b[1] << 16) | ((uint32_t)b[2] << 8) | b[3]; }
static void wr16(uint8_t *b, uint32_t v) { b[0] = (uint8_t)(v >> 8); b[1] = (uint8_t)v; }
static void wr32(uint8_t *b, uint32_t v) { b[0] = (uint8_t)(v >> 24); b[1] = (uint8_t)(v >> 16); b[2] = (uint8_t)(v >> 8); b[3] = (uint8_t)v; }

static uint32_t sum16(const uint8_t *b, size_t n) {
  uint32_t s = 0;
  for (size_t i = 0; i + 1 < n; i += 2) s += ((uint32_t)b[i] << 8) | b[i + 1];
  return s;
}

static uint32_t fold(uint32_t s) {
  while (s > 0xffff) s = (s & 0xffff) + (s >> 16);
  return s;
}

/* ---- keys ---- */

static EVP_CIPHER_CTX *new_ctx(const uint8_t *key, int seal) {
  EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
  if (!ctx) return NULL;
  int ok = seal ? EVP_EncryptInit_ex(ctx, EVP_aes_256_gcm(), NULL, key, NULL) : EVP_DecryptInit_ex(ctx, EVP_aes_256_gcm(), NULL, key, NULL);
  if (ok != 1) {
    EVP_CIPHER_CTX_free(ctx);
    return NULL;
  }
  return ctx;
}

/* ---- kept records: a key's bytes and its per-datagram state, in the kept region or on the heap ---- */

enum { KEPT_FREE = 0, KEPT_SEAL = 1, KEPT_OPEN = 2 };

typedef struct {
  uint32_t kind, id;
  uint64_t counter; /* sealing: the next counter */
  int64_t top;      /* opening: the replay window's highest counter accepted (-1 before the first) */
  uint32_t bits[WINDOW / 32];
  uint8_t key[32];
} kept;

/* "ATK1": change it with any change to `kept` or `keep_header`, so that an agent of another version does not read
 * another layout: attach refuses the region, and that agent starts a new data plane. */
#define KEEP_MAGIC 0x314b5441u
#define KEEP_HEADER 64

/* The region's header: its slots, then two halves of `meta` bytes each for the caller's description of them. */
typedef struct {
  uint32_t magic, slots, meta, current;
  uint32_t length[2];
} keep_header;

static struct {
  uint8_t *base;
  size_t size;
  keep_header *h;
  kept *slots;
} region;

static size_t region_size(uint32_t slots, uint32_t meta) { return KEEP_HEADER + (size_t)slots * sizeof(kept) + 2 * (size_t)meta; }

static int in_region(const kept *r) { return region.slots && r >= region.slots && r < region.slots + region.h->slots; }

/* A record of `kind`: a free slot of the region (none left: the heap, so a full region costs only the keeping). */
static kept *kept_new(uint32_t kind, uint32_t id, const uint8_t *key) {
  kept *r = NULL;
  for (uint32_t i = 0; region.slots && i < region.h->slots && !r; i++)
    if (region.slots[i].kind == KEPT_FREE) r = &region.slots[i];
  if (!r && !(r = malloc(sizeof *r))) return NULL;
  memset(r, 0, sizeof *r);
  r->id = id;
  r->top = -1;
  memcpy(r->key, key, 32);
  __atomic_store_n(&r->kind, kind, __ATOMIC_RELEASE);
  return r;
}

/* Cleanses the record: a slot is free then, a heap record freed. */
static void kept_free(kept *r) {
  if (!r) return;
  int slot = in_region(r);
  OPENSSL_cleanse(r, sizeof *r);
  if (!slot) free(r);
}

/* A slot's number, or -1 for a heap record. */
static int slot_of(const kept *r) { return in_region(r) ? (int)(r - region.slots) : -1; }

/* Slot `slot` if it holds a record of `kind`. */
static kept *slot_at(int slot, uint32_t kind) {
  if (!region.slots || slot < 0 || (uint32_t)slot >= region.h->slots) return NULL;
  kept *r = &region.slots[slot];
  return __atomic_load_n(&r->kind, __ATOMIC_ACQUIRE) == kind ? r : NULL;
}

static int map_region(int fd, size_t size) {
  void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return -errno;
  region.base = base;
  region.size = size;
  region.h = base;
  region.slots = (kept *)(region.base + KEEP_HEADER);
  return 0;
}

/* Unmaps the region (its slots stay in the memfd); records made after are on the heap. Keys still holding slots must not be used after. */
EXPORT void atoll_dp_keep_detach(void) {
  if (region.base) munmap(region.base, region.size);
  memset(&region, 0, sizeof region);
}

/* A new region of `slots` records and two halves of `meta` bytes, attached. @returns its memfd (close-on-exec), or -errno. */
EXPORT int atoll_dp_keep_create(int slots, int meta) {
  if (slots < 1 || meta < 1) return -EINVAL;
  atoll_dp_keep_detach();
  int fd = memfd_create("atoll-kept-keys", MFD_CLOEXEC);
  if (fd < 0) return -errno;
  size_t size = region_size((uint32_t)slots, (uint32_t)meta);
  int rc = ftruncate(fd, (off_t)size) == 0 ? map_region(fd, size) : -errno;
  if (rc < 0) {
    close(fd);
    return rc;
  }
  region.h->slots = (uint32_t)slots;
  region.h->meta = (uint32_t)meta;
  __atomic_store_n(&region.h->magic, KEEP_MAGIC, __ATOMIC_RELEASE);
  return fd;
}

/* Attaches the region in memfd `fd` (one atoll_dp_keep_create made). @returns 0, -EINVAL when it is not one, or -errno. */
EXPORT int atoll_dp_keep_attach(int fd) {
  atoll_dp_keep_detach();
  struct stat st;
  if (fstat(fd, &st) != 0) return -errno;
  if ((size_t)st.st_size < KEEP_HEADER) return -EINVAL;
  int rc = map_region(fd, (size_t)st.st_size);
  if (rc < 0) return rc;
  keep_header *h = region.h;
  if (h->magic != KEEP_MAGIC || region_size(h->slots, h->meta) != (size_t)st.st_size || h->current > 1 || h->length[0] > h->meta || h->length[1] > h->meta) {
    atoll_dp_keep_detach();
    return -EINVAL;
  }
  return 0;
}

/*
 * Replaces the description (the caller's: which peer a slot's key is for, and the like) by buf: written into the
 * half not in use, then made current with one store, so a process killed meanwhile leaves the last one whole.
 * @returns 0, -ENOSPC when it is larger than a half, -ENODEV without a region.
 */
EXPORT int atoll_dp_keep_meta_write(const uint8_t *buf, uint32_t len) {
  if (!region.base) return -ENODEV;
  keep_header *h = region.h;
  if (len > h->meta) return -ENOSPC;
  uint32_t next = h->current ^ 1u;
  memcpy(region.base + KEEP_HEADER + (size_t)h->slots * sizeof(kept) + (size_t)next * h->meta, buf, len);
  h->length[next] = len;
  __atomic_store_n(&h->current, next, __ATOMIC_RELEASE);
  return 0;
}

/* Copies the current description into out (cap bytes). @returns its length, -ENOSPC when out is too small, -ENODEV without a region. */
EXPORT int atoll_dp_keep_meta_read(uint8_t *out, uint32_t cap) {
  if (!region.base) return -ENODEV;
  keep_header *h = region.h;
  uint32_t cur = __atomic_load_n(&h->current, __ATOMIC_ACQUIRE), len = h->length[cur];
  if (len > cap) return -ENOSPC;
  memcpy(out, region.base + KEEP_HEADER + (size_t)h->slots * sizeof(kept) + (size_t)cur * h->meta, len);
  return (int)len;
}

/* Frees every used slot not among keep[0..n) (records a killed process made but never described). @returns how many. */
EXPORT int atoll_dp_keep_sweep(const int32_t *keep, int n) {
  int freed = 0;
  for (uint32_t i = 0; region.slots && i < region.h->slots; i++) {
    if (region.slots[i].kind == KEPT_FREE) continue;
    int listed = 0;
    for (int j = 0; j < n && !listed; j++) listed = keep[j] == (int32_t)i;
    if (!listed) {
      kept_free(&region.slots[i]);
      freed++;
    }
  }
  return freed;
}

/* Slots in use (tests). */
EXPORT int atoll_dp_keep_used(void) {
  int used = 0;
  for (uint32_t i = 0; region.slots && i < region.h->slots; i++) used += region.slots[i].kind != KEPT_FREE;
  return used;
}

/* ---- sealing ---- */

typedef struct {
  EVP_CIPHER_CTX *ctx;
  kept *r;
} seal_key;

static seal_key *seal_key_of(kept *r) {
  seal_key *k = calloc(1, sizeof *k);
  if (!k) return NULL;
  k->ctx = new_ctx(r->key, 1);
  if (!k->ctx) {
    free(k);
    return NULL;
  }
  k->r = r;
  return k;
}

/* A sending key: 32 bytes, its id; the counter starts at 0. NULL when memory or libcrypto fails. */
EXPORT seal_key *atoll_dp_seal_key_new(const uint8_t *key, uint32_t id) {
  kept *r = kept_new(KEPT_SEAL, id, key);
  if (!r) return NULL;
  seal_key *k = seal_key_of(r);
  if (!k) kept_free(r);
  return k;
}

/* The sending key kept in `slot`, with its counter. NULL when the slot holds none (or libcrypto fails). */
EXPORT seal_key *atoll_dp_seal_key_restore(int slot) {
  kept *r = slot_at(slot, KEPT_SEAL);
  return r ? seal_key_of(r) : NULL;
}

/* The key's slot in the kept region, or -1 when it is on the heap. */
EXPORT int atoll_dp_seal_key_slot(const seal_key *k) { return slot_of(k->r); }

EXPORT uint32_t atoll_dp_seal_key_id(const seal_key *k) { return k->r->id; }

/* The next counter the key will use (a double: exact below 2^53, and counters stay below 2^48). */
EXPORT double atoll_dp_seal_key_counter(const seal_key *k) { return (double)k->r->counter; }

/* Frees the key and cleanses its record (a slot is free again). */
EXPORT void atoll_dp_seal_key_free(seal_key *k) {
  if (!k) return;
  EVP_CIPHER_CTX_free(k->ctx);
  kept_free(k->r);
  OPENSSL_cleanse(k, sizeof *k);
  free(k);
}

/* Frees the key but leaves a slot as it is, for the next process (a heap record is freed). */
EXPORT void atoll_dp_seal_key_release(seal_key *k) {
  if (!k) return;
  EVP_CIPHER_CTX_free(k->ctx);
  if (!in_region(k->r)) kept_free(k->r);
  OPENSSL_cleanse(k, sizeof *k);
  free(k);
}

static void nonce_of(uint8_t nonce[12], uint64_t counter) {
  memset(nonce, 0, 4);
  wr32(nonce + 4, (uint32_t)(counter >> 32));
  wr32(nonce + 8, (uint32_t)counter);
}

/*
 * Seals the datagram at d: header written here (flags in its byte 1), payload of n bytes at d + HDR (sealed in place),
 * tag after it.
 */
static int seal_at(seal_key *k, int type, int flags, uint8_t *d, int n) {
  uint64_t c = k->r->counter++;
  uint8_t nonce[12];
  int outl;
  d[0] = (uint8_t)type;
  d[1] = (uint8_t)flags;
  d[2] = d[3] = 0;
  wr32(d + 4, k->r->id);
  wr32(d + 8, (uint32_t)(c >> 32));
  wr32(d + 12, (uint32_t)c);
  nonce_of(nonce, c);
  if (EVP_EncryptInit_ex(k->ctx, NULL, NULL, NULL, nonce) != 1 || EVP_EncryptUpdate(k->ctx, NULL, &outl, d, HDR) != 1 ||
      EVP_EncryptUpdate(k->ctx, d + HDR, &outl, d + HDR, n) != 1 || EVP_EncryptFinal_ex(k->ctx, d + HDR + n, &outl) != 1 ||
      EVP_CIPHER_CTX_ctrl(k->ctx, EVP_CTRL_GCM_GET_TAG, TAG, d + HDR + n) != 1)
    return -1;
  return 0;
}

/* Seals `plain` (n bytes) as one datagram into `out` (room for n + 32 bytes): for tests and the occasional one-off. */
EXPORT int atoll_dp_seal_one(seal_key *k, int type, const uint8_t *plain, int n, uint8_t *out) {
  memmove(out + HDR, plain, (size_t)n);
  return seal_at(k, type, 0, out, n) == 0 ? HDR + n + TAG : -1;
}

typedef struct {
  EVP_CIPHER_CTX *ctx;
  kept *r;
  int32_t peer;
  double expires_at;
} open_key;

/* A peer's pin (SHA-256 of its tunnel key's SPKI DER) and the caller's tag for it. */
typedef struct {
  uint8_t pin[PIN];
  int32_t tag;
} pin_entry;

/*
 * The receiving keys, by id: a short array (two per peer), searched from the last hit. With hellos on
 * (atoll_dp_table_pins), the peers' pins, sorted: a hello is handed on only when its key's pin is one of them.
 */
typedef struct {
  open_key **keys;
  int n, cap, last;
  pin_entry *pins;
  int npins, hellos;
  EVP_MD *sha256;
  EVP_MD_CTX *md;
} key_table;

EXPORT key_table *atoll_dp_table_new(void) { return calloc(1, sizeof(key_table)); }

/* Frees the key; `keep`: leave a slot as it is, for the next process. */
static void free_open_key(open_key *k, int keep) {
  EVP_CIPHER_CTX_free(k->ctx);
  if (!keep || !in_region(k->r)) kept_free(k->r);
  OPENSSL_cleanse(k, sizeof *k);
  free(k);
}

static int find(key_table *t, uint32_t id) {
  if (t->last < t->n && t->keys[t->last]->r->id == id) return t->last;
  for (int i = 0; i < t->n; i++)
    if (t->keys[i]->r->id == id) return t->last = i;
  return -1;
}

/* Puts record r in the table for `peer`. 0, -1 when its id is taken, -2 out of memory or libcrypto failed. */
static int table_put(key_table *t, kept *r, int32_t peer) {
  if (find(t, r->id) >= 0) return -1;
  if (t->n == t->cap) {
    int cap = t->cap ? t->cap * 2 : 16;
    open_key **keys = realloc(t->keys, (size_t)cap * sizeof *keys);
    if (!keys) return -2;
    t->keys = keys;
    t->cap = cap;
  }
  open_key *k = calloc(1, sizeof *k);
  if (!k) return -2;
  k->ctx = new_ctx(r->key, 0);
  if (!k->ctx) {
    free(k);
    return -2;
  }
  k->r = r;
  k->peer = peer;
  k->expires_at = 1.0 / 0.0;
  t->keys[t->n++] = k;
  return 0;
}

/* Adds receiving key `id` of peer `peer` (a tag of the caller's). 0, or -1 when the id is taken, -2 out of memory or libcrypto failed. */
EXPORT int atoll_dp_table_add(key_table *t, uint32_t id, int32_t peer, const uint8_t *key) {
  if (find(t, id) >= 0) return -1;
  kept *r = kept_new(KEPT_OPEN, id, key);
  if (!r) return -2;
  int rc = table_put(t, r, peer);
  if (rc != 0) kept_free(r);
  return rc;
}

/* Adds the receiving key kept in `slot`, with its replay window, for `peer`. 0, -1 when its id is taken, -2 out of memory or libcrypto failed, -3 when the slot holds none. */
EXPORT int atoll_dp_table_restore(key_table *t, int slot, int32_t peer) {
  kept *r = slot_at(slot, KEPT_OPEN);
  return r ? table_put(t, r, peer) : -3;
}

/* The slot of key `id` in the kept region: -1 on the heap, -2 when there is no such key. */
EXPORT int atoll_dp_table_slot(key_table *t, uint32_t id) {
  int i = find(t, id);
  return i < 0 ? -2 : slot_of(t->keys[i]->r);
}

/* Sets when key `id` stops opening datagrams (the caller's clock, as passed to atoll_dp_open). */
EXPORT void atoll_dp_table_expire(key_table *t, uint32_t id, double at) {
  int i = find(t, id);
  if (i >= 0) t->keys[i]->expires_at = at;
}

/* Removes and frees key `id`, cleansing its record. 0, or -1 when there is none. */
EXPORT int atoll_dp_table_remove(key_table *t, uint32_t id) {
  int i = find(t, id);
  if (i < 0) return -1;
  free_open_key(t->keys[i], 0);
  t->keys[i] = t->keys[--t->n];
  t->last = 0;
  return 0;
}

EXPORT int atoll_dp_table_size(const key_table *t) { return t->n; }

/* Frees every key and the table; `keep`: the keys' slots stay as they are, for the next process. */
EXPORT void atoll_dp_table_free(key_table *t, int keep) {
  if (!t) return;
  for (int i = 0; i < t->n; i++) free_open_key(t->keys[i], keep);
  free(t->keys);
  free(t->pins);
  EVP_MD_CTX_free(t->md);
  EVP_MD_free(t->sha256);
  free(t);
}

static int pin_cmp(const void *a, const void *b) { return memcmp(a, b, PIN); }

/*
 * Turns hellos on and sets the peers whose hellos are handed on: n pins (PIN bytes each, back to back) with their
 * tags. Until the first call every hello is dropped as a bad type. 0, or -2 out of memory or libcrypto failed (the
 * set as it was).
 */
EXPORT int atoll_dp_table_pins(key_table *t, const uint8_t *pins, const int32_t *tags, int n) {
  if (!t->md) {
    t->sha256 = EVP_MD_fetch(NULL, "SHA2-256", NULL);
    t->md = t->sha256 ? EVP_MD_CTX_new() : NULL;
    if (!t->md) return -2;
  }
  pin_entry *e = n > 0 ? malloc((size_t)n * sizeof *e) : NULL;
  if (n > 0 && !e) return -2;
  for (int i = 0; i < n; i++) {
    memcpy(e[i].pin, pins + (size_t)i * PIN, PIN);
    e[i].tag = tags[i];
  }
  if (n > 1) qsort(e, (size_t)n, sizeof *e, pin_cmp);
  free(t->pins);
  t->pins = e;
  t->npins = n;
  t->hellos = 1;
  return 0;
}

/* ---- the replay window (RFC 6479's idea, a sliding bitmap): the one implementation ---- */

/* Whether `c` is new: above the top, or inside the window and not seen. */
static int window_ok(const kept *k, uint64_t c) {
  if ((int64_t)c > k->top) return 1;
  if ((uint64_t)k->top - c >= WINDOW) return 0;
  uint32_t bit = (uint32_t)(c % WINDOW);
  return (k->bits[bit >> 5] & (1u << (bit & 31))) == 0;
}

/* Records `c`, which passed window_ok and was authentic. */
static void window_accept(kept *k, uint64_t c) {
  if ((int64_t)c > k->top) {
    uint64_t from = (uint64_t)(k->top + 1);
    if (c - from >= WINDOW) memset(k->bits, 0, sizeof k->bits);
    else
      for (uint64_t x = from; x <= c; x++) k->bits[(x % WINDOW) >> 5] &= ~(1u << (x % WINDOW & 31));
    k->top = (int64_t)c;
  }
  uint32_t bit = (uint32_t)(c % WINDOW);
  k->bits[bit >> 5] |= 1u << (bit & 31);
}

/* For the unit tests of the window, on a key of the table: ok (0/1) and accept (1 when recorded, 0 when seen). */
EXPORT int atoll_dp_window_test(key_table *t, uint32_t id, double counter, int accept) {
  int i = find(t, id);
  if (i < 0) return -1;
  uint64_t c = (uint64_t)counter;
  if (!window_ok(t->keys[i]->r, c)) return 0;
  if (accept) window_accept(t->keys[i]->r, c);
  return 1;
}

/* ---- receiving ---- */

/*
 * A hello is handed on unopened when hellos are on, its layout holds and its key's pin is a peer's (*peer: its tag):
 * what is not, the bulk of a flood of hellos, costs a hash here and nothing in JavaScript.
 */
static int pass_hello(key_table *t, const uint8_t *d, size_t len, int32_t *peer) {
  if (!t->hellos) return -1 - DROP_BAD_TYPE;
  if (len != HELLO_LEN || (d[1] & ~HELLO_DERIVED) || d[2] || d[3]) return -1 - DROP_HELLO_MALFORMED;
  uint8_t pin[PIN];
  unsigned int n = 0;
  if (EVP_DigestInit_ex2(t->md, t->sha256, NULL) != 1 || EVP_DigestUpdate(t->md, d + HELLO_SPKI_AT, HELLO_SPKI_LEN) != 1 ||
      EVP_DigestFinal_ex(t->md, pin, &n) != 1 || n != PIN)
    return -1 - DROP_HELLO_UNKNOWN;
  const pin_entry *e = t->npins > 0 ? bsearch(pin, t->pins, (size_t)t->npins, sizeof *t->pins, pin_cmp) : NULL;
  if (!e) return -1 - DROP_HELLO_UNKNOWN;
  *peer = e->tag;
  return KIND_HELLO;
}

/*
 * Opens one datagram d (len bytes) in place. @returns its result kind, KIND_SPARE for an authentic copy (FLAG_COPY)
 * whose original arrived (recorded, not handed on), or -1 - the drop reason.
 */
static int open_one(key_table *t, uint8_t *d, size_t len, double now, int32_t *peer) {
  if (len >= 1 && d[0] == HELLO_TYPE) return pass_hello(t, d, len, peer);
  if (len < HDR + TAG + 1) return -1 - DROP_TRUNCATED;
  if ((d[0] != TYPE_DATA && d[0] != TYPE_KEEPALIVE) || (d[1] & ~FLAG_COPY) || (d[1] && d[0] != TYPE_DATA) || d[2] || d[3])
    return -1 - DROP_BAD_TYPE;
  uint64_t c = ((uint64_t)rd32(d + 8) << 32) | rd32(d + 12);
  if (c >= MAX_COUNTER) return -1 - DROP_BAD_TYPE;
  int i = find(t, rd32(d + 4));
  if (i < 0 || t->keys[i]->expires_at < now) return -1 - DROP_UNKNOWN_KEY;
  open_key *k = t->keys[i];
  if (!window_ok(k->r, c)) return -1 - DROP_REPLAYED;
  uint8_t nonce[12];
  int outl, n = (int)(len - HDR - TAG);
  nonce_of(nonce, c);
  if (EVP_DecryptInit_ex(k->ctx, NULL, NULL, NULL, nonce) != 1 || EVP_DecryptUpdate(k->ctx, NULL, &outl, d, HDR) != 1 ||
      EVP_DecryptUpdate(k->ctx, d + HDR, &outl, d + HDR, n) != 1 || EVP_CIPHER_CTX_ctrl(k->ctx, EVP_CTRL_GCM_SET_TAG, TAG, d + HDR + n) != 1 ||
      EVP_DecryptFinal_ex(k->ctx, d + HDR + n, &outl) <= 0)
    return -1 - DROP_BAD_TAG;
  /* the original, one counter before, came (or is older than the window): this copy is not needed */
  int spare = d[1] == FLAG_COPY && c > 0 && !window_ok(k->r, c - 1);
  window_accept(k->r, c);
  *peer = k->peer;
  return spare ? KIND_SPARE : d[0];
}

/* The segment size UDP_GRO reported for message m, or its whole length. */
static size_t segment_size(const struct msghdr *m, size_t len) {
  for (struct cmsghdr *c = CMSG_FIRSTHDR(m); c; c = CMSG_NXTHDR((struct msghdr *)m, c)) {
    if (c->cmsg_level == SOL_UDP_ && c->cmsg_type == UDP_GRO_ && c->cmsg_len >= CMSG_LEN(sizeof(int))) {
      int seg;
      memcpy(&seg, CMSG_DATA(c), sizeof seg);
      return seg > 0 ? (size_t)seg : len;
    }
  }
  return len;
}

/* ---- merging TCP segments back into superpackets (the receiving half of atoll_dp_send's segmentation) ---- */

/* The TCP facts of a segment. */
typedef struct {
  uint32_t thl, seq, payload, flags;
} segment;

/* Whether packet p (virtio header first, len bytes) is one TCP segment in IPv4 without options or fragments (its
 * IP length all of len); its facts into s. */
static int tcp4(const uint8_t *p, size_t len, segment *s) {
  const uint8_t *ip = p + VNET, *tcp = ip + IP4;
  if (len < VNET + IP4 + 20 || ip[0] != 0x45 || ip[9] != 6) return 0;
  if ((ip[6] & 0x3f) != 0 || ip[7] != 0) return 0; /* MF or a fragment offset */
  uint32_t total = ((uint32_t)ip[2] << 8) | ip[3];
  if (total != len - VNET) return 0;
  s->thl = (uint32_t)(tcp[12] >> 4) * 4;
  if (s->thl < 20 || total < IP4 + s->thl) return 0;
  s->flags = tcp[13];
  s->payload = total - IP4 - s->thl;
  s->seq = rd32(tcp + 4);
  return 1;
}

/* Whether packet p (virtio header first, len bytes) may merge: a TCP segment (tcp4), not GSO, with a payload and no
 * flag that never merges. */
static int mergeable(const uint8_t *p, size_t len, segment *s) {
  return p[1] == 0 && tcp4(p, len, s) && s->payload > 0 && !(s->flags & TCP_NO_MERGE);
}

/*
 * The packet being merged: it starts in the ring where its first datagram's plaintext was, and each segment that
 * continues it has its payload moved to its end, which always lies before that segment (a datagram's header and tag,
 * and the segment's own headers, are more than what the payload moves by), over bytes already read.
 */
typedef struct {
  uint8_t *p;
  int res; /* its result, or -1 when none is held */
  int32_t peer;
  uint32_t addr, port; /* where its datagrams came from (network order) */
  uint32_t len, segments, mss, thl, next_seq;
} held;

/* Whether segment q (facts s) continues h's flow exactly: same addresses, ports, TTL and TOS, same TCP header (options
 * included) but the sequence number and PSH, the next sequence number, and no more payload than the first's. */
static int continues(const held *h, const uint8_t *q, const segment *s) {
  if (s->thl != h->thl || s->seq != h->next_seq || s->payload > h->mss || h->len + s->payload > VNET + MAX_IP) return 0;
  const uint8_t *a = h->p + VNET, *b = q + VNET;
  /* version/IHL and TOS; flags/fragment offset, TTL, protocol; addresses */
  if (a[0] != b[0] || a[1] != b[1] || memcmp(a + 6, b + 6, 4) || memcmp(a + 12, b + 12, 8)) return 0;
  a += IP4;
  b += IP4;
  /* ports; acknowledgement and data offset; flags but PSH, window; options */
  if (memcmp(a, b, 4) || memcmp(a + 8, b + 8, 5) || (a[13] & ~TCP_PSH) != (b[13] & ~TCP_PSH) || a[14] != b[14] || a[15] != b[15]) return 0;
  return memcmp(a + 20, b + 20, s->thl - 20) == 0;
}

/* Ends h: a superpacket when segments were merged (virtio GSO TCPV4, its IP length and checksum, the TCP checksum
 * field holding the pseudo-header's sum, as the TUN device expects of a packet that needs its checksum), its result's
 * length set. */
static void finish(held *h, int32_t *results) {
  if (h->res < 0) return;
  if (h->segments > 1) {
    uint8_t *b = h->p, *ip = b + VNET;
    uint32_t total = h->len - VNET;
    memset(b, 0, VNET);
    b[0] = 1;                       /* VIRTIO_NET_HDR_F_NEEDS_CSUM */
    b[1] = 1;                       /* VIRTIO_NET_HDR_GSO_TCPV4 */
    b[2] = (uint8_t)(IP4 + h->thl); /* hdr_len (little-endian, as the rest) */
    b[4] = (uint8_t)h->mss;
    b[5] = (uint8_t)(h->mss >> 8); /* gso_size */
    b[6] = IP4;                    /* csum_start */
    b[8] = 16;                     /* csum_offset */
    wr16(ip + 2, total);
    wr16(ip + 10, 0);
    wr16(ip + 10, ~fold(sum16(ip, IP4)) & 0xffff);
    wr16(ip + IP4 + 16, fold(sum16(ip + 12, 8) + 6 + total - IP4));
    results[h->res * RESULT_INTS + 4] = (int32_t)h->len;
  }
  h->res = -1;
}

/*
 * Opens the n messages of a recvmmsg vector `vec` (each one datagram or a UDP_GRO run, cut by its segment size), in
 * place. Writes RESULT_INTS ints per packet handed on (authentic data and keepalives, and the hellos of peers' keys,
 * unopened: see pass_hello) into `results` (room for max_results), and adds to counts[0..DROPS) the drops by reason,
 * to counts[DROPS] the datagrams seen and to counts[DROPS + 1] the copies set aside because their original came.
 * With `merge`, consecutive TCP segments of one flow in data datagrams from one peer and source address are handed on
 * as one superpacket; anything else between them ends it. Offsets count from `vec`: the ring is one block
 * (src/adapters/tunnel/udp-batch.ts). @returns the results written; datagrams beyond max_results are counted as truncated.
 *
 * It starts at message at[0], byte at[1] of it, and stops right after handing on a hello, leaving in `at` where to go
 * on (at[0] == n: the vector is done). A hello may bring the key of the datagrams behind it (the peer that answered
 * our hello seals under the keys it agreed at once): the caller adds that key, then opens the rest, in the order they
 * came. Opened in one pass, they were dropped as of an unknown key (a packet lost at an agent's restart).
 */
EXPORT int atoll_dp_open(key_table *t, struct mmsghdr *vec, int n, double now, int merge, int32_t *results, int max_results, uint32_t *counts, int32_t at[2]) {
  int r = 0;
  held h = {.res = -1};
  size_t first = at[1] > 0 ? (size_t)at[1] : 0;
  at[1] = 0;
  for (int i = at[0]; i < n; i++, first = 0) {
    struct msghdr *m = &vec[i].msg_hdr;
    const struct sockaddr_in *from = m->msg_name;
    uint32_t addr = from ? from->sin_addr.s_addr : 0, port = from ? from->sin_port : 0;
    uint8_t *buf = m->msg_iov[0].iov_base;
    size_t len = vec[i].msg_len;
    size_t seg = segment_size(m, len);
    if (seg == 0) seg = len ? len : 1;
    for (size_t off = first; off < len || (len == 0 && off == 0); off += seg) {
      size_t dlen = off + seg <= len ? seg : len - off;
      uint8_t *d = buf + off;
      counts[DROPS]++;
      if (r >= max_results) {
        counts[DROP_TRUNCATED]++;
        if (len == 0) break;
        continue;
      }
      int32_t peer = -1;
      int kind = open_one(t, d, dlen, now, &peer);
      if (kind < 0) counts[-1 - kind]++;
      if (kind == KIND_SPARE) counts[DROPS + 1]++;
      if (kind <= KIND_SPARE) {
        if (len == 0) break;
        continue;
      }
      uint8_t *p = d + (kind == KIND_HELLO ? 0 : HDR);
      uint32_t plen = (uint32_t)(kind == KIND_HELLO ? dlen : dlen - HDR - TAG);
      segment s;
      int tcp = merge && kind == KIND_DATA && mergeable(p, plen, &s);
      if (tcp && h.res >= 0 && h.peer == peer && h.addr == addr && h.port == port && continues(&h, p, &s)) {
        memmove(h.p + h.len, p + VNET + IP4 + s.thl, s.payload);
        h.len += s.payload;
        h.segments++;
        h.next_seq += s.payload;
        h.p[VNET + IP4 + 13] |= (uint8_t)(s.flags & TCP_PSH);
        int32_t *res = results + h.res * RESULT_INTS;
        res[5]++;
        res[6] += (int32_t)plen;
        if (s.payload < h.mss || (s.flags & TCP_PSH)) finish(&h, results);
        continue;
      }
      finish(&h, results);
      int32_t *res = results + r * RESULT_INTS;
      res[0] = kind;
      res[1] = peer;
      res[2] = i;
      res[3] = (int32_t)(p - (uint8_t *)vec);
      res[4] = (int32_t)plen;
      res[5] = 1;
      res[6] = (int32_t)plen;
      if (tcp && !(s.flags & TCP_PSH))
        h = (held){.p = p, .res = r, .peer = peer, .addr = addr, .port = port, .len = plen, .segments = 1, .mss = s.payload, .thl = s.thl, .next_seq = s.seq + s.payload};
      r++;
      if (kind == KIND_HELLO) {
        size_t next = off + seg;
        at[0] = next < len ? i : i + 1;
        at[1] = next < len ? (int32_t)next : 0;
        return r;
      }
      if (len == 0) break;
    }
  }
  at[0] = n;
  finish(&h, results);
  return r;
}

/* ---- sending ---- */

/*
 * What the sender saw of a TCP/IPv4 flow it carries: its 4-tuple (source and destination addresses, then ports, as
 * on the wire) and the sequence number after the highest data sent. A direct-mapped table of FLOWS slots: a flow that
 * takes another's slot starts afresh (at worst a segment of either goes once where it would have gone twice).
 */
#define FLOWS 256
typedef struct {
  uint8_t key[12];
  uint32_t next;
  uint8_t used;
} flow;

typedef struct {
  int fd;
  /* the run being built: its destination, bytes, datagrams, and the size of each (but a shorter last) */
  struct sockaddr_in dst;
  uint32_t bytes, count, stride;
  /* datagrams the kernel refused (dropped), and the errno of the last refusal */
  double send_failed;
  int last_errno;
  /* second copies queued (FLAG_COPY, see atoll_dp_send) */
  double copies;
  flow flows[FLOWS];
  uint8_t buf[GSO_MAX_BYTES];
} sender;

EXPORT sender *atoll_dp_sender_new(int fd) {
  sender *s = calloc(1, sizeof *s);
  if (s) s->fd = fd;
  return s;
}

EXPORT void atoll_dp_sender_free(sender *s) { free(s); }

/* Sends the run built so far. */
EXPORT void atoll_dp_flush(sender *s) {
  if (s->count == 0) return;
  struct iovec iov = {.iov_base = s->buf, .iov_len = s->bytes};
  union {
    char buf[CMSG_SPACE(sizeof(uint16_t))];
    struct cmsghdr align;
  } control;
  struct msghdr m = {.msg_name = &s->dst, .msg_namelen = sizeof s->dst, .msg_iov = &iov, .msg_iovlen = 1};
  if (s->stride < s->bytes) {
    memset(&control, 0, sizeof control);
    m.msg_control = control.buf;
    m.msg_controllen = sizeof control.buf;
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_UDP_;
    c->cmsg_type = UDP_SEGMENT_;
    c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
    uint16_t seg = (uint16_t)s->stride;
    memcpy(CMSG_DATA(c), &seg, sizeof seg);
  }
  if (sendmsg(s->fd, &m, MSG_DONTWAIT) < 0) {
    s->send_failed += s->count;
    s->last_errno = errno;
  }
  s->bytes = s->count = 0;
}

/*
 * Takes the counters: out[0] datagrams dropped since the last call, out[1] the last errno (0: none since), out[2] the
 * second copies queued since the last call.
 */
EXPORT void atoll_dp_sender_take(sender *s, double *out) {
  out[0] = s->send_failed;
  out[1] = s->last_errno;
  out[2] = s->copies;
  s->send_failed = 0;
  s->last_errno = 0;
  s->copies = 0;
}

/*
 * Room for the next datagram of `len` bytes to dst: a run is of one destination and of datagrams of its first's size
 * (the last may be shorter), within the kernel's limits; a datagram that does not continue it flushes it first.
 */
static uint8_t *reserve(sender *s, const struct sockaddr_in *dst, uint32_t len) {
  if (s->count > 0 && (s->dst.sin_addr.s_addr != dst->sin_addr.s_addr || s->dst.sin_port != dst->sin_port || len > s->stride ||
                       s->bytes + len > GSO_MAX_BYTES || s->count >= GSO_MAX_SEGMENTS))
    atoll_dp_flush(s);
  if (s->count == 0) {
    s->stride = len;
    s->dst = *dst;
  }
  return s->buf + s->bytes;
}

static void commit(sender *s, uint32_t len) {
  s->bytes += len;
  s->count++;
  if (len < s->stride) atoll_dp_flush(s); /* a shorter datagram ends a run */
}

/* One datagram of `type` with `flags` holding plain (n bytes) to dst. -1 when libcrypto failed (nothing queued). */
static int queue_one(sender *s, seal_key *k, const struct sockaddr_in *dst, int type, int flags, const uint8_t *plain, uint32_t n) {
  uint32_t len = HDR + n + TAG;
  uint8_t *d = reserve(s, dst, len);
  memcpy(d + HDR, plain, n);
  if (seal_at(k, type, flags, d, (int)n) != 0) return -1;
  commit(s, len);
  return 1;
}

#define VIRTIO_NET_HDR_F_NEEDS_CSUM 1
#define VIRTIO_NET_HDR_GSO_TCPV4 1

/*
 * Whether pkt (virtio header first), the TCP segment s (tcp4), has no data and is an acknowledgement whose SACK blocks
 * report new data held beyond a hole: not a duplicate SACK (RFC 2883: a first block below the acknowledgement or
 * inside the second), which a sender must not be told twice. See atoll_dp_send.
 */
static int sack_ack(const uint8_t *pkt, const segment *s) {
  if (s->payload > 0 || (s->flags & (TCP_ACK | TCP_SYN | TCP_FIN | TCP_RST)) != TCP_ACK) return 0;
  const uint8_t *tcp = pkt + VNET + IP4;
  uint32_t thl = s->thl;
  for (uint32_t o = 20; o < thl && tcp[o] != 0;) {
    if (tcp[o] == 1) {
      o++;
      continue;
    }
    uint32_t n = o + 1 < thl ? tcp[o + 1] : 0;
    if (n < 2 || o + n > thl) return 0;
    if (tcp[o] == 5) {
      if (n < 10 || (n - 2) % 8 != 0) return 0;
      uint32_t ack = rd32(tcp + 8), start = rd32(tcp + o + 2), end = rd32(tcp + o + 6);
      if ((int32_t)(start - ack) < 0) return 0;
      if (n >= 18 && (int32_t)(start - rd32(tcp + o + 10)) >= 0 && (int32_t)(end - rd32(tcp + o + 14)) <= 0) return 0;
      return 1;
    }
    o += n;
  }
  return 0;
}

/*
 * Records that the TCP/IPv4 flow whose IP header is ip (ihl bytes, TCP's after it) sent data [seq, end), a SYN
 * starting it afresh. @returns whether that data began below what the flow had sent before: a retransmission.
 */
static int sent_tcp(sender *s, const uint8_t *ip, uint32_t ihl, uint32_t seq, uint32_t end, int syn) {
  uint8_t key[12];
  memcpy(key, ip + 12, 8);
  memcpy(key + 8, ip + ihl, 4);
  uint32_t h = 2166136261u; /* FNV-1a */
  for (int i = 0; i < 12; i++) h = (h ^ key[i]) * 16777619u;
  flow *f = &s->flows[h % FLOWS];
  if (syn || !f->used || memcmp(f->key, key, sizeof key) != 0) {
    memcpy(f->key, key, sizeof key);
    f->used = 1;
    f->next = end;
    return 0;
  }
  int again = (int32_t)(seq - f->next) < 0;
  if ((int32_t)(end - f->next) > 0) f->next = end;
  return again;
}

/*
 * Whether pkt (virtio header first), the TCP segment g (tcp4) with data, is a retransmission of its flow (sent_tcp),
 * recording it either way. A SYN (its sequence number is the flow's first) records the flow afresh.
 */
static int resent(sender *s, const uint8_t *pkt, const segment *g) {
  if (g->flags & TCP_RST) return 0;
  int syn = (g->flags & TCP_SYN) != 0;
  if (g->payload == 0 && !syn) return 0;
  return sent_tcp(s, pkt + VNET, IP4, g->seq, g->seq + g->payload + (uint32_t)syn, syn);
}

/*
 * Queues `pkt` (virtio-net header first, as the TUN device gives it) to addr:port (host order) in datagrams of `type`
 * under k: itself when its IP packet fits max_ip bytes, else, for a TCP/IPv4 superpacket (GSO TCPV4), its segments of
 * at most its gso_size, each with its own IPv4 header (length, id + i, checksum), TCP sequence number, flags (FIN and
 * PSH on the last only, CWR on the first only) and a virtio header asking for the TCP checksum to be completed
 * (NEEDS_CSUM, the pseudo-header sum in the checksum field), as the kernel's own segmentation does. What does not
 * continue the run being built flushes it first; the last run stays for atoll_dp_flush. A data datagram holding an
 * acknowledgement with new SACK blocks (sack_ack) is queued twice, under two counters: one lost on a lossy path would
 * take information the sender gets nowhere else, and it would send again what had arrived. So is a segment its flow
 * sends again (resent, a retransmission; superpackets only record what their flow sent): a retransmission lost too
 * leaves its sender to find that out by its retransmission timer, a stall of a fifth of a second or more after which
 * its congestion control starts low again. The second copy carries FLAG_COPY, and the receiver hands it on only when
 * the first did not come (open_one): a receiving TCP given both would answer a duplicate SACK, which its sender reads
 * as reordering and repairs later.
 * @returns the datagrams queued, or -1 when the datagram path cannot take it (too big and not a TCP/IPv4
 *   superpacket, segments above max_ip, or the key's counters spent): nothing queued, the run flushed (the caller
 *   sends it on a stream, after what was queued).
 */
EXPORT int atoll_dp_send(sender *s, seal_key *k, uint32_t addr, uint32_t port, int type, const uint8_t *pkt, uint32_t len, uint32_t max_ip) {
  struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr = {.s_addr = htonl(addr)}};
  if (max_ip > GSO_MAX_BYTES - HDR - VNET - TAG) goto refuse; /* no datagram may outgrow the run's buffer */
  if (len < VNET || len - VNET <= max_ip) {
    if (k->r->counter >= MAX_COUNTER || queue_one(s, k, &dst, type, 0, pkt, len) < 0) goto refuse;
    segment g;
    int twice = type == TYPE_DATA && tcp4(pkt, len, &g) && (resent(s, pkt, &g) || sack_ack(pkt, &g));
    if (twice && k->r->counter < MAX_COUNTER && queue_one(s, k, &dst, type, FLAG_COPY, pkt, len) > 0) {
      s->copies++;
      return 2;
    }
    return 1;
  }
  if (len < VNET + 40 || (pkt[1] & 0x7f) != VIRTIO_NET_HDR_GSO_TCPV4) goto refuse;
  uint32_t gso = pkt[4] | ((uint32_t)pkt[5] << 8);
  const uint8_t *ip = pkt + VNET;
  if (ip[0] >> 4 != 4 || ip[9] != 6) goto refuse;
  uint32_t ihl = (ip[0] & 15u) * 4, tcp = VNET + ihl;
  if (len < tcp + 20) goto refuse;
  uint32_t thl = (pkt[tcp + 12] >> 4) * 4u, payload = tcp + thl, headers = ihl + thl;
  if (gso < 1 || headers + gso > max_ip || payload > len) goto refuse;
  uint32_t segs = (len - payload + gso - 1) / gso;
  if (k->r->counter + segs > MAX_COUNTER) goto refuse;
  uint32_t id0 = ((uint32_t)ip[4] << 8) | ip[5], seq0 = rd32(pkt + tcp + 4), flags = pkt[tcp + 13];
  uint32_t src = sum16(ip + 12, 8);
  uint32_t i = 0;
  for (uint32_t off = payload; off < len; off += gso, i++) {
    uint32_t n = len - off < gso ? len - off : gso;
    int last = off + n >= len;
    uint32_t plain = VNET + headers + n, dlen = HDR + plain + TAG;
    uint8_t *d = reserve(s, &dst, dlen);
    uint8_t *seg = d + HDR;
    memset(seg, 0, VNET);
    seg[0] = VIRTIO_NET_HDR_F_NEEDS_CSUM;
    seg[6] = (uint8_t)ihl; /* csum_start (LE): from the IP header's start */
    seg[8] = 16;           /* csum_offset: TCP's checksum field */
    memcpy(seg + VNET, ip, headers);
    memcpy(seg + VNET + headers, pkt + off, n);
    uint8_t *sip = seg + VNET, *st = sip + ihl;
    wr16(sip + 2, headers + n);
    wr16(sip + 4, (id0 + i) & 0xffff);
    wr16(sip + 10, 0);
    wr16(sip + 10, ~fold(sum16(sip, ihl)) & 0xffff);
    wr32(st + 4, seq0 + i * gso);
    uint32_t f = flags;
    if (!last) f &= ~(uint32_t)(TCP_FIN | TCP_PSH);
    if (i > 0) f &= ~(uint32_t)TCP_CWR;
    st[13] = (uint8_t)f;
    /* the pseudo-header sum, not complemented, as CHECKSUM_PARTIAL wants it */
    wr16(st + 16, fold(src + 6 + thl + n));
    if (seal_at(k, type, 0, d, (int)plain) != 0) goto refuse; /* only a broken libcrypto: the segments before it went */
    commit(s, dlen);
  }
  if (type == TYPE_DATA) sent_tcp(s, ip, ihl, seq0, seq0 + (len - payload), 0);
  return (int)i;
refuse:
  atoll_dp_flush(s);
  return -1;
}

/* Sends buf (len bytes) to addr:port as one datagram, after the run being built. @returns 0 or the errno. */
EXPORT int atoll_dp_send_raw(sender *s, uint32_t addr, uint32_t port, const uint8_t *buf, uint32_t len) {
  atoll_dp_flush(s);
  struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr = {.s_addr = htonl(addr)}};
  return sendto(s->fd, buf, len, MSG_DONTWAIT, (struct sockaddr *)&dst, sizeof dst) < 0 ? errno : 0;
}

/* ---- the keeper (native/atoll-keeper.c) ---- */

/*
 * Connects to the keeper at `path` and takes what it holds: up to `max` descriptors into fds (close-on-exec), its pid
 * into info[0] and their count into info[1]. The connection stays open (it tells the keeper an agent lives) and is
 * returned; closing it, or a byte 'q' on it (atoll_dp_keeper_quit), ends that. @returns the connection, or -errno
 * (-EPROTO: not a keeper's greeting).
 */
EXPORT int atoll_dp_keeper_connect(const char *path, int32_t *fds, int max, int32_t *info) {
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof addr.sun_path) return -ENAMETOOLONG;
  strcpy(addr.sun_path, path);
  struct keeper_greeting hello;
  int got_fds[FD_PASSING_MAX], n;
  int c = keeper_greeted(&addr, &hello, got_fds, &n);
  if (c < 0) return c;
  if (n > max) {
    for (int i = 0; i < n; i++) close(got_fds[i]);
    close(c);
    return -EPROTO;
  }
  for (int i = 0; i < n; i++) fds[i] = got_fds[i];
  info[0] = hello.pid;
  info[1] = n;
  return c;
}

/* Hands descriptors fds[0..n) to the keeper on connection c, which holds them instead of what it held. @returns 0 or -errno. */
EXPORT int atoll_dp_keeper_hold(int c, const int32_t *fds, int n) {
  if (n < 0 || n > FD_PASSING_MAX) return -EINVAL;
  struct {
    char magic[8];
    int32_t count;
  } msg;
  memcpy(msg.magic, "ATHOLD1", 8);
  msg.count = n;
  int out[FD_PASSING_MAX];
  for (int i = 0; i < n; i++) out[i] = fds[i];
  return send_fds(c, &msg, sizeof msg, out, n);
}

/*
 * Whether the keeper on connection c is still there: 0 once the connection ended (the keeper exited: asked to, killed,
 * or taken over by a standing keeper, which then holds the data plane but knows of no agent). A keeper sends nothing
 * after its greeting, so readable means ended.
 */
EXPORT int atoll_dp_keeper_alive(int c) {
  struct pollfd p = {.fd = c, .events = POLLIN};
  if (poll(&p, 1, 0) < 0) return errno == EINTR;
  if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return 0;
  if (!(p.revents & POLLIN)) return 1;
  char b;
  ssize_t got = recv(c, &b, 1, MSG_PEEK | MSG_DONTWAIT);
  return got > 0 || (got < 0 && (errno == EAGAIN || errno == EINTR));
}

/* Asks the keeper on connection c to let go of what it holds (a keeper the agent started exits then), and closes c. */
EXPORT void atoll_dp_keeper_quit(int c) {
  char q = 'q';
  (void)!send(c, &q, 1, MSG_NOSIGNAL);
  close(c);
}

/* ---- which OpenSSL ---- */

/* The path of the object our EVP_EncryptInit_ex binds to (the OpenSSL inside Node: the node executable), into out. */
EXPORT int atoll_dp_crypto_origin(char *out, int cap) {
  Dl_info info;
  if (!dladdr((void *)&EVP_EncryptInit_ex, &info) || !info.dli_fname) return -1;
  size_t n = strlen(info.dli_fname);
  if ((int)n >= cap) n = (size_t)cap - 1;
  memcpy(out, info.dli_fname, n);
  out[n] = 0;
  return (int)n;
}

/* OpenSSL's version as the library we bind to reports it. */
EXPORT const char *atoll_dp_crypto_version(void) { return OpenSSL_version(OPENSSL_VERSION); }
