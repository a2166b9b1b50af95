/**
 * rtnetlink over an AF_NETLINK socket through koffi: the pod hot path (veth, bridge port, address, route, link
 * deletion) and the resync's reads (links, addresses, routes, neighbours, fdb entries, the nftables generation)
 * without spawning `ip`, `bridge` or `nft`. Encoding and decoding are pure (src/core/net/netlink-codec.ts); this
 * file only owns the socket.
 *
 * Why not `ip -batch`: each spawn forks the ~100 MB agent (about 2.4 ms of the main thread, blocking the event loop)
 * and takes 4 to 5 ms in all; the same changes over netlink cost tens of microseconds of kernel time.
 *
 * Design choices (measured, see docs/architecture.md "A CNI call"):
 * - rtnetlink handles a request inside the sender's `send()`: the kernel does the work, waits for the RTNL lock and
 *   queues the ack before `send()` returns. So the blocking part is the send, not the receive: a veth deletion keeps
 *   `send()` busy for 16 to 33 ms (RCU grace periods), and any request can wait for the RTNL lock held by another
 *   process. Every send therefore runs on libuv's thread pool (koffi's `fn.async`), never on the main thread; after
 *   it returns, the answers are already queued and are read with non-blocking `recv` on the main thread (a missing
 *   answer is an error, never a wait). A dump is the exception: the kernel produces its later parts inside the
 *   reader's `recv()` calls (taking the RTNL lock for each), so a dump's receives run on the pool too, blocking,
 *   until NLMSG_DONE; a dump the kernel marks interrupted (the objects changed meanwhile) is taken again.
 * - One exchange sends a whole batch in one `send()` (the kernel handles the messages in order and acks each) and
 *   waits for one answer per request, matched by sequence number; answers with other numbers are dropped. A socket
 *   runs one exchange at a time (a second one waits), so two callers can never take each other's acks.
 * - A netlink socket stays bound to the namespace it was created in: for a pod's side, open the socket while the
 *   main thread is switched into the pod namespace (`inNetns`), then use it from anywhere.
 * - NETLINK_EXT_ACK gives the kernel's error text; NETLINK_CAP_ACK keeps acks small; sockets are close-on-exec so
 *   the `ip` and `nft` children the agent spawns never inherit them.
 * - LinkWatch (link-watch.ts) tells when a deleted link is gone (about 1 ms), long before the deletion's ack (16 to
 *   33 ms).
 */
import koffi from 'koffi';
import { atollError } from '../../core/errors.ts';
import { Mutex } from '../../core/mutex.ts';
import {
  AF_BRIDGE, AF_INET, AF_UNSPEC, type AddrInfo, decodeAck, decodeAddr, decodeDone, decodeGeneration, decodeLink, decodeMessages, decodeNeigh, decodeRoute,
  delLink, dumpAddrs4, dumpLinks, dumpNeighbours, dumpRoutes4, encodeBatch, getGeneration, getLink, type LinkInfo, type LinkRef, type NeighInfo,
  NLM_F_ACK, NLM_F_DUMP_INTR, NLMSG_DONE, NLMSG_ERROR, type NlMessage, type NlRequest, type RouteInfo,
} from '../../core/net/netlink-codec.ts';
import { errnoText } from './errno.ts';
import { NETLINK, netlinkCalls } from './libc.ts';

const { AF_NETLINK, SOCK_RAW, SOCK_CLOEXEC, NETLINK_ROUTE, SOL_SOCKET, SO_RCVTIMEO, EAGAIN, EINTR } = NETLINK;

/**
 * Each send that waits in the kernel holds one libuv pool thread. With the default 4, a burst of 30 DELs deletes
 * 4 veths at a time (150 ms here for all 30), while the kernel runs deletions in parallel and shares their RCU
 * grace periods (45 ms with 32 threads). libuv reads this once, when the pool first starts: this module is imported
 * (through the agent's modules) before anything uses the pool. An operator's own setting wins.
 */
export const THREADPOOL_SIZE = 32;
process.env.UV_THREADPOOL_SIZE ??= String(THREADPOOL_SIZE);

const SOL_NETLINK = 270;
const NETLINK_CAP_ACK = 10;
const NETLINK_EXT_ACK = 11;
const MSG_DONTWAIT = 0x40;
const MSG_TRUNC = 0x20;
const ENODEV = 19;
const RECV_BUFFER = 32 * 1024;
/** A dump's parts are at most a page or two each here; iproute2 reads them into 32 KB. */
const DUMP_BUFFER = 64 * 1024;
/**
 * Receive buffers, kept: a resync opens several sockets and runs several dumps, and a fresh 32 or 64 KB buffer for
 * each left the C heap full of blocks only a V8 collection would free. Answers are drained on the main thread
 * without blocking, so one buffer serves every socket; a dump's receives run on the pool, so each dump under way
 * takes its own from the spare ones.
 */
