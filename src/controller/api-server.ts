/**
 * The controller's HTTPS API for agents and operators. Requests are JSON, bodies bounded and validated against
 * strict schemas; agents authenticate by signing each request with their node key (a join also presents a bootstrap
 * token); operators use the admin token. A refused request is logged and changes nothing.
 *
 *   POST   /v1/join                  token + signature by the key in the body   -> { node, blocks }
 *   PUT    /v1/nodes/:name           signed by :name                            -> { node }
 *   POST   /v1/nodes/:name/usage     signed by :name                            -> { blocks }
 *   GET    /v1/nodes/:name/blocks    signed by :name                            -> { blocks }
 *   POST   /v1/nodes/:name/reusable  signed by :name                            -> { reusable } (addresses another pod may take)
 *   GET    /v1/watch?after=REV       signed by any node, or a relay's token: NDJSON, a snapshot (unless resuming) then changes
 *   GET    /v1/policy                signed by any node: NDJSON, the node's part of the NetworkPolicy state, then changes
 *   POST   /v1/policy/applied        signed by any node                         -> { known } (it applied up to a mark)
 *   DELETE /v1/nodes/:name           admin                                      -> { released }
 *   GET    /v1/ipam                  admin                                      -> report
 *   GET    /v1/health                anyone                                     -> { leader }
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { createServer, type Server } from 'node:https';
import { timingSafeEqual } from 'node:crypto';
import type { Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import { AtollError, asAtollError, atollError, type ErrorCode } from '../core/errors.ts';
import type { Clock, Logger } from '../core/ports.ts';
import type { ClusterRegistry } from '../core/cluster/registry.ts';
import { type ViewLine, viewScope } from '../core/cluster/view.ts';
import type { NodeFields, NodeRecord } from '../core/cluster/model.ts';
import { ReplayGuard } from '../core/cluster/signing.ts';
import { joinRequestSchema, nodeFieldsSchema, policyAppliedSchema, reusableRequestSchema, usageReportSchema } from '../config/controller-config.ts';
import { verifyRequest } from '../adapters/node/node-identity.ts';
import type { ViewFeed } from './view-feed.ts';
import type { KubePolicy } from './kube-policy.ts';
import type { PolicyLine } from '../core/policy/scope.ts';

export interface Leadership {
  isLeader(): boolean;
  leaderUrl(): Promise<string | undefined>;
}

/** Decides whether a node may register or update itself, and with which fields (Kubernetes: the Node's placement). */
export interface NodeAdmission {
  /** @throws AtollError when the node may not (NODE_NOT_IN_CLUSTER, NODE_LABELS_INVALID). */
  admit(name: string, fields: NodeFields): NodeFields;
}

export interface ApiServerComponents {
  readonly registry: ClusterRegistry;
  /** The nodes as watchers see them (one store watch for all of them). */
  readonly feed: ViewFeed;
  /** Without it, any node with a bootstrap token may join with the fields it sends. */
  readonly admission?: NodeAdmission;
  /** NetworkPolicy state, when the controller follows Kubernetes (else /v1/policy answers POLICY_NOT_SERVED). */
  readonly policy?: KubePolicy;
  readonly log: Logger;
  readonly clock: Clock;
  readonly leadership: Leadership;
}

export interface ApiServerInit {
  readonly host: string;
  readonly port: number;
  readonly key: string;
  readonly certChain: string;
  readonly bootstrapTokens: readonly string[];
  readonly adminToken: string;
  /** Tokens a relay presents to watch the nodes (and do nothing else). */
  readonly relayTokens: readonly string[];
  readonly maxBodyBytes: number;
  /** A watcher with more than this written and not yet taken is dropped (API_WATCH_TOO_SLOW). */
  readonly watchBufferBytes: number;
}

