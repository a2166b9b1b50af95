/**
 * The datagram path's per-datagram work in C (native/atoll-dp.c, built by the set-up into bin/libatoll-dp.so),
 * called through koffi once per packet sent and once per receive ring: segmenting a TCP superpacket, the datagram
 * headers, AES-256-GCM on the system's libcrypto (OpenSSL 3), the runs of UDP GSO sends; on receipt, cutting UDP_GRO
 * runs apart, the key lookup by id, the replay window and opening in place. The wire format is
 * src/core/tunnel/datagram.ts's.
 *
 * Why: in JavaScript every datagram cost five koffi calls to seal and five to open (about 0.8 us of the 1.1 to 1.3 us
 * each), plus segmenting and the header in JavaScript: the datagram path spent 2.4 times the TLS stream's CPU per
 * Gbit/s (docs/architecture.md, "The datagram path"). A koffi call costs about the same whatever it does, so the
 * work is moved behind one call per packet and per ring.
 *
 * The library is loaded with RTLD_DEEPBIND (koffi's `deep`): Node exports its own statically linked OpenSSL's
 * symbols, and without it the library's EVP calls would bind to Node's copy; {@link nativeCryptoOrigin} says which
 * object they bind to. Every object here lives outside the JavaScript heap and needs its `free()`, which also
 * cleanses the key.
 */
import { join } from 'node:path';
import koffi from 'koffi';
import { atollError } from '../core/errors.ts';
import type { DatagramDrop, DatagramType } from '../core/tunnel/datagram.ts';
import { installRoot } from './install-root.ts';

/** Where the set-up puts the library, under the install root (the checkout, or /opt/atoll in the image). */
export const NATIVE_LIBRARY = 'bin/libatoll-dp.so';
/** The drops the C side counts, in the order of its enum. */
const DROP_REASONS: readonly DatagramDrop[] = ['truncated', 'badType', 'unknownKey', 'replayed', 'badTag'];
const RESULT_INTS = 5;
/** Results per ring: 64 messages of at most 64 datagrams each (the kernel's UDP_GRO limit). */
const MAX_RESULTS = 64 * 64;

type Ptr = unknown;
interface Lib {
  sealKeyNew: (key: Uint8Array, id: number) => Ptr;
  sealKeyCounter: (k: Ptr) => number;
  sealKeyFree: (k: Ptr) => void;
  sealOne: (k: Ptr, type: number, plain: Uint8Array, n: number, out: Uint8Array) => number;
  tableNew: () => Ptr;
  tableAdd: (t: Ptr, id: number, peer: number, key: Uint8Array) => number;
  tableExpire: (t: Ptr, id: number, at: number) => void;
  tableRemove: (t: Ptr, id: number) => number;
  tableSize: (t: Ptr) => number;
  tableFree: (t: Ptr) => void;
  windowTest: (t: Ptr, id: number, counter: number, accept: number) => number;
  open: (t: Ptr, vec: Ptr, n: number, now: number, results: Int32Array, max: number, counts: Uint32Array) => number;
  senderNew: (fd: number) => Ptr;
  senderFree: (s: Ptr) => void;
  senderTake: (s: Ptr, out: Float64Array) => void;
  flush: (s: Ptr) => void;
  send: (s: Ptr, k: Ptr, addr: number, port: number, type: number, pkt: Uint8Array, len: number, maxIp: number) => number;
  sendRaw: (s: Ptr, addr: number, port: number, buf: Uint8Array, len: number) => number;
  cryptoOrigin: (out: Uint8Array, cap: number) => number;
  cryptoVersion: () => string;
}

let lib: Lib | undefined;

