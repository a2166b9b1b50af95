/**
 * The datagram path's UDP socket, created and read by us through koffi: `recvmmsg` with UDP_GRO, many datagrams per
 * call into memory of our own, instead of Node's dgram (a JavaScript callback, a fresh Buffer and a `recvmsg` per
 * datagram).
 *
 * Why (measured 2026-11-24 on this 2-vCPU VM, loopback, 1400-byte datagrams from a C sender using UDP GSO, 46 per
 * call; a loaded machine, so the rates are rough, the ratios the point): dgram 0.6 to 1.9 Gbit/s received; dgram's
 * 'message' as the readiness signal, then non-blocking `recvmmsg` until EAGAIN on the main thread, 3.9; a blocking
 * `recvmmsg` (64 per call) on a pool thread, 5.9; the same with UDP_GRO, 22 to 27. UDP_GRO makes the kernel hand over a
 * run of equal-sized datagrams from one sender (a UDP GSO send, or the device's GRO) as one buffer with its segment
 * size, and spares the sending host's kernel the software segmentation it does for a socket without it. The
 * dgram-as-readiness variant cannot use UDP_GRO: libuv reads the first buffer of each wake-up and drops the segment
 * size.
 *
 * Readiness without libuv: while idle, a pool thread waits in `poll` for the socket to be readable, and the main thread
 * then takes what is queued. The waiting call takes nothing off the socket, so datagrams leave the kernel only on the
 * main thread, which opens them at once: an agent killed at any moment (a crash, a SIGKILL) loses only what it was
 * opening right then, and its next process (src/adapters/tunnel/keeper.ts) finds the rest in the socket. (A blocking
 * `recvmmsg` waiting on the pool thread, as before, took a ring of datagrams that then waited for the main thread:
 * a root test that killed the agent under 100 pings a second lost one in about one restart of ten.) Once traffic
 * flows, the pool thread only sleeps {@link POLL_US} (`usleep`) and the
 * main thread takes everything that gathered meanwhile with non-blocking `recvmmsg` calls, 64 buffers each, until the
 * socket is empty; a sleep after which nothing came sends it back to waiting. So a busy socket costs one thread
 * hand-off per {@link POLL_US}, not per call: on the lab (datagrams arriving one by one through the routers, no GRO on
 * the way, 1 Gbit/s) waking per `recvmmsg` returned a few datagrams a time, and the hand-offs made the receiving agent
 * spend about 12 us per datagram, ten times the stream's CPU per Gbit/s. The price is up to {@link POLL_US} of added
 * delay while busy.
 *
 * The socket is blocking for the waiting call; the main thread's receives and sends pass MSG_DONTWAIT
 * (native/atoll-dp.c), so a full send buffer fails a send (EAGAIN) rather than blocking the event loop. The
 * waiting call holds a pool thread while idle: the agent's pool has 32 (src/adapters/kernel/netlink.ts).
 * {@link UdpBatchSocket.close} shuts the socket down, which wakes a waiting call, and closes the fd once the pool
 * thread's call returned; {@link UdpBatchSocket.closeKeeping} leaves the socket whole for the agent's next process.
 * The ring holds 64 slots of 64 KiB (a GRO buffer's limit) of address space; only the pages datagrams were written to
 * become resident.
 */
import koffi from 'koffi';
import { atollError } from '../../core/errors.ts';
import { errnoText } from '../kernel/errno.ts';
import { type UdpCalls, udpCalls } from '../kernel/libc.ts';

const AF_INET = 2;
const SOCK_DGRAM = 2;
const SOCK_CLOEXEC = 0o2000000;
const SOL_SOCKET = 1;
const SO_SNDBUF = 7;
const SO_RCVBUF = 8;
const SO_SNDBUFFORCE = 32;
const SO_RCVBUFFORCE = 33;
const IPPROTO_IP = 0;
const IP_MTU_DISCOVER = 10;
const IP_PMTUDISC_DO = 2;
const SOL_UDP = 17;
const UDP_GRO = 104;
const MSG_DONTWAIT = 0x40;
const POLLIN = 1;
const SHUT_RDWR = 2;

