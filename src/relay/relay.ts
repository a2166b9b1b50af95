/**
 * `atoll relay`: the cloud's meeting point for edge nodes behind NAT. Each edge node keeps one pinned TLS stream to
 * it (src/adapters/tunnel-stream.ts). Over that stream the relay
 * - tells the node its address as seen from the internet (the `observed` control message, sent on every connection:
 *   a node opens a short connection from the local port it will punch from, to learn that port's public mapping);
 * - carries relayed packets and control messages between two nodes it may connect (an edge pair of one community,
 *   or a pair with a cloud node; src/core/tunnel/plan.ts `relayAllows`), rewriting the peer id from destination to
 *   origin, so the receiver knows which node's blocks the packet's source must lie in. Hole punching is coordinated
 *   this way, and pairs that cannot punch (symmetric NAT) keep their traffic here.
 *
 * No time or byte limits per stream (GUIDE 5: circuit-relay-v2's 2 min / 128 KiB defaults cut long flows): a
 * relayed path lives as long as both streams do. A destination whose queue is full drops packets, as a router
 * would; the TCP flows inside slow down. Nodes are accepted only with a registered tunnel key, learnt from the
 * controller's watch with a relay token and kept in `<dataDir>/registry.json`, so a relay restarted while the
 * controller is down still knows everyone.
 */
import { join } from 'node:path';
import type { Server } from 'node:tls';
import type { Logger } from '../core/ports.ts';
import { FRAME_KIND, peerIdOfPin, pinOfPeerId } from '../core/tunnel/frame.ts';
import { relayAllows, type RelayMember, relayMembers } from '../core/tunnel/plan.ts';
import type { NodeRecord } from '../core/cluster/model.ts';
import { applyWatchLine, ControllerClient } from '../adapters/controller-client.ts';
import { ClusterStateFile } from '../adapters/cluster-state-file.ts';
import { discoverPinnedCa } from '../adapters/pki.ts';
import { listenTunnel, loadOrCreateTunnelCredentials, spkiPin, type TunnelStream } from '../adapters/tunnel-stream.ts';
import { SlabPool } from '../adapters/slab-pool.ts';
import type { RelayConfig } from '../config/relay-config.ts';

export interface RelayStats {
  /** Nodes with a relay stream now. */
  connected: number;
  forwardedPackets: number;
  forwardedBytes: number;
  forwardedControl: number;
  /** Relayed frames for a node that has no stream to the relay. */
  droppedNoDestination: number;
  /** Relayed frames between nodes the relay may not connect (different communities). */
  droppedNotAllowed: number;
  /** Relayed frames dropped because the destination's queue was full. */
  droppedQueueFull: number;
  /** Connections refused (unknown key, failed handshake). */
  refused: number;
}

/** The relay logs its counters this often (when they changed). */
const STATS_LOG_MS = 60_000;

interface Session {
  readonly member: RelayMember;
  readonly stream: TunnelStream;
}

export class Relay {
  readonly stats: RelayStats = { connected: 0, forwardedPackets: 0, forwardedBytes: 0, forwardedControl: 0, droppedNoDestination: 0, droppedNotAllowed: 0, droppedQueueFull: 0, refused: 0 };
  readonly #cfg: RelayConfig;
  readonly #log: Logger;
  readonly #registry: ClusterStateFile;
  #nodes: readonly NodeRecord[];
  #members = new Map<string, RelayMember>();
  /** The relay stream of each node, by pin. */
  readonly #sessions = new Map<string, Session>();
  #server: Server | undefined;
  readonly #abort = new AbortController();
  #statsTimer: NodeJS.Timeout | undefined;
  #pin = '';
  /** Frames split across reads are assembled here and wait in the destination's queue until written. */
  readonly #frames = new SlabPool();

  constructor(cfg: RelayConfig, log: Logger) {
    this.#cfg = cfg;
    this.#log = log;
    this.#registry = new ClusterStateFile(join(cfg.dataDir, 'registry.json'));
    this.#nodes = this.#registry.load().peers;
    this.#setMembers();
  }

  /** Frames assembled from several reads and not yet written on (for tests and metrics; 0 when idle). */
  get framesHeld(): number {
    return this.#frames.out;
  }

  /** The relay's key pin: agents configure it as `tunnel.relay.pin`. */
  get pin(): string {
    return this.#pin;
  }

  /** Loads or creates the key, listens, and starts following the controller. */
  async start(): Promise<void> {
    const credentials = loadOrCreateTunnelCredentials(this.#cfg.dataDir, 'atoll-relay');
    this.#pin = spkiPin(credentials.certPem);
    const { server } = await listenTunnel({
      host: this.#cfg.listenHost, port: this.#cfg.listenPort, credentials,
      acceptPin: (pin) => this.#members.has(pin),
      onStream: (stream) => this.#onStream(stream),
      onRefused: (reason) => {
        this.stats.refused++;
        this.#log.warn('relay connection refused', { reason });
      },
      streamOptions: { pool: this.#frames }, // forwarded frames wait in the destination's queue
    });
    this.#server = server;
    void this.#follow();
    let last = '';
    this.#statsTimer = setInterval(() => {
      const now = JSON.stringify(this.stats);
      if (now !== last) this.#log.info('relay stats', { ...this.stats });
      last = now;
    }, STATS_LOG_MS);
    this.#statsTimer.unref();
    this.#log.info('relay started', { listen: `${this.#cfg.listenHost}:${this.#cfg.listenPort}`, pin: this.#pin, members: this.#members.size });
  }

