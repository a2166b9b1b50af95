/**
 * Link removals as the kernel announces them (RTM_DELLINK on the RTNLGRP_LINK multicast group), over an AF_NETLINK
 * socket through koffi: {@link LinkWatch} tells when a deleted link is gone (about 1 ms), long before the deletion's
 * ack (16 to 33 ms). Requests, dumps and their acks are netlink.ts's; decoding is pure (src/core/net/netlink-codec.ts).
 */
import koffi from 'koffi';
import { atollError } from '../../core/errors.ts';
import { AF_UNSPEC, decodeLink, decodeMessages, RTM_DELLINK } from '../../core/net/netlink-codec.ts';
import { errnoText } from './errno.ts';
import { NETLINK, netlinkCalls } from './libc.ts';

const { AF_NETLINK, SOCK_RAW, SOCK_CLOEXEC, NETLINK_ROUTE, SOL_SOCKET, SO_RCVTIMEO, EAGAIN, EINTR } = NETLINK;

const SO_RCVBUFFORCE = 33;
const RTMGRP_LINK = 1;
const ENOBUFS = 105;

/**
 * Link removals announced by the kernel (RTM_DELLINK on the RTNLGRP_LINK multicast group) in the namespace the
 * watch was opened in.
 *
 * Why: deleting a veth takes 16 to 33 ms before the kernel acks it, but all of that is reclamation after the link
 * is gone. The kernel closes both ends, unlists them (the name is free again), removes the bridge port and the
 * addresses, and only then announces RTM_DELLINK (about 1 ms in); the ack waits for RCU grace periods and the last
 * references. A caller that needs the link gone, not its memory freed, waits for the announcement.
 *
 * One socket serves every waiter: a single receive is outstanding on the thread pool while anyone waits (with a
 * 250 ms timeout, so an idle watch holds no thread and does not keep the process alive). When notices are lost
 * (ENOBUFS, a full receive buffer), waiters are not told: race {@link gone} against the deletion's own ack.
 */
export class LinkWatch {
  readonly #fd: number;
  readonly #rx = Buffer.allocUnsafe(64 * 1024);
  readonly #waiters = new Map<number, Set<() => void>>();
  #reading = false;
  #closed = false;

  private constructor(fd: number) {
    this.#fd = fd;
  }

  /**
   * Opens the watch in the calling thread's current network namespace.
   * @throws AtollError KERNEL_OP_FAILED with the errno.
   */
  static open(where = "the agent's namespace"): LinkWatch {
    const c = netlinkCalls();
    const fd = c.socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
    if (fd < 0) throw atollError('KERNEL_OP_FAILED', `netlink: opening a link watch in ${where} failed: ${errnoText(koffi.errno())}`);
    const addr = Buffer.alloc(12); // sockaddr_nl: family, pad, port ID 0 (the kernel picks), groups
    addr.writeUInt16LE(AF_NETLINK, 0);
    addr.writeUInt32LE(RTMGRP_LINK, 8);
    if (c.bind(fd, addr, addr.length) !== 0) {
      const e = koffi.errno();
      c.close(fd);
      throw atollError('KERNEL_OP_FAILED', `netlink: subscribing to link events in ${where} failed: ${errnoText(e)}`);
    }
    const timeout = Buffer.alloc(16); // struct timeval { 0 s, 250000 us }
    timeout.writeBigInt64LE(250_000n, 8);
    c.setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, timeout, timeout.length);
    const rcvbuf = Buffer.alloc(4);
    rcvbuf.writeInt32LE(1 << 20);
    c.setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, rcvbuf, 4); // room for a burst of notices; best effort
    return new LinkWatch(fd);
  }

  /**
   * Resolves when the kernel announces that the link with ifindex `index` is gone. Register before starting the
   * deletion (a notice that came earlier is not kept); `cancel` when done waiting.
   */
  gone(index: number): { readonly promise: Promise<void>; readonly cancel: () => void } {
    // cannot happen: its user (src/agent/pod-network.ts) forgets the watch as it closes it, and opens or takes it and
    // registers without an await between
    if (this.#closed) throw new Error('the link watch is closed');
    let done!: () => void;
    const promise = new Promise<void>((resolve) => (done = resolve));
    const set = this.#waiters.get(index) ?? new Set();
    set.add(done);
    this.#waiters.set(index, set);
    if (!this.#reading) void this.#read();
    const cancel = () => {
      set.delete(done);
      if (set.size === 0 && this.#waiters.get(index) === set) this.#waiters.delete(index);
    };
    return { promise, cancel };
  }

  /** Stops watching; idempotent. A receive in flight ends within its timeout. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#waiters.clear();
    if (!this.#reading) netlinkCalls().close(this.#fd);
  }

  async #read(): Promise<void> {
    this.#reading = true;
    const c = netlinkCalls();
    try {
      while (!this.#closed && this.#waiters.size > 0) {
        const n = await new Promise<number>((resolve, reject) => {
          c.recv.async(this.#fd, this.#rx, this.#rx.length, 0, (err, r) => (err ? reject(err as Error) : resolve(r < 0 ? -koffi.errno() : r)));
        });
        if (n === -EAGAIN || n === -EINTR || n === -ENOBUFS) continue; // timeout; interrupted; notices lost (acks cover)
        if (n < 0) return; // the socket failed: waiters fall back on their acks
        for (const msg of decodeMessages(new Uint8Array(this.#rx.subarray(0, n)))) {
          if (msg.type !== RTM_DELLINK) continue;
          const link = decodeLink(msg);
          if (link.family !== AF_UNSPEC) continue; // a bridge's notice about its port, not the link's removal
          const set = this.#waiters.get(link.index);
          if (!set) continue;
          this.#waiters.delete(link.index);
          for (const done of set) done();
        }
      }
    } finally {
      this.#reading = false;
      if (this.#closed) c.close(this.#fd);
    }
  }
}
