/**
 * A TUN device with the virtio-net header and GSO offloads, read and written from the main thread through koffi.
 *
 * Why this shape (measured before Atoll at 3.5 Gbit/s without offloads and 17.9 with them):
 * - `IFF_TUN|IFF_NO_PI|IFF_VNET_HDR`, `TUNSETVNETHDRSZ` 10 and `TUNSETOFFLOAD` CSUM|TSO4|TSO6: the kernel hands us
 *   TCP superpackets of up to 64 KB with a 10-byte virtio-net header in front and accepts the same back, so one
 *   read/write moves tens of segments. The read buffer holds the largest superpacket the device's gso_max_size
 *   allows. Measured here: the device must keep gso_max_size 65536 (the default of veths too). Set to 65000, it works
 *   for traffic the node itself sends, but a superpacket *forwarded* from a pod's veth (built against the veth's 65536)
 *   that exceeds the TUN's gso_max_size is segmented in software before the TUN: 1.5 KB reads and 0.6-0.9 Gbit/s
 *   instead of 64 KB reads and 3-4 Gbit/s. A skb at the TUN is always shorter than its gso_max_size.
 * - Readiness comes from a libuv pipe handle on the fd (`net.Socket({ fd })` refuses a TUN fd, but a Pipe handle
 *   opened on it works): libuv reads one packet per wake-up, into our slab (its `onread` option), so on each wake-up
 *   we drain the rest with non-blocking `read()` until EAGAIN and hand the whole batch over at once.
 * - Nothing is allocated per packet: packets are read into 1 MiB slabs that are reused once every packet of theirs
 *   was released by its consumer (a fresh buffer per read kept V8's full GC busy at a few Gbit/s).
 * - Writes go one packet per `write()`: a TUN write is one packet, so a stream must never `writev` to it.
 * - The device lives in the network namespace the fd was opened in: pass `netns` to open it there (the main thread
 *   switches for the open and the ioctls only; see netns.ts).
 */
import { Socket } from 'node:net';
import koffi from 'koffi';
import { atollError } from '../../core/errors.ts';
import { ipSync } from '../kernel/iproute2.ts';
import { inNetns } from '../kernel/netns.ts';
import { SlabPool } from './slab-pool.ts';
import { errnoText } from '../kernel/errno.ts';
import { type TunCalls, tunCalls } from '../kernel/libc.ts';

const O_RDWR = 2;
const O_NONBLOCK = 0o4000;
const O_CLOEXEC = 0o2000000;
const TUNSETIFF = 0x400454ca;
const TUNSETOFFLOAD = 0x400454d0;
const TUNSETVNETHDRSZ = 0x400454d8;
const TUNGETIFF = 0x800454d2;
const IFF_TUN = 0x0001;
const IFF_NO_PI = 0x1000;
const IFF_VNET_HDR = 0x4000;
const TUN_F_CSUM = 0x01;
const TUN_F_TSO4 = 0x02;
const TUN_F_TSO6 = 0x04;
const IFREQ_SIZE = 40;
const IFNAMSIZ = 16;
const EAGAIN = 11;
const EINTR = 4;

/** The GSO limit set on the device: the kernel default, so forwarded pod superpackets keep their offload (see above). */
export const TUN_GSO_MAX_SIZE = 65_536;
/** The read buffer per packet: the largest superpacket (below gso_max_size) and its virtio header. */
export const TUN_READ_SIZE = TUN_GSO_MAX_SIZE + 10;
/** At most this many packets are drained per wake-up, so one busy device cannot starve the event loop. */
const MAX_BATCH = 256;
function tunError(name: string, what: string, errno: number): Error {
  return Object.assign(atollError('KERNEL_OP_FAILED', `TUN device ${name}: ${what} failed: ${errnoText(errno)}`,
    'run as root with /dev/net/tun present (modprobe tun); check `ip -d link show` for a foreign device of that name'), { errno });
}

/** Counters of one device, for metrics and tests. */
export interface TunStats {
  packetsRead: number;
  bytesRead: number;
  packetsWritten: number;
  bytesWritten: number;
  /** Writes the kernel refused (the packet is dropped; the errno is in lastWriteErrno). */
  writeErrors: number;
  lastWriteErrno: number;
}

export interface OpenTunOptions {
  /** The device name (at most 15 bytes). Opening an existing TUN device of ours attaches to it. */
  readonly name: string;
  /** Path of the network namespace to create the device in (e.g. /run/netns/x); the current one when absent. */
  readonly netns?: string;
  /** MTU to set; left as the kernel's default (1500) when absent. */
  readonly mtu?: number;
}