const STATUS: Partial<Record<ErrorCode, number>> = {
  API_BAD_REQUEST: 400,
  API_UNAUTHENTICATED: 401,
  API_FORBIDDEN: 403,
  NODE_NOT_REGISTERED: 404,
  NODE_NOT_IN_CLUSTER: 403,
  NODE_LABELS_INVALID: 409,
  NODE_IDENTITY_MISMATCH: 409,
  NODE_BLOCK_LIMIT: 409,
  API_TOO_LARGE: 413,
  API_REQUEST_TIMEOUT: 408,
  CLUSTER_CIDR_EXHAUSTED: 507,
  API_NOT_LEADER: 503,
  POLICY_NOT_SERVED: 404,
  STORE_UNAVAILABLE: 503,
};

const WATCH_PING_MS = 15_000;
/** Refuses bytes that are not UTF-8 instead of replacing them (JSON text is UTF-8, RFC 8259). */
const UTF8 = new TextDecoder('utf-8', { fatal: true });

function tokenMatches(given: string, tokens: readonly string[]): boolean {
  const g = Buffer.from(given);
  let ok = false;
  for (const t of tokens) {
    const b = Buffer.from(t);
    if (b.length === g.length && timingSafeEqual(b, g)) ok = true;
  }
  return ok;
}

function bad(message: string, fix = 'see docs/api.md for the request shapes'): AtollError {
  return atollError('API_BAD_REQUEST', message, fix);
}

function unauthenticated(reason: string): AtollError {
  return atollError('API_UNAUTHENTICATED', `request refused: ${reason}`, 'check the bootstrap token, the node key and the clock');
}

/**
 * How long an idle kept-alive connection stays open. Longer than an agent's default usage period (10 s), so its
 * reports reuse one TLS connection; with Node's default (5 s) the server closed it between two reports and each
 * report made a new handshake. An agent's client keeps its idle socket until the server closes it.
 */
const KEEP_ALIVE_MS = 30_000;
/**
 * A request's body must have arrived this long after its headers: a client that trickles one (or declares more than
 * it sends) is answered 408 and cut off, so it cannot hold a connection for ever. Agents send bodies of a few hundred
 * bytes at once. (`requestTimeout` cannot do it: it would end watches too.)
 */
const BODY_TIMEOUT_MS = 10_000;
/** The TLS handshake must be done this long after the TCP connection (Node's default is 120 s). */
const HANDSHAKE_TIMEOUT_MS = 10_000;

export class ApiServer {
  readonly #c: ApiServerComponents;
  readonly #init: ApiServerInit;
  readonly #guard: ReplayGuard;
  readonly #watches = new Set<AbortController>();
  #server: Server | undefined;

  constructor(components: ApiServerComponents, init: ApiServerInit) {
    this.#c = components;
    this.#init = init;
    // notBefore: requests signed before this process started cannot be replayed after a restart
    this.#guard = new ReplayGuard({ windowMs: 5 * 60_000, maxEntries: 200_000, notBefore: components.clock() });
  }

  /** Watches open now (agents and relays following the node list). */
  get watchClients(): number {
    return this.#watches.size;
  }

