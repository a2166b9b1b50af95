/**
 * The client of etcd's JSON gateway (`/v3/...`) that src/adapters/store/store-etcd.ts speaks through, with the global
 * fetch, so the controller carries no gRPC stack: failover across endpoints, unary calls, streams, the watch, and
 * the gateway's encodings.
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
import { AtollError, atollError } from '../../core/errors.ts';

export interface EtcdOptions {
  /** Client URLs of the etcd members, e.g. `http://10.0.0.1:2379`. */
  readonly endpoints: readonly string[];
  /** Every key lives under this prefix (e.g. `/atoll/prod/`), so clusters and tests can share one etcd. */
  readonly prefix: string;
  /** Bound on one request to one endpoint (default 5000 ms). */
  readonly requestTimeoutMs?: number;
}

/** A message of the gateway, after `{"result": …}` is unwrapped. */
export type Reply = Record<string, unknown>;

export interface GatewayKv {
  readonly key?: string;
  readonly value?: string;
  readonly create_revision?: string;
  readonly mod_revision?: string;
  readonly lease?: string;
}

export interface GatewayEvent {
  readonly type?: 'PUT' | 'DELETE';
  readonly kv?: GatewayKv;
}

export const GRPC_NOT_FOUND = 5;
const GRPC_UNAVAILABLE = 14;
/** Connection errors that prove the request never left: safe to send anywhere else, even a txn. */
const NOT_SENT = new Set(['ECONNREFUSED', 'EHOSTUNREACH', 'ENETUNREACH', 'EADDRNOTAVAIL', 'UND_ERR_CONNECT_TIMEOUT']);
export const RETRY_DELAY_MS = 100;

/** An error etcd answered: a definite refusal, except gRPC UNAVAILABLE ("no leader", "request timed out"). */
export class EtcdReplyError extends Error {
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

/** The gateway client EtcdStore and EtcdLeader (store-etcd.ts) use: failover across endpoints, unary calls and streams. */
export class EtcdClient {
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
 * Follows etcd's watch on a range from `afterRevision` until `signal` aborts, resuming from the last revision seen
 * (on another endpoint) when a stream breaks.
 * @throws AtollError STORE_COMPACTED when etcd compacted the history asked for; STORE_UNAVAILABLE when no endpoint
 *   accepted the watch for the request timeout, or when the client closes. Whatever `onEvents` throws.
 */
export async function follow(client: EtcdClient, range: { key: string; range_end?: string }, afterRevision: number,
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

export function headerRevision(r: Reply): number {
  return Number((r.header as { revision?: string } | undefined)?.revision ?? 0);
}

export function b64(s: string | Buffer): string {
  return Buffer.from(s).toString('base64');
}

export function unb64(s: string | undefined): string {
  return s === undefined ? '' : Buffer.from(s, 'base64').toString('utf8');
}

/** The etcd range of every key starting with `prefix` (all keys when it is empty). */
export function prefixRange(prefix: string): { key: string; range_end: string } {
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
