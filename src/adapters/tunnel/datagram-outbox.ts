/**
 * What the datagram path (src/adapters/tunnel/datagram-path.ts) sends, through its socket's descriptor: packets and
 * keepalives sealed for a peer into runs of datagrams (native: src/adapters/tunnel/datagram-native.ts, DatagramSender),
 * flushed after each batch, and hellos as they are. Failed sends and second copies are counted in the path's stats;
 * which packets may go, and to whom, is the path's to decide.
 */
import type { DATAGRAM_TYPE } from '../../core/tunnel/datagram.ts';
import { DatagramSender } from './datagram-native.ts';
import type { DatagramPathStats } from './datagram-path-types.ts';
import type { Endpoint, PeerState } from './datagram-peer-state.ts';

export class DatagramOutbox {
  readonly #stats: Pick<DatagramPathStats, 'copiesSent' | 'lastSendErrno' | 'dropped'>;
  /** The largest IP packet one datagram carries. */
  readonly #maxIp: number;
  /** Seals and sends runs of datagrams (UDP GSO). */
  #sender: DatagramSender | undefined;

  constructor(stats: Pick<DatagramPathStats, 'copiesSent' | 'lastSendErrno' | 'dropped'>, maxIp: number) {
    this.#stats = stats;
    this.#maxIp = maxIp;
  }

  /** Sends through the socket of descriptor `fd` (bound by the path) from now on; nothing is sent before. */
  attach(fd: number): void {
    this.#sender = new DatagramSender(fd);
  }

  /**
   * Seals `pkt` (a superpacket in segments) for `p` into the sender's run (native: one system call sends a run of
   * equal-sized datagrams to one peer with UDP GSO; a run ends at another peer, at a datagram larger than the run's
   * first, after a shorter one, and at the kernel's limits). @returns the datagrams queued, or -1.
   */
  queue(p: PeerState, type: typeof DATAGRAM_TYPE.data | typeof DATAGRAM_TYPE.keepalive, pkt: Uint8Array): number {
    const sender = this.#sender;
    const k = p.send;
    const e = p.endpoint;
    if (!sender || !k || !e) return -1;
    return sender.send(k.key, e.addr, e.port, type, pkt, this.#maxIp);
  }

  /** Sends what {@link queue} queued. */
  flush(): void {
    const sender = this.#sender;
    if (!sender) return;
    const { failed, errno, copies } = sender.flush();
    if (failed > 0) this.#stats.dropped.sendFailed += failed;
    this.#stats.copiesSent += copies;
    if (errno !== 0) this.#stats.lastSendErrno = errno;
  }

  /** Sends `datagram` (a hello: not sealed) to `to` at once. */
  sendRaw(to: Endpoint, datagram: Uint8Array): void {
    // after what is queued
    this.flush();
    const err = (this.#sender as DatagramSender).sendRaw(to.addr, to.port, datagram);
    if (err !== 0) {
      this.#stats.dropped.sendFailed++;
      this.#stats.lastSendErrno = err;
    }
  }

  /** Frees the sender; nothing is sent after. Idempotent. */
  free(): void {
    this.#sender?.free();
    this.#sender = undefined;
  }
}
