/**
 * The {@link ClusterStore} on the Kubernetes API, so a Kubernetes install needs no etcd of its own: keys are
 * custom resources (IPBlock, NodeRegistration, StoreEntry; src/adapters/store/store-kube-names.ts maps keys to objects),
 * and leadership is a Lease (src/adapters/store/store-kube-lease.ts). CRDs: deploy/helm/atoll/crds/.
 *
 * Why a log object: Kubernetes compares-and-swaps one object at a time (resourceVersion), but the registry needs
 * transactions over several keys (a block lease and the node record that lists it; a deregistration). So one
 * StoreLog object per store is the commit point: it holds the store revision, the last committed transactions
 * (bounded by count and bytes) and `appliedThrough`. A transaction (in fact a batch of them: concurrent callers of
 * one store share a commit) goes:
 *   1. read the log (resourceVersion R, revision N);
 *   2. roll forward: apply the transactions after `appliedThrough` to the entry objects, unless this store applied
 *      them itself (idempotent: an object whose spec.modRevision is already that high is left alone);
 *   3. read the entry objects of the keys named (beside step 1: an object newer than the log fails step 4, an older
 *      one is covered by the log), and evaluate the compares against them with the log laid over;
 *   4. replace the log at resourceVersion R with revision N+k, the new transactions appended and
 *      `appliedThrough: N`: this is the commit; a 409 means another writer committed first: start again;
 *   5. apply the ops to the entry objects (create, replace at their resourceVersion, delete with a resourceVersion
 *      precondition; each carries spec.modRevision), and resolve.
 * A crash between 4 and 5 leaves the newest transactions committed but not applied; the next writer's step 2 heals
 * it. Readers never write, and read from a view kept in memory: at open (and after a gap) the entry objects are
 * listed, then the log read and its history laid over them (a key the history changed later than its object says is
 * taken from the history), so a committed transaction is seen whole or not at all, whoever applies it and however
 * late. Each get or list then reads the log once (concurrent reads share that read) and lays the transactions after
 * the view's revision on it, in order: linearizable, at the cost of one small request instead of a listing. A gap
 * wider than the history, or a log that moved back, loads again.
 *
 * Watches replay the log's history, then follow the StoreLog object through one Kubernetes watch per store, shared
 * by all its watchers (a controller streams to every agent); a gap larger than the history rejects STORE_COMPACTED.
 * Objects edited by hand (kubectl edit) are surfaced as they are, as long as their spec.modRevision is not lowered
 * (the view follows the entry objects through one watch per kind, and lays such edits on at the first read after
 * their event arrived: within moments, not at once): `atoll ipam check` then reports, say, an IPBlock made to
 * overlap another.
 * docs/architecture.md, "The Kubernetes store", has the limits.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import type { ClusterStore, KvEntry, KvList, LeaderElection, TxnCompare, TxnOp, TxnResult, WatchEvent } from '../../core/cluster/store.ts';
import { AtollError, atollError } from '../../core/errors.ts';
import { type KubeClient, type KubeObject, kubeStatusOf } from '../kube/kube-client.ts';
import { checkTxnOps } from './store-txn-check.ts';
import { ENTRY_KINDS, type EntryKind, KIND_PLURAL, keyOfName, kindOfKey, objectName, storeTag } from './store-kube-names.ts';
import { KubeLeaseElection, storeError } from './store-kube-lease.ts';

export const API_GROUP = 'atoll.dev';
const API_VERSION = `${API_GROUP}/v1alpha1`;
const API_PATH = `/apis/${API_VERSION}`;
/** Label on every entry object: the tag of the store it belongs to. */
export const STORE_LABEL = `${API_GROUP}/store`;
/** Label on an IPBlock: the node its value names, so `kubectl get ipblocks -l atoll.dev/node=NODE` works. */
export const NODE_LABEL = `${API_GROUP}/node`;
const LABEL_VALUE = /^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$/;

/** Transactions per commit at most (concurrent callers of one store share a commit). */
const MAX_BATCH = 64;
/** Commits lost to other writers in a row before a batch gives up with STORE_UNAVAILABLE. */
const MAX_COMMIT_ATTEMPTS = 100;
/** Conflicting writes to one entry object in a row before applying it gives up. */
const MAX_APPLY_ATTEMPTS = 20;
/** How long a watch keeps trying to reach the API server before it rejects. */
const WATCH_RETRY_MS = 30_000;

