/**
 * The agent's cross-site tunnel: the TUN device, the tunnel endpoint (packets to and from peers' streams, with the
 * source check), the routes of the peers' blocks into the TUN device, and the streams themselves: an edge node dials
 * every cloud peer (reconnecting with backoff), a cloud node listens and accepts only peers whose key matches a
 * registered peer's `tunnelKey`; edge peers of one community reach each other through the relay and hole-punch a
 * direct stream (below). What to do comes from the pure plan (src/core/tunnel/plan.ts) on every peer change and
 * every resync.
 *
 * Hole punching (DCUtR's idea over TCP simultaneous open): an edge node keeps one stream to the relay. For each punch
 * peer, the initiator (the name sorting first) opens a short connection to the relay from a fresh local port and
 * learns that port's public mapping; it sends it to the peer through the relay (`punch`); the peer does the same and
 * answers (`punch-ack`); both then connect to each other's public address from those ports until one TCP connection
 * comes up through both NATs, and run TLS on it with both keys pinned (the initiator as TLS client). Until then, and
 * whenever the direct stream breaks, packets go through circuits: each end asks the relay for one to the other, on
 * which it is the TLS client and receives (its reads then need no buffer allocation); both ends connect to the
 * relay's circuit port with the tokens it hands out and run TLS end to end over the joined connections
 * (src/relay/circuits.ts). A circuit closes a little after a direct stream took over. A failed punch (symmetric NAT)
 * is retried with backoff up to {@link PUNCH_RETRY_MAX_MS}; the circuits stay meanwhile.
 *
 * MTU: the TUN device gets the pods' MTU, so no packet a pod sends is too big for it; the stream is TCP, so the
 * underlay's MTU does not limit the tunnel's packets (TCP superpackets pass whole, GSO on both TUN devices).
 */
import type { Server } from 'node:tls';
import type { NodeRecord } from '../core/cluster/model.ts';
import { planTunnel, renderTunnelRouteDiff, type TunnelPeerPlan, type TunnelPlan, type TunnelRole, tunnelRoutes } from '../core/tunnel/plan.ts';
import { ROUTE_PROTO } from '../core/overlay/plan.ts';
import type { Logger } from '../core/ports.ts';
import type { IpRoute2 } from '../adapters/iproute2.ts';
import { openTun } from '../adapters/tun.ts';
import { type StreamKind, TunnelEndpoint } from '../adapters/tunnel-endpoint.ts';
import type { PeerPath, TunnelStatus } from '../core/tunnel/status.ts';
import type { TunnelCredentials } from '../adapters/tunnel-credentials.ts';
import { dialTunnel, joinCircuit, listenTunnel, punchTunnel } from '../adapters/tunnel-dial.ts';
import type { TunnelStream } from '../adapters/tunnel-stream.ts';
import type { CircuitReady, CircuitRefused, ControlMessage, PeerMessage, PunchAck, PunchRequest } from '../core/tunnel/messages.ts';
import { peerIdOfPin, pinOfPeerId } from '../core/tunnel/frame.ts';
import { Backoff, pollUntil } from '../core/retry.ts';
import { monotonicClock, sleep } from '../adapters/timers.ts';

export interface TunnelComponents {
  readonly ip: IpRoute2;
  readonly log: Logger;
}

export interface TunnelInit {
  readonly nodeName: string;
  readonly role: TunnelRole;
  readonly device: string;
  readonly port: number;
  /** Address a cloud node listens on ('0.0.0.0' for all). */
  readonly listenHost: string;
  readonly mtu: number;
  readonly credentials: TunnelCredentials;
  /** This node's community ('' for none): edge <-> edge paths only inside one. */
  readonly community: string;
  /** The relay (edge nodes): where it listens and its key pin. */
  readonly relay?: { readonly host: string; readonly port: number; readonly pin: string };
  readonly retryMinMs?: number;
  readonly retryMaxMs?: number;
  /** How long one hole-punching attempt may take. */
  readonly punchTimeoutMs?: number;
}

interface PunchState {
  attempts: number;
  successes: number;
  lastError: string;
}