function load(): Lib {
  if (lib) return lib;
  const path = join(installRoot(), NATIVE_LIBRARY);
  let l: ReturnType<typeof koffi.load>;
  try {
    l = koffi.load(path, { deep: true });
  } catch (cause) {
    throw atollError('KERNEL_OP_FAILED', `the datagram path needs ${path} (and libcrypto.so.3, OpenSSL 3), which did not load`,
      'run the set-up (make setup builds it; apt-get install libssl3), or turn tunnel.udp off', cause);
  }
  lib = {
    sealKeyNew: l.func('void *atoll_dp_seal_key_new(const uint8_t *key, uint32_t id)') as Lib['sealKeyNew'],
    sealKeyCounter: l.func('double atoll_dp_seal_key_counter(void *k)') as Lib['sealKeyCounter'],
    sealKeyFree: l.func('void atoll_dp_seal_key_free(void *k)') as Lib['sealKeyFree'],
    sealOne: l.func('int atoll_dp_seal_one(void *k, int type, const uint8_t *plain, int n, uint8_t *out)') as Lib['sealOne'],
    tableNew: l.func('void *atoll_dp_table_new()') as Lib['tableNew'],
    tableAdd: l.func('int atoll_dp_table_add(void *t, uint32_t id, int32_t peer, const uint8_t *key)') as Lib['tableAdd'],
    tableExpire: l.func('void atoll_dp_table_expire(void *t, uint32_t id, double at)') as Lib['tableExpire'],
    tableRemove: l.func('int atoll_dp_table_remove(void *t, uint32_t id)') as Lib['tableRemove'],
    tableSize: l.func('int atoll_dp_table_size(void *t)') as Lib['tableSize'],
    tableFree: l.func('void atoll_dp_table_free(void *t)') as Lib['tableFree'],
    windowTest: l.func('int atoll_dp_window_test(void *t, uint32_t id, double counter, int accept)') as Lib['windowTest'],
    open: l.func('int atoll_dp_open(void *t, void *vec, int n, double now, int32_t *results, int max, uint32_t *counts)') as Lib['open'],
    senderNew: l.func('void *atoll_dp_sender_new(int fd)') as Lib['senderNew'],
    senderFree: l.func('void atoll_dp_sender_free(void *s)') as Lib['senderFree'],
    senderTake: l.func('void atoll_dp_sender_take(void *s, double *out)') as Lib['senderTake'],
    flush: l.func('void atoll_dp_flush(void *s)') as Lib['flush'],
    send: l.func('int atoll_dp_send(void *s, void *k, uint32_t addr, uint32_t port, int type, const uint8_t *pkt, uint32_t len, uint32_t maxIp)') as Lib['send'],
    sendRaw: l.func('int atoll_dp_send_raw(void *s, uint32_t addr, uint32_t port, const uint8_t *buf, uint32_t len)') as Lib['sendRaw'],
    cryptoOrigin: l.func('int atoll_dp_crypto_origin(uint8_t *out, int cap)') as Lib['cryptoOrigin'],
    cryptoVersion: l.func('const char *atoll_dp_crypto_version()') as Lib['cryptoVersion'],
  };
  return lib;
}

/** The file our AES-GCM calls bind to (it must be the system's libcrypto.so.3, not Node's executable), and its version. */
export function nativeCryptoOrigin(): { path: string; version: string } {
  const l = load();
  const out = new Uint8Array(4096);
  const n = l.cryptoOrigin(out, out.length);
  return { path: n < 0 ? '' : Buffer.from(out.subarray(0, n)).toString(), version: l.cryptoVersion() };
}

/** A 32-bit IPv4 address (host order) of a dotted one, or undefined. */
export function ipv4Number(host: string): number | undefined {
  const o = host.split('.').map(Number);
  if (o.length !== 4 || o.some((x) => !Number.isInteger(x) || x < 0 || x > 255)) return undefined;
  return ((o[0]! << 24) >>> 0) + (o[1]! << 16) + (o[2]! << 8) + o[3]!;
}

/** One sending key (AES-256-GCM) and its counter, which is the nonce: datagrams sealed under it never repeat one. */
export class SealKey {
  readonly id: number;
  #k: Ptr;
  readonly #l: Lib;