  #setMembers(): void {
    this.#members = new Map(relayMembers(this.#nodes).map((m) => [m.pin, m]));
    for (const [pin, s] of this.#sessions) {
      if (!this.#members.has(pin)) s.stream.close(new Error('no longer a registered node'));
    }
  }

  #onStream(stream: TunnelStream): void {
    const member = this.#members.get(stream.peerPin) as RelayMember;
    stream.sendControl({ t: 'observed', host: stream.remote.host, port: stream.remote.port });
    stream.on('control', (msg: { t: string }) => {
      if (msg.t !== 'hello') return;
      // a node's relay stream (not a short observing connection): the newest one wins
      const old = this.#sessions.get(member.pin);
      this.#sessions.set(member.pin, { member, stream });
      this.stats.connected = this.#sessions.size;
      if (old && old.stream !== stream) old.stream.close();
      this.#log.info('node on the relay', { node: member.name, from: `${stream.remote.host}:${stream.remote.port}` });
    });
    const fromId = peerIdOfPin(member.pin);
    stream.on('relayed', (id: Uint8Array, pkt: Uint8Array) => this.#forward(member, fromId, id, FRAME_KIND.relayedPacket, pkt));
    stream.on('relayed-control', (id: Uint8Array, _msg: unknown, body: Uint8Array) => this.#forward(member, fromId, id, FRAME_KIND.relayedControl, body));
    stream.once('close', (err?: Error) => {
      if (this.#sessions.get(member.pin)?.stream !== stream) return;
      this.#sessions.delete(member.pin);
      this.stats.connected = this.#sessions.size;
      this.#log.info('node left the relay', { node: member.name, ...(err ? { err: err.message } : {}) });
    });
  }

  /** Passes a relayed frame from `from` on to the node `toId` names, if it is here and the pair is allowed. */
  #forward(from: RelayMember, fromId: Uint8Array, toId: Uint8Array, kind: typeof FRAME_KIND.relayedPacket | typeof FRAME_KIND.relayedControl, body: Uint8Array): void {
    const done = () => this.#frames.release(body);
    const to = this.#sessions.get(pinOfPeerId(toId));
    if (!to) {
      this.stats.droppedNoDestination++;
      done();
      return;
    }
    // the registry as it is now (a node may have changed community since it connected)
    const [a, b] = [this.#members.get(from.pin), this.#members.get(to.member.pin)];
    if (!a || !b || !relayAllows(a, b)) {
      this.stats.droppedNotAllowed++;
      done();
      return;
    }
    if (!to.stream.relay(kind, fromId, toId, body, done)) {
      this.stats.droppedQueueFull++;
      done();
      return;
    }
    if (kind === FRAME_KIND.relayedControl) this.stats.forwardedControl++;
    else {
      this.stats.forwardedPackets++;
      this.stats.forwardedBytes += body.length;
    }
  }

  /** Follows the controller's node list (with backoff while it is unreachable), keeping the registry file current. */
  async #follow(): Promise<void> {
    const signal = this.#abort.signal;
    let backoff = 500;
    while (!signal.aborted) {
      try {
        const caPem = await this.#ca();
        const client = new ControllerClient({ urls: this.#cfg.controller.urls, caPem, nodeName: 'relay', bearerToken: this.#cfg.controller.token });
        await client.watch(this.#registry.load().revision, (line) => {
          if (line.type === 'ping') return;
          backoff = 500;
          this.#nodes = applyWatchLine(this.#nodes, line);
          this.#registry.save({ blocks: [], revision: line.revision, peers: this.#nodes });
          this.#setMembers();
        }, signal);
      } catch (err) {
        if (signal.aborted) return;
        this.#log.warn('controller watch failed; the relay keeps its saved registry and retries', { err: err instanceof Error ? err.message : String(err), retryInMs: backoff });
      }
      await new Promise((r) => setTimeout(r, backoff));
      backoff = Math.min(30_000, backoff * 2);
    }
  }

  async #ca(): Promise<string> {
    let last: unknown;
    for (const url of this.#cfg.controller.urls) {
      try {
        return await discoverPinnedCa(url, this.#cfg.controller.caCertHash);
      } catch (err) {
        last = err;
      }
    }
    throw last;
  }

  stop(): void {
    this.#abort.abort();
    clearInterval(this.#statsTimer);
    this.#server?.close();
    for (const s of this.#sessions.values()) s.stream.close();
    this.#sessions.clear();
  }
}
