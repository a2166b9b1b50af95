/**
 * The {@link ClusterStore} and {@link LeaderElection} on etcd v3, spoken through etcd's JSON gateway (`/v3/...`)
 * with the global fetch, so the controller carries no gRPC stack.
 *
 * Why etcd: several controller replicas (or a controller beside a Kubernetes control plane that already runs etcd)
 * need one linearizable store; etcd's transactions, revisions and watches are exactly the shape of the port.
 *
 * The gateway, as etcd 3.4 serves it: keys and values are base64; int64s are JSON strings; fields at their default
 * value are left out (a failed txn has no `succeeded`, a put event no `type`, a keepalive for a lease that is gone no
 * `TTL`); a compare of mod_revision == 0 holds for a missing key; streams (watch, lease keepalive) are newline-
 * delimited `{"result":…}` objects, with `{"error":…}` in their place when a stream fails; a unary error is a
 * non-2xx status with `{"error","code"}` (a gRPC code). A watch from before the compacted revision answers
 * `created` and then `canceled` with `compact_revision`.
 *
 * Failover: a request goes to the endpoint that answered last, and on to the next when it cannot connect. A txn that
 * may have reached etcd (connection reset, timeout, etcd "unavailable") is never resent: it rejects with
 * STORE_UNAVAILABLE and the caller re-reads. Watches resume on another endpoint from the last revision they saw.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import type { ClusterStore, KvEntry, KvList, LeaderElection, TxnCompare, TxnOp, TxnResult, WatchEvent } from '../../core/cluster/store.ts';
import { AtollError, atollError } from '../../core/errors.ts';
import { checkTxnOps } from './store-txn-check.ts';

export interface EtcdOptions {
  /** Client URLs of the etcd members, e.g. `http://10.0.0.1:2379`. */
  readonly endpoints: readonly string[];
  /** Every key lives under this prefix (e.g. `/atoll/prod/`), so clusters and tests can share one etcd. */
  readonly prefix: string;
  /** Bound on one request to one endpoint (default 5000 ms). */
  readonly requestTimeoutMs?: number;
}

export interface EtcdLeaderOptions extends EtcdOptions {
  /** This replica's identity, stored as the leader key's value (e.g. its API URL). */
  readonly id: string;
  /** TTL of the leader's lease: a replica that dies is replaced within this long. */
  readonly ttlSeconds: number;
  /** The leader key under `prefix` (default `leader`). */
  readonly key?: string;
}

/** A message of the gateway, after `{"result": …}` is unwrapped. */
type Reply = Record<string, unknown>;

interface GatewayKv {
  readonly key?: string;
  readonly value?: string;
  readonly create_revision?: string;
  readonly mod_revision?: string;
  readonly lease?: string;
}

interface GatewayEvent {
  readonly type?: 'PUT' | 'DELETE';
  readonly kv?: GatewayKv;
}

const GRPC_NOT_FOUND = 5;
const GRPC_UNAVAILABLE = 14;
/** Connection errors that prove the request never left: safe to send anywhere else, even a txn. */
const NOT_SENT = new Set(['ECONNREFUSED', 'EHOSTUNREACH', 'ENETUNREACH', 'EADDRNOTAVAIL', 'UND_ERR_CONNECT_TIMEOUT']);
const RETRY_DELAY_MS = 100;

/** An error etcd answered: a definite refusal, except gRPC UNAVAILABLE ("no leader", "request timed out"). */
class EtcdReplyError extends Error {
  readonly grpcCode: number;

  constructor(grpcCode: number, message: string) {
    super(message);
    this.grpcCode = grpcCode;
  }
}

interface Stream {
  readonly first: Reply;
  readonly rest: AsyncGenerator<Reply>;
  /** Closes the connection. */
  cancel(): void;
}

/** The gateway client both classes use: failover across endpoints, unary calls and streams. */
class EtcdClient {
  readonly endpoints: readonly string[];
  readonly timeoutMs: number;
  readonly #closed = new AbortController();
  /** Index of the endpoint that answered last. */
  #preferred = 0;

  constructor(opts: EtcdOptions) {
    if (opts.endpoints.length === 0) throw atollError('STORE_UNAVAILABLE', 'no etcd endpoints were given', 'list at least one etcd client URL');
    for (const e of opts.endpoints) {
      if (!/^https?:\/\/[^/]+$/.test(e)) throw atollError('STORE_UNAVAILABLE', `etcd endpoint ${e} is not an http(s)://host:port URL`, 'give client URLs without a path, e.g. http://127.0.0.1:2379');
    }
    this.endpoints = opts.endpoints;
    this.timeoutMs = opts.requestTimeoutMs ?? 5000;
  }

