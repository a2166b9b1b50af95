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
 * it. Readers never write: they read from a view kept in memory (store-kube-view.ts), which also surfaces objects
 * edited by hand. Watches replay the log's history, then follow the StoreLog through one Kubernetes watch per store
 * (store-kube-watch.ts). The objects' shapes and what the log says of a key are in store-kube-log.ts.
 * docs/architecture.md, "The Kubernetes store", has the limits.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import type { ClusterStore, KvEntry, KvList, LeaderElection, TxnCompare, TxnOp, TxnResult, WatchEvent } from '../../core/cluster/store.ts';
import { AtollError, atollError } from '../../core/errors.ts';
import { type KubeClient, kubeStatusOf } from '../kube/kube-client.ts';
import { checkTxnOps } from './store-txn-check.ts';
import { type EntryKind, KIND_PLURAL, kindOfKey, objectName, storeTag } from './store-kube-names.ts';
import { KubeLeaseElection, storeError } from './store-kube-lease.ts';
import {
  API_PATH, API_VERSION, type EntryObject, type EntrySpec, evaluate, latestOps, type LogObject, type LogOp, type LogSpec, type LogTxn, NODE_LABEL, STORE_LABEL,
} from './store-kube-log.ts';
import { KubeStoreView } from './store-kube-view.ts';
import { StoreLogWatch } from './store-kube-watch.ts';

const LABEL_VALUE = /^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$/;

/** Transactions per commit at most (concurrent callers of one store share a commit). */
const MAX_BATCH = 64;
/** Commits lost to other writers in a row before a batch gives up with STORE_UNAVAILABLE. */
const MAX_COMMIT_ATTEMPTS = 100;
/** Conflicting writes to one entry object in a row before applying it gives up. */
const MAX_APPLY_ATTEMPTS = 20;

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
  /** What readers read: every key, brought to the log's revision before each read. */
  readonly #view: KubeStoreView;
  readonly #watch: StoreLogWatch;

  constructor(components: { readonly kube: KubeClient }, init: KubeStoreInit) {
    this.#kube = components.kube;
    this.name = init.name;
    this.#tag = storeTag(init.name);
    this.#logPath = `${API_PATH}/storelogs/${init.name}`;
    this.#historyBytes = init.historyBytes ?? 32 * 1024;
    this.#historyCount = init.historyCount ?? 1000;
    const readLog = () => this.#readLog();
    this.#view = new KubeStoreView({ kube: this.#kube, readLog, closed: this.#closed.signal }, { tag: this.#tag });
    this.#watch = new StoreLogWatch({ kube: this.#kube, readLog, assertOpen: () => this.#assertOpen(), closed: this.#closed.signal }, { name: this.name });
  }

  /**
   * Opens the store named `init.name`, creating its empty StoreLog if there is none.
   * @throws AtollError STORE_UNAVAILABLE when the API server cannot be reached, or the CRDs are not installed.
   */
  static async open(components: { readonly kube: KubeClient }, init: KubeStoreInit): Promise<KubeStore> {
    const store = new KubeStore(components, init);
    await store.#ensureLog();
    try {
      await store.#view.sync();
    } catch (err) {
      throw storeError(err, `open the Kubernetes store ${init.name}`);
    }
    return store;
  }

  /** The entry at `key` in the view, once the view reached the log's current revision. */
  async get(key: string): Promise<KvEntry | undefined> {
    this.#assertOpen();
    try {
      await this.#view.sync();
    } catch (err) {
      throw storeError(err, `read key ${key}`);
    }
    return this.#view.get(key);
  }

  /** The view's entries under `prefix`, once the view reached the log's current revision. */
  async list(prefix: string): Promise<KvList> {
    this.#assertOpen();
    try {
      await this.#view.sync();
    } catch (err) {
      throw storeError(err, `list keys under "${prefix}"`);
    }
    return this.#view.list(prefix);
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
    return this.#watch.watch(prefix, afterRevision, onEvent, signal);
  }

  /** Ends every watch (with STORE_UNAVAILABLE) and refuses further calls; pending transactions still finish. */
  async close(): Promise<void> {
    this.#closed.abort();
    this.#view.close();
    this.#watch.endAll(this.#closedError());
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
