/**
 * The tunnel's data path on one node: packets read from the TUN device go to the stream of the peer owning their
 * destination; packets from a peer's stream enter the TUN device only if their source lies in that peer's blocks.
 *
 * Why here and not in the core: this glues two adapters (TUN, streams). The decisions (longest-prefix match, the
 * source check) are pure and live in src/core/tunnel/routing.ts. One stream per peer: a newer stream for a peer
 * replaces the older one (the caller reconnects; whichever side dialled last wins).
 * Backpressure: while any stream is over its high-water mark the TUN device is not read, so the kernel's TUN queue
 * fills and the senders' TCP slows down instead of the agent buffering without bound.
 */
import { FRAME_HEADER } from '../core/tunnel/frame.ts';
import { packetDestination, PeerRoutes, type TunnelPeer } from '../core/tunnel/routing.ts';
import type { TunDevice } from './tun.ts';
import type { TunnelStream } from './tunnel-stream.ts';

export interface TunnelEndpointStats {
  /** Packets from the TUN device with no peer owning their destination (or not IPv4). */
  droppedNoPeer: number;
  /** Packets for a peer without a live stream. */
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

export class TunnelEndpoint {
  readonly stats: TunnelEndpointStats = { droppedNoPeer: 0, droppedNoStream: 0, droppedBadSource: 0, droppedTunWrite: 0, forwardedOut: 0, forwardedIn: 0, pauses: 0 };
  private readonly tun: TunDevice;
  private routes: PeerRoutes;
  private readonly streams = new Map<string, TunnelStream>();
  private readonly congested = new Set<TunnelStream>();
  private paused = false;

  constructor(tun: TunDevice, peers: readonly TunnelPeer[]) {
    this.tun = tun;
    this.routes = new PeerRoutes(peers);
  }

  /** Starts reading the TUN device. */
  start(): void {
    this.tun.start((batch) => this.fromTun(batch), FRAME_HEADER);
  }

  /** Replaces the peers and their blocks; streams of peers no longer present are closed. */
  setPeers(peers: readonly TunnelPeer[]): void {
    this.routes = new PeerRoutes(peers);
    const keep = new Set(this.routes.peers());
    for (const [id, s] of this.streams) if (!keep.has(id)) s.close();
  }

  /** Makes `stream` the one carrying packets to and from `peerId`; an older stream of that peer is closed. */
  attach(peerId: string, stream: TunnelStream): void {
    const old = this.streams.get(peerId);
    this.streams.set(peerId, stream);
    if (old && old !== stream) old.close();
    stream.on('frame', (pkt: Uint8Array) => {
      if (!this.routes.acceptFrom(peerId, pkt)) {
        this.stats.droppedBadSource++;
        return;
      }
      if (this.tun.write(pkt)) this.stats.forwardedIn++;
      else this.stats.droppedTunWrite++;
    });
    stream.on('drain', () => this.uncongest(stream));
    stream.on('close', () => {
      if (this.streams.get(peerId) === stream) this.streams.delete(peerId);
      this.uncongest(stream);
    });
  }

  /** The live stream of a peer, if any. */
  streamOf(peerId: string): TunnelStream | undefined {
    return this.streams.get(peerId);
  }

  private fromTun(batch: Buffer[]): void {
    for (const pkt of batch) {
      const dst = packetDestination(pkt);
      const peer = dst === undefined ? undefined : this.routes.lookup(dst);
      if (peer === undefined) {
        this.stats.droppedNoPeer++;
        continue;
      }
      const stream = this.streams.get(peer);
      if (!stream || !stream.send(pkt)) {
        this.stats.droppedNoStream++;
        continue;
      }
      this.stats.forwardedOut++;
      if (stream.congested) this.congested.add(stream);
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

  /** Closes every stream and the TUN device. */
  close(): void {
    for (const s of this.streams.values()) s.close();
    this.streams.clear();
    this.tun.close();
  }
}