const drainBuffer = Buffer.allocUnsafeSlow(RECV_BUFFER);
const spareDumpBuffers: Buffer[] = [];
const MAX_SPARE_DUMP_BUFFERS = 4;
/** How long a dump's receive waits for its next part before the dump counts as failed. */
const DUMP_RECV_TIMEOUT_US = 5_000_000;
/** Interrupted dumps (the objects changed while listed) are taken again this many times, then reported. */
const DUMP_TRIES = 4;

/** Loads libc's socket calls; call once at start-up so the first CNI request pays nothing for it. */
export function initNetlink(): void {
  netlinkCalls();
}

/** The outcome of one request of an exchange. */
export interface NlResult {
  /** 0 on success, else the positive errno the kernel answered. */
  readonly errno: number;
  /** The kernel's extended-ack text, if any. */
  readonly message?: string;
  /** Data answers (e.g. the RTM_NEWLINK answering RTM_GETLINK). */
  readonly replies: readonly NlMessage[];
}

/** A failed request as an AtollError KERNEL_OP_FAILED naming the operation, the object, the namespace and the errno. */
export function netlinkError(req: NlRequest, res: NlResult, where: string): Error {
  const err = atollError('KERNEL_OP_FAILED', `netlink: ${req.what} in ${where} failed: ${errnoText(res.errno)}${res.message ? `: ${res.message}` : ''}`,
    'check `ip -d link` and the kernel log; the change was rolled back where it could be');
  return Object.assign(err, { errno: res.errno });
}

/**
 * One netlink socket (NETLINK_ROUTE unless opened for another protocol), bound to the network namespace the calling
 * thread was in when it was opened.
 */
export class RtnlSocket {
  readonly #fd: number;
  readonly #lock = new Mutex();
  #seq = 1;
  #closed = false;
  /** Whether SO_RCVTIMEO is set: only a dump's receives block, so only a socket that dumps needs the bound. */
  #bounded = false;
  /** "the agent's namespace" or "network namespace <path>", for errors. */
  readonly where: string;

  private constructor(fd: number, where: string) {
    this.#fd = fd;
    this.where = where;
  }