/** Messages (buffers, each one datagram or a GRO run of them) one `recvmmsg` call takes. */
export const RING_MESSAGES = 64;
/** Bytes per message slot: the most one GRO buffer (or one datagram) holds. */
const SLOT = 65_536;
const MMSGHDR = 64;
const IOVEC = 16;
const SOCKADDR = 16;
const CMSG_SPACE = 32;
const IOVECS = RING_MESSAGES * MMSGHDR;
const NAMES = IOVECS + RING_MESSAGES * IOVEC;
const CMSGS = NAMES + RING_MESSAGES * SOCKADDR;
const DATA = CMSGS + RING_MESSAGES * CMSG_SPACE;
const RING_BYTES = DATA + RING_MESSAGES * SLOT;
/** While busy, the pool thread sleeps this long between the main thread's drains: the added delay, at most. */
export const POLL_US = 250;
/** At most this many `recvmmsg` calls per drain; more waiting is taken after the event loop's other I/O. */
const MAX_CALLS_PER_DRAIN = 16;
/** After a failed receive, wait this long before the next (a failure that repeats must not spin a pool thread). */
const RETRY_MS = 100;

/** Where a datagram came from. The same object is handed out again for the same address: do not keep or change it. */
export interface UdpSource {
  readonly address: string;
  readonly port: number;
}

export interface UdpBatchSocketInit {
  /** IPv4 address to bind ('0.0.0.0' for all) and port (0: any free one). */
  readonly host: string;
  readonly port: number;
  /** Receive and send buffer size asked of the kernel (beyond net.core.rmem_max/wmem_max when running as root). */
  readonly bufferBytes: number;
}

export interface UdpBatchStats {
  /** `recvmmsg` calls that returned messages, and the messages (buffers: a datagram or a UDP_GRO run) they brought. */
  batches: number;
  buffers: number;
  /** Times the socket went idle (a pool thread waiting for the next datagram). */
  waits: number;
  /** Failed waiting receives (retried after {@link RETRY_MS}). */
  receiveErrors: number;
}

/** The `recvmmsg` vector in malloc'd memory (the kernel writes into it from a pool thread: it must not move). */
class Ring {
  readonly mem: unknown;
  readonly #bytes: Uint8Array;
  readonly #view: DataView;

  constructor(c: UdpCalls) {
    this.mem = c.malloc(RING_BYTES);
    if (!this.mem) throw atollError('KERNEL_OP_FAILED', `malloc of ${RING_BYTES} bytes for the UDP receive ring failed`, 'give the agent more memory');
    this.#bytes = new Uint8Array(koffi.view(this.mem, RING_BYTES));
    this.#bytes.fill(0, 0, DATA); // the headers; the slots stay untouched (not resident) until datagrams land there
    this.#view = new DataView(this.#bytes.buffer);
    const base = BigInt(koffi.address(this.mem));
    const v = this.#view;
    for (let i = 0; i < RING_MESSAGES; i++) {
      const h = i * MMSGHDR;
      v.setBigUint64(h, base + BigInt(NAMES + i * SOCKADDR), true); // msg_name
      v.setBigUint64(h + 16, base + BigInt(IOVECS + i * IOVEC), true); // msg_iov
      v.setBigUint64(h + 24, 1n, true); // msg_iovlen
      v.setBigUint64(h + 32, base + BigInt(CMSGS + i * CMSG_SPACE), true); // msg_control
      v.setBigUint64(IOVECS + i * IOVEC, base + BigInt(DATA + i * SLOT), true); // iov_base
      v.setBigUint64(IOVECS + i * IOVEC + 8, BigInt(SLOT), true); // iov_len
    }
  }

  /** Restores the lengths the kernel overwrote (name and control) before the next call. */
  reset(): void {
    const v = this.#view;
    for (let i = 0; i < RING_MESSAGES; i++) {
      v.setUint32(i * MMSGHDR + 8, SOCKADDR, true); // msg_namelen
      v.setUint32(i * MMSGHDR + 40, CMSG_SPACE, true); // msg_controllen (the high half stays 0)
    }
  }

  /** The whole block: the vector, then the slots. */
  get bytes(): Uint8Array {
    return this.#bytes;
  }

