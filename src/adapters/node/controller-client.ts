/**
 * The agent's client of the controller API (src/controller/api-server.ts): HTTPS with the pinned controller CA,
 * every request signed with the node key, fail-over across controller URLs (a follower's "not leader" answer points
 * to the leader). A client keeps its connections alive and resumes TLS sessions (its own agent, one TLS context for
 * its life): a usage report every few seconds from every node then costs the controller no full handshake each.
 */
import type { IncomingMessage } from 'node:http';
import { Agent, request, type RequestOptions } from 'node:https';
import { type ConnectionOptions, createSecureContext, type SecureContext } from 'node:tls';
import { AtollError, atollError, ERROR_CATALOGUE, type ErrorCode } from '../../core/errors.ts';
import type { NodeRecord, NodeFields, NodeUsage } from '../../core/cluster/model.ts';
import { type NodeIdentity, signRequest } from './node-identity.ts';
import { decodeWatchLine, type WatchLine } from '../../config/watch-line.ts';
import { decodePolicyLine } from '../../config/policy-line.ts';
import type { PolicyLine } from '../../core/policy/scope.ts';

export interface ControllerClientInit {
  readonly urls: readonly string[];
  readonly caPem: string;
  /** A node signs every request with its key... */
  readonly identity?: NodeIdentity;
  readonly nodeName: string;
  /** ...a relay sends its relay token instead (it may only watch). */
  readonly bearerToken?: string;
  readonly timeoutMs?: number;
}

export type { WatchLine };

interface Answer {
  readonly status: number;
  readonly body: unknown;
}

/** Errors worth trying the next controller for. */
function retryable(err: unknown): boolean {
  return !(err instanceof AtollError) || err.code === 'CONTROLLER_UNREACHABLE' || err.code === 'API_NOT_LEADER' || err.code === 'STORE_UNAVAILABLE';
}

export class ControllerClient {
  readonly #init: ControllerClientInit;
  /** The pinned CA as one context, not parsed again for each connection. */
  readonly #tls: SecureContext;
  /** This client's connections only: its pool and session cache are keyed by host, not by CA. */
  readonly #agent = new Agent({ keepAlive: true });
  #preferred = 0;

  constructor(init: ControllerClientInit) {
    this.#init = init;
    this.#tls = createSecureContext({ ca: init.caPem });
  }

  /** Closes the connections kept alive (a watch under way ends with an error); the client is not used after. */
  close(): void {
    this.#agent.destroy();
  }

  /** The controller URL that answered last. */
  get url(): string {
    return this.#init.urls[this.#preferred] as string;
  }

  join(token: string, identity: string, fields: NodeFields): Promise<{ node: NodeRecord; blocks: string[] }> {
    return this.#call('POST', '/v1/join', { ...fields, token, name: this.#init.nodeName, identity }) as Promise<{ node: NodeRecord; blocks: string[] }>;
  }

  update(fields: NodeFields): Promise<{ node: NodeRecord }> {
    return this.#call('PUT', `/v1/nodes/${this.#init.nodeName}`, fields) as Promise<{ node: NodeRecord }>;
  }

  reportUsage(usage: Omit<NodeUsage, 'at'>): Promise<{ blocks: string[] }> {
    return this.#call('POST', `/v1/nodes/${this.#init.nodeName}/usage`, usage) as Promise<{ blocks: string[] }>;
  }

  /**
   * Streams node changes after `after` (0: a snapshot first) until the stream ends, the signal aborts, or no line
   * arrives for `idleMs` (the server pings every 15 s). Resolves when the stream ends; rejects when it cannot start.
   */
  watch(after: number, onLine: (line: WatchLine) => void, signal: AbortSignal, idleMs = 45_000): Promise<void> {
    return this.#follow(`/v1/watch?after=${after}`, decodeWatchLine, onLine, signal, idleMs);
  }

  /**
   * Streams this node's part of the NetworkPolicy state: a snapshot, then changes, until the stream ends, the signal
   * aborts, or no line arrives for `idleMs`. Rejects with POLICY_NOT_SERVED when the controller follows no Kubernetes.
   */
  watchPolicy(onLine: (line: PolicyLine, from: string) => void, signal: AbortSignal, idleMs = 45_000): Promise<void> {
    return this.#follow('/v1/policy', decodePolicyLine, onLine, signal, idleMs);
  }

