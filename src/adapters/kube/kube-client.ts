/**
 * A small Kubernetes API client on node:https: the few verbs the controller needs (get, list with paging, watch,
 * create, update with resourceVersion, merge patch, delete with preconditions), one keep-alive agent, bearer token
 * or client certificate. Why not `@kubernetes/client-node`: it adds about 70 MB of idle RSS (docs/architecture.md,
 * "Kubernetes"); this is a few hundred lines on the HTTP stack the controller already loads.
 *
 * Errors: a refused request throws AtollError KUBE_API_REFUSED with the HTTP status and the server's reason (see
 * {@link kubeStatusOf}); an unreachable server throws KUBE_API_UNAVAILABLE. A watch that the server ends with 410 Gone
 * (history compacted) rejects with STORE_COMPACTED so callers re-list.
 */
import { Agent, request as httpsRequest } from 'node:https';
import type { IncomingMessage } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import { AtollError, atollError } from '../../core/errors.ts';
import type { KubeConnection } from './kube-config.ts';

// not an ESM import, whose facade loads far more (the rule in eslint.config.js says why)
const { request: httpRequest } = process.getBuiltinModule('node:http');

/** The metadata every object carries that Atoll reads or writes. */
export interface ObjectMeta {
  readonly name: string;
  readonly namespace?: string;
  readonly uid?: string;
  readonly resourceVersion?: string;
  readonly labels?: Readonly<Record<string, string>>;
  readonly annotations?: Readonly<Record<string, string>>;
  readonly deletionTimestamp?: string;
  readonly creationTimestamp?: string;
}

export interface KubeObject {
  readonly apiVersion?: string;
  readonly kind?: string;
  readonly metadata: ObjectMeta;
}

export interface KubeList<T> {
  readonly items: T[];
  readonly resourceVersion: string;
}

export type WatchEventType = 'ADDED' | 'MODIFIED' | 'DELETED' | 'BOOKMARK';

export interface KubeWatchEvent<T> {
  readonly type: WatchEventType;
  readonly object: T;
}

/** The status and reason of a refused request, or undefined for any other error. */
export function kubeStatusOf(err: unknown): { status: number; reason: string } | undefined {
  if (err instanceof AtollError && err.code === 'KUBE_API_REFUSED') {
    const d = err.detail as { status?: number; reason?: string } | undefined;
    if (d?.status) return { status: d.status, reason: d.reason ?? '' };
  }
  return undefined;
}

interface RequestInit {
  readonly body?: unknown;
  readonly contentType?: string;
  readonly signal?: AbortSignal;
  readonly query?: Readonly<Record<string, string | undefined>>;
  /** The pool for HTTPS (default: the requests' one). */
  readonly agent?: Agent;
}

const MAX_RESPONSE_BYTES = 64 << 20;
const MAX_TOO_MANY = 10;

export class KubeClient {
  readonly #conn: KubeConnection;
  readonly #agent: Agent;
  /** Watches hold their connection for minutes: they get their own, unbounded, pool so they never starve requests. */
  readonly #watchAgent: Agent;

  constructor(conn: KubeConnection) {
    this.#conn = conn;
    this.#agent = new Agent({ keepAlive: true, maxSockets: 16, ca: conn.ca, cert: conn.cert, key: conn.key });
    this.#watchAgent = new Agent({ ca: conn.ca, cert: conn.cert, key: conn.key });
  }

  /** The server this client talks to (for logs). */
  get server(): string {
    return this.#conn.server.href;
  }

  /** The object at `path`, or undefined when it does not exist (404). */
  async get<T>(path: string, signal?: AbortSignal): Promise<T | undefined> {
    try {
      return await this.request<T>('GET', path, { signal });
    } catch (err) {
      if (kubeStatusOf(err)?.status === 404) return undefined;
      throw err;
    }
  }

  /** Every object of a collection, in pages of 500, and the resourceVersion to watch from. */
  async list<T>(path: string, opts: { labelSelector?: string; signal?: AbortSignal } = {}): Promise<KubeList<T>> {
    const items: T[] = [];
    let cont: string | undefined;
    let resourceVersion = '';
    do {
      const page = await this.request<{ items: T[] | null; metadata: { resourceVersion: string; continue?: string } }>('GET', path, {
        signal: opts.signal, query: { limit: '500', continue: cont, labelSelector: opts.labelSelector },
      });
      items.push(...(page.items ?? []));
      resourceVersion = page.metadata.resourceVersion;
      cont = page.metadata.continue || undefined;
    } while (cont);
    return { items, resourceVersion };
  }

