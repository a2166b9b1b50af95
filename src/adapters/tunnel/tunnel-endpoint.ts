/**
 * The tunnel's data path on one node: packets read from the TUN device go to the stream of the peer owning their
 * destination; packets from a peer's stream enter the TUN device only if their source lies in that peer's blocks.
 *
 * Why here and not in the core: this glues two adapters (TUN, streams). The decisions (longest-prefix match, the
 * source check) are pure and live in src/core/tunnel/routing.ts. A peer has at most one direct stream and two
 * circuits (streams through the relay, end to end: src/relay/circuits.ts): the one we asked for, on which we are the
 * TLS client and receive (`circuitIn`: its reads need no buffer allocation), and the one the peer asked for, on
 * which we send (`circuitOut`); a newer stream of a kind replaces the older (the caller reconnects). Packets take
 * the direct stream when there is one, else a circuit, the peer's first: a path moves from relayed to direct when a
 * punched stream attaches, and back when it closes, packet by packet, so the TCP flows inside see at most a few
 * reordered or lost packets. Every stream is pinned to the peer's key, so a packet from any is checked against that
 * peer's blocks.
 * With a datagram path (src/adapters/tunnel/datagram-path.ts, {@link TunnelEndpoint.useDatagrams}) packets take it first
 * whenever it is usable for their peer, again packet by packet: a flow moves between datagrams, the direct stream
 * and the relay as paths come and go. A peer that no stream or circuit reaches (or only a silent one) gets datagrams
 * all the same for a while after it was last heard (its agent may be restarting behind its keeper: {@link DatagramPath.sendAnyway}). Packets
 * arriving as datagrams pass the same source check.
 * Backpressure: while any stream is over its high-water mark the TUN device is not read, so the kernel's TUN queue
 * fills and the senders' TCP slows down instead of the agent buffering without bound.
 */
import { FRAME_HEADER } from '../../core/tunnel/frame.ts';
import { packetDestination, PeerRoutes, type TunnelPeer } from '../../core/tunnel/routing.ts';
import type { PeerPath } from '../../core/tunnel/status.ts';
import type { DatagramPath } from './datagram-path.ts';
import type { TunDevice } from './tun.ts';
import type { TunnelStream } from './tunnel-stream.ts';

export interface TunnelEndpointStats {
  /** Packets from the TUN device with no peer owning their destination (or not IPv4). */
  droppedNoPeer: number;
  /** Packets for a peer without a live path (no direct stream, and no relay for it). */
  droppedNoStream: number;
  /** Packets from a peer whose source is not in that peer's blocks (spoofed or misrouted). */
  droppedBadSource: number;
  /** Packets the TUN device refused. */
  droppedTunWrite: number;
  forwardedOut: number;
  forwardedIn: number;
  /** Times reading the TUN device paused because a stream was over its high-water mark. */
  pauses: number;
}

export interface PeerTraffic {
  txPackets: number;
  txBytes: number;
  rxPackets: number;
  rxBytes: number;
}

interface PeerEntry {
  readonly peer: TunnelPeer;
  readonly traffic: PeerTraffic;
}

/** How a stream reaches its peer: straight (dialled, accepted or punched), or through the relay (see above). */
export type StreamKind = 'direct' | 'circuitIn' | 'circuitOut';

export class TunnelEndpoint {
  readonly stats: TunnelEndpointStats = { droppedNoPeer: 0, droppedNoStream: 0, droppedBadSource: 0, droppedTunWrite: 0, forwardedOut: 0, forwardedIn: 0, pauses: 0 };
  private readonly tun: TunDevice;
  private routes: PeerRoutes;
  private readonly entries = new Map<string, PeerEntry>();
  /** Each peer's streams, by kind. */
  private readonly streams: Record<StreamKind, Map<string, TunnelStream>> = { direct: new Map(), circuitIn: new Map(), circuitOut: new Map() };
  private readonly congested = new Set<TunnelStream>();
  /** One batch's packets for each stream, gathered while the batch is routed (empty between batches). */
  private readonly outbox = new Map<TunnelStream, { readonly entry: PeerEntry; readonly pkts: Buffer[] }>();
  private paused = false;
  private datagrams: DatagramPath | undefined;

  constructor(tun: TunDevice, peers: readonly TunnelPeer[]) {
    this.tun = tun;
    this.routes = new PeerRoutes([]);
    this.setPeers(peers);
  }

  /**
   * Sends packets on `path` whenever it is usable for their peer, before any stream. Its packets must come in through
   * {@link fromDatagram}.
   */
  useDatagrams(path: DatagramPath): void {
    this.datagrams = path;
  }

  /**
   * An authentic packet from `peerId` that came as `datagrams` datagrams of `bytes` (TCP segments the datagram path
   * merged back into a superpacket, native/atoll-dp.c; else 1 and its length): into the TUN device if its source is
   * the peer's (a superpacket's segments share their addresses). Counted by datagram when accepted; a superpacket the
   * TUN device refuses counts once in droppedTunWrite.
   */
  fromDatagram(peerId: string, pkt: Uint8Array, datagrams: number, bytes: number): void {
    const e = this.entries.get(peerId);
    if (!e || !this.routes.acceptFrom(e.peer.id, pkt)) {
      this.stats.droppedBadSource += datagrams;
      return;
    }
    this.stats.forwardedIn += datagrams;
    e.traffic.rxPackets += datagrams;
    e.traffic.rxBytes += bytes;
    if (!this.tun.write(pkt)) this.stats.droppedTunWrite++;
  }

  /** Starts reading the TUN device. */
  start(): void {
    this.tun.start((batch) => this.fromTun(batch), FRAME_HEADER);
  }