  /**
   * Tells controller `from` (the one whose policy stream sent the mark) that this node applied what came before mark
   * `seq` of stream `stream`; resolves whether it knew that mark.
   */
  async policyApplied(from: string, stream: string, seq: number): Promise<boolean> {
    const ans = await this.#send(from, 'POST', '/v1/policy/applied', Buffer.from(JSON.stringify({ stream, seq })));
    return (ans.body as { known?: unknown }).known === true;
  }

  /**
   * Which of the addresses this node released another pod may take now. Every controller replica is asked, as each
   * knows only what the nodes it served applied; an address is reusable when every one says so. Rejects when any
   * cannot answer.
   */
  async reusable(addresses: readonly { readonly ip: string; readonly namespace: string; readonly name: string }[]): Promise<Set<string>> {
    const payload = Buffer.from(JSON.stringify({ addresses }));
    const answers = await Promise.all(this.#init.urls.map((u) => this.#send(u, 'POST', `/v1/nodes/${this.#init.nodeName}/reusable`, payload)));
    const sets = answers.map((a) => {
      const listed = (a.body as { reusable?: unknown }).reusable;
      return new Set(Array.isArray(listed) ? listed.filter((ip) => typeof ip === 'string') : []);
    });
    return new Set(addresses.map((a) => a.ip).filter((ip) => sets.every((s) => s.has(ip))));
  }

  async #follow<L>(path: string, decode: (text: string, source: string) => L, onLine: (line: L, from: string) => void, signal: AbortSignal, idleMs: number): Promise<void> {
    let lastErr: unknown;
    for (let i = 0; i < this.#init.urls.length; i++) {
      const idx = (this.#preferred + i) % this.#init.urls.length;
      try {
        await this.#stream(this.#init.urls[idx] as string, path, decode, onLine, signal, idleMs);
        this.#preferred = idx;
        return;
      } catch (err) {
        lastErr = err;
        if (signal.aborted || !retryable(err)) throw err;
      }
    }
    throw lastErr;
  }

  async #call(method: string, path: string, body: unknown): Promise<unknown> {
    const payload = Buffer.from(JSON.stringify(body));
    let lastErr: unknown;
    const tried = new Set<string>();
    let next: string | undefined = this.url;
    for (let i = 0; i < this.#init.urls.length + 1 && next; i++) {
      const url: string = next;
      tried.add(url);
      try {
        const ans = await this.#send(url, method, path, payload);
        this.#preferred = Math.max(0, this.#init.urls.indexOf(url));
        return ans.body;
      } catch (err) {
        lastErr = err;
        if (!retryable(err)) throw err;
        const hint = err instanceof AtollError && err.code === 'API_NOT_LEADER' ? leaderHint(err) : undefined;
        next = hint && !tried.has(hint) ? hint : this.#init.urls.find((u) => !tried.has(u));
      }
    }
    throw lastErr;
  }

  /** Request options on this client's agent and TLS context (https passes `secureContext` on to tls.connect). */
  #options(opts: RequestOptions): RequestOptions {
    const options: RequestOptions & Pick<ConnectionOptions, 'secureContext'> = { ...opts, agent: this.#agent, secureContext: this.#tls };
    return options;
  }

  #headers(method: string, path: string, payload: Buffer): Record<string, string> {
    const { identity, bearerToken } = this.#init;
    // cannot happen: the agent passes its node identity, the relay its controller.token (required by its schema)
    if (!identity && bearerToken === undefined) throw new Error('a controller client needs a node identity or a bearer token');
    return {
      'content-type': 'application/json',
      'content-length': String(payload.length),
      ...(identity ? signRequest(identity, { method, path, node: this.#init.nodeName, body: payload, now: Date.now() }) : { authorization: `Bearer ${bearerToken}` }),
    };
  }

  #send(base: string, method: string, path: string, payload: Buffer): Promise<Answer> {
    const url = new URL(path, base);
    return new Promise((resolve, reject) => {
      const req = request(url, this.#options({ method, headers: this.#headers(method, path, payload), timeout: this.#init.timeoutMs ?? 10_000 }), (res) => {
        readJson(res).then((parsed) => {
          const status = res.statusCode ?? 0;
          if (status >= 200 && status < 300) resolve({ status, body: parsed });
          else reject(answerError(base, status, parsed));
        }, reject);
      });
      // only a cause: the 'error' handler below rejects with CONTROLLER_UNREACHABLE naming it
      req.on('timeout', () => req.destroy(new Error(`no answer within ${this.#init.timeoutMs ?? 10_000} ms`)));
      req.on('error', (cause) => reject(atollError('CONTROLLER_UNREACHABLE', `controller ${base} unreachable: ${cause.message}`, 'the agent keeps working from its local state and retries', cause)));
      req.end(payload);
    });
  }