/**
 * An open TUN device. Packets in both directions carry the 10-byte virtio-net header first.
 * The device is brought up by {@link openTun}; addresses and routes are the caller's business.
 */
export class TunDevice {
  readonly name: string;
  readonly fd: number;
  readonly stats: TunStats = { packetsRead: 0, bytesRead: 0, packetsWritten: 0, bytesWritten: 0, writeErrors: 0, lastWriteErrno: 0 };
  private readonly lib: TunCalls;
  private watcher: Socket | undefined;
  /** Packets are read into its slabs, reused once their packets were released. */
  private readonly pool = new SlabPool();
  private closed = false;

  constructor(name: string, fd: number) {
    this.name = name;
    this.fd = fd;
    this.lib = tunCalls();
  }

  /**
   * Starts reading: `onBatch` gets the packets of one wake-up, each a view of a slab that is not reused until the
   * packet is given back with {@link release} (so it may be queued until then). Every packet must be released once,
   * when it was sent or dropped; one that never is only keeps its slab from being reused. `headroom` bytes are left
   * free in front of every packet (e.g. for a frame's length prefix): packet `p` of the batch has
   * `p.byteOffset - headroom` writable bytes before it, in the same buffer.
   */
  start(onBatch: (packets: Buffer[]) => void, headroom = 0): void {
    // cannot happen: the tunnel endpoint that owns the device starts it once (src/adapters/tunnel/tunnel-endpoint.ts start)
    if (this.watcher) throw new Error(`TUN device ${this.name} is already reading`);
    const { Pipe, constants } = (process as unknown as { binding(m: string): { Pipe: new (t: number) => object; constants: { SOCKET: number } } }).binding('pipe_wrap');
    const handle = new Pipe(constants.SOCKET) as { open(fd: number): number };
    const rc = handle.open(this.fd);
    if (rc !== 0) throw tunError(this.name, 'watching the fd with libuv', -rc);
    // libuv reads the first packet of each wake-up straight into the slab (onread: no buffer allocated per read, which
    // at a few thousand wake-ups a second kept V8's major GC busy); the rest of the wake-up is drained by hand.
    const watcher = new Socket({
      handle, readable: true, writable: false,
      onread: {
        buffer: () => this.pool.region(headroom, TUN_READ_SIZE),
        callback: (n: number, region: Buffer) => {
          const batch: Buffer[] = [this.commit(region, n)];
          this.drain(batch, headroom);
          onBatch(batch);
          return true;
        },
      },
    } as unknown as ConstructorParameters<typeof Socket>[0]);
    this.watcher = watcher;
    watcher.on('error', (err) => {
      process.emitWarning(`TUN device ${this.name}: read error: ${err.message}`);
    });
  }

  /** Stops reading until {@link resume}: the kernel queues (then drops) packets meanwhile. */
  pause(): void {
    this.watcher?.pause();
  }

  resume(): void {
    this.watcher?.resume();
  }

  /** Claims the first `n` bytes of `region` (just read into) as a packet. */
  private commit(region: Buffer, n: number): Buffer {
    this.stats.packetsRead++;
    this.stats.bytesRead += n;
    return this.pool.commit(region, n);
  }

  /** Gives back a packet read from this device: its bytes may be overwritten from now on. */
  release(pkt: Uint8Array): void {
    this.pool.release(pkt);
  }

  /** Packets handed out and not released yet (for tests and metrics). */
  get packetsOut(): number {
    return this.pool.out;
  }

  private drain(batch: Buffer[], headroom: number): void {
    while (batch.length < MAX_BATCH) {
      const region = this.pool.region(headroom, TUN_READ_SIZE);
      const n = this.lib.read(this.fd, region, TUN_READ_SIZE);
      if (n < 0) {
        const errno = koffi.errno();
        if (errno === EINTR) continue;
        if (errno !== EAGAIN) process.emitWarning(`TUN device ${this.name}: read failed: ${errnoText(errno)}`);
        return;
      }
      if (n === 0) return;
      batch.push(this.commit(region, n));
    }
  }