  /** Message `i`'s bytes, as received (one datagram, or a UDP_GRO run of them; a view, valid until the ring's next call). */
  payload(i: number): Uint8Array {
    const len = this.#view.getUint32(i * MMSGHDR + 56, true);
    return this.#bytes.subarray(DATA + i * SLOT, DATA + i * SLOT + len);
  }

  /** Message `i`'s source: IPv4 address (host order) and port, as one number. */
  sourceKey(i: number): number {
    const v = this.#view;
    const a = NAMES + i * SOCKADDR;
    return v.getUint32(a + 4, false) * 65_536 + v.getUint16(a + 2, false);
  }
}

/** Sources by {@link Ring.sourceKey}, a few slots: most datagrams come from a few peers; a flood of others only misses. */
class SourceCache {
  static readonly SLOTS = 64;
  readonly #keys = new Float64Array(SourceCache.SLOTS).fill(-1);
  readonly #values: (UdpSource | undefined)[] = new Array<UdpSource | undefined>(SourceCache.SLOTS);

  get(key: number): UdpSource {
    const slot = key % SourceCache.SLOTS;
    if (this.#keys[slot] === key) return this.#values[slot] as UdpSource;
    const addr = Math.floor(key / 65_536);
    const value = { address: `${addr >>> 24}.${(addr >>> 16) & 255}.${(addr >>> 8) & 255}.${addr & 255}`, port: key % 65_536 };
    this.#keys[slot] = key;
    this.#values[slot] = value;
    return value;
  }
}

/**
 * A bound IPv4 UDP socket with IP_PMTUDISC_DO (never fragmented on the way) and UDP_GRO, received in batches. Send
 * on {@link fd} with MSG_DONTWAIT (src/adapters/tunnel/datagram-native.ts).
 */
export class UdpBatchSocket {
  readonly fd: number;
  /** The bound port. */
  readonly port: number;
  readonly stats: UdpBatchStats = { batches: 0, buffers: 0, waits: 0, receiveErrors: 0 };
  readonly #c: UdpCalls;
  readonly #ring: Ring;
  readonly #sources = new SourceCache();
  #onMessages: ((n: number) => void) | undefined;
  /** Whether a pool thread holds a call (a wait or a sleep): the fd and the ring are freed only once it returned. */
  #pooled = false;
  /** Whether that call is the wait in `poll` (not the sleep). */
  #receiving = false;
  #closed = false;
  #released = false;
  /** While {@link closeKeeping} waits for the pool thread: called once the descriptor is closed. */
  #kept: (() => void) | undefined;
  /** The bound sockaddr_in. */
  #bound: Uint8Array = new Uint8Array(SOCKADDR);
  /** The `struct pollfd` the waiting `poll` reads, in malloc'd memory (a pool thread reads it: it must not move). */
  readonly #pollfd: unknown;

