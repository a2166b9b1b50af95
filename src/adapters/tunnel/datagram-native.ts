/**
 * The datagram path's per-datagram work in C (native/atoll-dp.c, built by the set-up into bin/libatoll-dp.so),
 * called through koffi once per packet sent and once per receive ring: segmenting a TCP superpacket, the datagram
 * headers, AES-256-GCM on the OpenSSL inside Node, the runs of UDP GSO sends; on receipt, cutting UDP_GRO
 * runs apart, the key lookup by id, the replay window, opening in place and merging a flow's TCP segments back into
 * superpackets for the TUN device. The wire format is src/core/tunnel/datagram.ts's.
 *
 * Why: in JavaScript every datagram cost five koffi calls to seal and five to open (about 0.8 us of the 1.1 to 1.3 us
 * each), plus segmenting and the header in JavaScript: the datagram path spent 2.4 times the TLS stream's CPU per
 * Gbit/s (docs/architecture.md, "The datagram path"). A koffi call costs about the same whatever it does, so the
 * work is moved behind one call per packet and per ring.
 *
 * AES-GCM is the OpenSSL inside Node's executable (exported for addons; the library links no libcrypto of its own):
 * {@link nativeCryptoOrigin} says which object the EVP calls bind to. Every object here lives outside the JavaScript
 * heap and needs its `free()`, which also cleanses the key.
 */
import { atollError } from '../../core/errors.ts';
import type { DatagramDrop, DatagramType } from '../../core/tunnel/datagram.ts';
import type { HelloDrop } from '../../core/tunnel/hello.ts';
import { openNativeLibrary } from './native-library.ts';

/** The drops the C side counts, in the order of its enum. */
const DROP_REASONS: readonly (DatagramDrop | HelloDrop)[] = ['truncated', 'badType', 'unknownKey', 'replayed', 'badTag', 'helloMalformed', 'helloUnknownPeer'];
/** Bytes of a pin's SHA-256, as the C side compares them. */
const PIN_BYTES = 32;
/** Ints per result of {@link OpenKeyTable.open}: kind, peer tag, message, offset, length, datagrams, their bytes. */
export const RESULT_INTS = 7;
/** Results per ring: 64 messages of at most 64 datagrams each (the kernel's UDP_GRO limit). */
const MAX_RESULTS = 64 * 64;

