/**
 * The operations listener each component (agent, controller, relay) serves when its configuration has a `metrics`
 * section: plain HTTP, read only, for probes and Prometheus.
 *
 *   GET /healthz   200 while the process serves HTTP at all (liveness: restart it when this stops answering)
 *   GET /readyz    200 when the component does its job now, else 503 with the reasons, one a line
 *   GET /metrics   the component's metrics in the Prometheus text format (prom-client renders them; the values
 *                  come from the component's own counters, read by collect callbacks at scrape time)
 *
 * Why a listener of its own, not the controller's API or the agent's status socket: probes and Prometheus need
 * plain HTTP without client certificates or root, and none of it may be reachable where the API is (it binds to
 * loopback by default). Anything else gets a clear HTTP error and changes nothing: another method 405, another
 * path 404, a body 413, headers over 8 KiB 431 (Node's parser).
 */
import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import type { Registry } from 'prom-client';
import { atollError } from '../../core/errors.ts';

// not an ESM import, whose facade loads far more (the rule in eslint.config.js says why)
const { createServer } = process.getBuiltinModule('node:http');

/** Whether the component is ready, and if not why (each reason one short sentence). */
export interface Readiness {
  readonly ready: boolean;
  readonly reasons: readonly string[];
}

export interface OpsServerInit {
  /** `host:port`; port 0 picks a free one (see {@link OpsServer.port}). */
  readonly listen: string;
  readonly registry: Registry;
  readonly readiness: () => Readiness;
}

export interface OpsServer {
  readonly port: number;
  close(): Promise<void>;
}

const MAX_HEADER_BYTES = 8 * 1024;
const ROUTES = ['/healthz', '/readyz', '/metrics'];

/** Splits `host:port` (IPv6 hosts in brackets). */
export function splitHostPort(listen: string): { host: string; port: number } {
  const colon = listen.lastIndexOf(':');
  return { host: listen.slice(0, colon).replace(/^\[|\]$/g, ''), port: Number(listen.slice(colon + 1)) };
}

/**
 * Listens on `init.listen`.
 * @throws AtollError CONFIG_FILE_INVALID when the address cannot be bound (in use, not on this host).
 */
export async function startOpsServer(init: OpsServerInit): Promise<OpsServer> {
  const server: Server = createServer({ maxHeaderSize: MAX_HEADER_BYTES }, (req, res) => void handle(req, res, init));
  server.headersTimeout = 5000;
  server.requestTimeout = 10_000;
  const { host, port } = splitHostPort(init.listen);
  await new Promise<void>((resolve, reject) => {
    server.once('error', (cause) => reject(atollError('OPS_LISTEN_FAILED', `cannot listen for metrics and health on ${init.listen}: ${cause.message}`,
      'choose another metrics.listen address (a free port on an address of this host)', cause)));
    server.listen(port, host, () => resolve());
  });
  const address = server.address();
  return {
    port: typeof address === 'object' && address ? address.port : port,
    close: () => new Promise<void>((resolve) => {
      server.close(() => resolve());
      server.closeAllConnections();
    }),
  };
}

function answer(res: ServerResponse, status: number, body: string, headers: Record<string, string> = {}): void {
  res.writeHead(status, { 'content-type': 'text/plain; charset=utf-8', 'cache-control': 'no-store', ...headers });
  res.end(body);
}

async function handle(req: IncomingMessage, res: ServerResponse, init: OpsServerInit): Promise<void> {
  const path = (req.url ?? '/').split('?')[0];
  if (!ROUTES.includes(path ?? '')) {
    answer(res, 404, `no such path ${JSON.stringify((req.url ?? '').slice(0, 200))}; try ${ROUTES.join(', ')}\n`);
    return;
  }
  if (req.method !== 'GET' && req.method !== 'HEAD') {
    answer(res, 405, `${req.method} is not allowed here: the endpoints are read only (GET)\n`, { allow: 'GET, HEAD' });
    return;
  }
  if (Number(req.headers['content-length'] ?? 0) > 0 || req.headers['transfer-encoding'] !== undefined) {
    answer(res, 413, 'a request body is not accepted here\n', { connection: 'close' });
    req.destroy();
    return;
  }
  try {
    if (path === '/healthz') return answer(res, 200, 'ok\n');
    if (path === '/readyz') {
      const r = init.readiness();
      return answer(res, r.ready ? 200 : 503, r.ready ? 'ready\n' : `not ready:\n${r.reasons.map((s) => `- ${s}\n`).join('')}`);
    }
    const text = await init.registry.metrics();
    answer(res, 200, text, { 'content-type': init.registry.contentType });
  } catch (err) {
    answer(res, 500, `failed to answer ${path}: ${err instanceof Error ? err.message : String(err)}\n`);
  }
}