export interface EntrySpec {
  readonly key: string;
  readonly value: string;
  readonly createRevision: number;
  readonly modRevision: number;
}

export interface EntryObject extends KubeObject {
  readonly spec: EntrySpec;
}

export interface LogOp {
  readonly type: 'put' | 'delete';
  readonly key: string;
  readonly value?: string;
  readonly createRevision?: number;
}

export interface LogTxn {
  readonly revision: number;
  readonly ops: readonly LogOp[];
}

export interface LogSpec {
  readonly revision: number;
  /** The history holds every transaction after this revision. */
  readonly compacted: number;
  /** Every transaction up to this revision is applied to the entry objects. */
  readonly appliedThrough: number;
  readonly history: readonly LogTxn[];
}

export interface LogObject extends KubeObject {
  readonly spec: LogSpec;
}

export interface KubeStoreInit {
  /** The StoreLog's name; entry objects carry its tag (store-kube-names.ts), so stores can share a cluster. */
  readonly name: string;
  /**
   * Bound on the history's JSON size (default 32 KiB). Every commit rewrites the log object whole and every read
   * fetches it: on loopback a commit took 24 ms with 64 KiB of history and 12 ms with 16 KiB.
   */
  readonly historyBytes?: number;
  /** Bound on the number of transactions in the history (default 1000). */
  readonly historyCount?: number;
}

interface Pending {
  readonly compares: readonly TxnCompare[];
  readonly ops: readonly TxnOp[];
  readonly resolve: (r: TxnResult) => void;
  readonly reject: (err: unknown) => void;
}

/** One {@link KubeStore.watch}, as the shared watch of the StoreLog feeds it. */
interface LogWatcher {
  /** Delivers what `spec` holds after the revision this watcher is at (or ends it: a gap, or its handler threw). */
  deliver(spec: LogSpec): void;
  /** Ends the watch: resolved without `err`, rejected with it. */
  end(err?: unknown): void;
}

/** A change of one entry object, as its watch saw it. */
interface ObjectEvent {
  readonly kind: EntryKind;
  readonly name: string;
  readonly deleted: boolean;
  readonly spec: EntrySpec;
  readonly seq: number;
}

/** The newest op on each key in a history, with its revision. */
type Latest = Map<string, { readonly op: LogOp; readonly revision: number }>;

export class KubeStore implements ClusterStore {
  readonly name: string;
  readonly #kube: KubeClient;
  readonly #tag: string;
  readonly #logPath: string;
  readonly #historyBytes: number;
  readonly #historyCount: number;
  readonly #closed = new AbortController();
  #queue: Pending[] = [];
  #committing = false;
  /** Revisions up to this one are applied to the entry objects, by this store itself. */
  #appliedByMe = 0;
  readonly #watchers = new Set<LogWatcher>();
  /** Stops the shared watch of the StoreLog; undefined while none runs. */
  #follower: AbortController | undefined;
  /** What the store holds at revision {@link #rev}: the objects listed at the last load, advanced by the log. */
  #view = new Map<string, KvEntry>();
  #rev = 0;
  /** The view's keys in order; undefined when the key set changed since. */
  #sorted: string[] | undefined;
  /** Keys the log deleted since the last load (and still in its history), at that revision: a late apply event is older. */
  #deletedAt = new Map<string, number>();
  /** Set when the view may have missed a change (an object watch ended): the next read loads again. */
  #stale = true;
  /** The newest event of each entry object (`kind/name`) not yet laid on the view, numbered in arrival order. */
  readonly #objectEvents = new Map<string, ObjectEvent>();
  #objectSeq = 0;
  /** Stops the watches of the entry objects begun by the last load. */
  #objectWatch = new AbortController();
  /** The view's refresh in flight, and the one queued behind it (a read needs a log read begun after it began). */
  #syncing: Promise<void> | undefined;
  #queued: Promise<void> | undefined;

  constructor(components: { readonly kube: KubeClient }, init: KubeStoreInit) {
    this.#kube = components.kube;
    this.name = init.name;
    this.#tag = storeTag(init.name);
    this.#logPath = `${API_PATH}/storelogs/${init.name}`;
    this.#historyBytes = init.historyBytes ?? 32 * 1024;
    this.#historyCount = init.historyCount ?? 1000;
  }