  /**
   * Creates the socket and binds it; with `adopted`, takes over that descriptor, a socket bound before that another
   * process handed on (the tunnel's keeper, src/adapters/tunnel/keeper.ts), and sets its options again.
   * @throws AtollError TUNNEL_UNREACHABLE when the address cannot be bound (in use, not local), KERNEL_OP_FAILED when
   *   a socket option the datagram path needs is refused or `adopted` is not a bound IPv4 UDP socket.
   */
  constructor(init: UdpBatchSocketInit, adopted?: number) {
    const c = udpCalls();
    this.#c = c;
    const fd = adopted ?? c.socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw atollError('KERNEL_OP_FAILED', `socket(AF_INET, SOCK_DGRAM) for the tunnel's UDP port failed: ${errnoText(koffi.errno())}`, 'check the agent\'s limits (ulimit -n)');
    const fail = (err: Error): never => {
      c.close(fd);
      throw err;
    };
    const set = (level: number, name: number, value: number) => c.setsockopt(fd, level, name, new Int32Array([value]), 4) === 0;
    // FORCE goes past rmem_max/wmem_max (root, as the agent runs); the plain option, capped, otherwise
    if (!set(SOL_SOCKET, SO_RCVBUFFORCE, init.bufferBytes)) set(SOL_SOCKET, SO_RCVBUF, init.bufferBytes);
    if (!set(SOL_SOCKET, SO_SNDBUFFORCE, init.bufferBytes)) set(SOL_SOCKET, SO_SNDBUF, init.bufferBytes);
    for (const [level, name, value, what] of [[IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO, 'IP_MTU_DISCOVER'], [SOL_UDP, UDP_GRO, 1, 'UDP_GRO']] as const) {
      if (!set(level, name, value)) {
        fail(atollError('KERNEL_OP_FAILED', `setsockopt ${what} on the tunnel's UDP socket failed: ${errnoText(koffi.errno())}`, 'run on Linux 5.0 or later (UDP_GRO), or turn tunnel.udp off'));
      }
    }
    if (adopted === undefined) {
      const addr = sockaddrIn(init.host, init.port);
      if (!addr) fail(atollError('TUNNEL_UNREACHABLE', `the tunnel's UDP address ${init.host} is not an IPv4 address`, 'set tunnel.udp to an IPv4 listen address'));
      if (c.bind(fd, addr as Uint8Array, SOCKADDR) !== 0) {
        fail(atollError('TUNNEL_UNREACHABLE', `the tunnel's UDP port ${init.host}:${init.port} cannot be bound: ${errnoText(koffi.errno())}`, 'free the port or set tunnel.udp.port'));
      }
    }
    const bound = new Uint8Array(SOCKADDR);
    if (c.getsockname(fd, bound, new Int32Array([SOCKADDR])) !== 0) fail(atollError('KERNEL_OP_FAILED', `getsockname on the tunnel's UDP socket failed: ${errnoText(koffi.errno())}`));
    this.fd = fd;
    this.port = (bound[2]! << 8) | bound[3]!;
    this.#bound = bound;
    if (bound[0] !== AF_INET || this.port === 0) fail(atollError('KERNEL_OP_FAILED', `descriptor ${fd} handed on for the tunnel's UDP port is not a bound IPv4 socket`));
    this.#pollfd = c.malloc(8);
    if (!this.#pollfd) fail(atollError('KERNEL_OP_FAILED', 'malloc of a pollfd for the UDP socket failed', 'give the agent more memory'));
    const pfd = new DataView(koffi.view(this.#pollfd, 8));
    pfd.setInt32(0, fd, true);
    pfd.setInt16(4, POLLIN, true);
    this.#ring = new Ring(c);
  }

  /**
   * Starts receiving: `onMessages` gets the number of messages the ring holds after each `recvmmsg` (read them during
   * the call with {@link payload}, {@link sourceOf}, or whole through {@link ring}; each is one datagram or a UDP_GRO
   * run of equal-sized ones, with its segment size in its control message).
   */
  start(onMessages: (n: number) => void): void {
    // cannot happen: the datagram path starts its socket once (src/adapters/tunnel/datagram-path.ts run, guarded by its timer)
    if (this.#onMessages) throw new Error('the UDP socket is already receiving');
    this.#onMessages = onMessages;
    this.#wait();
  }

  /** The `recvmmsg` vector (a native pointer, for src/adapters/tunnel/datagram-native.ts), valid during `onMessages`. */
  get ring(): unknown {
    return this.#ring.mem;
  }

  /** The ring's bytes: offsets into the ring index this view. */
  get ringBytes(): Uint8Array {
    return this.#ring.bytes;
  }

  /** Whether the ring was freed (a callback that closed the socket must stop reading it). */
  get closed(): boolean {
    return this.#released;
  }

  /** Message `i`'s bytes (a view, valid during `onMessages`). */
  payload(i: number): Uint8Array {
    return this.#ring.payload(i);
  }

  /** Message `i`'s source, as a number: its IPv4 address (host order) times 65536 plus its port. */
  sourceKey(i: number): number {
    return this.#ring.sourceKey(i);
  }

  /** Message `i`'s source. */
  sourceOf(i: number): UdpSource {
    return this.#sources.get(this.#ring.sourceKey(i));
  }

  /** Idle: a pool thread waits in `poll` until a datagram is queued; the main thread takes it. */
  #wait(): void {
    if (this.#closed) return;
    this.stats.waits++;
    this.#pooled = true;
    this.#receiving = true;
    this.#c.poll.async(this.#pollfd, 1, -1, (err, n) => {
      this.#pooled = false;
      this.#receiving = false;
      if (this.#closed) return this.#release();
      if (err !== null || n < 0) {
        this.stats.receiveErrors++;
        setTimeout(() => this.#wait(), RETRY_MS).unref();
        return;
      }
      this.#drain(true);
    });
  }

  /** Busy: datagrams gather for {@link POLL_US} while a pool thread sleeps, then the main thread takes them. */
  #nap(): void {
    if (this.#closed) return;
    this.#pooled = true;
    this.#c.usleep.async(POLL_US, () => {
      this.#pooled = false;
      if (this.#closed) return this.#release();
      this.#drain();
    });
  }

  /** Takes what is queued, 64 buffers a call. `woken`: `poll` said the socket is readable. */
  #drain(woken = false): void {
    if (this.#closed) return;
    for (let i = 0; i < MAX_CALLS_PER_DRAIN; i++) {
      this.#ring.reset();
      const n = this.#c.recvmmsg(this.fd, this.#ring.mem, RING_MESSAGES, MSG_DONTWAIT, null);
      if (n <= 0 && i === 0 && woken) {
        // readable, yet nothing to take (an error queued): not at once again, or poll and this would spin
        this.stats.receiveErrors++;
        setTimeout(() => this.#wait(), RETRY_MS).unref();
        return;
      }
      if (n <= 0) return i === 0 ? this.#wait() : this.#nap(); // nothing came during a whole sleep: idle again
      this.#deliver(n);
      if (n < RING_MESSAGES || this.#closed) return this.#nap();
    }
    setImmediate(() => this.#drain());
  }

  #deliver(n: number): void {
    this.stats.batches++;
    this.stats.buffers += n;
    (this.#onMessages as (n: number) => void)(n);
  }

  #release(): void {
    this.#released = true;
    this.#c.close(this.fd);
    this.#c.free(this.#ring.mem);
    this.#c.free(this.#pollfd);
    this.#kept?.();
    this.#kept = undefined;
  }

  /** Stops receiving and closes the socket (once a pool thread's call, woken by the shutdown, returned). Idempotent. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#c.shutdown(this.fd, SHUT_RDWR);
    if (!this.#pooled) this.#release();
  }

  /**
   * Stops receiving and closes the descriptor, leaving the socket whole for another process that holds it (the
   * agent's next one: src/adapters/tunnel/keeper.ts), which gets every datagram this one did not take. A shutdown would end
   * the socket for every process; instead a pool thread waiting in `poll` is woken by a 1-byte datagram to the
   * socket's own address (left for the next process, which drops it as truncated). Resolves once the descriptor is
   * closed (at most `timeoutMs`: the wake-up datagram lost, the next datagram ends the wait later).
   */
  closeKeeping(timeoutMs = 2000): Promise<void> {
    if (this.#closed) return Promise.resolve();
    this.#closed = true;
    if (!this.#pooled) {
      this.#release();
      return Promise.resolve();
    }
    return new Promise((resolve) => {
      const timer = setTimeout(resolve, timeoutMs);
      this.#kept = () => {
        clearTimeout(timer);
        resolve();
      };
      if (this.#receiving) this.#wakeUp();
    });
  }

  /** A 1-byte datagram to the socket's own address (0.0.0.0: loopback). */
  #wakeUp(): void {
    const to = this.#bound.slice();
    if (to[4] === 0 && to[5] === 0 && to[6] === 0 && to[7] === 0) to.set([127, 0, 0, 1], 4);
    this.#c.sendto(this.fd, new Uint8Array(1), 1, MSG_DONTWAIT, to, SOCKADDR);
  }
}

/** A sockaddr_in for `host`:`port`, or undefined when `host` is not a dotted IPv4 address. */
function sockaddrIn(host: string, port: number): Uint8Array | undefined {
  const octets = host.split('.').map(Number);
  if (octets.length !== 4 || octets.some((o) => !Number.isInteger(o) || o < 0 || o > 255)) return undefined;
  const a = new Uint8Array(SOCKADDR);
  a[0] = AF_INET;
  a[2] = port >> 8;
  a[3] = port & 255;
  a.set(octets, 4);
  return a;
}
