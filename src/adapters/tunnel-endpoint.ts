/**
 * The tunnel's data path on one node: packets read from the TUN device go to the stream of the peer owning their
 * destination; packets from a peer's stream enter the TUN device only if their source lies in that peer's blocks.
 *
 * Why here and not in the core: this glues two adapters (TUN, streams). The decisions (longest-prefix match, the
 * source check) are pure and live in src/core/tunnel/routing.ts. One direct stream per peer: a newer stream for a
 * peer replaces the older one (the caller reconnects; whichever side dialled last wins). Peers the relay may carry
 * (edge peers of one community) use the stream to the relay while they have no direct stream: a path moves from
 * relayed to direct when a punched stream attaches, and back when it closes, packet by packet, so the TCP flows
 * inside see at most a few reordered or lost packets. A packet through the relay is checked like a direct one,
 * against the blocks of the peer whose key the relay names as its origin.
 * Backpressure: while any stream is over its high-water mark the TUN device is not read, so the kernel's TUN queue
 * fills and the senders' TCP slows down instead of the agent buffering without bound.
 */
import { FRAME_HEADROOM, peerIdOfPin, pinOfPeerId } from '../core/tunnel/frame.ts';
import { packetDestination, PeerRoutes, type TunnelPeer } from '../core/tunnel/routing.ts';
import type { PeerPath } from '../core/tunnel/status.ts';
import type { TunDevice } from './tun.ts';
import type { TunnelStream } from './tunnel-stream.ts';

export interface TunnelEndpointStats {
  /** Packets from the TUN device with no peer owning their destination (or not IPv4). */
  droppedNoPeer: number;
  /** Packets for a peer without a live path (no direct stream, and no relay for it). */
  droppedNoStream: number;
  /** Packets from a peer whose source is not in that peer's blocks (spoofed or misrouted). */
  droppedBadSource: number;
  /** Packets through the relay from a key that is not a peer we may reach that way. */
  droppedUnknownRelayed: number;
  /** Packets the TUN device refused. */
  droppedTunWrite: number;
  forwardedOut: number;
  forwardedIn: number;
  /** Times reading the TUN device paused because a stream was over its high-water mark. */
  pauses: number;
}

/** A peer of the endpoint: its blocks, its key pin, and whether the relay may carry its packets. */
export interface EndpointPeer extends TunnelPeer {
  readonly pin: string;
  readonly viaRelay: boolean;
}

export interface PeerTraffic {
  txPackets: number;
  txBytes: number;
  rxPackets: number;
  rxBytes: number;
}

interface PeerEntry {
  readonly peer: EndpointPeer;
  readonly id: Uint8Array;
  readonly traffic: PeerTraffic;
}

export class TunnelEndpoint {
  readonly stats: TunnelEndpointStats = { droppedNoPeer: 0, droppedNoStream: 0, droppedBadSource: 0, droppedUnknownRelayed: 0, droppedTunWrite: 0, forwardedOut: 0, forwardedIn: 0, pauses: 0 };
  private readonly tun: TunDevice;
  private routes: PeerRoutes;
  private readonly entries = new Map<string, PeerEntry>();
  /** Peers the relay may carry, by pin. */
  private readonly relayedByPin = new Map<string, PeerEntry>();
  private readonly streams = new Map<string, TunnelStream>();
  private relay: TunnelStream | undefined;
  private readonly congested = new Set<TunnelStream>();
  private paused = false;

  constructor(tun: TunDevice, peers: readonly EndpointPeer[]) {
    this.tun = tun;
    this.routes = new PeerRoutes([]);
    this.setPeers(peers);
  }

  /** Starts reading the TUN device. */
  start(): void {
    this.tun.start((batch) => this.fromTun(batch), FRAME_HEADROOM);
  }