  /**
   * Opens a socket in the calling thread's current network namespace (wrap in `inNetns` for a pod's).
   * @param protocol NETLINK_ROUTE, or NETLINK_NETFILTER for {@link nftGeneration}.
   * @throws AtollError KERNEL_OP_FAILED with the errno.
   */
  static open(where = "the agent's namespace", protocol: number = NETLINK_ROUTE): RtnlSocket {
    const c = netlinkCalls();
    const fd = c.socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, protocol);
    if (fd < 0) throw atollError('KERNEL_OP_FAILED', `netlink: opening a netlink socket (protocol ${protocol}) in ${where} failed: ${errnoText(koffi.errno())}`);
    const one = Buffer.alloc(4);
    one.writeInt32LE(1);
    // Both are optional comforts (older kernels lack them): error text, and acks without the echoed request.
    c.setsockopt(fd, SOL_NETLINK, NETLINK_EXT_ACK, one, 4);
    c.setsockopt(fd, SOL_NETLINK, NETLINK_CAP_ACK, one, 4);
    return new RtnlSocket(fd, where);
  }

  /** Closes the socket; idempotent. Do not call while an exchange is running. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    netlinkCalls().close(this.#fd);
  }

  /**
   * Sends `reqs` in one `send()` and resolves with one result per request, in order. A request without NLM_F_ACK
   * (RTM_GETLINK) is complete with its answer or its error. The kernel carries on after a failed request, so later
   * requests of a batch may act anyway: batch only what is harmless after an earlier failure.
   * Exchanges on one socket run one after another.
   */
  exchange(reqs: readonly NlRequest[]): Promise<NlResult[]> {
    return this.#lock.run(() => this.#exchange(reqs));
  }

  /** {@link exchange}, then throws the first failure as a KERNEL_OP_FAILED AtollError (with `errno`). */
  async run(reqs: readonly NlRequest[]): Promise<NlResult[]> {
    const res = await this.exchange(reqs);
    res.forEach((r, i) => {
      if (r.errno !== 0) throw netlinkError(reqs[i] as NlRequest, r, this.where);
    });
    return res;
  }

  /** The link named `name` or with index `index`, or undefined when there is none. */
  async link(ref: LinkRef): Promise<LinkInfo | undefined> {
    const [r] = await this.exchange([getLink(ref)]);
    if (!r || r.errno === ENODEV) return undefined;
    if (r.errno !== 0) throw netlinkError(getLink(ref), r, this.where);
    const msg = r.replies[0];
    return msg && decodeLink(msg);
  }

  /** Deletes a link (both ends of a veth). Succeeds when it is already gone (ENODEV). Takes 16 to 33 ms of kernel time. */
  async deleteLink(ref: LinkRef): Promise<void> {
    const req = delLink(ref);
    const [r] = await this.exchange([req]);
    if (r && r.errno !== 0 && r.errno !== ENODEV) throw netlinkError(req, r, this.where);
  }

  /** Every link of the namespace (without statistics). */
  async links(): Promise<LinkInfo[]> {
    return (await this.dump(dumpLinks(), decodeLink)).filter((l) => l.family === AF_UNSPEC);
  }

  /** Every IPv4 address of the namespace. */
  addresses(): Promise<AddrInfo[]> {
    return this.dump(dumpAddrs4(), decodeAddr);
  }

  /** Every IPv4 route of every table. */
  routes(): Promise<RouteInfo[]> {
    return this.dump(dumpRoutes4(), decodeRoute);
  }

  /** Every IPv4 neighbour (AF_INET) or every bridge and VXLAN fdb entry (AF_BRIDGE). */
  neighbours(family: typeof AF_INET | typeof AF_BRIDGE): Promise<NeighInfo[]> {
    return this.dump(dumpNeighbours(family), decodeNeigh);
  }

  /**
   * The namespace's nf_tables ruleset generation: every committed transaction raises it by one, whoever commits it
   * (the socket must be opened with NETLINK_NETFILTER).
   */
  async nftGeneration(): Promise<number> {
    const req = getGeneration();
    const [r] = await this.exchange([req]);
    if (!r || r.errno !== 0) throw netlinkError(req, r ?? { errno: 0, replies: [] }, this.where);
    const msg = r.replies[0];
    if (!msg) throw atollError('KERNEL_OP_FAILED', `netlink: ${req.what} in ${this.where}: the kernel answered nothing`);
    return decodeGeneration(msg);
  }

  /**
   * Runs a dump request and resolves with its answers (the NLMSG_DONE left out), each decoded by `decode` while the
   * receive buffer holds it (so `decode` must copy out what it keeps). Sending and every receive run on the pool;
   * one exchange or dump at a time per socket.
   * @throws AtollError KERNEL_OP_FAILED when the kernel refuses it, a part does not come within 5 s, or the dump
   * stays interrupted after four tries.
   */
  dump<T>(req: NlRequest, decode: (msg: NlMessage) => T): Promise<T[]> {
    return this.#lock.run(async () => {
      for (let i = 0; i < DUMP_TRIES; i++) {
        const rx = spareDumpBuffers.pop() ?? Buffer.allocUnsafeSlow(DUMP_BUFFER);
        try {
          const { answers, interrupted } = await this.#dump(req, decode, rx);
          if (!interrupted) return answers;
        } finally {
          if (spareDumpBuffers.length < MAX_SPARE_DUMP_BUFFERS) spareDumpBuffers.push(rx);
        }
      }
      throw atollError('KERNEL_OP_FAILED', `netlink: ${req.what} in ${this.where} was interrupted ${DUMP_TRIES} times in a row (the objects kept changing)`, 'the next resync tries again');
    });
  }

  async #dump<T>(req: NlRequest, decode: (msg: NlMessage) => T, rx: Buffer): Promise<{ answers: T[]; interrupted: boolean }> {
    // cannot happen, here and in #exchange: each user opens a socket for one operation, awaits its requests, then
    // closes it (src/agent/pod-network.ts, overlay.ts, tunnel-routes.ts)
    if (this.#closed) throw new Error(`netlink socket in ${this.where} is closed`);
    if (!this.#bounded) {
      // a lost part must not hold a pool thread for ever
      const timeout = Buffer.alloc(16); // struct timeval
      timeout.writeBigInt64LE(BigInt(Math.floor(DUMP_RECV_TIMEOUT_US / 1e6)), 0);
      timeout.writeBigInt64LE(BigInt(DUMP_RECV_TIMEOUT_US % 1e6), 8);
      netlinkCalls().setsockopt(this.#fd, SOL_SOCKET, SO_RCVTIMEO, timeout, timeout.length);
      this.#bounded = true;
    }
    if (this.#seq + 1 >= 0x7fffffff) this.#seq = 1;
    const seq = this.#seq++;
    const sent = await this.#send(encodeBatch([req], seq));
    if (sent < 0) throw atollError('KERNEL_OP_FAILED', `netlink: ${req.what} in ${this.where}: sending failed: ${errnoText(-sent)}`);
    const answers: T[] = [];
    let interrupted = false;
    for (;;) {
      const n = await new Promise<number>((resolve, reject) => {
        netlinkCalls().recv.async(this.#fd, rx, rx.length, MSG_TRUNC, (err, r) => (err ? reject(err as Error) : resolve(r < 0 ? -koffi.errno() : r)));
      });
      if (n === -EINTR) continue;
      if (n < 0) {
        const why = n === -EAGAIN ? `no answer within ${DUMP_RECV_TIMEOUT_US / 1e6} s` : errnoText(-n);
        throw atollError('KERNEL_OP_FAILED', `netlink: ${req.what} in ${this.where}: receiving failed: ${why}`);
      }
      if (n > rx.length) throw atollError('KERNEL_OP_FAILED', `netlink: ${req.what} in ${this.where}: a part of ${n} bytes did not fit ${rx.length}`);
      for (const msg of decodeMessages(rx.subarray(0, n))) {
        if (msg.seq !== seq) continue; // a leftover of an earlier, failed exchange
        if (msg.flags & NLM_F_DUMP_INTR) interrupted = true;
        if (msg.type === NLMSG_DONE) {
          const errno = decodeDone(msg);
          if (errno !== 0) throw netlinkError(req, { errno, replies: [] }, this.where);
          return { answers, interrupted };
        }
        if (msg.type === NLMSG_ERROR) {
          const ack = decodeAck(msg);
          throw netlinkError(req, { errno: ack.errno, replies: [], ...(ack.message === undefined ? {} : { message: ack.message }) }, this.where);
        }
        answers.push(decode(msg));
      }
    }
  }

  async #exchange(reqs: readonly NlRequest[]): Promise<NlResult[]> {
    // cannot happen: see #dump
    if (this.#closed) throw new Error(`netlink socket in ${this.where} is closed`);
    if (reqs.length === 0) return [];
    if (this.#seq + reqs.length >= 0x7fffffff) this.#seq = 1;
    const first = this.#seq;
    this.#seq += reqs.length;
    const sent = await this.#send(encodeBatch(reqs, first));
    if (sent < 0) throw atollError('KERNEL_OP_FAILED', `netlink: sending ${reqs.map((r) => r.what).join('; ')} in ${this.where} failed: ${errnoText(-sent)}`);
    // Every answer is queued by the time send() returns: read them without blocking.
    const results = reqs.map(() => ({ errno: 0, message: undefined as string | undefined, replies: [] as NlMessage[], done: false }));
    for (const msg of this.#drain()) {
      const seq = msg.type === NLMSG_ERROR ? decodeAck(msg).seq : msg.seq;
      const r = results[seq - first];
      if (!r || r.done) continue; // not ours: a leftover of an earlier, failed exchange
      const req = reqs[seq - first] as NlRequest;
      if (msg.type === NLMSG_ERROR) {
        const ack = decodeAck(msg);
        r.errno = ack.errno;
        r.message = ack.message;
        r.done = true;
      } else {
        if (msg.type !== NLMSG_DONE) r.replies.push(msg);
        // The answer completes a request without NLM_F_ACK (RTM_GETLINK); with NLM_F_ACK, the ack follows.
        r.done = !(req.flags & NLM_F_ACK);
      }
    }
    const missing = reqs.filter((_, i) => !results[i]?.done);
    if (missing.length > 0) {
      throw atollError('KERNEL_OP_FAILED', `netlink: the kernel did not answer ${missing.map((r) => r.what).join('; ')} in ${this.where}`,
        'a bug in Atoll or a kernel that answers later than send(): please report it with the kernel version');
    }
    return results.map(({ errno, message, replies }) => (message === undefined ? { errno, replies } : { errno, message, replies }));
  }

  /** `send()` on a pool thread; resolves with its return value (negative errno on failure). */
  #send(bytes: Uint8Array): Promise<number> {
    return new Promise((resolve, reject) => {
      netlinkCalls().send.async(this.#fd, bytes, bytes.length, 0, (err, n) => {
        if (err) reject(err as Error);
        else resolve(n < 0 ? -koffi.errno() : n);
      });
    });
  }

  /** Every message queued on the socket, read with non-blocking `recv()` until there is none. */
  #drain(): NlMessage[] {
    const c = netlinkCalls();
    const out: NlMessage[] = [];
    for (;;) {
      const n = c.recv(this.#fd, drainBuffer, drainBuffer.length, MSG_DONTWAIT);
      if (n >= 0) {
        out.push(...decodeMessages(new Uint8Array(drainBuffer.subarray(0, n)))); // a copy: the buffer is shared
        continue;
      }
      const e = koffi.errno();
      if (e === EAGAIN) return out;
      // ENOBUFS: the receive buffer overflowed and answers were lost.
      if (e !== EINTR) throw atollError('KERNEL_OP_FAILED', `netlink: receiving in ${this.where} failed: ${errnoText(e)}`);
    }
  }
}
