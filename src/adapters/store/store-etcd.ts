/**
 * The {@link ClusterStore} and {@link LeaderElection} on etcd v3, spoken through etcd's JSON gateway (`/v3/...`)
 * with the global fetch, so the controller carries no gRPC stack.
 *
 * Why etcd: several controller replicas (or a controller beside a Kubernetes control plane that already runs etcd)
 * need one linearizable store; etcd's transactions, revisions and watches are exactly the shape of the port.
 *
 * The gateway's encodings, the failover across endpoints and the watch are in store-etcd-client.ts.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import type { ClusterStore, KvEntry, KvList, LeaderElection, TxnCompare, TxnOp, TxnResult, WatchEvent } from '../../core/cluster/store.ts';
import { AtollError, atollError } from '../../core/errors.ts';
import { checkTxnOps } from './store-txn-check.ts';
import {
  b64, EtcdClient, type EtcdOptions, EtcdReplyError, follow, type GatewayKv, GRPC_NOT_FOUND, headerRevision, prefixRange, RETRY_DELAY_MS, unb64,
} from './store-etcd-client.ts';

export interface EtcdLeaderOptions extends EtcdOptions {
  /** This replica's identity, stored as the leader key's value (e.g. its API URL). */
  readonly id: string;
  /** TTL of the leader's lease: a replica that dies is replaced within this long. */
  readonly ttlSeconds: number;
  /** The leader key under `prefix` (default `leader`). */
  readonly key?: string;
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