  /**
   * Opens the store named `init.name`, creating its empty StoreLog if there is none.
   * @throws AtollError STORE_UNAVAILABLE when the API server cannot be reached, or the CRDs are not installed.
   */
  static async open(components: { readonly kube: KubeClient }, init: KubeStoreInit): Promise<KubeStore> {
    const store = new KubeStore(components, init);
    await store.#ensureLog();
    try {
      await store.#sync();
    } catch (err) {
      throw storeError(err, `open the Kubernetes store ${init.name}`);
    }
    return store;
  }

  /** The entry at `key` in the view, once the view reached the log's current revision. */
  async get(key: string): Promise<KvEntry | undefined> {
    this.#assertOpen();
    try {
      await this.#sync();
    } catch (err) {
      throw storeError(err, `read key ${key}`);
    }
    return this.#view.get(key);
  }

  /** The view's entries under `prefix`, once the view reached the log's current revision. */
  async list(prefix: string): Promise<KvList> {
    this.#assertOpen();
    try {
      await this.#sync();
    } catch (err) {
      throw storeError(err, `list keys under "${prefix}"`);
    }
    this.#sorted ??= [...this.#view.keys()].sort();
    const entries: KvEntry[] = [];
    for (let i = lowerBound(this.#sorted, prefix); i < this.#sorted.length && this.#sorted[i]!.startsWith(prefix); i++) entries.push(this.#view.get(this.#sorted[i]!)!);
    return { entries, revision: this.#rev };
  }

  /**
   * Commits with the other transactions pending on this store, in one replace of the log.
   * @throws AtollError STORE_UNAVAILABLE when the API server cannot be reached (if the log replace itself was cut
   *   off, whether it applied is unknown: re-read), or after MAX_COMMIT_ATTEMPTS commits lost to other writers.
   */
  async txn(compares: readonly TxnCompare[], ops: readonly TxnOp[]): Promise<TxnResult> {
    checkTxnOps(ops);
    this.#assertOpen();
    return new Promise((resolve, reject) => {
      this.#queue.push({ compares, ops, resolve, reject });
      void this.#drain();
    });
  }

  /**
   * The history after `afterRevision` (from a fresh read of the log), then each commit as the store's one shared
   * watch of the StoreLog sees it: however many watchers, one Kubernetes watch per store.
   */
  watch(prefix: string, afterRevision: number, onEvent: (events: readonly WatchEvent[]) => void, signal: AbortSignal): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      this.#assertOpen();
      if (signal.aborted) return resolve();
      let last = afterRevision;
      const end = (err?: unknown) => {
        if (!this.#watchers.delete(watcher)) return;
        signal.removeEventListener('abort', onAbort);
        if (this.#watchers.size === 0) this.#follower?.abort();
        if (err === undefined) resolve(); else reject(err);
      };
      const onAbort = () => end();
      const watcher: LogWatcher = {
        deliver: (spec) => {
          if (spec.compacted > last) {
            return end(atollError('STORE_COMPACTED', `StoreLog ${this.name} holds the transactions after revision ${spec.compacted} only; a watch needs those after ${last}`,
              'list the keys again and watch from the revision of that listing'));
          }
          for (const t of spec.history) {
            if (t.revision <= last) continue;
            last = t.revision;
            const events = t.ops.filter((op) => op.key.startsWith(prefix)).map((op): WatchEvent =>
              ({ type: op.type, key: op.key, value: op.type === 'put' ? op.value ?? '' : '', modRevision: t.revision }));
            if (events.length === 0) continue;
            try {
              onEvent(events);
            } catch (err) {
              return end(err);
            }
          }
        },
        end,
      };
      signal.addEventListener('abort', onAbort, { once: true });
      this.#watchers.add(watcher);
      this.#follow();
      void this.#replay(watcher);
    });
  }

  /** The history a new watcher asks for, from a fresh read of the log; retried while the API server is away. */
  async #replay(watcher: LogWatcher): Promise<void> {
    const since = performance.now();
    while (this.#watchers.has(watcher)) {
      try {
        return watcher.deliver((await this.#readLog()).spec);
      } catch (err) {
        if (!(err instanceof AtollError && err.code.startsWith('KUBE_API_')) || performance.now() - since > WATCH_RETRY_MS) {
          return watcher.end(storeError(err, `read StoreLog ${this.name}`));
        }
        await sleep(500);
      }
    }
  }

  /** Starts the shared watch of the StoreLog unless it runs; it stops when the last watcher leaves. */
  #follow(): void {
    if (this.#follower !== undefined) return;
    const stop = new AbortController();
    this.#follower = stop;
    const signal = AbortSignal.any([stop.signal, this.#closed.signal]);
    const deliver = (spec: LogSpec) => {
      for (const w of [...this.#watchers]) w.deliver(spec);
    };
    void (async () => {
      let failingSince: number | undefined;
      let rv: string | undefined;
      while (!signal.aborted) {
        try {
          if (rv === undefined) {
            const log = await this.#readLog();
            failingSince = undefined;
            deliver(log.spec);
            rv = log.metadata.resourceVersion ?? '';
          }
          await this.#kube.watch<LogObject>(`${API_PATH}/storelogs`, rv, (e) => {
            if (e.type === 'DELETED') throw atollError('STORE_UNAVAILABLE', `StoreLog ${this.name} was deleted`, 'restore the store, then restart the controllers');
            rv = e.object.metadata.resourceVersion ?? rv;
            if (e.type !== 'BOOKMARK') deliver(e.object.spec);
          }, { fieldSelector: `metadata.name=${this.name}`, signal });
        } catch (err) {
          if (signal.aborted) break;
          // Read the log again before watching again: after a 410 (the API server's watch cache moved on) or an
          // outage, its history covers the gap, and a successful read ends the outage's count.
          rv = undefined;
          if (err instanceof AtollError && err.code === 'STORE_COMPACTED') continue;
          failingSince ??= performance.now();
          if (!(err instanceof AtollError && err.code.startsWith('KUBE_API_')) || performance.now() - failingSince > WATCH_RETRY_MS) {
            for (const w of [...this.#watchers]) w.end(storeError(err, `watch StoreLog ${this.name}`));
            break;
          }
          await sleep(500, undefined, { signal }).catch(() => undefined);
        }
      }
      if (this.#follower === stop) this.#follower = undefined;
      // A watcher that came while this one was stopping needs a follower of its own.
      if (this.#watchers.size > 0 && !this.#closed.signal.aborted) this.#follow();
    })();
  }

  /** Ends every watch (with STORE_UNAVAILABLE) and refuses further calls; pending transactions still finish. */
  async close(): Promise<void> {
    this.#closed.abort();
    this.#objectWatch.abort();
    for (const w of [...this.#watchers]) w.end(this.#closedError());
  }

  /**
   * Brings the view to the log's revision as of a read of the log begun after this call, or later: reads are
   * linearizable, as if they read the objects and the log. Concurrent callers share the reads of the log.
   */
  #sync(): Promise<void> {
    if (this.#queued) return this.#queued;
    if (!this.#syncing) return this.#startSync();
    this.#queued = this.#syncing.catch(() => undefined).then(() => this.#startSync());
    return this.#queued;
  }

  #startSync(): Promise<void> {
    this.#queued = undefined;
    const running = this.#refresh().finally(() => {
      if (this.#syncing === running) this.#syncing = undefined;
    });
    this.#syncing = running;
    return running;
  }

  /**
   * One read of the log, its history laid on the view; then the object events that arrived before that read (hand
   * edits: this store's own applies and other writers' are older than the view). Loads again after a gap wider than
   * the history, a log that moved back, or an object watch that ended.
   */
  async #refresh(): Promise<void> {
    const mark = this.#objectSeq;
    if (this.#stale) return this.#load();
    const log = await this.#readLog();
    if (!this.#advance(log.spec)) return this.#load();
    this.#layObjectEvents(mark);
  }

  /**
   * Lists the entry objects, then reads the log and lays its history over them (as a reader without a view would);
   * then watches the objects from the listings, for hand edits.
   */
  async #load(): Promise<void> {
    this.#stale = true;
    this.#objectWatch.abort();
    this.#objectEvents.clear();
    const lists = await Promise.all(ENTRY_KINDS.map((kind) => this.#kube.list<EntryObject>(`${API_PATH}/${KIND_PLURAL[kind]}`, { labelSelector: `${STORE_LABEL}=${this.#tag}` })));
    const log = await this.#readLog();
    const objects = new Map<string, EntrySpec>();
    for (const obj of lists.flatMap((l) => l.items)) {
      const key = obj.spec?.key;
      if (typeof key !== 'string') continue;
      // Two objects for one key (one renamed by hand): the one at the key's own name wins.
      if (!objects.has(key) || obj.metadata.name === objectName(this.#tag, key)) objects.set(key, obj.spec);
    }
    const latest = latestOps(log.spec.history);
    this.#view = new Map();
    this.#deletedAt = new Map();
    for (const key of new Set([...objects.keys(), ...latest.keys()])) {
      const entry = resolveKey(key, objects.get(key), latest, log.spec.appliedThrough);
      if (entry) this.#view.set(key, entry);
    }
    for (const [key, { op, revision }] of latest) if (op.type === 'delete') this.#deletedAt.set(key, revision);
    this.#rev = log.spec.revision;
    this.#sorted = undefined;
    if (this.#closed.signal.aborted) return;
    const stop = new AbortController();
    this.#objectWatch = stop;
    this.#stale = false;
    ENTRY_KINDS.forEach((kind, i) => void this.#watchObjects(kind, lists[i]!.resourceVersion, stop.signal));
  }

  /** Lays the log's transactions after the view's revision on it; false when the history does not reach back to it. */
  #advance(spec: LogSpec): boolean {
    if (spec.revision < this.#rev || (spec.revision > this.#rev && spec.compacted > this.#rev)) return false;
    for (const t of spec.history) {
      if (t.revision <= this.#rev) continue;
      for (const op of t.ops) {
        if (op.type === 'put') {
          if (!this.#view.has(op.key)) this.#sorted = undefined;
          this.#view.set(op.key, { key: op.key, value: op.value ?? '', createRevision: op.createRevision ?? t.revision, modRevision: t.revision });
          this.#deletedAt.delete(op.key);
        } else {
          if (this.#view.delete(op.key)) this.#sorted = undefined;
          this.#deletedAt.set(op.key, t.revision);
        }
      }
    }
    this.#rev = spec.revision;
    // As a reader without a view: once a delete left the history, an object that says otherwise is believed.
    for (const [key, revision] of this.#deletedAt) if (revision <= spec.compacted) this.#deletedAt.delete(key);
    return true;
  }

  /** Follows one kind's objects of this store into {@link #objectEvents}; when the watch cannot go on, the next read loads again. */
  async #watchObjects(kind: EntryKind, resourceVersion: string, signal: AbortSignal): Promise<void> {
    let rv = resourceVersion;
    try {
      while (!signal.aborted) {
        await this.#kube.watch<EntryObject>(`${API_PATH}/${KIND_PLURAL[kind]}`, rv, (e) => {
          rv = e.object.metadata.resourceVersion ?? rv;
          if (e.type === 'BOOKMARK' || typeof e.object.spec?.key !== 'string') return;
          const name = e.object.metadata.name;
          this.#objectEvents.set(`${kind}/${name}`, { kind, name, deleted: e.type === 'DELETED', spec: e.object.spec, seq: ++this.#objectSeq });
        }, { labelSelector: `${STORE_LABEL}=${this.#tag}`, signal });
      }
    } catch {
      if (!signal.aborted) this.#stale = true;
    }
  }

  /**
   * Lays on the view what the object events say, as a reader without a view would see the objects: an object at or
   * past its key's revision in the view is taken as it is (edited by hand), an older one is an apply the view has
   * (or a late one it ignores). Deletes, and puts past the view, that arrived after `mark` (the read of the log
   * began) wait for the next read: they may be applies of a transaction newer than the log read.
   */
  #layObjectEvents(mark: number): void {
    for (const [id, e] of this.#objectEvents) {
      const { spec } = e;
      if (e.seq > mark && (e.deleted || spec.modRevision > this.#rev)) continue;
      this.#objectEvents.delete(id);
      const own = e.name === objectName(this.#tag, spec.key);
      const current = this.#view.get(spec.key);
      if (e.deleted) {
        if (current && current.modRevision <= spec.modRevision && (own || current.value === spec.value)) this.#dropKey(spec.key);
        continue;
      }
      if (!own) {
        // Renamed by hand: the key the name stands for is gone (unless the log changed it since), and a key's own
        // object wins over a renamed one.
        const was = keyOfName(this.#tag, e.kind, e.name);
        if (was !== undefined && (this.#view.get(was)?.modRevision ?? Infinity) <= spec.modRevision) this.#dropKey(was);
        if (current) continue;
      }
      if (spec.modRevision >= (current?.modRevision ?? this.#deletedAt.get(spec.key) ?? 0)) {
        if (!current) this.#sorted = undefined;
        this.#view.set(spec.key, toKv(spec));
      }
    }
  }

  #dropKey(key: string): void {
    this.#view.delete(key);
    this.#sorted = undefined;
  }

  async #ensureLog(): Promise<void> {
    try {
      if (await this.#kube.get<LogObject>(this.#logPath)) return;
      const spec: LogSpec = { revision: 0, compacted: 0, appliedThrough: 0, history: [] };
      await this.#kube.create(`${API_PATH}/storelogs`, { apiVersion: API_VERSION, kind: 'StoreLog', metadata: { name: this.name }, spec });
    } catch (err) {
      if (kubeStatusOf(err)?.status === 409) return; // another replica created it
      throw storeError(err, `open StoreLog ${this.name}`);
    }
  }

  async #readLog(): Promise<LogObject> {
    const log = await this.#kube.get<LogObject>(this.#logPath);
    if (log === undefined) {
      throw atollError('STORE_UNAVAILABLE', `StoreLog ${this.name} does not exist (deleted?)`, 'restore it from a backup, or restart the controller to begin an empty store');
    }
    return log;
  }

  #entryPath(key: string, kind: EntryKind = kindOfKey(key)): string {
    return `${API_PATH}/${KIND_PLURAL[kind]}/${objectName(this.#tag, key)}`;
  }

  #getEntry(key: string): Promise<EntryObject | undefined> {
    return this.#kube.get<EntryObject>(this.#entryPath(key));
  }

  async #drain(): Promise<void> {
    if (this.#committing) return;
    this.#committing = true;
    try {
      while (this.#queue.length > 0) {
        const batch = this.#queue.splice(0, MAX_BATCH);
        try {
          const results = await this.#commit(batch);
          batch.forEach((p, i) => p.resolve(results[i]!));
        } catch (err) {
          for (const p of batch) p.reject(err);
        }
      }
    } finally {
      this.#committing = false;
    }
  }

  /** Steps 1 to 5 of the header, for a batch; the results in the batch's order. */
  async #commit(batch: readonly Pending[]): Promise<TxnResult[]> {
    for (let attempt = 1; attempt <= MAX_COMMIT_ATTEMPTS; attempt++) {
      let log: LogObject;
      let objects: Map<string, EntryObject | undefined>;
      try {
        // The objects may be read beside the log: one newer than the log fails the commit below (the log moved),
        // one older is covered by the log's history.
        const keys = [...new Set(batch.flatMap((p) => [...p.compares.map((c) => c.key), ...p.ops.map((o) => o.key)]))];
        const [read, ...got] = await Promise.all([this.#readLog(), ...keys.map((k) => this.#getEntry(k))]);
        log = read as LogObject;
        objects = new Map(keys.map((k, i) => [k, got[i] as EntryObject | undefined]));
        await this.#rollForward(log.spec);
      } catch (err) {
        throw storeError(err, 'prepare a transaction');
      }
      const { results, txns } = evaluate(batch, log.spec, objects);
      if (txns.length === 0) return results;
      const spec = this.#nextLog(log.spec, txns);
      try {
        await this.#kube.replace(this.#logPath, { ...log, spec });
      } catch (err) {
        const status = kubeStatusOf(err)?.status;
        if (status === 409) {
          await sleep(Math.random() * Math.min(50, attempt * 5));
          continue;
        }
        if (status !== undefined) throw storeError(err, `commit revision ${spec.revision} (refused, not applied)`);
        throw atollError('STORE_UNAVAILABLE', `Kubernetes store: the commit of revision ${spec.revision} to StoreLog ${this.name} was cut off; whether it was applied is unknown`,
          're-read the keys the transaction compares, then retry if it was not applied', err);
      }
      // Committed. Applying is best effort: whatever is left undone, the next writer rolls forward.
      await this.#apply(txns, objects).then(() => {
        this.#appliedByMe = spec.revision;
      }, () => undefined);
      return results;
    }
    throw atollError('STORE_UNAVAILABLE', `Kubernetes store: lost ${MAX_COMMIT_ATTEMPTS} commits in a row to other writers on StoreLog ${this.name}`,
      'retry; if it persists, check how many controllers write (only the leader should)');
  }

  /** The log after `txns`: revision, history trimmed to its bounds (never the new transactions), appliedThrough. */
  #nextLog(spec: LogSpec, txns: readonly LogTxn[]): LogSpec {
    const history = [...spec.history, ...txns];
    let bytes = history.reduce((n, t) => n + JSON.stringify(t).length, 0);
    let drop = 0;
    let compacted = spec.compacted;
    while (drop < spec.history.length && (history.length - drop > this.#historyCount || bytes > this.#historyBytes)) {
      bytes -= JSON.stringify(history[drop]).length;
      compacted = history[drop]!.revision;
      drop++;
    }
    return { revision: txns.at(-1)!.revision, compacted, appliedThrough: spec.revision, history: history.slice(drop) };
  }

  /** Applies the log's transactions after appliedThrough, unless this store applied them itself. */
  async #rollForward(spec: LogSpec): Promise<void> {
    const from = Math.max(spec.appliedThrough, this.#appliedByMe);
    if (spec.revision <= from) return;
    await this.#apply(spec.history.filter((t) => t.revision > from), new Map());
    this.#appliedByMe = spec.revision;
  }

  /**
   * Brings each key the transactions touch to its newest op, in parallel. `known` holds objects already read
   * (a guess: a conflict re-reads). Objects this creates are checked against the log afterwards.
   */
  async #apply(txns: readonly LogTxn[], known: ReadonlyMap<string, EntryObject | undefined>): Promise<void> {
    const latest = latestOps(txns);
    const created: EntryObject[] = [];
    await Promise.all([...latest].map(async ([key, { op, revision }]) => {
      const made = await this.#applyOp(key, op, revision, known.has(key) ? known.get(key) : await this.#getEntry(key));
      if (made) created.push(made);
    }));
    if (created.length > 0) await this.#undoStaleCreates(created);
  }

  /** One key to the state `op` at `revision` gives it; returns the object when it created one. */
  async #applyOp(key: string, op: LogOp, revision: number, first: EntryObject | undefined): Promise<EntryObject | undefined> {
    let obj = first;
    const path = this.#entryPath(key);
    for (let attempt = 0; attempt < MAX_APPLY_ATTEMPTS; attempt++) {
      // An object already at this revision or later (applied, or changed by a later transaction) is left alone.
      if (obj !== undefined && obj.spec.key === key && obj.spec.modRevision >= revision) return undefined;
      try {
        if (op.type === 'delete') {
          if (obj === undefined) return undefined;
          await this.#kube.delete(path, { resourceVersion: obj.metadata.resourceVersion });
          return undefined;
        }
        const body = this.#entryObject(key, { key, value: op.value ?? '', createRevision: op.createRevision ?? revision, modRevision: revision }, obj);
        if (obj !== undefined) {
          await this.#kube.replace(path, body);
          return undefined;
        }
        return await this.#kube.create<EntryObject>(`${API_PATH}/${KIND_PLURAL[kindOfKey(key)]}`, body);
      } catch (err) {
        const status = kubeStatusOf(err)?.status;
        if (status !== 409 && status !== 404) throw err;
        obj = await this.#getEntry(key); // another writer got there first: look again
      }
    }
    throw atollError('STORE_UNAVAILABLE', `Kubernetes store: object ${path} kept changing while revision ${revision} was applied to it`, 'the next transaction rolls it forward');
  }

  /**
   * A create can land late: a slow writer reads "absent", another applies the same transaction and a later one
   * that deletes the key, then the slow create arrives. The history names such keys; the object is removed again.
   * (Until then readers do not see it: the history lays the delete over it.)
   */
  async #undoStaleCreates(created: readonly EntryObject[]): Promise<void> {
    const latest = latestOps((await this.#readLog()).spec.history);
    await Promise.all(created.map(async (obj) => {
      const newest = latest.get(obj.spec.key);
      if (newest === undefined || newest.revision <= obj.spec.modRevision || newest.op.type !== 'delete') return;
      await this.#kube.delete(this.#entryPath(obj.spec.key), { resourceVersion: obj.metadata.resourceVersion }).catch(() => undefined);
    }));
  }

  #entryObject(key: string, spec: EntrySpec, previous: EntryObject | undefined): EntryObject {
    const labels: Record<string, string> = { ...previous?.metadata.labels, [STORE_LABEL]: this.#tag };
    delete labels[NODE_LABEL];
    const node = kindOfKey(key) === 'IPBlock' ? nodeOf(spec.value) : undefined;
    if (node !== undefined) labels[NODE_LABEL] = node;
    const name = objectName(this.#tag, key);
    const metadata = previous === undefined ? { name, labels } : { ...previous.metadata, labels };
    return { apiVersion: API_VERSION, kind: kindOfKey(key), metadata, spec };
  }

  #assertOpen(): void {
    if (this.#closed.signal.aborted) throw this.#closedError();
  }

  #closedError(): AtollError {
    return atollError('STORE_UNAVAILABLE', `the Kubernetes store ${this.name} is closed`, 'open a new store');
  }
}

/**
 * Evaluates a batch in order against the objects read and the log laid over them, each transaction seeing the
 * ones before it: the results, and the transactions to commit (one revision each, only ops that change something).
 */
export function evaluate(batch: readonly Pick<Pending, 'compares' | 'ops'>[], log: LogSpec, objects: ReadonlyMap<string, EntryObject | undefined>): { results: TxnResult[]; txns: LogTxn[] } {
  const latest = latestOps(log.history);
  const view = new Map<string, KvEntry | undefined>();
  for (const [key, obj] of objects) view.set(key, resolveKey(key, obj?.spec.key === key ? obj.spec : undefined, latest, log.appliedThrough));
  let revision = log.revision;
  const results: TxnResult[] = [];
  const txns: LogTxn[] = [];
  for (const p of batch) {
    if (!p.compares.every((c) => (view.get(c.key)?.modRevision ?? 0) === c.modRevision)) {
      results.push({ succeeded: false, revision });
      continue;
    }
    const next = revision + 1;
    const ops = p.ops.flatMap((op): LogOp[] => op.type === 'put'
      ? [{ type: 'put', key: op.key, value: op.value, createRevision: view.get(op.key)?.createRevision ?? next }]
      : view.get(op.key) !== undefined ? [{ type: 'delete', key: op.key }] : []);
    if (ops.length > 0) {
      revision = next;
      txns.push({ revision, ops });
      for (const op of ops) {
        view.set(op.key, op.type === 'put' ? { key: op.key, value: op.value ?? '', createRevision: op.createRevision ?? revision, modRevision: revision } : undefined);
      }
    }
    results.push({ succeeded: true, revision });
  }
  return { results, txns };
}

export function latestOps(history: readonly LogTxn[]): Latest {
  const latest: Latest = new Map();
  for (const t of history) for (const op of t.ops) latest.set(op.key, { op, revision: t.revision });
  return latest;
}

/**
 * What a key holds, from its object (if any) with the log laid over: an object at or past the key's newest
 * revision in the history is taken as it is (applied; or edited by hand since); otherwise the history decides,
 * except that a key the history shows applied but whose object is gone stays gone (deleted by hand).
 */
export function resolveKey(key: string, obj: EntrySpec | undefined, latest: Latest, appliedThrough: number): KvEntry | undefined {
  const newest = latest.get(key);
  if (newest === undefined || (obj !== undefined && obj.modRevision >= newest.revision)) return obj && toKv(obj);
  if (obj === undefined && newest.revision <= appliedThrough) return undefined;
  if (newest.op.type === 'delete') return undefined;
  return { key, value: newest.op.value ?? '', createRevision: newest.op.createRevision ?? newest.revision, modRevision: newest.revision };
}

/** The first index of `sorted` whose string is not below `s`. */
function lowerBound(sorted: readonly string[], s: string): number {
  let lo = 0;
  let hi = sorted.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (sorted[mid]! < s) lo = mid + 1; else hi = mid;
  }
  return lo;
}

function toKv(s: EntrySpec): KvEntry {
  return { key: s.key, value: s.value, createRevision: s.createRevision, modRevision: s.modRevision };
}

/** The `node` field of a JSON value, when it is a valid label value. */
function nodeOf(value: string): string | undefined {
  try {
    const node = (JSON.parse(value) as { node?: unknown } | null)?.node;
    return typeof node === 'string' && LABEL_VALUE.test(node) ? node : undefined;
  } catch {
    return undefined;
  }
}

export interface KubeStoreConfig {
  /** This replica's identity (its API URL): the Lease's holderIdentity. */
  readonly id: string;
  /** The Lease's namespace (it must exist). */
  readonly namespace: string;
  /** The Lease's name, and the StoreLog's. */
  readonly leaseName: string;
  readonly leaseDurationSeconds: number;
}

/**
 * The controller's store and election on Kubernetes: the StoreLog and the Lease are both named `leaseName`.
 * @throws AtollError STORE_UNAVAILABLE when the API server cannot be reached or the CRDs are not installed.
 */
export async function openKubeStore(kube: KubeClient, cfg: KubeStoreConfig): Promise<{ store: ClusterStore; election: LeaderElection }> {
  const store = await KubeStore.open({ kube }, { name: cfg.leaseName });
  const election = new KubeLeaseElection({ kube }, { namespace: cfg.namespace, name: cfg.leaseName, id: cfg.id, leaseDurationSeconds: cfg.leaseDurationSeconds });
  return { store, election };
}
