/**
 * The agent's cross-site tunnel: the TUN device, the tunnel endpoint (packets to and from peers' streams, with the
 * source check), the routes of the peers' blocks into the TUN device, and the streams themselves: an edge node dials
 * every cloud peer (reconnecting with backoff), a cloud node listens and accepts only peers whose key matches a
 * registered peer's `tunnelKey`. What to do comes from the pure plan (src/core/tunnel/plan.ts) on every peer change
 * and every resync.
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
import { TunnelEndpoint } from '../adapters/tunnel-endpoint.ts';
import { dialTunnel, listenTunnel, type TunnelCredentials, type TunnelStream } from '../adapters/tunnel-stream.ts';

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
  readonly retryMinMs?: number;
  readonly retryMaxMs?: number;
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

  constructor(components: TunnelComponents, init: TunnelInit) {
    this.#c = components;
    this.#init = init;
  }

  get plan(): TunnelPlan {
    return this.#plan;
  }

  get endpoint(): TunnelEndpoint | undefined {
    return this.#endpoint;
  }

  /** Connections refused since start (unknown key, failed handshake). */
  get refused(): number {
    return this.#refused;
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
    this.#c.log.info('tunnel started', { device, mtu, role, ...(role === 'cloud' ? { listen: `${listenHost}:${port}` } : {}) });
  }

  /** A peer that dials us (an edge peer of a cloud node) with this pin. */
  #acceptable(pin: string): TunnelPeerPlan | undefined {
    return this.#plan.peers.find((p) => p.pin === pin && p.dial === undefined);
  }

  #attach(peer: TunnelPeerPlan, stream: TunnelStream): void {
    this.#endpoint?.attach(peer.name, stream);
    this.#c.log.info('tunnel stream up', { peer: peer.name, pin: peer.pin });
    stream.once('close', (err?: Error) => this.#c.log.info('tunnel stream closed', { peer: peer.name, ...(err ? { err: err.message } : {}) }));
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
    const plan = planTunnel({ name: this.#init.nodeName, role: this.#init.role, port: this.#init.port }, peers, remote);
    const changed = JSON.stringify(plan) !== JSON.stringify(this.#plan);
    this.#plan = plan;
    if (changed) {
      endpoint.setPeers(plan.peers.map((p) => ({ id: p.name, blocks: p.blocks })));
      this.#c.log.info('tunnel peers', { peers: plan.peers.map((p) => `${p.name} (${p.dial ? `dial ${p.dial.host}:${p.dial.port}` : 'accept'})`), skipped: plan.skipped });
    }
    this.#syncDialers(plan);
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
    const want = new Map(plan.peers.filter((p) => p.dial).map((p) => [p.name, p]));
    for (const [name, d] of this.#dialers) {
      const p = want.get(name);
      if (!p || dialKey(p) !== d.key) {
        d.abort.abort();
        this.#dialers.delete(name);
      }
    }
    for (const [name, p] of want) {
      if (this.#dialers.has(name)) continue;
      const d: Dialer = { key: dialKey(p), abort: new AbortController() };
      this.#dialers.set(name, d);
      void this.#dialLoop(p, d.abort.signal);
    }
  }

  /** Keeps one stream to `peer` up: dial, wait for it to close, dial again; backoff while dials fail. */
  async #dialLoop(peer: TunnelPeerPlan, signal: AbortSignal): Promise<void> {
    const min = this.#init.retryMinMs ?? 500;
    const max = this.#init.retryMaxMs ?? 30_000;
    const dial = peer.dial as { host: string; port: number };
    let backoff = min;
    let lastError = '';
    while (!signal.aborted) {
      try {
        const stream = await dialTunnel({ host: dial.host, port: dial.port, credentials: this.#init.credentials, peerPin: peer.pin, timeoutMs: 10_000 });
        if (signal.aborted) {
          stream.close();
          return;
        }
        this.#attach(peer, stream);
        lastError = '';
        const upAt = Date.now();
        const closed = new Promise<void>((resolve) => stream.once('close', () => resolve()));
        const onAbort = () => stream.close();
        signal.addEventListener('abort', onAbort, { once: true });
        await closed;
        signal.removeEventListener('abort', onAbort);
        // a stream the peer drops at once (it does not know our key yet, say) counts as a failed dial: back off
        if (Date.now() - upAt >= STABLE_STREAM_MS) backoff = min;
        await sleep(backoff, signal);
        backoff = Math.min(max, backoff * 2);
      } catch (err) {
        const message = err instanceof Error ? err.message : String(err);
        if (message !== lastError) this.#c.log.warn('tunnel dial failed; retrying with backoff', { peer: peer.name, err: message, retryInMs: backoff });
        lastError = message;
        await sleep(backoff, signal);
        backoff = Math.min(max, backoff * 2);
      }
    }
  }

  /** Stops dialling and listening, closes every stream and the TUN device (its routes go with it). */
  stop(): void {
    for (const d of this.#dialers.values()) d.abort.abort();
    this.#dialers.clear();
    this.#server?.close();
    this.#endpoint?.close();
    this.#endpoint = undefined;
  }
}

/** A stream that lived this long resets the dial backoff. */
const STABLE_STREAM_MS = 5000;

const dialKey = (p: TunnelPeerPlan) => `${p.pin}|${p.dial?.host}|${p.dial?.port}`;

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const done = () => {
      clearTimeout(t);
      signal.removeEventListener('abort', done);
      resolve();
    };
    const t = setTimeout(done, ms);
    signal.addEventListener('abort', done, { once: true });
  });
}
