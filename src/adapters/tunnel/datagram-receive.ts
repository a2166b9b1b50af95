/**
 * What the datagram path (src/adapters/tunnel/datagram-path.ts) does with what its socket received: each ring opened
 * natively under the receiving keys (src/adapters/tunnel/datagram-native.ts, OpenKeyTable), then each authentic
 * datagram handed on: a hello to the hellos, a keepalive to its peer's times (an echo answered, a new address taken),
 * a packet through its source check to the caller. Bad input was dropped and counted natively, before this.
 */
import { DATAGRAM_TYPE } from '../../core/tunnel/datagram.ts';
import { onKeepalive, onPacket } from '../../core/tunnel/datagram-peer.ts';
import { HELLO_TYPE } from '../../core/tunnel/hello.ts';
import { type OpenKeyTable, RESULT_INTS } from './datagram-native.ts';
import type { HelloExchange } from './datagram-hello-exchange.ts';
import type { KeptPeers } from './datagram-kept-peers.ts';
import type { DatagramOutbox } from './datagram-outbox.ts';
import type { DatagramPathComponents, DatagramPathStats } from './datagram-path-types.ts';
import { endpointOf, type PeerState } from './datagram-peer-state.ts';
import type { UdpBatchSocket } from './udp-batch.ts';
import { steadyClock } from '../timers.ts';

export interface DatagramReceiverComponents {
  /** The path's native key table: it opens the rings. */
  readonly table: OpenKeyTable;
  /** The path's peers, by their tag in the table. */
  readonly tags: ReadonlyMap<number, PeerState>;
  /** The hellos; undefined without a tunnel key (the table then passes no hello). */
  readonly hellos: HelloExchange | undefined;
  /** The kept region's description; undefined without one. */
  readonly kept: Pick<KeptPeers, 'outdated'> | undefined;
  /** Describes the kept region again (datagram-kept-peers.ts): after every change of keys or addresses. */
  readonly describe: () => void;
  /** Where an echo's answer goes. */
  readonly out: Pick<DatagramOutbox, 'queue' | 'flush'>;
  readonly onPacket: DatagramPathComponents['onPacket'];
  readonly stats: DatagramPathStats;
}

export interface DatagramReceiverInit {
  /** The path's dead interval. */
  readonly deadAfterMs: number;
}

export class DatagramReceiver {
  readonly #c: DatagramReceiverComponents;
  readonly #init: DatagramReceiverInit;
  /** An echo's answer: a one-byte keepalive. */
  readonly #echoReply = new Uint8Array(1);

  constructor(components: DatagramReceiverComponents, init: DatagramReceiverInit) {
    this.#c = components;
    this.#init = init;
  }

  /**
   * A ring of `n` messages from the socket: opened natively (the GRO runs cut apart, keys found, replay windows
   * checked, tags verified, in place, TCP segments of a flow merged back into superpackets), then per authentic packet
   * the source check and keepalive or packet here.
   * A peer heard from after a silence may have turned usable: the kept region is described again at once, not at the
   * next tick, or an agent killed in between takes the path back as unusable and drops its packets until keepalives
   * and a stream come back.
   */
  onMessages(socket: UdpBatchSocket, n: number): void {
    const now = steadyClock();
    const dead = this.#init.deadAfterMs;
    let revived = false;
    const table = this.#c.table;
    const stats = this.#c.stats;
    // a hello ends each pass: the keys it agrees open the datagrams behind it (the peer seals under them at once)
    // close() from a callback frees the ring at once: stop reading it then
    for (let more = false, done = false; !done && !socket.closed; more = true) {
      const opened = table.open(socket.ring, n, now, stats.dropped, true, more);
      done = opened.done;
      stats.copiesSpared += opened.spared;
      revived = this.#handOn(socket, opened.handed, now, dead) || revived;
    }
    if (revived && this.#c.kept?.outdated(now)) this.#c.describe();
  }

  /** The `handed` results of the last open, in order. @returns whether a peer was heard from after a silence. */
  #handOn(socket: UdpBatchSocket, handed: number, now: number, dead: number): boolean {
    let revived = false;
    let answered = false;
    const stats = this.#c.stats;
    const r = this.#c.table.results;
    const bytes = socket.ringBytes;
    for (let i = 0, o = 0; i < handed && !socket.closed; i++, o += RESULT_INTS) {
      const kind = r[o]!;
      const msg = r[o + 2]!;
      const off = r[o + 3]!;
      const len = r[o + 4]!;
      if (kind === HELLO_TYPE) {
        // the native table passes hellos only once the path's #helloPins set its pins, which it does only with a
        // tunnel key
        (this.#c.hellos as HelloExchange).onHello(bytes.subarray(off, off + len), socket.sourceOf(msg), this.#c.tags.get(r[o + 1]!));
        continue;
      }
      const p = this.#c.tags.get(r[o + 1]!);
      const datagrams = r[o + 5]!;
      if (!p) {
        stats.dropped.unknownKey += datagrams;
        continue;
      }
      const known = p.endpoint?.key === socket.sourceKey(msg);
      if (kind === DATAGRAM_TYPE.keepalive) {
        stats.keepalivesReceived++;
        if (!known) {
          const from = socket.sourceOf(msg);
          p.endpoint = endpointOf(from.address, from.port);
          stats.endpointMoves++;
          this.#c.describe();
        }
        const heard = onKeepalive(p, bytes[off]!, len, now, dead);
        revived ||= heard.revived;
        if (heard.answer !== undefined) {
          this.#echoReply[0] = heard.answer;
          if (this.#c.out.queue(p, DATAGRAM_TYPE.keepalive, this.#echoReply) > 0) {
            stats.keepalivesSent++;
            answered = true;
          }
        }
        continue;
      }
      if (!known) {
        stats.dropped.unknownAddress += datagrams;
        continue;
      }
      revived ||= onPacket(p, now, dead);
      stats.received += datagrams;
      this.#c.onPacket(p.id, bytes.subarray(off, off + len), datagrams, r[o + 6]!);
    }
    if (answered) this.#c.out.flush();
    return revived;
  }
}