  /** Replaces the peers and their blocks; streams of peers no longer present are closed. Traffic counters stay. */
  setPeers(peers: readonly EndpointPeer[]): void {
    this.routes = new PeerRoutes(peers);
    const old = new Map(this.entries);
    this.entries.clear();
    this.relayedByPin.clear();
    for (const p of peers) {
      const e: PeerEntry = { peer: p, id: peerIdOfPin(p.pin), traffic: old.get(p.id)?.traffic ?? { txPackets: 0, txBytes: 0, rxPackets: 0, rxBytes: 0 } };
      this.entries.set(p.id, e);
      if (p.viaRelay) this.relayedByPin.set(p.pin, e);
    }
    for (const [id, s] of this.streams) if (!this.entries.has(id)) s.close();
  }

  /** Makes `stream` the direct stream carrying packets to and from `peerId`; an older stream of that peer is closed. */
  attach(peerId: string, stream: TunnelStream): void {
    const old = this.streams.get(peerId);
    this.streams.set(peerId, stream);
    if (old && old !== stream) old.close();
    stream.on('frame', (pkt: Uint8Array) => this.toTun(this.entries.get(peerId), pkt));
    this.watch(stream, () => {
      if (this.streams.get(peerId) === stream) this.streams.delete(peerId);
    });
  }

  /** Makes `stream` (to the relay) the path for peers without a direct stream that the relay may carry. */
  setRelay(stream: TunnelStream): void {
    const old = this.relay;
    this.relay = stream;
    if (old && old !== stream) old.close();
    stream.on('relayed', (id: Uint8Array, pkt: Uint8Array) => {
      const e = this.relayedByPin.get(pinOfPeerId(id));
      if (!e) this.stats.droppedUnknownRelayed++;
      else this.toTun(e, pkt);
    });
    this.watch(stream, () => {
      if (this.relay === stream) this.relay = undefined;
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

  /** The live direct stream of a peer, if any. */
  streamOf(peerId: string): TunnelStream | undefined {
    return this.streams.get(peerId);
  }

  /** How packets to `peerId` travel now. */
  pathOf(peerId: string): PeerPath {
    if (this.streams.has(peerId)) return 'direct';
    return this.relay && this.entries.get(peerId)?.peer.viaRelay ? 'relayed' : 'down';
  }

  /** Packets and bytes to and from `peerId` (over any path) since the agent started. */
  trafficOf(peerId: string): Readonly<PeerTraffic> | undefined {
    return this.entries.get(peerId)?.traffic;
  }

  private fromTun(batch: Buffer[]): void {
    for (const pkt of batch) {
      const dst = packetDestination(pkt);
      const peer = dst === undefined ? undefined : this.routes.lookup(dst);
      const e = peer === undefined ? undefined : this.entries.get(peer);
      if (peer === undefined || e === undefined) {
        this.stats.droppedNoPeer++;
        this.tun.release(pkt);
        continue;
      }
      const direct = this.streams.get(peer);
      const sent = () => this.tun.release(pkt);
      let via: TunnelStream | undefined;
      if (direct) via = direct.send(pkt, sent) ? direct : undefined;
      else if (this.relay && e.peer.viaRelay) via = this.relay.sendRelayed(e.id, pkt, sent) ? this.relay : undefined;
      if (!via) {
        this.stats.droppedNoStream++;
        this.tun.release(pkt);
        continue;
      }
      this.stats.forwardedOut++;
      e.traffic.txPackets++;
      e.traffic.txBytes += pkt.length;
      if (via.congested) this.congested.add(via);
    }
    if (this.congested.size > 0 && !this.paused) {
      this.paused = true;
      this.stats.pauses++;
      this.tun.pause();
    }
  }

  private uncongest(stream: TunnelStream): void {
    this.congested.delete(stream);
    if (this.congested.size === 0 && this.paused) {
      this.paused = false;
      this.tun.resume();
    }
  }

  /** Closes every stream (the relay's too) and the TUN device. */
  close(): void {
    for (const s of this.streams.values()) s.close();
    this.streams.clear();
    this.relay?.close();
    this.tun.close();
  }
}