  get closed(): boolean {
    return this.#closed.signal.aborted;
  }

  close(): void {
    this.#closed.abort();
  }

  /**
   * One request/response call. With `retrySafe` false (a txn), only a failure to connect moves on to the next
   * endpoint; anything after the request may have left rejects with STORE_UNAVAILABLE, outcome unknown.
   */
  call(path: string, body: unknown, retrySafe: boolean, timeoutMs = this.timeoutMs): Promise<Reply> {
    return this.#failover(path, retrySafe, timeoutMs, undefined, async (endpoint) => {
      const res = await fetch(endpoint + path, post(body, AbortSignal.any([this.#closed.signal, AbortSignal.timeout(timeoutMs)])));
      const text = await res.text();
      if (!res.ok) throw replyError(text, res.status);
      // Stream methods (lease keepalive) answer one `{"result":…}` line per request message.
      return unwrap(JSON.parse(text.split('\n', 1)[0]!) as Reply);
    });
  }

  /** Opens a stream and waits for its first message (within the request timeout). */
  stream(path: string, body: unknown, signal: AbortSignal, headers: Record<string, string> = {}): Promise<Stream> {
    return this.#failover(path, true, this.timeoutMs, signal, async (endpoint) => {
      const conn = new AbortController();
      // only causes, here and below: #failover lists them per endpoint in its STORE_UNAVAILABLE
      const timer = setTimeout(() => conn.abort(new Error(`no first message within ${this.timeoutMs} ms`)), this.timeoutMs);
      try {
        const res = await fetch(endpoint + path, post(body, AbortSignal.any([signal, this.#closed.signal, conn.signal]), headers));
        if (!res.ok || res.body === null) throw replyError(await res.text(), res.status);
        const rest = jsonLines(res.body);
        const first = await rest.next();
        if (first.done === true) throw new Error('the stream ended before its first message');
        return { first: first.value, rest, cancel: () => conn.abort() };
      } catch (err) {
        conn.abort();
        throw err;
      } finally {
        clearTimeout(timer);
      }
    });
  }

  /** Makes the next request start at another endpoint than `endpoint` (its stream broke). */
  avoid(endpoint: string): void {
    if (this.endpoints[this.#preferred] === endpoint) this.#preferred = (this.#preferred + 1) % this.endpoints.length;
  }

  get preferred(): string {
    return this.endpoints[this.#preferred]!;
  }

  closedError(): AtollError {
    return atollError('STORE_UNAVAILABLE', `the etcd client for ${this.endpoints.join(',')} is closed`, 'open a new store');
  }

  /**
   * Tries each endpoint once, from the one that answered last; while none does, goes round again after a pause
   * (a member without a leader answers "unavailable" until an election ends), for at most `budgetMs`.
   */
  async #failover<T>(path: string, retrySafe: boolean, budgetMs: number, signal: AbortSignal | undefined, attempt: (endpoint: string) => Promise<T>): Promise<T> {
    const deadline = performance.now() + budgetMs;
    const stop = signal === undefined ? this.#closed.signal : AbortSignal.any([signal, this.#closed.signal]);
    for (let round = 1; ; round++) {
      const failures: string[] = [];
      // Other calls move #preferred meanwhile: this round goes from where it started.
      const first = this.#preferred;
      for (let i = 0; i < this.endpoints.length; i++) {
        const index = (first + i) % this.endpoints.length;
        const endpoint = this.endpoints[index]!;
        try {
          const out = await attempt(endpoint);
          this.#preferred = index;
          return out;
        } catch (err) {
          if (this.closed) throw this.closedError();
          if (signal?.aborted === true) throw signal.reason;
          if (err instanceof EtcdReplyError && err.grpcCode !== GRPC_UNAVAILABLE) {
            throw atollError('STORE_UNAVAILABLE', `etcd at ${endpoint} refused ${path}: ${err.message} (gRPC code ${err.grpcCode})`, 'see the etcd log of that member', err);
          }
          if (!retrySafe && !notSent(err)) {
            throw atollError('STORE_UNAVAILABLE', `etcd at ${endpoint} did not complete ${path} (${describe(err)}); whether it was applied is unknown`,
              're-read the keys the transaction compares, then retry if it was not applied', err);
          }
          failures.push(`${endpoint}: ${describe(err)}`);
        }
      }
      const pause = RETRY_DELAY_MS * round;
      if (performance.now() + pause >= deadline) {
        throw atollError('STORE_UNAVAILABLE', `no etcd endpoint completed ${path} within ${budgetMs} ms (${failures.join('; ')})`,
          'check that etcd runs, has a leader, and is reachable at those URLs');
      }
      await sleep(pause, undefined, { signal: stop }).catch(() => undefined);
      if (this.closed) throw this.closedError();
      if (signal?.aborted === true) throw signal.reason;
    }
  }
}

/**
 * A {@link ClusterStore} on etcd v3. Keys are stored under `prefix`; revisions are etcd's, shared with every other
 * key in that etcd, so they increase but skip.
 */
export class EtcdStore implements ClusterStore {
  readonly prefix: string;
  readonly #client: EtcdClient;

  /** @throws AtollError STORE_UNAVAILABLE when `endpoints` is empty or holds something other than http(s) URLs. */
  constructor(opts: EtcdOptions) {
    this.#client = new EtcdClient(opts);
    this.prefix = opts.prefix;
  }

  async get(key: string): Promise<KvEntry | undefined> {
    const r = await this.#client.call('/v3/kv/range', { key: b64(this.prefix + key) }, true);
    const kv = (r.kvs as GatewayKv[] | undefined)?.[0];
    return kv === undefined ? undefined : this.#entry(kv);
  }

  async list(prefix: string): Promise<KvList> {
    const r = await this.#client.call('/v3/kv/range', prefixRange(this.prefix + prefix), true);
    return { entries: ((r.kvs as GatewayKv[] | undefined) ?? []).map((kv) => this.#entry(kv)), revision: headerRevision(r) };
  }

  /** @throws AtollError STORE_UNAVAILABLE when no endpoint answered, or when the outcome is unknown (re-read). */
  async txn(compares: readonly TxnCompare[], ops: readonly TxnOp[]): Promise<TxnResult> {
    checkTxnOps(ops);
    const r = await this.#client.call('/v3/kv/txn', {
      compare: compares.map((c) => ({ key: b64(this.prefix + c.key), target: 'MOD', result: 'EQUAL', mod_revision: String(c.modRevision) })),
      success: ops.map((op) => op.type === 'put'
        ? { request_put: { key: b64(this.prefix + op.key), value: b64(op.value) } }
        : { request_delete_range: { key: b64(this.prefix + op.key) } }),
    }, false);
    return { succeeded: r.succeeded === true, revision: headerRevision(r) };
  }

  async watch(prefix: string, afterRevision: number, onEvent: (events: readonly WatchEvent[]) => void, signal: AbortSignal): Promise<void> {
    await follow(this.#client, prefixRange(this.prefix + prefix), afterRevision, (events) => {
      onEvent(events.map((e) => ({
        type: e.type === 'DELETE' ? 'delete' : 'put',
        key: unb64(e.kv?.key).slice(this.prefix.length),
        value: unb64(e.kv?.value),
        modRevision: Number(e.kv?.mod_revision ?? 0),
      })));
    }, signal);
  }

  /** Ends every watch (with STORE_UNAVAILABLE) and refuses further calls. */
  async close(): Promise<void> {
    this.#client.close();
  }

  #entry(kv: GatewayKv): KvEntry {
    return {
      key: unb64(kv.key).slice(this.prefix.length),
      value: unb64(kv.value),
      createRevision: Number(kv.create_revision ?? 0),
      modRevision: Number(kv.mod_revision ?? 0),
    };
  }
}

interface Term {
  readonly lease: string;
  /** Stops the keepalive loop. */
  readonly stop: AbortController;
  readonly lost: AbortController;
  leading: boolean;
  deadline?: ReturnType<typeof setTimeout>;
}

/**
 * Leader election on etcd, as etcd's own `concurrency.Election` does it: a lease kept alive every ttl/3, and a
 * transaction "create the leader key with that lease if it has no create revision". Losers watch the key and try
 * again when it is deleted (resign revokes the lease; a dead leader's lease expires within the TTL).
 *
 * `lost` aborts when etcd reports the lease gone, or when no keepalive succeeded for the TTL, counted from when the
 * last successful keepalive was sent, so this replica stops before etcd could let another one lead.
 */
export class EtcdLeader implements LeaderElection {
  readonly #client: EtcdClient;
  readonly #key: string;
  readonly #id: string;
  readonly #ttlSeconds: number;
  #term: Term | undefined;

  constructor(opts: EtcdLeaderOptions) {
    this.#client = new EtcdClient(opts);
    this.#key = opts.prefix + (opts.key ?? 'leader');
    this.#id = opts.id;
    this.#ttlSeconds = opts.ttlSeconds;
  }

  /**
   * Resolves once this replica leads (at once if it already does). One campaign at a time.
   * @throws the signal's reason when `signal` aborts first; AtollError STORE_UNAVAILABLE when etcd cannot be reached
   *   or the lease was lost while waiting.
   */
  async campaign(signal: AbortSignal): Promise<{ readonly lost: AbortSignal }> {
    signal.throwIfAborted();
    const current = this.#term;
    if (current !== undefined && !current.lost.signal.aborted) {
      if (current.leading) return { lost: current.lost.signal };
      throw atollError('INTERNAL', `${this.#id} is already campaigning for ${this.#key}`, 'await the running campaign');
    }
    // A term that was lost: revoke its lease if etcd still has it, so it does not linger for the TTL.
    if (current !== undefined) await this.#endTerm(current, 'a new campaign began').catch(() => undefined);
    const term = await this.#beginTerm();
    this.#term = term;
    try {
      await this.#contend(term, signal);
    } catch (err) {
      await this.#endTerm(term, 'the campaign ended').catch(() => undefined);
      throw err;
    }
    term.leading = true;
    return { lost: term.lost.signal };
  }

  async leader(): Promise<string | undefined> {
    const r = await this.#client.call('/v3/kv/range', { key: b64(this.#key) }, true);
    const kv = (r.kvs as GatewayKv[] | undefined)?.[0];
    return kv === undefined ? undefined : unb64(kv.value);
  }

  /** Stops leading (aborting `lost`) and revokes the lease, which deletes the leader key for the others. */
  async resign(): Promise<void> {
    const term = this.#term;
    if (term !== undefined) await this.#endTerm(term, 'it resigned');
  }

  async #beginTerm(): Promise<Term> {
    const sentAt = performance.now();
    const r = await this.#client.call('/v3/lease/grant', { TTL: String(this.#ttlSeconds), ID: '0' }, true);
    const term: Term = { lease: String(r.ID), stop: new AbortController(), lost: new AbortController(), leading: false };
    this.#arm(term, sentAt);
    void this.#keepAlive(term);
    return term;
  }

  /** Returns once this term holds the leader key. */
  async #contend(term: Term, signal: AbortSignal): Promise<void> {
    const key = b64(this.#key);
    for (;;) {
      signal.throwIfAborted();
      term.lost.signal.throwIfAborted();
      let owner: GatewayKv | undefined;
      let revision: number;
      try {
        const r = await this.#client.call('/v3/kv/txn', {
          compare: [{ key, target: 'CREATE', result: 'EQUAL', create_revision: '0' }],
          success: [{ request_put: { key, value: b64(this.#id), lease: term.lease } }],
          failure: [{ request_range: { key } }],
        }, false);
        if (r.succeeded === true) return;
        const responses = r.responses as { response_range?: { kvs?: GatewayKv[] } }[] | undefined;
        owner = responses?.[0]?.response_range?.kvs?.[0];
        revision = headerRevision(r);
      } catch (err) {
        if (!(err instanceof AtollError && err.code === 'STORE_UNAVAILABLE')) throw err;
        // The outcome is unknown (or etcd refused the lease): see who holds the key now.
        await sleep(RETRY_DELAY_MS);
        const r = await this.#client.call('/v3/kv/range', { key }, true);
        owner = (r.kvs as GatewayKv[] | undefined)?.[0];
        revision = headerRevision(r);
      }
      if (owner?.lease === term.lease) return;
      if (owner !== undefined) await this.#awaitDeletion(revision, AbortSignal.any([signal, term.lost.signal]));
    }
  }

  /** Resolves when the leader key is deleted after `revision`, or `signal` aborts. */
  async #awaitDeletion(revision: number, signal: AbortSignal): Promise<void> {
    const deleted = new AbortController();
    try {
      await follow(this.#client, { key: b64(this.#key) }, revision, (events) => {
        if (events.some((e) => e.type === 'DELETE')) deleted.abort();
      }, AbortSignal.any([signal, deleted.signal]));
    } catch (err) {
      // History too old to follow: read the key again instead.
      if (!(err instanceof AtollError && err.code === 'STORE_COMPACTED')) throw err;
    }
  }

  async #keepAlive(term: Term): Promise<void> {
    const everyMs = Math.max(1, Math.round((this.#ttlSeconds * 1000) / 3));
    while (!term.stop.signal.aborted) {
      try {
        await sleep(everyMs, undefined, { signal: term.stop.signal });
      } catch {
        return;
      }
      const sentAt = performance.now();
      let ttl: number;
      try {
        ttl = Number((await this.#client.call('/v3/lease/keepalive', { ID: term.lease }, true, everyMs)).TTL ?? 0);
      } catch (err) {
        if (err instanceof AtollError) continue; // etcd unreachable: the deadline ends the term if this goes on
        return this.#lose(term, `its keepalive failed: ${String(err)}`);
      }
      if (term.stop.signal.aborted) return;
      if (ttl <= 0) return this.#lose(term, `etcd no longer holds its lease ${term.lease}`);
      this.#arm(term, sentAt);
    }
  }

  /** (Re)sets the deadline: the TTL after `renewedAt`, the send time of the last successful renewal. */
  #arm(term: Term, renewedAt: number): void {
    clearTimeout(term.deadline);
    const left = renewedAt + this.#ttlSeconds * 1000 - performance.now();
    term.deadline = setTimeout(() => this.#lose(term, `its lease ${term.lease} was not renewed for ${this.#ttlSeconds} s`), left);
  }

  #lose(term: Term, why: string): void {
    term.stop.abort();
    clearTimeout(term.deadline);
    term.lost.abort(atollError('STORE_UNAVAILABLE', `${this.#id} no longer leads ${this.#key}: ${why}`, 'stop acting as leader and campaign again'));
  }

  async #endTerm(term: Term, why: string): Promise<void> {
    if (this.#term === term) this.#term = undefined;
    this.#lose(term, why);
    try {
      await this.#client.call('/v3/lease/revoke', { ID: term.lease }, true);
    } catch (err) {
      // A lease that is already gone (expired) is as good as revoked.
      if (!(err instanceof AtollError && err.cause instanceof EtcdReplyError && err.cause.grpcCode === GRPC_NOT_FOUND)) throw err;
    }
  }
}

/**
 * Follows etcd's watch on a range from `afterRevision` until `signal` aborts, resuming from the last revision seen
 * (on another endpoint) when a stream breaks.
 * @throws AtollError STORE_COMPACTED when etcd compacted the history asked for; STORE_UNAVAILABLE when no endpoint
 *   accepted the watch for the request timeout, or when the client closes. Whatever `onEvents` throws.
 */
async function follow(client: EtcdClient, range: { key: string; range_end?: string }, afterRevision: number,
  onEvents: (events: readonly GatewayEvent[]) => void, signal: AbortSignal): Promise<void> {
  let next = afterRevision + 1;
  let failingSince: number | undefined;
  while (!signal.aborted) {
    let stream: Stream;
    const endpoint = client.preferred;
    try {
      // With "hasleader", a member cut off from its cluster's leader cancels the watch instead of going quiet.
      stream = await client.stream('/v3/watch', { create_request: { ...range, start_revision: String(next) } }, signal, { 'Grpc-Metadata-hasleader': 'true' });
    } catch (err) {
      if (signal.aborted) return;
      failingSince ??= performance.now();
      if (client.closed || performance.now() - failingSince > client.timeoutMs) throw err;
      await sleep(RETRY_DELAY_MS, undefined, { signal }).catch(() => undefined);
      continue;
    }
    try {
      for (let msg: Reply = stream.first; ;) {
        if (msg.canceled === true) {
          const compacted = Number(msg.compact_revision ?? 0);
          if (compacted > 0) {
            throw atollError('STORE_COMPACTED', `etcd compacted its history up to revision ${compacted}; a watch asked for the changes after ${afterRevision}`,
              'list the keys again and watch from the revision of that listing');
          }
          throw new StreamBroke(`etcd canceled the watch: ${String(msg.cancel_reason ?? 'no reason given')}`);
        }
        if (msg.created === true) failingSince = undefined;
        const events = (msg.events as GatewayEvent[] | undefined) ?? [];
        if (events.length > 0) {
          onEvents(events);
          next = Number(events[events.length - 1]!.kv?.mod_revision ?? next - 1) + 1;
        }
        const r = await stream.rest.next();
        if (r.done === true) throw new StreamBroke('the watch stream ended');
        msg = r.value;
      }
    } catch (err) {
      stream.cancel();
      if (signal.aborted) return;
      if (client.closed) throw client.closedError();
      if (!(err instanceof StreamBroke || err instanceof EtcdReplyError)) throw err;
      client.avoid(endpoint);
      await sleep(RETRY_DELAY_MS, undefined, { signal }).catch(() => undefined);
    }
  }
}

/** A watch stream ended or failed; the watch itself resumes elsewhere. */
class StreamBroke extends Error {}

async function* jsonLines(body: ReadableStream<Uint8Array>): AsyncGenerator<Reply> {
  const decoder = new TextDecoder();
  let buf = '';
  try {
    for await (const chunk of body) {
      buf += decoder.decode(chunk, { stream: true });
      for (let nl = buf.indexOf('\n'); nl >= 0; nl = buf.indexOf('\n')) {
        const line = buf.slice(0, nl).trim();
        buf = buf.slice(nl + 1);
        if (line !== '') yield unwrap(JSON.parse(line) as Reply);
      }
    }
  } catch (err) {
    if (err instanceof EtcdReplyError) throw err;
    throw new StreamBroke(`the stream broke: ${describe(err)}`, { cause: err });
  }
  if (buf.trim() !== '') yield unwrap(JSON.parse(buf) as Reply);
}

/** `{"result": r}` → r; `{"error": e}` (a stream's failure) → throws. */
function unwrap(msg: Reply): Reply {
  if (typeof msg.error === 'object' && msg.error !== null) throw streamError(msg.error as StreamErrorBody);
  const result = msg.result;
  return typeof result === 'object' && result !== null ? (result as Reply) : msg;
}

interface StreamErrorBody {
  readonly grpc_code?: number;
  readonly message?: string;
}

function streamError(e: StreamErrorBody): EtcdReplyError {
  return new EtcdReplyError(e.grpc_code ?? 0, e.message ?? JSON.stringify(e));
}

/** A non-2xx answer: `{"error","code","message"}`, or a stream's `{"error": {…}}` when a stream fails at once. */
function replyError(text: string, status: number): EtcdReplyError {
  try {
    const e = JSON.parse(text) as { code?: number; message?: string; error?: string | StreamErrorBody };
    if (typeof e.error === 'object') return streamError(e.error);
    return new EtcdReplyError(e.code ?? 0, e.message ?? e.error ?? text);
  } catch {
    return new EtcdReplyError(0, `HTTP ${status}: ${text.slice(0, 200)}`);
  }
}

function post(body: unknown, signal: AbortSignal, headers: Record<string, string> = {}): RequestInit {
  return { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body), signal };
}

function notSent(err: unknown): boolean {
  const code = (err as { cause?: { code?: unknown } } | undefined)?.cause?.code;
  return typeof code === 'string' && NOT_SENT.has(code);
}

function describe(err: unknown): string {
  if (!(err instanceof Error)) return String(err);
  const code = (err.cause as { code?: unknown } | undefined)?.code;
  return typeof code === 'string' ? `${err.message} (${code})` : err.message;
}

function headerRevision(r: Reply): number {
  return Number((r.header as { revision?: string } | undefined)?.revision ?? 0);
}

function b64(s: string | Buffer): string {
  return Buffer.from(s).toString('base64');
}

function unb64(s: string | undefined): string {
  return s === undefined ? '' : Buffer.from(s, 'base64').toString('utf8');
}

/** The etcd range of every key starting with `prefix` (all keys when it is empty). */
function prefixRange(prefix: string): { key: string; range_end: string } {
  const start = Buffer.from(prefix);
  const end = Buffer.from(start);
  for (let i = end.length - 1; i >= 0; i--) {
    if (end[i]! < 0xff) {
      end[i]! += 1;
      return { key: b64(start), range_end: b64(end.subarray(0, i + 1)) };
    }
  }
  // Empty, or all 0xff bytes: from the first key to the end ("\0" as range_end means "no upper bound").
  return { key: b64(start.length === 0 ? Buffer.from([0]) : start), range_end: b64(Buffer.from([0])) };
}