interface Dialer {
  readonly key: string;
  readonly abort: AbortController;
}

export class Tunnel {
  readonly #c: TunnelComponents;
  readonly #init: TunnelInit;
  #endpoint: TunnelEndpoint | undefined;
  #server: Server | undefined;
  #plan: TunnelPlan = { peers: [], skipped: [] };
  readonly #dialers = new Map<string, Dialer>();
  #chain: Promise<void> = Promise.resolve();
  #refused = 0;
  readonly #abort = new AbortController();
  #relayStream: TunnelStream | undefined;
  /** The relay's circuit port, as its `observed` message says. */
  #circuitPort: number | undefined;
  readonly #punchers = new Map<string, Dialer>();
  readonly #circuitKeepers = new Map<string, Dialer>();
  readonly #punch = new Map<string, PunchState>();
  /** Answers awaited, by nonce: from the relay (circuit-ready, circuit-refused) and from peers (punch-ack). */
  readonly #circuitAnswers = new Map<string, (msg: CircuitReady | CircuitRefused) => void>();
  readonly #punchAnswers = new Map<string, (msg: PunchAck) => void>();
  readonly #pathSince = new Map<string, { path: PeerPath; since: number }>();

  constructor(components: TunnelComponents, init: TunnelInit) {
    this.#c = components;
    this.#init = init;
  }

  /** Opens the TUN device, starts the endpoint and, on a cloud node, the listener. @throws AtollError on failure. */
  async start(): Promise<void> {
    const { device, mtu, role, listenHost, port, credentials } = this.#init;
    const tun = openTun({ name: device, mtu });
    this.#endpoint = new TunnelEndpoint(tun, []);
    this.#endpoint.start();
    if (role === 'cloud') {
      const { server } = await listenTunnel({
        host: listenHost, port, credentials,
        acceptPin: (pin) => this.#acceptable(pin) !== undefined,
        onStream: (stream) => this.#attach(this.#acceptable(stream.peerPin) as TunnelPeerPlan, stream),
        onRefused: (reason) => {
          this.#refused++;
          this.#c.log.warn('tunnel connection refused', { reason });
        },
      });
      this.#server = server;
    }
    if (role === 'edge' && this.#init.relay) void this.#relayLoop(this.#init.relay, this.#abort.signal);
    this.#c.log.info('tunnel started', { device, mtu, role, ...(role === 'cloud' ? { listen: `${listenHost}:${port}` } : {}), ...(this.#init.relay ? { relay: `${this.#init.relay.host}:${this.#init.relay.port}` } : {}) });
  }

  /** A peer that dials us (an edge peer of a cloud node) with this pin. */
  #acceptable(pin: string): TunnelPeerPlan | undefined {
    return this.#plan.peers.find((p) => p.pin === pin && p.mode === 'accept');
  }

