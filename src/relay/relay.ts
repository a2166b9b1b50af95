/**
 * `atoll relay`: the cloud's meeting point for edge nodes behind NAT. Each edge node keeps one pinned TLS stream to
 * it (src/adapters/tunnel/tunnel-stream.ts), its control stream. Over it the relay
 * - tells the node its address as seen from the internet and the circuit port (the `observed` control message, sent
 *   on every connection: a node opens a short connection from the local port it will punch from, to learn that
 *   port's public mapping);
 * - carries control messages between two nodes it may connect (an edge pair of one community, or a pair with a cloud
 *   node; src/core/tunnel/plan.ts `relayAllows`), naming the origin: hole punching is coordinated this way;
 * - offers circuits (src/relay/circuits.ts): a node asks for one to a peer (`circuit`), the relay hands each end a
 *   one-time token (`circuit-ready` to the asker, `circuit-join` to the peer), both connect to the circuit port, and
 *   the relay joins the two connections; the nodes run TLS end to end over them. Pairs that cannot punch (symmetric
 *   NAT), and every pair until it has punched, carry their packets this way.
 *
 * No time or byte limits (libp2p circuit-relay-v2's 2 min / 128 KiB defaults cut long flows): a circuit lives as
 * long as both its connections do. Nodes are accepted only with a registered tunnel key, learnt from the
 * controller's watch with a relay token and kept in `<dataDir>/registry.json`, so a relay restarted while the
 * controller is down still knows everyone.
 */
import { join } from 'node:path';
import type { Server } from 'node:tls';
import type { Logger } from '../core/ports.ts';
import { AtollError, atollError } from '../core/errors.ts';
import { peerIdOfPin, pinOfPeerId } from '../core/tunnel/frame.ts';
import { relayAllows, type RelayMember, relayMembers } from '../core/tunnel/plan.ts';
import type { NodeRecord } from '../core/cluster/model.ts';
import { ControllerClient } from '../adapters/node/controller-client.ts';
import { WatchBatch } from '../adapters/node/watch-batch.ts';
import { type ClusterState, ClusterStateFile } from '../adapters/node/cluster-state-file.ts';
import { StateWriter } from '../adapters/node/state-writer.ts';
import { discoverPinnedCa, spkiPin } from '../adapters/pki.ts';
import { loadOrCreateTunnelCredentials } from '../adapters/tunnel/tunnel-credentials.ts';
import { listenTunnel } from '../adapters/tunnel/tunnel-dial.ts';
import type { TunnelStream } from '../adapters/tunnel/tunnel-stream.ts';
import type { CircuitRequest, ControlMessage } from '../core/tunnel/messages.ts';
import { CircuitBroker, type CircuitStats } from './circuits.ts';
import { sleep } from '../adapters/timers.ts';
import { Backoff } from '../core/retry.ts';
import type { RelayConfig } from '../config/relay-config.ts';
import type { OpsServer, Readiness } from '../adapters/ops/ops-server.ts';

export interface RelayStats {
  /** Nodes with a control stream now. */
  connected: number;
  forwardedControl: number;
  /** Relayed control messages, or circuit requests, for a node that has no stream to the relay. */
  droppedNoDestination: number;
  /** Relayed control messages, or circuit requests, between nodes the relay may not connect (different communities). */
  droppedNotAllowed: number;
  /** Relayed control messages dropped because the destination's queue was full. */
  droppedQueueFull: number;
  /** Connections refused (unknown key, failed handshake). */
  refused: number;
  /** Circuits offered (each a pair of tokens). */
  circuitsOffered: number;
}

/** The relay logs its counters this often (when they changed). */
const STATS_LOG_MS = 60_000;
/** Watch lines that come within this of each other are applied and saved once (src/adapters/node/watch-batch.ts). */
const WATCH_SETTLE_MS = 50;

interface Session {
  readonly member: RelayMember;
  readonly stream: TunnelStream;
}

export class Relay {
  readonly stats: RelayStats = { connected: 0, forwardedControl: 0, droppedNoDestination: 0, droppedNotAllowed: 0, droppedQueueFull: 0, refused: 0, circuitsOffered: 0 };
  readonly #cfg: RelayConfig;
  readonly #log: Logger;
  readonly #registry: ClusterStateFile;
  /** Writes the registry file; a write the disk refuses is logged once and tried again (the relay goes on from memory). */
  readonly #registryWriter: StateWriter<ClusterState>;
  #nodes: readonly NodeRecord[];
  /** The controller's revision the registry in memory is at (the watch resumes from it). */
  #revision: number;
  #members = new Map<string, RelayMember>();
  /** The relay stream of each node, by pin. */
  readonly #sessions = new Map<string, Session>();
  #server: Server | undefined;
  readonly #abort = new AbortController();
  #statsTimer: NodeJS.Timeout | undefined;
  #pin = '';
  readonly #circuits: CircuitBroker;
  #ops: OpsServer | undefined;
  /** The registry is known: from the saved file (non-empty) or a snapshot of the controller's watch. */
  #registryLoaded: boolean;

