/**
 * What the datagram path (src/adapters/tunnel/datagram-path.ts) takes and shows: its components and init, its
 * counters, a peer's status. Types only, so the modules the path delegates to (the stream key exchange, the hellos,
 * the kept region, receiving and sending) share them without importing the path.
 */
import type { DatagramDrop } from '../../core/tunnel/datagram.ts';
import type { HelloDrop } from '../../core/tunnel/hello.ts';
import type { Logger } from '../../core/ports.ts';
import type { DatagramLocalState } from './datagram-state-file.ts';
import type { TunnelStream } from './tunnel-stream.ts';

export type DatagramDropReason = DatagramDrop | HelloDrop | 'sendFailed';

export interface DatagramPathStats {
  sent: number;
  received: number;
  keepalivesSent: number;
  keepalivesReceived: number;
  /**
   * Packets the datagram path could not take (no usable path, or too big and not splittable): the streams carried them,
   * or with no stream {@link DatagramPath.sendAnyway} may have sent them all the same (`sentAnyway`).
   */
  fallbacks: number;
  /** Datagrams sent on a path that was not usable, as nothing else reached their peer ({@link DatagramPath.sendAnyway}). */
  sentAnyway: number;
  /** Authentic keepalives from a new address of their peer: the peer's address moved there. */
  endpointMoves: number;
  /** The errno of the last failed send (0: none). */
  lastSendErrno: number;
  /** Hellos sent and authentic ones received; pairs of keys the hellos agreed on. */
  hellosSent: number;
  hellosReceived: number;
  helloKeys: number;
  /**
   * Second copies of datagrams sent (a flow's retransmissions and SACK acknowledgements go twice), and copies that
   * came when their original had too, set aside uncounted in `received` (native/atoll-dp.c, atoll_dp_send).
   */
  copiesSent: number;
  copiesSpared: number;
  readonly dropped: Record<DatagramDropReason, number>;
}

export interface DatagramPathComponents {
  /** The stream a key is offered on when rotating: any live stream of the peer (direct or a circuit). */
  readonly streamOf: (peerId: string) => TunnelStream | undefined;
  /** Our public host as seen from outside (the relay's `observed`), '' when unknown: peers then use the stream's. */
  readonly publicHost: () => string;
  /**
   * An authentic packet from `peerId`: its source check and the TUN device are the caller's. A view valid during the
   * call; `datagrams` of `bytes` (their plaintexts) came merged into it (TCP segments into a superpacket), else 1.
   */
  readonly onPacket: (peerId: string, pkt: Uint8Array, datagrams: number, bytes: number) => void;
  /** Keys agreed by hellos and paths being rebuilt are logged here. */
  readonly log?: Logger;
  /** Where the hellos' memory lives (src/adapters/tunnel/datagram-state-file.ts); with {@link DatagramPathInit.identityKeyPem}. */
  readonly state?: { load(): DatagramLocalState; save(state: DatagramLocalState): void; readonly path?: string };
}

export interface DatagramPathInit {
  /** Address and port to bind ('0.0.0.0' for all; port 0 for any free one). */
  readonly host: string;
  readonly port: number;
  /** The underlay's MTU: no datagram is larger. */
  readonly underlayMtu: number;
  readonly keepaliveMs?: number;
  readonly deadAfterMs?: number;
  /** {@link LAST_RESORT_MS}, for tests. */
  readonly lastResortMs?: number;
  readonly rekey?: { readonly packets: number; readonly ms: number };
  /** The node's tunnel key (PEM): with it and a state store, the hellos rebuild paths without a stream. */
  readonly identityKeyPem?: string;
  /**
   * A kept region is attached (src/adapters/tunnel/datagram-native.ts, KeptRegion; held by the node's keeper): the keys
   * live in it, the peers' keys and addresses are described in it at every change, and {@link DatagramPath.bind}
   * takes back what a previous process of the agent left there.
   */
  readonly kept?: boolean;
}

/** What `atoll peers` shows of one peer's datagram path. */
export interface DatagramPeerStatus {
  readonly usable: boolean;
  readonly endpoint: string | undefined;
  /** Since when (ms since the epoch) hellos are rebuilding the path, with no stream and no relay to help. */
  readonly rebuildingSince?: number;
  /** The round trip of the last echo answered (ms); absent until one was (a peer from before never answers). */
  readonly rttMs?: number;
}