type Ptr = unknown;
interface Lib {
  sealKeyNew: (key: Uint8Array, id: number) => Ptr;
  sealKeyCounter: (k: Ptr) => number;
  sealKeyFree: (k: Ptr) => void;
  sealKeyRelease: (k: Ptr) => void;
  sealKeyRestore: (slot: number) => Ptr;
  sealKeySlot: (k: Ptr) => number;
  sealKeyId: (k: Ptr) => number;
  sealOne: (k: Ptr, type: number, plain: Uint8Array, n: number, out: Uint8Array) => number;
  tableNew: () => Ptr;
  tableAdd: (t: Ptr, id: number, peer: number, key: Uint8Array) => number;
  tableExpire: (t: Ptr, id: number, at: number) => void;
  tableRemove: (t: Ptr, id: number) => number;
  tableSize: (t: Ptr) => number;
  tableFree: (t: Ptr, keep: number) => void;
  tableRestore: (t: Ptr, slot: number, peer: number) => number;
  tableSlot: (t: Ptr, id: number) => number;
  tablePins: (t: Ptr, pins: Uint8Array, tags: Int32Array, n: number) => number;
  keepCreate: (slots: number, meta: number) => number;
  keepAttach: (fd: number) => number;
  keepDetach: () => void;
  keepMetaWrite: (buf: Uint8Array, len: number) => number;
  keepMetaRead: (out: Uint8Array, cap: number) => number;
  keepSweep: (keep: Int32Array, n: number) => number;
  keepUsed: () => number;
  keeperConnect: (path: string, fds: Int32Array, max: number, info: Int32Array) => number;
  keeperQuit: (c: number) => void;
  keeperHold: (c: number, fds: Int32Array, n: number) => number;
  keeperAlive: (c: number) => number;
  windowTest: (t: Ptr, id: number, counter: number, accept: number) => number;
  open: (t: Ptr, vec: Ptr, n: number, now: number, merge: number, results: Int32Array, max: number, counts: Uint32Array, at: Int32Array) => number;
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
  const l = openNativeLibrary('the datagram path', 'run the set-up (make setup builds it) and the project\'s Node, or turn tunnel.udp off',
    ' (it binds to the OpenSSL inside Node: a Node 22 or later built with OpenSSL 3)');
  lib = {
    sealKeyNew: l.func('void *atoll_dp_seal_key_new(const uint8_t *key, uint32_t id)') as Lib['sealKeyNew'],
    sealKeyCounter: l.func('double atoll_dp_seal_key_counter(void *k)') as Lib['sealKeyCounter'],
    sealKeyFree: l.func('void atoll_dp_seal_key_free(void *k)') as Lib['sealKeyFree'],
    sealKeyRelease: l.func('void atoll_dp_seal_key_release(void *k)') as Lib['sealKeyRelease'],
    sealKeyRestore: l.func('void *atoll_dp_seal_key_restore(int slot)') as Lib['sealKeyRestore'],
    sealKeySlot: l.func('int atoll_dp_seal_key_slot(void *k)') as Lib['sealKeySlot'],
    sealKeyId: l.func('uint32_t atoll_dp_seal_key_id(void *k)') as Lib['sealKeyId'],
    sealOne: l.func('int atoll_dp_seal_one(void *k, int type, const uint8_t *plain, int n, uint8_t *out)') as Lib['sealOne'],
    tableNew: l.func('void *atoll_dp_table_new()') as Lib['tableNew'],
    tableAdd: l.func('int atoll_dp_table_add(void *t, uint32_t id, int32_t peer, const uint8_t *key)') as Lib['tableAdd'],
    tableExpire: l.func('void atoll_dp_table_expire(void *t, uint32_t id, double at)') as Lib['tableExpire'],
    tableRemove: l.func('int atoll_dp_table_remove(void *t, uint32_t id)') as Lib['tableRemove'],
    tableSize: l.func('int atoll_dp_table_size(void *t)') as Lib['tableSize'],
    tableFree: l.func('void atoll_dp_table_free(void *t, int keep)') as Lib['tableFree'],
    tableRestore: l.func('int atoll_dp_table_restore(void *t, int slot, int32_t peer)') as Lib['tableRestore'],
    tableSlot: l.func('int atoll_dp_table_slot(void *t, uint32_t id)') as Lib['tableSlot'],
    tablePins: l.func('int atoll_dp_table_pins(void *t, const uint8_t *pins, const int32_t *tags, int n)') as Lib['tablePins'],
    keepCreate: l.func('int atoll_dp_keep_create(int slots, int meta)') as Lib['keepCreate'],
    keepAttach: l.func('int atoll_dp_keep_attach(int fd)') as Lib['keepAttach'],
    keepDetach: l.func('void atoll_dp_keep_detach()') as Lib['keepDetach'],
    keepMetaWrite: l.func('int atoll_dp_keep_meta_write(const uint8_t *buf, uint32_t len)') as Lib['keepMetaWrite'],
    keepMetaRead: l.func('int atoll_dp_keep_meta_read(uint8_t *out, uint32_t cap)') as Lib['keepMetaRead'],
    keepSweep: l.func('int atoll_dp_keep_sweep(const int32_t *keep, int n)') as Lib['keepSweep'],
    keepUsed: l.func('int atoll_dp_keep_used()') as Lib['keepUsed'],
    keeperConnect: l.func('int atoll_dp_keeper_connect(const char *path, int32_t *fds, int max, int32_t *info)') as Lib['keeperConnect'],
    keeperQuit: l.func('void atoll_dp_keeper_quit(int c)') as Lib['keeperQuit'],
    keeperHold: l.func('int atoll_dp_keeper_hold(int c, const int32_t *fds, int n)') as Lib['keeperHold'],
    keeperAlive: l.func('int atoll_dp_keeper_alive(int c)') as Lib['keeperAlive'],
    windowTest: l.func('int atoll_dp_window_test(void *t, uint32_t id, double counter, int accept)') as Lib['windowTest'],
    open: l.func('int atoll_dp_open(void *t, void *vec, int n, double now, int merge, int32_t *results, int max, uint32_t *counts, int32_t *at)') as Lib['open'],
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

/** The file our AES-GCM calls bind to (the OpenSSL inside Node: Node's executable), and its version. */
export function nativeCryptoOrigin(): { path: string; version: string } {
  const l = load();
  const out = new Uint8Array(4096);
  const n = l.cryptoOrigin(out, out.length);
  return { path: n < 0 ? '' : Buffer.from(out.subarray(0, n)).toString(), version: l.cryptoVersion() };
}

/** A failure inside the library's native objects: memory, or the OpenSSL inside Node. */
function nativeFailed(what: string) {
  return atollError('KERNEL_OP_FAILED', `the datagram path: ${what}`,
    'check the agent\'s memory limit and that it runs the project\'s Node (whose OpenSSL 3 the library binds to), or turn tunnel.udp off');
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

  /**
   * @param key 32 bytes (not kept: the caller may zero it). @param id the key id the datagrams carry. With a
   * {@link KeptRegion} attached, the key and its counter live in one of its slots.
   */
  constructor(key: Uint8Array, id: number);
  /** @internal the handle of a key taken back from the kept region ({@link SealKey.restore}). */
  constructor(key: null, id: number, handle: Ptr);
  constructor(key: Uint8Array | null, id: number, handle?: Ptr) {
    this.#l = load();
    this.id = id >>> 0;
    if (key === null) {
      this.#k = handle;
      return;
    }
    if (key.length !== 32) throw new RangeError(`an AES-256-GCM key has 32 bytes, not ${key.length}`);
    this.#k = this.#l.sealKeyNew(key, this.id);
    if (!this.#k) throw nativeFailed(`sending key ${this.id}: EVP init of AES-256-GCM failed (or out of memory)`);
  }

  /** The sending key kept in `slot` of the attached region, with its counter; undefined when the slot holds none. */
  static restore(slot: number): SealKey | undefined {
    const l = load();
    const k = l.sealKeyRestore(slot);
    return k ? new SealKey(null, l.sealKeyId(k), k) : undefined;
  }

  /** Its slot in the kept region, or -1 (on the heap). */
  get slot(): number {
    return this.#k === null ? -1 : this.#l.sealKeySlot(this.#k);
  }

  /** The native handle, for {@link DatagramSender.send}. */
  get handle(): Ptr {
    // cannot happen: the datagram path drops a key from its peer before it frees it (src/adapters/tunnel/datagram-path.ts)
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
    if (n < 0) throw nativeFailed(`sealing one datagram under key ${this.id} failed in OpenSSL`);
    return out;
  }

  /** Frees the key (cleansed, its slot too); idempotent. */
  free(): void {
    if (this.#k === null) return;
    this.#l.sealKeyFree(this.#k);
    this.#k = null;
  }

  /** Frees the key but leaves its slot as it is, for the agent's next process; idempotent. */
  release(): void {
    if (this.#k === null) return;
    this.#l.sealKeyRelease(this.#k);
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
  /** The datagrams merged into it (TCP segments into a superpacket; 1 when not merged), and their plaintexts' bytes. */
  readonly datagrams: number;
  readonly bytes: number;
}

/**
 * The receiving keys by id, each with its replay window (RFC 6479's idea: the highest counter and a bitmap of the 2048
 * below it; a counter is tested before opening and recorded only once the tag verified, so forged datagrams cannot
 * move the window). Opens whole recvmmsg rings.
 */
export class OpenKeyTable {
  /** Per datagram handed on: kind, peer tag, message, offset, length (valid until the next {@link open}). */
  readonly results = new Int32Array(MAX_RESULTS * RESULT_INTS);
  /** The drops by reason, then the datagrams seen, then the copies set aside (native/atoll-dp.c, atoll_dp_open). */
  readonly #counts = new Uint32Array(DROP_REASONS.length + 2);
  /** Where {@link open} goes on in its ring: a message, and a byte in it (a run of datagrams the kernel merged). */
  readonly #at = new Int32Array(2);
  #t: Ptr;
  readonly #l: Lib;

  constructor() {
    this.#l = load();
    this.#t = this.#l.tableNew();
    if (!this.#t) throw nativeFailed('malloc for the datagram key table failed');
  }

  get #table(): Ptr {
    // cannot happen: the datagram path frees its table only in close(), after dropping its peers and its socket's reads
    if (this.#t === null) throw new Error('the datagram key table was freed');
    return this.#t;
  }

  /** Adds key `id` (32 bytes, not kept) of peer tag `peer`. @returns false when the id is taken. */
  add(id: number, peer: number, key: Uint8Array): boolean {
    if (key.length !== 32) throw new RangeError(`an AES-256-GCM key has 32 bytes, not ${key.length}`);
    const rc = this.#l.tableAdd(this.#table, id >>> 0, peer, key);
    if (rc === -2) throw nativeFailed(`receiving key ${id >>> 0}: EVP init of AES-256-GCM failed (or out of memory)`);
    return rc === 0;
  }

  /**
   * Adds the receiving key kept in `slot` of the attached region, with its replay window, for peer tag `peer`.
   * @returns false when the slot holds none or its id is taken.
   */
  restore(slot: number, peer: number): boolean {
    const rc = this.#l.tableRestore(this.#table, slot, peer);
    if (rc === -2) throw nativeFailed(`the receiving key kept in slot ${slot}: EVP init of AES-256-GCM failed (or out of memory)`);
    return rc === 0;
  }

  /** The slot of key `id` in the kept region: -1 on the heap or when there is no such key. */
  slot(id: number): number {
    return this.#t === null ? -1 : Math.max(-1, this.#l.tableSlot(this.#t, id >>> 0));
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

  /**
   * Turns hellos on: from now a hello is handed on only when its sender's key has the pin (`sha256:` and 64 hex
   * digits, as src/adapters/tunnel/datagram-hello.ts makes them) of one of `peers`, with that peer's tag; the others are
   * dropped in C as `helloUnknownPeer`, and every hello before the first call as `badType`. Replaces the set.
   */
  setHelloPins(peers: readonly { readonly pin: string; readonly tag: number }[]): void {
    const usable = peers.filter((p) => /^sha256:[0-9a-f]{64}$/.test(p.pin));
    const pins = new Uint8Array(usable.length * PIN_BYTES);
    const tags = new Int32Array(usable.length);
    usable.forEach((p, i) => {
      pins.set(Buffer.from(p.pin.slice('sha256:'.length), 'hex'), i * PIN_BYTES);
      tags[i] = p.tag;
    });
    if (this.#l.tablePins(this.#table, pins, tags, usable.length) !== 0) throw nativeFailed('malloc or SHA-256 for the hello pins failed');
  }

  /** The replay window of key `id` (tests): whether `counter` is new, and with `accept` recorded. -1: no such key. */
  window(id: number, counter: number, accept: boolean): number {
    return this.#l.windowTest(this.#table, id >>> 0, counter, accept ? 1 : 0);
  }

  /**
   * Opens the `n` messages of the recvmmsg vector at `ring` (src/adapters/tunnel/udp-batch.ts) in place, at time `now`;
   * with `merge`, consecutive TCP segments of one flow from one peer and address come back merged into a superpacket
   * for the TUN device (native/atoll-dp.c). Adds the drops by reason to `dropped`. It stops right after a hello, whose
   * handling may add the key of the datagrams behind it: call again with `more` until `done` to open the rest, in the
   * order they came. @returns the packets handed on, in {@link results}, the datagrams seen, the copies set aside
   * (authentic copies whose original had come), and whether the ring is done.
   */
  open(ring: Ptr, n: number, now: number, dropped: Record<DatagramDrop | HelloDrop, number>, merge = true, more = false): { handed: number; seen: number; spared: number; done: boolean } {
    const counts = this.#counts;
    counts.fill(0);
    if (!more) this.#at.fill(0);
    const handed = this.#l.open(this.#table, ring, n, now, merge ? 1 : 0, this.results, MAX_RESULTS, counts, this.#at);
    for (let i = 0; i < DROP_REASONS.length; i++) if (counts[i]! > 0) dropped[DROP_REASONS[i]!] += counts[i]!;
    return { handed, seen: counts[DROP_REASONS.length]!, spared: counts[DROP_REASONS.length + 1]!, done: this.#at[0]! >= n };
  }

  /** Result `i` of the last {@link open}, as an object (tests; the hot path reads {@link results}). */
  result(i: number): OpenedDatagram {
    const r = this.results;
    const o = i * RESULT_INTS;
    return { kind: r[o] as DatagramType | 3, peer: r[o + 1]!, message: r[o + 2]!, offset: r[o + 3]!, length: r[o + 4]!, datagrams: r[o + 5]!, bytes: r[o + 6]! };
  }

  /** Frees every key (cleansed; with `keep`, their slots in the kept region stay as they are) and the table; idempotent. */
  free(keep = false): void {
    if (this.#t === null) return;
    this.#l.tableFree(this.#t, keep ? 1 : 0);
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
  readonly #taken = new Float64Array(3);

  constructor(fd: number) {
    this.#l = load();
    this.#s = this.#l.senderNew(fd);
    if (!this.#s) throw nativeFailed('malloc for the datagram sender failed');
  }

  get #sender(): Ptr {
    // cannot happen: the datagram path forgets its sender as it frees it (close, closeKeeping)
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

  /**
   * Sends what is queued. @returns the datagrams the kernel refused since the last call, the last errno (0: none), and
   * the second copies queued since the last call (retransmissions and SACK acknowledgements, see atoll_dp_send).
   */
  flush(): { failed: number; errno: number; copies: number } {
    if (this.#s === null) return { failed: 0, errno: 0, copies: 0 };
    this.#l.flush(this.#s);
    this.#l.senderTake(this.#s, this.#taken);
    return { failed: this.#taken[0]!, errno: this.#taken[1]!, copies: this.#taken[2]! };
  }

  /** Frees the sender (what is queued is dropped); idempotent. */
  free(): void {
    if (this.#s === null) return;
    this.#l.senderFree(this.#s);
    this.#s = null;
  }
}

/**
 * The kept region (native/atoll-dp.c): a memfd whose slots hold the keys made while it is attached, with their
 * counters and replay windows, and a description of them (the caller's, written whole or not at all). The node's
 * keeper (src/adapters/tunnel/keeper.ts) holds the memfd, so the keys outlive the agent's process. One per process.
 */
export const KeptRegion = {
  /** A new region of `slots` keys and `metaBytes` of description, attached. @returns its memfd. */
  create(slots: number, metaBytes: number): number {
    const fd = load().keepCreate(slots, metaBytes);
    if (fd < 0) throw atollError('KERNEL_OP_FAILED', `memfd for the kept datagram keys failed: errno ${-fd}`, 'check the agent\'s limits (ulimit -n, memory)');
    return fd;
  },
  /** Attaches the region in memfd `fd`. @returns false when `fd` holds no region. */
  attach(fd: number): boolean {
    return load().keepAttach(fd) === 0;
  },
  /** Unmaps it; keys made after are on the heap. Keys holding its slots must not be used after. */
  detach(): void {
    load().keepDetach();
  },
  /** Replaces the description. @throws RangeError when it is larger than the region's room for it. */
  write(meta: Uint8Array): void {
    const rc = load().keepMetaWrite(meta, meta.length);
    if (rc === -28) throw new RangeError(`the kept keys' description (${meta.length} bytes) outgrew the region`);
  },
  /** The description, or undefined without a region. */
  read(capacity: number): Uint8Array | undefined {
    const out = new Uint8Array(capacity);
    const n = load().keepMetaRead(out, capacity);
    return n < 0 ? undefined : out.subarray(0, n);
  },
  /** Frees every used slot not in `keep`. @returns how many. */
  sweep(keep: readonly number[]): number {
    return load().keepSweep(Int32Array.from(keep), keep.length);
  },
  /** Slots in use. */
  used(): number {
    return load().keepUsed();
  },
};

/**
 * Connects to the keeper listening at `path` (native/atoll-keeper.c) and takes what it holds. The connection, kept
 * open, tells the keeper an agent lives. @returns undefined when no keeper answers there.
 */
export function keeperConnect(path: string): { connection: number; pid: number; fds: number[] } | undefined {
  const fds = new Int32Array(8);
  const info = new Int32Array(2);
  const c = load().keeperConnect(path, fds, fds.length, info);
  return c < 0 ? undefined : { connection: c, pid: info[0]!, fds: [...fds.subarray(0, info[1]!)] };
}

/** Asks the keeper on `connection` to let go of what it holds (one the agent started exits then), and closes the connection. */
export function keeperQuit(connection: number): void {
  load().keeperQuit(connection);
}

/** Whether the keeper on `connection` is still there (false once it exited or was taken over). */
export function keeperAlive(connection: number): boolean {
  return load().keeperAlive(connection) === 1;
}

/** Hands `fds` to the keeper on `connection`, which holds them instead of what it held. @returns 0 or the errno. */
export function keeperHold(connection: number, fds: readonly number[]): number {
  return -load().keeperHold(connection, Int32Array.from(fds), fds.length);
}