  /**
   * Writes one packet (virtio header first) to the device. Never blocks; a packet the kernel refuses is dropped and
   * counted (a malformed packet gets EINVAL; the tunnel carries IP, which tolerates loss).
   * @returns whether the kernel took it.
   */
  write(pkt: Uint8Array): boolean {
    if (this.closed) return false;
    for (;;) {
      const n = this.lib.write(this.fd, pkt, pkt.length);
      if (n >= 0) {
        this.stats.packetsWritten++;
        this.stats.bytesWritten += n;
        return true;
      }
      const errno = koffi.errno();
      if (errno === EINTR) continue;
      this.stats.writeErrors++;
      this.stats.lastWriteErrno = errno;
      return false;
    }
  }

  /** Stops reading and closes the fd; the kernel then deletes the device (it is not persistent). Idempotent. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    if (this.watcher) {
      this.watcher.destroy(); // closes the fd through libuv
      this.watcher = undefined;
    } else {
      this.lib.close(this.fd);
    }
  }
}

/**
 * Creates (or attaches to) the TUN device `name` with the virtio-net header and TCP/checksum offloads, sets its
 * gso_max_size and brings it up. The device disappears once no process holds a descriptor of it (this one closed or
 * exited, and no keeper holding one: src/adapters/tunnel/keeper.ts).
 * @throws AtollError KERNEL_OP_FAILED naming the device, the step and the errno.
 */
export function openTun(opts: OpenTunOptions): TunDevice {
  const { name } = opts;
  if (Buffer.byteLength(name) >= IFNAMSIZ || name.length === 0) {
    throw atollError('KERNEL_OP_FAILED', `TUN device name ${JSON.stringify(name)} is empty or longer than 15 bytes`, 'pick a shorter name');
  }
  const lib = tunCalls();
  const create = (): number => {
    const fd = lib.open('/dev/net/tun', O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) throw tunError(name, 'opening /dev/net/tun', koffi.errno());
    const fail = (what: string): never => {
      const errno = koffi.errno();
      lib.close(fd);
      throw tunError(name, what, errno);
    };
    const ifr = Buffer.alloc(IFREQ_SIZE);
    ifr.write(name, 0, 'utf8');
    ifr.writeUInt16LE(IFF_TUN | IFF_NO_PI | IFF_VNET_HDR, IFNAMSIZ);
    if (lib.ioctlPtr(fd, TUNSETIFF, ifr) < 0) fail('TUNSETIFF');
    const sz = Buffer.alloc(4);
    sz.writeInt32LE(10);
    if (lib.ioctlPtr(fd, TUNSETVNETHDRSZ, sz) < 0) fail('TUNSETVNETHDRSZ 10');
    if (lib.ioctlVal(fd, TUNSETOFFLOAD, TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6) < 0) fail('TUNSETOFFLOAD CSUM|TSO4|TSO6');
    return fd;
  };
  return bringUp(opts, opts.netns ? inNetns(opts.netns, create) : create());
}

/** Sets the device's gso_max_size and MTU and brings it up; closes `fd` on failure. */
function bringUp(opts: OpenTunOptions, fd: number): TunDevice {
  try {
    const set = ['link', 'set', 'dev', opts.name, 'gso_max_size', String(TUN_GSO_MAX_SIZE)];
    if (opts.mtu !== undefined) set.push('mtu', String(opts.mtu));
    ipSync([...set, 'up'], `TUN device ${opts.name}`, { netns: opts.netns });
  } catch (err) {
    tunCalls().close(fd);
    throw err;
  }
  return new TunDevice(opts.name, fd);
}

/**
 * Takes over `fd`, a descriptor of the TUN device `opts.name` that another process handed on (the tunnel's keeper,
 * src/adapters/tunnel/keeper.ts), as {@link openTun} would have made it. @returns undefined, the descriptor closed, when it
 * is not attached to that device with the virtio-net header (the device was deleted meanwhile, or another one).
 */
export function adoptTun(fd: number, opts: OpenTunOptions): TunDevice | undefined {
  const lib = tunCalls();
  const ifr = Buffer.alloc(IFREQ_SIZE);
  const attached = lib.ioctlPtr(fd, TUNGETIFF, ifr) === 0;
  const name = ifr.subarray(0, IFNAMSIZ).toString('utf8').replace(/\0.*$/s, '');
  const flags = ifr.readUInt16LE(IFNAMSIZ);
  if (!attached || name !== opts.name || (flags & (IFF_TUN | IFF_NO_PI | IFF_VNET_HDR)) !== (IFF_TUN | IFF_NO_PI | IFF_VNET_HDR)) {
    lib.close(fd);
    return undefined;
  }
  return bringUp(opts, fd);
}