  #stream<L>(base: string, path: string, decode: (text: string, source: string) => L, onLine: (l: L, from: string) => void, signal: AbortSignal, idleMs: number): Promise<void> {
    const url = new URL(path, base);
    const empty = Buffer.alloc(0);
    return new Promise((resolve, reject) => {
      const req = request(url, this.#options({ method: 'GET', headers: this.#headers('GET', path, empty), signal }), (res) => {
        if (res.statusCode !== 200) {
          readJson(res).then((parsed) => reject(answerError(base, res.statusCode ?? 0, parsed)), reject);
          return;
        }
        let buf = '';
        // only a cause, here and below: the request's 'error' handler rejects with CONTROLLER_UNREACHABLE naming it
        let idle = setTimeout(() => req.destroy(new Error('watch stream idle')), idleMs);
        res.setEncoding('utf8');
        res.on('data', (d: string) => {
          clearTimeout(idle);
          idle = setTimeout(() => req.destroy(new Error('watch stream idle')), idleMs);
          buf += d;
          let nl: number;
          try {
            while ((nl = buf.indexOf('\n')) >= 0) {
              const text = buf.slice(0, nl);
              buf = buf.slice(nl + 1);
              if (text) onLine(decode(text, base), base);
            }
          } catch (err) {
            // a bad line (CONTROLLER_WATCH_INVALID) or a failing handler ends this watch; the caller watches again
            clearTimeout(idle);
            reject(err);
            req.destroy();
          }
        });
        res.on('end', () => {
          clearTimeout(idle);
          resolve();
        });
        res.on('error', (e) => {
          clearTimeout(idle);
          reject(e);
        });
      });
      req.on('error', (cause) => reject(signal.aborted ? cause : atollError('CONTROLLER_UNREACHABLE', `controller ${base} unreachable: ${cause.message}`, 'retrying', cause)));
      req.end();
    });
  }
}

/** The whole body of a response as JSON; undefined when it is not JSON. */
function readJson(res: IncomingMessage): Promise<unknown> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    res.on('data', (d: Buffer) => chunks.push(d));
    res.on('end', () => {
      try {
        resolve(JSON.parse(Buffer.concat(chunks).toString('utf8')));
      } catch {
        resolve(undefined);
      }
    });
    res.on('error', reject);
  });
}

function answerError(base: string, status: number, body: unknown): AtollError {
  const b = (body ?? {}) as { code?: string; message?: string; fix?: string; leaderUrl?: string };
  const fallback: ErrorCode = status >= 500 ? 'STORE_UNAVAILABLE' : 'API_BAD_REQUEST';
  const code = b.code !== undefined && b.code in ERROR_CATALOGUE ? (b.code as ErrorCode) : fallback;
  const err = atollError(code, `controller ${base} answered ${status}: ${b.message ?? 'no message'}`, b.fix);
  if (b.leaderUrl) Object.assign(err, { leaderUrl: b.leaderUrl });
  return err;
}

function leaderHint(err: AtollError): string | undefined {
  return (err as AtollError & { leaderUrl?: string }).leaderUrl;
}

/** An operator's request to the controller with the admin token (atoll ipam, atoll node). */
export function adminRequest(base: string, caPem: string, adminToken: string, method: string, path: string): Promise<unknown> {
  return new Promise((resolve, reject) => {
    const req = request(new URL(path, base), { method, ca: caPem, headers: { authorization: `Bearer ${adminToken}` }, timeout: 15_000 }, (res) => {
      readJson(res).then((body) => {
        const status = res.statusCode ?? 0;
        if (status >= 200 && status < 300) resolve(body);
        else reject(answerError(base, status, body));
      }, reject);
    });
    // only a cause: the 'error' handler below rejects with CONTROLLER_UNREACHABLE naming it
    req.on('timeout', () => req.destroy(new Error('no answer within 15 s')));
    req.on('error', (cause) => reject(atollError('CONTROLLER_UNREACHABLE', `controller ${base} unreachable: ${cause.message}`, 'check that the controller runs and the URL', cause)));
    req.end();
  });
}