  create<T>(path: string, body: unknown, signal?: AbortSignal): Promise<T> {
    return this.request<T>('POST', path, { body, signal });
  }

  /** PUT: fails with 409 Conflict when `body.metadata.resourceVersion` is not the current one (compare-and-swap). */
  replace<T>(path: string, body: unknown, signal?: AbortSignal): Promise<T> {
    return this.request<T>('PUT', path, { body, signal });
  }

  mergePatch<T>(path: string, patch: unknown, signal?: AbortSignal): Promise<T> {
    return this.request<T>('PATCH', path, { body: patch, contentType: 'application/merge-patch+json', signal });
  }

  /** DELETE, optionally only if the object is still at `resourceVersion` (409 otherwise); 404 resolves false. */
  async delete(path: string, opts: { resourceVersion?: string; signal?: AbortSignal } = {}): Promise<boolean> {
    const body = opts.resourceVersion ? { kind: 'DeleteOptions', apiVersion: 'v1', preconditions: { resourceVersion: opts.resourceVersion } } : undefined;
    try {
      await this.request('DELETE', path, { body, signal: opts.signal });
      return true;
    } catch (err) {
      if (kubeStatusOf(err)?.status === 404) return false;
      throw err;
    }
  }

  /**
   * Watches a collection from `resourceVersion` (with bookmarks; `fieldSelector` `metadata.name=N` for one object), calling `onEvent` for each event in order, until
   * the server ends the watch (resolves: resume from the last resourceVersion seen) or `signal` aborts (resolves).
   * Rejects with STORE_COMPACTED on 410 Gone (re-list), KUBE_API_* otherwise.
   */
  async watch<T>(path: string, resourceVersion: string, onEvent: (e: KubeWatchEvent<T>) => void, opts: { labelSelector?: string; fieldSelector?: string; signal: AbortSignal; timeoutSeconds?: number }): Promise<void> {
    const res = await this.#open('GET', path, {
      agent: this.#watchAgent,
      signal: opts.signal,
      query: {
        watch: '1', resourceVersion, allowWatchBookmarks: 'true', labelSelector: opts.labelSelector, fieldSelector: opts.fieldSelector,
        timeoutSeconds: String(opts.timeoutSeconds ?? 300),
      },
    });
    if (res.statusCode === 410) {
      res.resume();
      throw gone(path);
    }
    if ((res.statusCode ?? 0) >= 300) throw await refusal('GET', path, res);
    await new Promise<void>((resolve, reject) => {
      let buf = '';
      const onAbort = () => { res.destroy(); resolve(); };
      opts.signal.addEventListener('abort', onAbort, { once: true });
      const done = (err?: Error) => {
        opts.signal.removeEventListener('abort', onAbort);
        if (err) reject(err); else resolve();
      };
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => {
        buf += chunk;
        let nl: number;
        while ((nl = buf.indexOf('\n')) >= 0) {
          const line = buf.slice(0, nl);
          buf = buf.slice(nl + 1);
          if (line.trim() === '') continue;
          let ev: { type: string; object: { code?: number; message?: string } };
          try {
            ev = JSON.parse(line) as typeof ev;
          } catch (err) {
            res.destroy();
            return done(atollError('KUBE_API_UNAVAILABLE', `the watch of ${path} sent a line that is not JSON`, 'check the API endpoint (an edge cache in between?)', err));
          }
          if (ev.type === 'ERROR') {
            res.destroy();
            return done(ev.object.code === 410 ? gone(path) : atollError('KUBE_API_REFUSED', `the watch of ${path} ended with an error: ${ev.object.message ?? 'unknown'}`, 'the watch is retried', undefined, { status: ev.object.code ?? 0, reason: ev.object.message ?? '' }));
          }
          try {
            onEvent(ev as unknown as KubeWatchEvent<T>);
          } catch (err) {
            res.destroy();
            return done(err as Error);
          }
        }
      });
      res.on('end', () => done());
      res.on('error', (err) => (opts.signal.aborted ? done() : done(unavailable('GET', path, err))));
      res.on('close', () => done());
    });
  }

  /**
   * One request with a JSON answer. A 429 (the server is starting, or priority and fairness sheds load) was not
   * processed, so it is sent again after the server's Retry-After (at most 1 s), up to {@link MAX_TOO_MANY} times.
   */
  async request<T>(method: string, path: string, init: RequestInit = {}): Promise<T> {
    let res = await this.#open(method, path, init);
    let text = await readBody(res, method, path);
    for (let i = 0; i < MAX_TOO_MANY && res.statusCode === 429; i++) {
      await sleep(Math.min(1000, 1000 * (Number(res.headers['retry-after']) || 0.2)), undefined, { signal: init.signal });
      res = await this.#open(method, path, init);
      text = await readBody(res, method, path);
    }
    if ((res.statusCode ?? 0) >= 300) throw refusalOf(method, path, res.statusCode ?? 0, text);
    if (text === '') return undefined as T;
    return (String(res.headers['content-type']).includes('json') ? JSON.parse(text) : text) as T;
  }

  #open(method: string, path: string, init: RequestInit): Promise<IncomingMessage> {
    const url = new URL(path, this.#conn.server);
    for (const [k, v] of Object.entries(init.query ?? {})) if (v !== undefined) url.searchParams.set(k, v);
    const body = init.body === undefined ? undefined : JSON.stringify(init.body);
    const headers: Record<string, string> = { accept: 'application/json', 'user-agent': this.#conn.userAgent };
    const token = this.#conn.token?.();
    if (token) headers.authorization = `Bearer ${token}`;
    if (body !== undefined) {
      headers['content-type'] = init.contentType ?? 'application/json';
      headers['content-length'] = String(Buffer.byteLength(body));
    }
    const send = url.protocol === 'http:' ? httpRequest : httpsRequest;
    return new Promise((resolve, reject) => {
      const req = send(url, { method, headers, agent: url.protocol === 'http:' ? undefined : init.agent ?? this.#agent, signal: init.signal }, resolve);
      req.on('error', (err) => reject(init.signal?.aborted ? err : unavailable(method, path, err)));
      req.end(body);
    });
  }

  close(): void {
    this.#agent.destroy();
    this.#watchAgent.destroy();
  }
}

function readBody(res: IncomingMessage, method: string, path: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    res.on('data', (c: Buffer) => {
      size += c.length;
      // only a cause: the 'error' handler below rejects with KUBE_API_UNAVAILABLE naming it
      if (size > MAX_RESPONSE_BYTES) res.destroy(new Error(`answer over ${MAX_RESPONSE_BYTES} bytes`));
      else chunks.push(c);
    });
    res.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    res.on('error', (err) => reject(unavailable(method, path, err)));
  });
}