  /** Replaces the peers and their blocks; streams of peers no longer present are closed. Traffic counters stay. */
  setPeers(peers: readonly TunnelPeer[]): void {
    this.routes = new PeerRoutes(peers);
    const old = new Map(this.entries);
    this.entries.clear();
    for (const p of peers) this.entries.set(p.id, { peer: p, traffic: old.get(p.id)?.traffic ?? { txPackets: 0, txBytes: 0, rxPackets: 0, rxBytes: 0 } });
    for (const byPeer of Object.values(this.streams)) {
      for (const [id, s] of byPeer) if (!this.entries.has(id)) s.close();
    }
  }

  /**
   * Makes `stream` the `kind` stream carrying packets to and from `peerId` (its key was pinned to that peer's); an
   * older stream of that kind is closed.
   */
  attach(peerId: string, stream: TunnelStream, kind: StreamKind = 'direct'): void {
    const byPeer = this.streams[kind];
    const old = byPeer.get(peerId);
    byPeer.set(peerId, stream);
    if (old && old !== stream) old.close();
    stream.on('frame', (pkt: Uint8Array) => this.toTun(this.entries.get(peerId), pkt));
    this.watch(stream, () => {
      if (byPeer.get(peerId) === stream) byPeer.delete(peerId);
    });
  }

  private watch(stream: TunnelStream, onClose: () => void): void {
    stream.on('drain', () => this.uncongest(stream));
    stream.on('close', () => {
      onClose();
      this.uncongest(stream);
    });
  }

  private toTun(e: PeerEntry | undefined, pkt: Uint8Array): void {
    if (!e || !this.routes.acceptFrom(e.peer.id, pkt)) {
      this.stats.droppedBadSource++;
      return;
    }
    if (!this.tun.write(pkt)) {
      this.stats.droppedTunWrite++;
      return;
    }
    this.stats.forwardedIn++;
    e.traffic.rxPackets++;
    e.traffic.rxBytes += pkt.length;
  }

  /** The live `kind` stream of a peer, if any. */
  streamOf(peerId: string, kind: StreamKind = 'direct'): TunnelStream | undefined {
    return this.streams[kind].get(peerId);
  }

  /** How packets to `peerId` travel now. */
  pathOf(peerId: string): PeerPath {
    if (this.datagrams?.usable(peerId)) return 'udp';
    if (this.streams.direct.has(peerId)) return 'direct';
    return this.circuitOf(peerId) ? 'relayed' : 'down';
  }

  /** The circuit packets to `peerId` take when there is no direct stream: the peer's, else ours. */
  circuitOf(peerId: string): TunnelStream | undefined {
    return this.streams.circuitOut.get(peerId) ?? this.streams.circuitIn.get(peerId);
  }

  /** Packets and bytes to and from `peerId` (over any path) since the agent started. */
  trafficOf(peerId: string): Readonly<PeerTraffic> | undefined {
    return this.entries.get(peerId)?.traffic;
  }

  private fromTun(batch: Buffer[]): void {
    const outbox = this.outbox;
    for (const pkt of batch) {
      const dst = packetDestination(pkt);
      const peer = dst === undefined ? undefined : this.routes.lookup(dst);
      const e = peer === undefined ? undefined : this.entries.get(peer);
      if (peer === undefined || e === undefined) {
        this.stats.droppedNoPeer++;
        this.tun.release(pkt);
        continue;
      }
      // the datagram path while usable, else a stream or circuit; with neither, or only a silent one, the datagram path
      // all the same: the peer's agent may be restarting, its keeper's socket queueing the datagrams for the next process
      const datagram = this.datagrams?.send(peer, pkt) === true;
      const via = datagram ? undefined : this.streams.direct.get(peer) ?? this.circuitOf(peer);
      if (datagram || this.datagrams?.sendAnyway(peer, pkt, via)) {
        this.tun.release(pkt); // the datagrams hold copies
        this.stats.forwardedOut++;
        e.traffic.txPackets++;
        e.traffic.txBytes += pkt.length;
        continue;
      }
      if (via === undefined) {
        this.stats.droppedNoStream++;
        this.tun.release(pkt);
        continue;
      }
      const out = outbox.get(via);
      if (out) out.pkts.push(pkt);
      else outbox.set(via, { entry: e, pkts: [pkt] });
    }
    this.datagrams?.flush();
    for (const [via, { entry, pkts }] of outbox) this.toStream(via, entry, pkts);
    outbox.clear();
    if (this.congested.size > 0 && !this.paused) {
      this.paused = true;
      this.stats.pauses++;
      this.tun.pause();
    }
  }

  /** Sends one batch's packets for `entry`'s peer on `via`, in one go (see {@link TunnelStream.sendAll}). */
  private toStream(via: TunnelStream, entry: PeerEntry, pkts: Buffer[]): void {
    if (!via.sendAll(pkts, () => { for (const p of pkts) this.tun.release(p); })) {
      this.stats.droppedNoStream += pkts.length;
      for (const p of pkts) this.tun.release(p);
      return;
    }
    this.stats.forwardedOut += pkts.length;
    entry.traffic.txPackets += pkts.length;
    for (const p of pkts) entry.traffic.txBytes += p.length;
    if (via.congested) this.congested.add(via);
  }

  private uncongest(stream: TunnelStream): void {
    this.congested.delete(stream);
    if (this.congested.size === 0 && this.paused) {
      this.paused = false;
      this.tun.resume();
    }
  }

  /** Closes every stream and the TUN device. */
  close(): void {
    for (const byPeer of Object.values(this.streams)) {
      for (const s of byPeer.values()) s.close();
      byPeer.clear();
    }
    this.tun.close();
  }
}