  constructor(cfg: RelayConfig, log: Logger) {
    this.#cfg = cfg;
    this.#log = log;
    this.#registry = new ClusterStateFile(join(cfg.dataDir, 'registry.json'));
    this.#registryWriter = new StateWriter({ log, write: (st) => this.#registry.save(st) }, {
      what: "the relay's registry", path: join(cfg.dataDir, 'registry.json'), meanwhile: 'the relay serves its members from memory',
      fix: "free space on the relay's data directory, or remount it read-write; the relay writes the file again by itself",
    });
    const saved = this.#registry.load();
    this.#nodes = saved.peers;
    this.#revision = saved.revision;
    this.#registryLoaded = this.#nodes.length > 0;
    this.#setMembers();
    this.#circuits = new CircuitBroker(log);
  }

  /** The circuits' counters: open, joined, lapsed offers, bad tokens, bytes carried. */
  get circuits(): Readonly<CircuitStats> {
    return this.#circuits.stats;
  }

  /** The relay's key pin: agents configure it as `tunnel.relay.pin`. */
  get pin(): string {
    return this.#pin;
  }

  /** Ready: it listens and knows the registered nodes (/readyz). */
  readiness(): Readiness {
    const reasons = [
      ...(this.#server?.listening ? [] : ['not listening']),
      ...(this.#registryLoaded ? [] : ['no registry yet: no saved copy, and the controller\'s node list has not arrived']),
    ];
    return { ready: reasons.length === 0, reasons };
  }

  /** The port of the metrics and health listener, when it runs. */
  get opsPort(): number | undefined {
    return this.#ops?.port;
  }

  /** Starts the metrics and health listener (when configured), loads or creates the key, listens, and starts following the controller. */
  async start(): Promise<void> {
    if (this.#cfg.metrics) {
      // loaded only when configured: prom-client stays out of the memory of a component without metrics
      const [{ Metrics }, { startOpsServer }, { registerRelayMetrics }] = await Promise.all([import('../adapters/ops/metrics.ts'), import('../adapters/ops/ops-server.ts'), import('./relay-metrics.ts')]);
      const metrics = new Metrics();
      registerRelayMetrics(metrics, { stats: this.stats, circuits: () => this.#circuits.stats, members: () => this.#members.size });
      this.#ops = await startOpsServer({ listen: this.#cfg.metrics.listen, registry: metrics.registry, readiness: () => this.readiness() });
    }
    try {
      await this.#listen();
    } catch (err) {
      await this.#ops?.close();
      throw err;
    }
  }

  async #listen(): Promise<void> {
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
    });
    this.#server = server;
    await this.#circuits.listen(this.#cfg.listenHost, this.#cfg.circuitPort);
    void this.#follow();
    let last = '';
    this.#statsTimer = setInterval(() => {
      this.#registryWriter.flush(); // a registry the disk refused before
      const now = JSON.stringify(this.stats);
      if (now !== last) this.#log.info('relay stats', { ...this.stats, circuits: { ...this.#circuits.stats } });
      last = now;
    }, STATS_LOG_MS);
    this.#statsTimer.unref();
    this.#log.info('relay started', { listen: `${this.#cfg.listenHost}:${this.#cfg.listenPort}`, circuitPort: this.#cfg.circuitPort, pin: this.#pin, members: this.#members.size });
  }

  #setMembers(): void {
    this.#members = new Map(relayMembers(this.#nodes).map((m) => [m.pin, m]));
    for (const [pin, s] of this.#sessions) {
      if (!this.#members.has(pin)) {
        s.stream.close(atollError('NODE_NOT_REGISTERED', `node ${s.member.name} is no longer registered with the controller under the key it connected with`,
          'the relay let it go; join the node again if it belongs to the cluster'));
      }
    }
  }

  #onStream(stream: TunnelStream): void {
    const member = this.#members.get(stream.peerPin) as RelayMember;
    stream.sendControl({ t: 'observed', host: stream.remote.host, port: stream.remote.port, circuitPort: this.#cfg.circuitPort });
    stream.on('control', (msg: ControlMessage) => {
      if (msg.t === 'circuit') {
        this.#offerCircuit(member, stream, msg);
        return;
      }
      if (msg.t !== 'hello') return; // answers only the relay sends
      // a node's relay stream (not a short observing connection): the newest one wins
      const old = this.#sessions.get(member.pin);
      this.#sessions.set(member.pin, { member, stream });
      this.stats.connected = this.#sessions.size;
      if (old && old.stream !== stream) old.stream.close();
      this.#log.info('node on the relay', { node: member.name, from: `${stream.remote.host}:${stream.remote.port}` });
    });
    const fromId = peerIdOfPin(member.pin);
    stream.on('relayed-control', (id: Uint8Array, _msg: unknown, body: Uint8Array) => this.#forward(member, fromId, id, body));
    stream.once('close', (err?: Error) => {
      if (this.#sessions.get(member.pin)?.stream !== stream) return;
      this.#sessions.delete(member.pin);
      this.stats.connected = this.#sessions.size;
      this.#log.info('node left the relay', { node: member.name, ...(err ? { err: err.message } : {}), ...(err instanceof AtollError ? { code: err.code } : {}) });
    });
  }

  /** The session of the node `pin` names, when it is here and may be connected with `from` (the registry as it is now). */
  #peerOf(from: RelayMember, pin: string): Session | undefined {
    const to = this.#sessions.get(pin);
    if (!to) {
      this.stats.droppedNoDestination++;
      return undefined;
    }
    // a node may have changed community since it connected
    const [a, b] = [this.#members.get(from.pin), this.#members.get(to.member.pin)];
    if (!a || !b || !relayAllows(a, b)) {
      this.stats.droppedNotAllowed++;
      return undefined;
    }
    return to;
  }

  /** Passes a relayed control message from `from` on to the node `toId` names, if it is here and the pair is allowed. */
  #forward(from: RelayMember, fromId: Uint8Array, toId: Uint8Array, body: Uint8Array): void {
    const to = this.#peerOf(from, pinOfPeerId(toId));
    if (!to) return;
    if (!to.stream.relay(fromId, body)) {
      this.stats.droppedQueueFull++;
      return;
    }
    this.stats.forwardedControl++;
  }

  /**
   * A node asks for a circuit to a peer (`circuit`): when the pair may be connected
   * and the peer is here, each gets a token (the asker `circuit-ready` with its nonce, the peer `circuit-join` naming
   * the asker); otherwise the asker gets `circuit-refused`.
   */
  #offerCircuit(from: RelayMember, stream: TunnelStream, msg: CircuitRequest): void {
    const to = this.#peerOf(from, msg.to);
    if (!to) {
      stream.sendControl({ t: 'circuit-refused', n: msg.n, reason: `${msg.to} is not on the relay or may not be connected with ${from.name}` });
      return;
    }
    const [mine, theirs] = this.#circuits.offer(`${from.name} -> ${to.member.name}`);
    this.stats.circuitsOffered++;
    stream.sendControl({ t: 'circuit-ready', n: msg.n, token: mine });
    to.stream.sendControl({ t: 'circuit-join', from: from.pin, token: theirs });
  }

  /** Follows the controller's node list (with backoff while it is unreachable), keeping the registry file current. */
  async #follow(): Promise<void> {
    const signal = this.#abort.signal;
    const backoff = new Backoff({ minMs: 500, maxMs: 30_000 }, sleep);
    while (!signal.aborted) {
      try {
        const caPem = await this.#ca();
        const client = new ControllerClient({ urls: this.#cfg.controller.urls, caPem, nodeName: 'relay', bearerToken: this.#cfg.controller.token });
        const lines = new WatchBatch(WATCH_SETTLE_MS, () => this.#nodes, (nodes, revision) => {
          this.#nodes = nodes;
          this.#revision = revision;
          this.#registryLoaded = true;
          this.#setMembers();
          this.#registryWriter.save({ blocks: [], revision, peers: nodes });
        });
        try {
          await client.watch(this.#revision, (line) => {
            if (line.type === 'ping') return;
            backoff.reset();
            lines.add(line);
          }, signal);
        } finally {
          lines.settle();
          client.close();
        }
      } catch (err) {
        if (signal.aborted) return;
        this.#log.warn('controller watch failed; the relay keeps its saved registry and retries', {
          err: err instanceof Error ? err.message : String(err), ...(err instanceof AtollError ? { code: err.code } : {}), retryInMs: backoff.delayMs,
        });
      }
      await backoff.wait(signal);
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
    this.#circuits.close();
    for (const s of this.#sessions.values()) s.stream.close();
    this.#sessions.clear();
    void this.#ops?.close();
  }
}