async function refusal(method: string, path: string, res: IncomingMessage): Promise<AtollError> {
  return refusalOf(method, path, res.statusCode ?? 0, await readBody(res, method, path));
}

function refusalOf(method: string, path: string, status: number, text: string): AtollError {
  let reason = '';
  let message = text.slice(0, 300);
  try {
    const s = JSON.parse(text) as { reason?: string; message?: string };
    reason = s.reason ?? '';
    message = s.message ?? message;
  } catch { /* not a Status object: keep the text */ }
  const hint = status === 401 ? 'check the token or client certificate (kubernetes.kubeconfig, or the pod\'s service account)'
    : status === 403 ? 'the account lacks a permission: compare its ClusterRole with deploy/atoll.yaml'
      : status === 409 ? 'another writer changed the object first: re-read and retry'
        : 'see the message; the request is retried where that makes sense';
  return atollError('KUBE_API_REFUSED', `Kubernetes API ${method} ${path} answered ${status} ${reason}: ${message}`, hint, undefined, { status, reason });
}

function unavailable(method: string, path: string, cause: unknown): AtollError {
  return atollError('KUBE_API_UNAVAILABLE', `Kubernetes API ${method} ${path} failed: ${(cause as Error).message}`,
    'check that the API server (or the edge cache, kubernetes.server) is reachable; the controller retries', cause);
}

function gone(path: string): AtollError {
  return atollError('STORE_COMPACTED', `the watch of ${path} is too old (410 Gone)`, 'list again and watch from the new resourceVersion');
}