  /** Listens; resolves with the bound port. */
  async start(): Promise<number> {
    const server = createServer({ key: this.#init.key, cert: this.#init.certChain, handshakeTimeout: HANDSHAKE_TIMEOUT_MS }, (req, res) => void this.#handle(req, res));
    server.headersTimeout = 10_000;
    server.keepAliveTimeout = KEEP_ALIVE_MS;
    server.requestTimeout = 0; // watches are long-lived; bodies are bounded by size instead
    server.on('clientError', (err: Error & { code?: string }, socket: Duplex) => this.#clientError(err, socket));
    this.#server = server;
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(this.#init.port, this.#init.host, () => resolve());
    });
    const addr = server.address();
    return typeof addr === 'object' && addr ? addr.port : this.#init.port;
  }

  async stop(): Promise<void> {
    for (const w of this.#watches) w.abort();
    const server = this.#server;
    if (!server) return;
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }

  async #handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const method = req.method ?? 'GET';
    let path = req.url ?? '/';
    try {
      const url = requestUrl(path);
      path = url.pathname;
      const body = await this.#readBody(req);
      const nodeRoute = /^\/v1\/nodes\/([^/]+)(\/usage|\/blocks|\/reusable)?$/.exec(path);
      if (method === 'GET' && path === '/v1/health') return send(res, 200, { leader: this.#c.leadership.isLeader(), leaderUrl: await this.#c.leadership.leaderUrl() });
      if (method === 'POST' && path === '/v1/join') return send(res, 200, await this.#join(req, body));
      if (method === 'GET' && path === '/v1/watch') return await this.#watch(req, res, url, body);
      if (method === 'GET' && path === '/v1/policy') return await this.#policyWatch(req, res, body);
      if (method === 'POST' && path === '/v1/policy/applied') return send(res, 200, await this.#policyApplied(req, body));
      if (method === 'GET' && path === '/v1/ipam') {
        this.#admin(req);
        return send(res, 200, await this.#c.registry.ipamReport());
      }
      if (nodeRoute) {
        const name = decodePathPart(nodeRoute[1] as string);
        const sub = nodeRoute[2];
        if (method === 'DELETE' && !sub) {
          this.#admin(req);
          await this.#requireLeader();
          const released = await this.#c.registry.deregister(name);
          this.#c.log.info('node deregistered', { node: name, released });
          return send(res, 200, { released });
        }
        await this.#verifySelf(req, name, body);
        if (method === 'PUT' && !sub) {
          await this.#requireLeader();
          const asked = parseJson(nodeFieldsSchema, body);
          return send(res, 200, { node: await this.#c.registry.update(name, this.#c.admission ? this.#c.admission.admit(name, asked) : asked) });
        }
        if (method === 'POST' && sub === '/usage') {
          await this.#requireLeader();
          return send(res, 200, { blocks: await this.#c.registry.reportUsage(name, parseJson(usageReportSchema, body)) });
        }
        if (method === 'GET' && sub === '/blocks') return send(res, 200, { blocks: await this.#c.registry.blocksOf(name) });
        if (method === 'POST' && sub === '/reusable') {
          const { addresses } = parseJson(reusableRequestSchema, body);
          // without NetworkPolicy no peer matches a pod by its address
          return send(res, 200, { reusable: this.#c.policy ? this.#c.policy.reusable(name, addresses) : addresses.map((a) => a.ip) });
        }
      }
      throw atollError('API_BAD_REQUEST', `no route ${method} ${path}`, 'see docs/api.md');
    } catch (e) {
      const err = asAtollError(e);
      if (req.socket.destroyed && !res.headersSent) {
        // the client hung up mid-request, or #clientError already answered its malformed body: nobody to answer
        this.#c.log.debug('API request abandoned', { method, path, code: err.code, err: err.message });
        return;
      }
      const status = STATUS[err.code] ?? 500;
      const level = status >= 500 ? 'error' : 'warn';
      this.#c.log[level]('API request refused', { method, path, remote: req.socket.remoteAddress, code: err.code, err: err.message });
      if (!res.headersSent) {
        const extra = err.code === 'API_NOT_LEADER' ? { leaderUrl: await this.#c.leadership.leaderUrl().catch(() => undefined) } : {};
        // a body that did not come: the connection goes with the answer, whatever the client still sends
        if (err.code === 'API_REQUEST_TIMEOUT') res.setHeader('connection', 'close');
        send(res, status, { code: err.code, message: err.message, fix: err.fix, ...extra });
        if (err.code === 'API_REQUEST_TIMEOUT') res.once('finish', () => req.socket.destroySoon());
      } else res.destroy();
    }
  }

  /** A request Node's HTTP parser refused (bad bytes in the request line or headers, headers too large). */
  #clientError(err: Error & { code?: string }, socket: Duplex): void {
    if (err.code === 'ECONNRESET' || err.code === 'HPE_INVALID_EOF_STATE' || !socket.writable) { // the client hung up
      socket.destroy();
      return;
    }
    const tooLarge = err.code === 'HPE_HEADER_OVERFLOW';
    const code: ErrorCode = tooLarge ? 'API_TOO_LARGE' : 'API_BAD_REQUEST';
    const message = `malformed HTTP request: ${err.code ?? err.message}`;
    this.#c.log.warn('API request refused', { remote: (socket as Socket).remoteAddress, code, err: message });
    const text = JSON.stringify({ code, message, fix: tooLarge ? 'send smaller headers' : 'send a well-formed HTTP/1.1 request' });
    socket.end(`HTTP/1.1 ${tooLarge ? '431 Request Header Fields Too Large' : '400 Bad Request'}\r\ncontent-type: application/json\r\n` +
      `content-length: ${Buffer.byteLength(text)}\r\nconnection: close\r\n\r\n${text}`);
  }

  async #join(req: IncomingMessage, body: Buffer): Promise<unknown> {
    const join = parseJson(joinRequestSchema, body);
    if (!tokenMatches(join.token, this.#init.bootstrapTokens)) throw unauthenticated('unknown bootstrap token');
    this.#verifySignature(req, join.identity, join.name, body);
    await this.#requireLeader();
    const { token: _token, name, identity, ...asked } = join;
    const fields = this.#c.admission ? this.#c.admission.admit(name, asked) : asked;
    const view = await this.#c.registry.register({ ...fields, name, identity, observedAddress: req.socket.remoteAddress?.replace(/^::ffff:/, '') ?? '' });
    this.#c.log.info('node joined', { node: join.name, blocks: view.blocks });
    return view;
  }

  async #watch(req: IncomingMessage, res: ServerResponse, url: URL, body: Buffer): Promise<void> {
    const auth = req.headers.authorization;
    let viewer: NodeRecord | undefined;
    if (auth !== undefined) {
      // a relay: its token lets it watch (every node) and do nothing else
      if (!auth.startsWith('Bearer ') || !tokenMatches(auth.slice(7), this.#init.relayTokens)) throw unauthenticated('relay token missing or wrong');
    } else {
      const node = req.headers['x-atoll-node'];
      if (typeof node !== 'string') throw unauthenticated('missing x-atoll-node');
      viewer = await this.#verifySelf(req, node, body);
    }
    const afterText = url.searchParams.get('after') ?? '0';
    if (!/^\d{1,15}$/.test(afterText)) throw bad(`after=${afterText} is not a revision`);
    const after = Number(afterText);
    const feed = this.#c.feed;
    if (!feed.loaded) throw atollError('STORE_UNAVAILABLE', 'this controller replica has not read the nodes from its store yet', 'watch again in a moment (agents do); if it lasts, check the controller\'s store');
    const views = feed.views;
    await this.#serveStream(res, viewer?.name ?? '(a relay)', (send) => {
      // the views as this replica holds them now, then every change to them: no await between the two
      const scope = viewScope(viewer && (views.node(viewer.name) ?? viewer));
      const resume = after === 0 ? { kind: 'snapshot' as const, line: views.snapshot(scope) } : views.resume(scope, after);
      const lines: readonly ViewLine[] = resume.kind === 'snapshot' ? [resume.line] : resume.lines;
      return { first: lines.map((line) => `${JSON.stringify(line)}\n`).join(''), unsubscribe: views.watch(scope, { send: (_line, text) => send(`${text}\n`) }) };
    });
  }

  /** Streams a node its part of the NetworkPolicy state (src/controller/kube-policy.ts), with pings, until it leaves. */
  async #policyWatch(req: IncomingMessage, res: ServerResponse, body: Buffer): Promise<void> {
    const node = req.headers['x-atoll-node'];
    if (typeof node !== 'string') throw unauthenticated('missing x-atoll-node');
    const viewer = await this.#verifySelf(req, node, body);
    const policy = this.#c.policy;
    if (!policy) throw atollError('POLICY_NOT_SERVED', 'this controller does not follow Kubernetes, so it has no NetworkPolicies to serve', 'turn networkPolicy off in the agent configuration, or run the controller with kubernetes set');
    if (!policy.synced) throw atollError('STORE_UNAVAILABLE', 'this controller replica has not read the NetworkPolicies, Namespaces and Pods yet', 'watch again in a moment (agents do)');
    await this.#serveStream(res, viewer.name, (send) => {
      const text = (lines: readonly PolicyLine[]) => lines.map((l) => `${JSON.stringify(l)}\n`).join('');
      const { first, unwatch } = policy.watch(viewer.name, (lines) => send(text(lines)));
      return { first: text(first), unsubscribe: unwatch };
    });
  }

  /** A node applied its policy stream up to a mark (src/core/policy/reuse.ts). */
  async #policyApplied(req: IncomingMessage, body: Buffer): Promise<{ known: boolean }> {
    const node = req.headers['x-atoll-node'];
    if (typeof node !== 'string') throw unauthenticated('missing x-atoll-node');
    const viewer = await this.#verifySelf(req, node, body);
    const { stream, seq } = parseJson(policyAppliedSchema, body);
    return { known: this.#c.policy?.applied(viewer.name, stream, seq) ?? false };
  }

  /**
   * Serves an NDJSON stream until the client leaves or the server stops. `begin` returns what the client is owed
   * first (its snapshot, or the changes it missed) and subscribes to what follows, with no await between the two;
   * `{"type":"ping"}` goes every 15 s. A client that leaves more than `watchBufferBytes` unread beyond what it was owed
   * is dropped (API_WATCH_TOO_SLOW): a reader that stalls must not hold the controller's memory; it reconnects.
   */
  async #serveStream(res: ServerResponse, who: string, begin: (send: (text: string) => void) => { first: string; unsubscribe: () => void }): Promise<void> {
    const abort = new AbortController();
    this.#watches.add(abort);
    res.on('close', () => abort.abort());
    res.writeHead(200, { 'content-type': 'application/x-ndjson', 'cache-control': 'no-store' });
    let owed = 0;
    const send = (text: string) => {
      if (abort.signal.aborted) return;
      res.write(text);
      if (res.writableLength > owed + this.#init.watchBufferBytes) {
        const err = atollError('API_WATCH_TOO_SLOW', `the watcher ${who} left ${res.writableLength} bytes of its stream unread`,
          'it reconnects and resumes; if this repeats, check that host\'s CPU and its link to the controller');
        this.#c.log.warn('watch dropped', { err: err.message, code: err.code });
        abort.abort();
        res.destroy();
      }
    };
    const ping = setInterval(() => send('{"type":"ping"}\n'), WATCH_PING_MS);
    const { first, unsubscribe } = begin(send);
    owed = Buffer.byteLength(first);
    res.write(first);
    try {
      await new Promise<void>((resolve) => {
        if (abort.signal.aborted) return resolve();
        abort.signal.addEventListener('abort', () => resolve(), { once: true });
      });
    } finally {
      unsubscribe();
      clearInterval(ping);
      this.#watches.delete(abort);
      res.end();
    }
  }

  /** Verifies the request is signed by the registered key of `name`; returns the signer's record. */
  async #verifySelf(req: IncomingMessage, name: string, body: Buffer): Promise<NodeRecord> {
    const signer = req.headers['x-atoll-node'];
    if (typeof signer !== 'string') throw unauthenticated('missing x-atoll-node');
    const record = await this.#c.registry.node(signer);
    if (!record) throw unauthenticated(`node ${signer} is not registered`);
    this.#verifySignature(req, record.identity, signer, body);
    if (signer !== name) throw atollError('API_FORBIDDEN', `node ${signer} asked to act on node ${name}`, 'a node may only change its own record');
    return record;
  }

  #verifySignature(req: IncomingMessage, identity: string, name: string, body: Buffer): void {
    const v = verifyRequest(identity, req.headers, req.method ?? 'GET', req.url ?? '/', body, this.#guard, this.#c.clock());
    if (!v.ok) throw unauthenticated(v.reason);
    if (v.node !== name) throw unauthenticated(`signed as ${v.node}, not ${name}`);
  }

  #admin(req: IncomingMessage): void {
    const auth = req.headers.authorization ?? '';
    const token = auth.startsWith('Bearer ') ? auth.slice(7) : '';
    if (!tokenMatches(token, [this.#init.adminToken])) throw unauthenticated('admin token missing or wrong');
  }

  async #requireLeader(): Promise<void> {
    if (!this.#c.leadership.isLeader()) {
      throw atollError('API_NOT_LEADER', 'this controller replica is not the leader', `send writes to the leader (${(await this.#c.leadership.leaderUrl()) ?? 'unknown yet'})`);
    }
  }

  #readBody(req: IncomingMessage): Promise<Buffer> {
    const max = this.#init.maxBodyBytes;
    return new Promise((resolve, reject) => {
      const declared = Number(req.headers['content-length'] ?? 0);
      if (declared > max) {
        reject(atollError('API_TOO_LARGE', `request body of ${declared} bytes is over ${max}`, 'send a smaller body'));
        req.resume();
        return;
      }
      const chunks: Buffer[] = [];
      let size = 0;
      const timer = setTimeout(() => {
        req.removeAllListeners('data');
        req.resume();
        reject(atollError('API_REQUEST_TIMEOUT', `the request body did not arrive within ${BODY_TIMEOUT_MS / 1000} s (${size} bytes came)`,
          'send the whole body right after the headers, with a Content-Length that matches it'));
      }, BODY_TIMEOUT_MS);
      timer.unref();
      req.once('close', () => clearTimeout(timer));
      req.on('data', (d: Buffer) => {
        if (size > max) return; // refused already: the rest is read and dropped, so that the client gets the 413
        size += d.length;
        if (size > max) {
          chunks.length = 0;
          reject(atollError('API_TOO_LARGE', `request body is over ${max} bytes`, 'send a smaller body'));
        } else chunks.push(d);
      });
      req.on('end', () => {
        clearTimeout(timer);
        resolve(Buffer.concat(chunks));
      });
      req.on('error', (cause) => reject(bad(`the request body could not be read: ${cause.message}`, 'send the whole body, with a correct length or chunking')));
    });
  }
}

/** The request target as a URL. @throws AtollError API_BAD_REQUEST when it is none (e.g. `//[`). */
function requestUrl(target: string): URL {
  try {
    return new URL(target, 'https://controller');
  } catch {
    throw bad(`request target ${JSON.stringify(target.slice(0, 256))} is not a path`);
  }
}

/** A percent-decoded path segment. @throws AtollError API_BAD_REQUEST on a malformed escape (`%zz`). */
export function decodePathPart(part: string): string {
  try {
    return decodeURIComponent(part);
  } catch {
    throw bad(`path segment ${JSON.stringify(part.slice(0, 256))} has a malformed %-escape`);
  }
}

/** A request body decoded against `schema`. @throws AtollError API_BAD_REQUEST when it is not UTF-8 JSON or fails it. */
export function parseJson<T>(schema: { safeParse(v: unknown): { success: true; data: T } | { success: false; error: { issues: { path: PropertyKey[]; message: string }[] } } }, body: Buffer): T {
  let raw: unknown;
  try {
    raw = JSON.parse(UTF8.decode(body));
  } catch {
    throw bad('request body is not JSON in UTF-8');
  }
  const res = schema.safeParse(raw);
  if (!res.success) throw bad(`request body is invalid: ${res.error.issues.map((i) => `${i.path.join('.') || '(top)'}: ${i.message}`).join('; ')}`);
  return res.data;
}

function send(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}
