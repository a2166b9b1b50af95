/**
 * The agent's status socket: HTTP on a unix socket beside the CNI socket (root only, mode 0600), read by
 * `atoll peers`, `atoll status`, `atoll trace` and the lab. `GET /v1/peers` answers the tunnel's {@link TunnelStatus}
 * as JSON (`{"tunnel": null}` on a node without a tunnel); `GET /v1/status` the whole {@link AgentStatus};
 * `GET /v1/policy/explain?from=IP&to=IP[&port=tcp/80]` the {@link PolicyTrace} of that flow (404 when the agent
 * enforces no NetworkPolicy, 400 with `error` and `code` for a question it cannot read). An adapter,
 * not part of the agent, because both sides use it: the agent serves it, the CLI and the lab read it.
 */
import { chmodSync, unlinkSync } from 'node:fs';
import type { Server } from 'node:http';
import { asAtollError, atollError } from '../../core/errors.ts';
import { dirname, join } from 'node:path';
import type { TunnelStatus } from '../../core/tunnel/status.ts';
import type { AgentStatus } from '../../core/ops/agent-status.ts';
import type { PolicyTrace } from '../../core/ops/policy-trace.ts';

// not an ESM import, whose facade loads far more (the rule in eslint.config.js says why)
const { createServer, request } = process.getBuiltinModule('node:http');

/** Where the status socket of the agent whose CNI socket is `socketPath` listens. */
export function statusSocketOf(socketPath: string): string {
  return join(dirname(socketPath), 'atoll-status.sock');
}

/** What the status socket answers from. */
export interface StatusSources {
  readonly tunnel: () => TunnelStatus | undefined;
  readonly status: () => AgentStatus;
  /** Absent when the agent enforces no NetworkPolicy. @throws AtollError for a question it cannot read. */
  readonly policyTrace?: (q: { readonly from: string; readonly to: string; readonly port: string | undefined }) => PolicyTrace | Promise<PolicyTrace>;
}

export async function startStatusServer(path: string, sources: StatusSources): Promise<Server> {
  const { tunnel, status, policyTrace } = sources;
  try {
    unlinkSync(path);
  } catch {
    // no stale socket
  }
  const server = createServer((req, res) => {
    if (req.method === 'GET' && req.url === '/v1/peers') {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ tunnel: tunnel() ?? null }));
      return;
    }
    if (req.method === 'GET' && req.url === '/v1/status') {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify(status()));
      return;
    }
    const url = new URL(req.url ?? '/', 'http://status');
    if (req.method === 'GET' && url.pathname === '/v1/policy/explain' && policyTrace) {
      const q = { from: url.searchParams.get('from') ?? '', to: url.searchParams.get('to') ?? '', port: url.searchParams.get('port') ?? undefined };
      Promise.resolve().then(() => policyTrace(q)).then((answer) => {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify(answer));
      }, (err: unknown) => {
        const e = asAtollError(err);
        res.writeHead(e.code === 'POLICY_TRACE_INVALID' ? 400 : 500, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ error: e.message, code: e.code }));
      });
      return;
    }
    res.writeHead(404, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ error: `no such status path ${req.method} ${req.url}; try GET /v1/peers or GET /v1/status` }));
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(path, () => resolve());
  });
  chmodSync(path, 0o600);
  return server;
}

/**
 * Reads the tunnel status from the agent's status socket at `socketPath` (null: the node runs no tunnel).
 * @throws AtollError AGENT_UNREACHABLE when nothing answers there, or not with JSON.
 */
export async function readTunnelStatus(socketPath: string, timeoutMs = 5000): Promise<TunnelStatus | null> {
  return (await getJson<{ tunnel: TunnelStatus | null }>(socketPath, '/v1/peers', timeoutMs)).tunnel;
}

/**
 * Reads the agent's whole status from its status socket at `socketPath`.
 * @throws AtollError AGENT_UNREACHABLE when nothing answers there, or not with the status.
 */
export function readAgentStatus(socketPath: string, timeoutMs = 5000): Promise<AgentStatus> {
  return getJson<AgentStatus>(socketPath, '/v1/status', timeoutMs);
}

/**
 * Asks the agent at `socketPath` which policy and rule let a flow through, or which side drops it (its own plan).
 * @throws AtollError AGENT_UNREACHABLE when nothing answers there, or it enforces no NetworkPolicy (HTTP 404).
 */
export function readPolicyTrace(socketPath: string, q: { readonly from: string; readonly to: string; readonly port?: string }, timeoutMs = 5000): Promise<PolicyTrace> {
  const query = new URLSearchParams({ from: q.from, to: q.to, ...(q.port ? { port: q.port } : {}) });
  return getJson<PolicyTrace>(socketPath, `/v1/policy/explain?${query}`, timeoutMs);
}

function getJson<T>(socketPath: string, path: string, timeoutMs: number): Promise<T> {
  return new Promise((resolve, reject) => {
    const req = request({ socketPath, path, method: 'GET', timeout: timeoutMs }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (d: Buffer) => chunks.push(d));
      res.on('end', () => {
        if (res.statusCode !== 200) {
          reject(atollError('AGENT_UNREACHABLE', `the agent's status socket ${socketPath} does not answer GET ${path} (HTTP ${res.statusCode})`,
            'run the same Atoll version as the agent (an older agent lacks it)'));
          return;
        }
        try {
          resolve(JSON.parse(Buffer.concat(chunks).toString('utf8')) as T);
        } catch (cause) {
          reject(atollError('AGENT_UNREACHABLE', `the agent's status socket ${socketPath} answered something that is not JSON`, 'check that an atoll agent owns that socket', cause));
        }
      });
    });
    // only a cause: the 'error' handler below rejects with AGENT_UNREACHABLE naming it
    req.on('timeout', () => req.destroy(new Error(`no answer within ${timeoutMs} ms`)));
    req.on('error', (cause: NodeJS.ErrnoException) => reject((cause.code === 'ECONNRESET')
      // something listens there but closed the connection without an HTTP answer: most often the CNI socket beside it
      ? atollError('AGENT_UNREACHABLE', `${socketPath} accepted the connection and closed it without an answer: not an agent's status socket, or the agent stopped while answering`,
        `if it is the agent's CNI socket, its status socket is ${statusSocketOf(socketPath)}: point --socket there, or use --config AGENT_CONFIG`, cause)
      : atollError('AGENT_UNREACHABLE', `cannot read the agent's status at ${socketPath}: ${cause.message}`,
        'start the agent, or point at its socket with --config AGENT_CONFIG or --socket PATH (run as root)', cause)));
    req.end();
  });
}