  #attach(peer: TunnelPeerPlan, stream: TunnelStream, kind: StreamKind = 'direct'): void {
    this.#endpoint?.attach(peer.name, stream, kind);
    const what = kind === 'direct' ? 'tunnel stream' : 'circuit';
    this.#c.log.info(`${what} up`, { peer: peer.name, pin: peer.pin, mode: peer.mode, remote: `${stream.remote.host}:${stream.remote.port}` });
    this.#notePath(peer.name);
    stream.once('close', (err?: Error) => {
      this.#c.log.info(`${what} closed`, { peer: peer.name, ...(err ? { err: err.message } : {}) });
      this.#notePath(peer.name);
    });
  }

  /** Logs a peer's path when it changed (direct, relayed, down) and remembers since when. */
  #notePath(name: string): void {
    const path = this.#endpoint?.pathOf(name) ?? 'down';
    const was = this.#pathSince.get(name);
    if (was?.path === path) return;
    this.#pathSince.set(name, { path, since: Date.now() });
    if (was) this.#c.log.info('tunnel path changed', { peer: name, from: was.path, to: path });
  }

  /**
   * Brings peers, routes and dialers in line with `peers`, of which `remote` are outside this node's site.
   * Serialised: calls run one after the other. A failed route batch is logged and retried at the next call.
   */
  sync(peers: readonly NodeRecord[], remote: ReadonlySet<string>): Promise<void> {
    this.#chain = this.#chain.then(() => this.#sync(peers, remote)).catch((err: unknown) => {
      this.#c.log.error('tunnel sync failed; retrying at the next resync', { err });
    });
    return this.#chain;
  }

  async #sync(peers: readonly NodeRecord[], remote: ReadonlySet<string>): Promise<void> {
    const endpoint = this.#endpoint;
    if (!endpoint) return;
    const { nodeName: name, role, port, community } = this.#init;
    const plan = planTunnel({ name, role, port, community, relay: this.#init.relay !== undefined }, peers, remote);
    const changed = JSON.stringify(plan) !== JSON.stringify(this.#plan);
    this.#plan = plan;
    if (changed) {
      endpoint.setPeers(plan.peers.map((p) => ({ id: p.name, blocks: p.blocks })));
      this.#c.log.info('tunnel peers', { peers: plan.peers.map((p) => `${p.name} (${p.dial ? `dial ${p.dial.host}:${p.dial.port}` : p.mode})`), skipped: plan.skipped });
      for (const p of plan.peers) this.#notePath(p.name);
    }
    this.#syncDialers(plan);
    this.#syncPunchers(plan);
    syncLoops(this.#circuitKeepers, plan.peers.filter((p) => p.mode === 'punch'), (p, signal) => this.#circuitLoop(p, signal));
    const device = this.#init.device;
    const have = (await this.#c.ip.json<{ dst: string; gateway?: string }>(['route', 'show', 'proto', String(ROUTE_PROTO), 'dev', device]))
      .filter((r) => !r.gateway).map((r) => (r.dst.includes('/') ? r.dst : `${r.dst}/32`));
    const lines = renderTunnelRouteDiff(tunnelRoutes(plan), have, device);
    if (lines.length > 0) {
      await this.#c.ip.batch(lines, { force: true }); // one refused line (a foreign route) must not stall the rest
      this.#c.log.info('tunnel routes updated', { changes: lines });
    }
  }

  #syncDialers(plan: TunnelPlan): void {
    syncLoops(this.#dialers, plan.peers.filter((p) => p.mode === 'dial'), (p, signal) => this.#dialLoop(p, signal));
  }

  #syncPunchers(plan: TunnelPlan): void {
    syncLoops(this.#punchers, plan.peers.filter((p) => p.mode === 'punch' && p.initiator), (p, signal) => this.#punchLoop(p, signal));
  }

  /** Keeps one stream to `peer` up: dial, wait for it to close, dial again; backoff while dials fail. */
  #dialLoop(peer: TunnelPeerPlan, signal: AbortSignal): Promise<void> {
    const dial = peer.dial as { host: string; port: number };
    return this.#keepUp({ what: 'tunnel', peer: peer.name }, { ...dial, pin: peer.pin }, signal, this.#init.retryMaxMs ?? 30_000, (stream) => {
      this.#attach(peer, stream);
      return () => {};
    });
  }

  /** Keeps one control stream to the relay up (an edge node): punching and circuits for punch peers. */
  #relayLoop(relay: { host: string; port: number; pin: string }, signal: AbortSignal): Promise<void> {
    return this.#keepUp({ what: 'relay', relay: `${relay.host}:${relay.port}` }, relay, signal, RELAY_RETRY_MAX_MS, (stream) => {
      stream.sendControl({ t: 'hello' });
      this.#relayStream = stream;
      stream.on('control', (msg: ControlMessage) => this.#onRelayControl(msg));
      stream.on('relayed-control', (id: Uint8Array, msg: PeerMessage) => this.#onRelayedControl(pinOfPeerId(id), msg));
      this.#c.log.info('relay stream up', { relay: `${relay.host}:${relay.port}` });
      return () => {
        this.#relayStream = undefined;
        this.#c.log.warn('relay stream closed; reconnecting', { relay: `${relay.host}:${relay.port}` });
      };
    });
  }

  /** The relay's own messages: its circuit port, answers to our circuit requests, and circuits peers asked for. */
  #onRelayControl(msg: ControlMessage): void {
    if (msg.t === 'observed') this.#circuitPort = msg.circuitPort;
    else if (msg.t === 'circuit-ready' || msg.t === 'circuit-refused') this.#circuitAnswers.get(msg.n)?.(msg);
    else if (msg.t === 'circuit-join') void this.#joinAsked(msg.from, msg.token);
  }

  /**
   * Our circuit to a punch peer (we receive on it): while the pair has no direct stream, keep one through the relay
   * (ask, join as the TLS client, wait for it to close); a little after a direct stream took over, close it.
   */
  async #circuitLoop(peer: TunnelPeerPlan, signal: AbortSignal): Promise<void> {
    const backoff = new Backoff({ minMs: CIRCUIT_RETRY_MIN_MS, maxMs: CIRCUIT_RETRY_MAX_MS }, sleep);
    let lastError = '';
    while (!signal.aborted) {
      const direct = this.#endpoint?.streamOf(peer.name);
      if (direct) {
        await untilClosed(direct, signal);
        continue;
      }
      const relay = this.#relayStream;
      const relayAt = this.#init.relay;
      if (!relay || !relayAt || this.#circuitPort === undefined) {
        await sleep(200, signal);
        continue;
      }
      try {
        const answer = await this.#ask(this.#circuitAnswers, (n) => relay.sendControl({ t: 'circuit', to: peer.pin, n }), 'the relay did not answer the circuit request within 5 s');
        if (answer.t === 'circuit-refused') throw new Error(`the relay refused the circuit: ${answer.reason}`);
        const stream = await joinCircuit({ host: relayAt.host, port: this.#circuitPort, token: answer.token, credentials: this.#init.credentials, peerPin: peer.pin, tlsRole: 'client' });
        if (signal.aborted) {
          stream.close();
          return;
        }
        this.#attach(peer, stream, 'circuitIn');
        backoff.reset();
        lastError = '';
        await this.#untilDirect(peer, stream, signal);
        if (stream.alive) {
          await sleep(CIRCUIT_LINGER_MS, signal); // packets in flight on it still arrive
          stream.close();
        }
      } catch (err) {
        const message = err instanceof Error ? err.message : String(err);
        if (message !== lastError) this.#c.log.warn('circuit through the relay failed; retrying with backoff', { peer: peer.name, err: message, retryInMs: backoff.delayMs });
        lastError = message;
        await backoff.wait(signal);
      }
    }
  }

  /** Resolves when `circuit` closed, or a direct stream to `peer` is up. */
  async #untilDirect(peer: TunnelPeerPlan, circuit: TunnelStream, signal: AbortSignal): Promise<void> {
    await pollUntil(() => !circuit.alive || this.#endpoint?.streamOf(peer.name) !== undefined, { intervalMs: CIRCUIT_CHECK_MS, signal }, { clock: monotonicClock, sleep });
  }

  /** A circuit the peer asked for (it receives on it, we send): join it as the TLS server. */
  async #joinAsked(fromPin: string, token: string): Promise<void> {
    const peer = this.#plan.peers.find((p) => p.pin === fromPin && p.mode === 'punch');
    const relayAt = this.#init.relay;
    if (!peer || !relayAt || this.#circuitPort === undefined) return;
    try {
      const stream = await joinCircuit({ host: relayAt.host, port: this.#circuitPort, token, credentials: this.#init.credentials, peerPin: peer.pin, tlsRole: 'server' });
      if (this.#abort.signal.aborted || !this.#plan.peers.some((p) => p.name === peer.name)) {
        stream.close();
        return;
      }
      this.#attach(peer, stream, 'circuitOut');
    } catch (err) {
      this.#c.log.warn('joining a circuit through the relay failed; the peer asks again', { peer: peer.name, err: err instanceof Error ? err.message : String(err) });
    }
  }

  /** Sends a request with a fresh nonce `n` (`send`) and waits (bounded) for the answer in `answers` carrying that nonce. */
  #ask<A>(answers: Map<string, (msg: A) => void>, send: (n: string) => void, timeoutText: string): Promise<A> {
    const n = Math.random().toString(16).slice(2, 14);
    const answered = new Promise<A>((resolve, reject) => {
      const t = setTimeout(() => {
        answers.delete(n);
        reject(new Error(timeoutText));
      }, ASK_TIMEOUT_MS);
      answers.set(n, (m) => {
        clearTimeout(t);
        answers.delete(n);
        resolve(m);
      });
    });
    send(n);
    return answered;
  }

  /**
   * Dials `to` (its key pinned), hands the stream to `up` (which returns what to do when it closes), waits for it to
   * close, and dials again; backoff while dials fail or streams die at once (the far end does not know our key yet).
   */
  async #keepUp(label: Record<string, string>, to: { host: string; port: number; pin: string }, signal: AbortSignal, maxBackoffMs: number,
    up: (stream: TunnelStream) => () => void): Promise<void> {
    const backoff = new Backoff({ minMs: this.#init.retryMinMs ?? 500, maxMs: Math.min(maxBackoffMs, this.#init.retryMaxMs ?? maxBackoffMs) }, sleep);
    let lastError = '';
    while (!signal.aborted) {
      try {
        const stream = await dialTunnel({ host: to.host, port: to.port, credentials: this.#init.credentials, peerPin: to.pin, timeoutMs: 10_000 });
        if (signal.aborted) {
          stream.close();
          return;
        }
        const down = up(stream);
        lastError = '';
        const upAt = Date.now();
        await untilClosed(stream, signal);
        down();
        if (Date.now() - upAt >= STABLE_STREAM_MS) backoff.reset();
      } catch (err) {
        const message = err instanceof Error ? err.message : String(err);
        if (message !== lastError) this.#c.log.warn(`${label.what} dial failed; retrying with backoff`, { ...label, err: message, retryInMs: backoff.delayMs });
        lastError = message;
      }
      await backoff.wait(signal);
    }
  }

  #onRelayedControl(fromPin: string, msg: PeerMessage): void {
    const peer = this.#plan.peers.find((p) => p.pin === fromPin && p.mode === 'punch');
    if (!peer) return; // not (or no longer) a peer we may reach: the relay should not have sent it
    if (msg.t === 'punch-ack') this.#punchAnswers.get(msg.n)?.(msg);
    else if (!peer.initiator) void this.#answerPunch(peer, msg);
  }

  /**
   * Our public address for a fresh local port, as the relay sees it: a short connection from that port. Under an
   * endpoint-independent NAT the peer can reach us there from now on (once we send to it).
   */
  async #observe(): Promise<{ localPort: number; host: string; port: number }> {
    const relay = this.#init.relay as { host: string; port: number; pin: string };
    let last: unknown;
    for (let i = 0; i < 3; i++) {
      const localPort = 20_000 + Math.floor(Math.random() * 40_000);
      try {
        const stream = await dialTunnel({ host: relay.host, port: relay.port, credentials: this.#init.credentials, peerPin: relay.pin, timeoutMs: 3000, localPort });
        try {
          const msg = await new Promise<ControlMessage>((resolve, reject) => {
            const t = setTimeout(() => reject(new Error('the relay did not say our address within 3 s')), 3000);
            stream.once('control', (m: ControlMessage) => {
              clearTimeout(t);
              resolve(m);
            });
          });
          if (msg.t !== 'observed') throw new Error(`the relay answered ${msg.t}, not observed`);
          return { localPort, host: msg.host, port: msg.port };
        } finally {
          stream.close();
        }
      } catch (err) {
        last = err;
      }
    }
    throw last;
  }

  #punchState(name: string): PunchState {
    let st = this.#punch.get(name);
    if (!st) this.#punch.set(name, (st = { attempts: 0, successes: 0, lastError: '' }));
    return st;
  }

  /** The initiator's side: while the peer has no direct stream, punch (through the relay's help), with backoff. */
  async #punchLoop(peer: TunnelPeerPlan, signal: AbortSignal): Promise<void> {
    const backoff = new Backoff({ minMs: PUNCH_RETRY_MIN_MS, maxMs: PUNCH_RETRY_MAX_MS }, sleep);
    while (!signal.aborted) {
      const direct = this.#endpoint?.streamOf(peer.name);
      if (direct) {
        await untilClosed(direct, signal);
        backoff.reset();
        await sleep(PUNCH_AFTER_CLOSE_MS, signal);
        continue;
      }
      const relay = this.#relayStream;
      if (!relay) {
        await sleep(500, signal);
        continue;
      }
      const st = this.#punchState(peer.name);
      st.attempts++;
      try {
        const me = await this.#observe();
        const ack = await this.#ask(this.#punchAnswers, (n) => relay.sendRelayedControl(peerIdOfPin(peer.pin), { t: 'punch', n, host: me.host, port: me.port }),
          'the peer did not answer the punch request through the relay within 5 s');
        await this.#punchTo(peer, { host: ack.host, port: ack.port }, me.localPort, 'client', signal);
      } catch (err) {
        const message = err instanceof Error ? err.message : String(err);
        if (message !== st.lastError) this.#c.log.info('hole punching failed; the relay carries the traffic meanwhile', { peer: peer.name, err: message, retryInMs: backoff.delayMs });
        st.lastError = message;
        await backoff.wait(signal);
      }
    }
  }

  /**
   * Connects to `peer` at its public address from `localPort` (both ends at once), and on success makes the stream
   * the peer's direct path, unless we stopped or the peer left the plan meanwhile. @throws when punching failed.
   */
  async #punchTo(peer: TunnelPeerPlan, at: { host: string; port: number }, localPort: number, tlsRole: 'client' | 'server', signal: AbortSignal): Promise<void> {
    const stream = await punchTunnel({
      ...at, localPort, credentials: this.#init.credentials, peerPin: peer.pin, tlsRole, deadlineMs: this.#init.punchTimeoutMs ?? PUNCH_TIMEOUT_MS, streamOptions: PUNCHED_STREAM,
    });
    if (signal.aborted || !this.#plan.peers.some((p) => p.name === peer.name)) {
      stream.close();
      return;
    }
    const st = this.#punchState(peer.name);
    st.successes++;
    st.lastError = '';
    this.#attach(peer, stream);
  }

  /** The responder's side of a punch request: learn our public address, answer, and connect at the same time. */
  async #answerPunch(peer: TunnelPeerPlan, msg: PunchRequest): Promise<void> {
    const st = this.#punchState(peer.name);
    st.attempts++;
    try {
      const me = await this.#observe();
      this.#relayStream?.sendRelayedControl(peerIdOfPin(peer.pin), { t: 'punch-ack', n: msg.n, host: me.host, port: me.port });
      await this.#punchTo(peer, { host: msg.host, port: msg.port }, me.localPort, 'server', this.#abort.signal);
    } catch (err) {
      st.lastError = err instanceof Error ? err.message : String(err);
    }
  }

  /** Path, round trip and traffic of every peer, for `atoll peers`. */
  status(): TunnelStatus {
    const endpoint = this.#endpoint;
    const relay = this.#init.relay;
    return {
      role: this.#init.role,
      ...(relay ? { relay: { address: `${relay.host}:${relay.port}`, connected: this.#relayStream?.alive ?? false, rttMs: this.#relayStream?.rttMs } } : {}),
      peers: this.#plan.peers.map((p) => {
        const path = endpoint?.pathOf(p.name) ?? 'down';
        const t = endpoint?.trafficOf(p.name);
        const punch = this.#punch.get(p.name);
        return {
          name: p.name, role: p.role, mode: p.mode, path,
          rttMs: (path === 'direct' ? endpoint?.streamOf(p.name) : endpoint?.circuitOf(p.name))?.rttMs,
          txBytes: t?.txBytes ?? 0, rxBytes: t?.rxBytes ?? 0, txPackets: t?.txPackets ?? 0, rxPackets: t?.rxPackets ?? 0,
          since: this.#pathSince.get(p.name)?.since ?? 0,
          ...(punch ? { punch: { ...punch } } : {}),
        };
      }),
      skipped: this.#plan.skipped,
      refusedConnections: this.#refused,
      dropped: endpoint ? { noPeer: endpoint.stats.droppedNoPeer, noPath: endpoint.stats.droppedNoStream, badSource: endpoint.stats.droppedBadSource, tunWrite: endpoint.stats.droppedTunWrite } : {},
    };
  }

  /** Stops dialling, punching and listening, closes every stream and the TUN device (its routes go with it). */
  stop(): void {
    this.#abort.abort();
    for (const loops of [this.#dialers, this.#punchers, this.#circuitKeepers]) {
      for (const d of loops.values()) d.abort.abort();
      loops.clear();
    }
    this.#server?.close();
    this.#endpoint?.close();
    this.#endpoint = undefined;
  }
}

/** The relay carries every relayed pair and coordinates punching: an edge retries it at least this often. */
const RELAY_RETRY_MAX_MS = 5000;
/** A stream that lived this long resets the dial backoff. */
const STABLE_STREAM_MS = 5000;
/**
 * A punched stream is declared dead after 3 s without a byte from the peer (its keepalives come every second whatever
 * our send queue holds), so a broken direct path falls back to the relay within about 3 s. Streams without a
 * fallback keep the longer default: a short cut then costs nothing.
 */
const PUNCHED_STREAM = { deadAfterMs: 3000 } as const;
/** One hole-punching attempt: both ends connecting to each other until this deadline. */
const PUNCH_TIMEOUT_MS = 5000;
const PUNCH_RETRY_MIN_MS = 2000;
/** A pair that cannot punch (symmetric NAT) tries again this often at most; meanwhile the relay carries it. */
const PUNCH_RETRY_MAX_MS = 60_000;
/** After a direct stream closed, wait this long before punching again (the relay carries packets meanwhile). */
const PUNCH_AFTER_CLOSE_MS = 1000;
/** A request to the relay or, through it, to a peer is answered within this long, or it failed. */
const ASK_TIMEOUT_MS = 5000;
/** A circuit that failed is asked for again after this long, doubling up to CIRCUIT_RETRY_MAX_MS. */
const CIRCUIT_RETRY_MIN_MS = 250;
const CIRCUIT_RETRY_MAX_MS = 5000;
/** How often a circuit's keeper looks whether a direct stream took over... */
const CIRCUIT_CHECK_MS = 250;
/** ...and how long the circuit stays after that, for the packets already on it. */
const CIRCUIT_LINGER_MS = 2000;

const loopKey = (p: TunnelPeerPlan) => `${p.pin}|${p.mode}|${p.dial?.host}|${p.dial?.port}`;

/** Runs `loop` once per peer in `want`, restarting it when the peer's key, mode or address changes; stops the rest. */
function syncLoops(loops: Map<string, Dialer>, want: readonly TunnelPeerPlan[], loop: (p: TunnelPeerPlan, signal: AbortSignal) => Promise<void>): void {
  const byName = new Map(want.map((p) => [p.name, p]));
  for (const [name, d] of loops) {
    const p = byName.get(name);
    if (!p || loopKey(p) !== d.key) {
      d.abort.abort();
      loops.delete(name);
    }
  }
  for (const [name, p] of byName) {
    if (loops.has(name)) continue;
    const d: Dialer = { key: loopKey(p), abort: new AbortController() };
    loops.set(name, d);
    void loop(p, d.abort.signal);
  }
}

/** Resolves when `stream` closes; closes it when `signal` aborts first. */
async function untilClosed(stream: TunnelStream, signal: AbortSignal): Promise<void> {
  if (!stream.alive) return;
  const closed = new Promise<void>((resolve) => stream.once('close', () => resolve()));
  const onAbort = () => stream.close();
  signal.addEventListener('abort', onAbort, { once: true });
  await closed;
  signal.removeEventListener('abort', onAbort);
}