  /** @param key 32 bytes (not kept: the caller may zero it). @param id the key id the datagrams carry. */
  constructor(key: Uint8Array, id: number) {
    if (key.length !== 32) throw new RangeError(`an AES-256-GCM key has 32 bytes, not ${key.length}`);
    this.#l = load();
    this.id = id >>> 0;
    this.#k = this.#l.sealKeyNew(key, this.id);
    if (!this.#k) throw new Error('EVP init of AES-256-GCM failed');
  }

  /** The native handle, for {@link DatagramSender.send}. */
  get handle(): Ptr {
    if (this.#k === null) throw new Error('the sending key was freed');
    return this.#k;
  }

  /** Datagrams sealed so far (the next counter). */
  get counter(): number {
    return this.#k === null ? 0 : this.#l.sealKeyCounter(this.#k);
  }

  /** Seals one datagram of `type` holding `plain` (for tests and forged input). @returns the datagram. */
  sealOne(type: DatagramType, plain: Uint8Array): Uint8Array {
    const out = new Uint8Array(plain.length + 32);
    const n = this.#l.sealOne(this.handle, type, plain, plain.length, out);
    if (n < 0) throw new Error('sealing failed');
    return out;
  }

  /** Frees the key (cleansed); idempotent. */
  free(): void {
    if (this.#k === null) return;
    this.#l.sealKeyFree(this.#k);
    this.#k = null;
  }
}

/** One datagram {@link OpenKeyTable.open} handed on: data or keepalive (authentic, opened), or a hello (as received). */
export interface OpenedDatagram {
  readonly kind: DatagramType | 3;
  /** The peer tag its key was added with (-1 for a hello). */
  readonly peer: number;
  /** Its message in the ring (for its source). */
  readonly message: number;
  /** Where its plaintext (a hello: the whole datagram) lies in the ring's bytes. */
  readonly offset: number;
  readonly length: number;
}

/**
 * The receiving keys by id, each with its replay window (RFC 6479's idea: the highest counter and a bitmap of the 2048
 * below it; a counter is tested before opening and recorded only once the tag verified, so forged datagrams cannot
 * move the window). Opens whole recvmmsg rings.
 */
export class OpenKeyTable {
  /** Per datagram handed on: kind, peer tag, message, offset, length (valid until the next {@link open}). */
  readonly results = new Int32Array(MAX_RESULTS * RESULT_INTS);
  readonly #counts = new Uint32Array(DROP_REASONS.length + 1);
  #t: Ptr;
  readonly #l: Lib;

  constructor() {
    this.#l = load();
    this.#t = this.#l.tableNew();
    if (!this.#t) throw new Error('malloc for the datagram key table failed');
  }

  get #table(): Ptr {
    if (this.#t === null) throw new Error('the datagram key table was freed');
    return this.#t;
  }

  /** Adds key `id` (32 bytes, not kept) of peer tag `peer`. @returns false when the id is taken. */
  add(id: number, peer: number, key: Uint8Array): boolean {
    if (key.length !== 32) throw new RangeError(`an AES-256-GCM key has 32 bytes, not ${key.length}`);
    const rc = this.#l.tableAdd(this.#table, id >>> 0, peer, key);
    if (rc === -2) throw new Error('EVP init of AES-256-GCM failed');
    return rc === 0;
  }

  /** Key `id` opens nothing after `at` (the clock passed to {@link open}). */
  expire(id: number, at: number): void {
    this.#l.tableExpire(this.#table, id >>> 0, at);
  }

  /** Removes and frees (cleanses) key `id`. @returns false when there was none. */
  remove(id: number): boolean {
    return this.#t !== null && this.#l.tableRemove(this.#t, id >>> 0) === 0;
  }

  get size(): number {
    return this.#t === null ? 0 : this.#l.tableSize(this.#t);
  }

  /** The replay window of key `id` (tests): whether `counter` is new, and with `accept` recorded. -1: no such key. */
  window(id: number, counter: number, accept: boolean): number {
    return this.#l.windowTest(this.#table, id >>> 0, counter, accept ? 1 : 0);
  }

  /**
   * Opens the `n` messages of the recvmmsg vector at `ring` (src/adapters/udp-batch.ts) in place, at time `now`.
   * Adds the drops by reason to `dropped`. @returns the datagrams handed on, in {@link results}, and the datagrams seen.
   */
  open(ring: Ptr, n: number, now: number, dropped: Record<DatagramDrop, number>): { handed: number; seen: number } {
    const counts = this.#counts;
    counts.fill(0);
    const handed = this.#l.open(this.#table, ring, n, now, this.results, MAX_RESULTS, counts);
    for (let i = 0; i < DROP_REASONS.length; i++) if (counts[i]! > 0) dropped[DROP_REASONS[i]!] += counts[i]!;
    return { handed, seen: counts[DROP_REASONS.length]! };
  }

  /** Result `i` of the last {@link open}, as an object (tests; the hot path reads {@link results}). */
  result(i: number): OpenedDatagram {
    const r = this.results;
    const o = i * RESULT_INTS;
    return { kind: r[o] as DatagramType | 3, peer: r[o + 1]!, message: r[o + 2]!, offset: r[o + 3]!, length: r[o + 4]! };
  }

  /** Frees every key (cleansed) and the table; idempotent. */
  free(): void {
    if (this.#t === null) return;
    this.#l.tableFree(this.#t);
    this.#t = null;
  }
}

/**
 * Seals packets into runs of datagrams and sends each run with one `sendmsg` and UDP_SEGMENT (UDP GSO) on `fd`, with
 * MSG_DONTWAIT (a full send buffer drops the run, as a full NIC queue would, and is counted).
 */
export class DatagramSender {
  readonly #l: Lib;
  #s: Ptr;
  readonly #taken = new Float64Array(2);

  constructor(fd: number) {
    this.#l = load();
    this.#s = this.#l.senderNew(fd);
    if (!this.#s) throw new Error('malloc for the datagram sender failed');
  }

  get #sender(): Ptr {
    if (this.#s === null) throw new Error('the datagram sender was freed');
    return this.#s;
  }

  /**
   * Queues `pkt` (virtio-net header first) to `addr`:`port` (addr: {@link ipv4Number}) under `key`, a TCP/IPv4
   * superpacket cut into segments whose IP packets fit `maxIp`. @returns the datagrams queued, or -1 when the path
   * cannot take it (too big and not splittable): nothing queued, what was queued before sent.
   */
  send(key: SealKey, addr: number, port: number, type: DatagramType, pkt: Uint8Array, maxIp: number): number {
    return this.#l.send(this.#sender, key.handle, addr, port, type, pkt, pkt.length, maxIp);
  }

  /** Sends `buf` as one datagram, after what is queued. @returns 0 or the errno. */
  sendRaw(addr: number, port: number, buf: Uint8Array): number {
    return this.#l.sendRaw(this.#sender, addr, port, buf, buf.length);
  }

  /** Sends what is queued. @returns the datagrams the kernel refused since the last call, and the last errno (0: none). */
  flush(): { failed: number; errno: number } {
    if (this.#s === null) return { failed: 0, errno: 0 };
    this.#l.flush(this.#s);
    this.#l.senderTake(this.#s, this.#taken);
    return { failed: this.#taken[0]!, errno: this.#taken[1]! };
  }

  /** Frees the sender (what is queued is dropped); idempotent. */
  free(): void {
    if (this.#s === null) return;
    this.#l.senderFree(this.#s);
    this.#s = null;
  }
}
