/**
 * What the Kubernetes store (src/adapters/store/store-kube.ts) reads from: a view of every key kept in memory. Readers
 * never write. At open (and after a gap) the entry objects are listed, then the log read and its history laid over
 * them (a key the history changed later than its object says is taken from the history), so a committed transaction
 * is seen whole or not at all, whoever applies it and however late. Each get or list then reads the log once
 * (concurrent reads share that read) and lays the transactions after the view's revision on it, in order:
 * linearizable, at the cost of one small request instead of a listing. A gap wider than the history, or a log that
 * moved back, loads again.
 *
 * Objects edited by hand (kubectl edit) are surfaced as they are, as long as their spec.modRevision is not lowered
 * (the view follows the entry objects through one watch per kind, and lays such edits on at the first read after
 * their event arrived: within moments, not at once): `atoll ipam check` then reports, say, an IPBlock made to
 * overlap another.
 */
import type { KvEntry, KvList } from '../../core/cluster/store.ts';
import { lowerBound } from '../../core/sorted.ts';
import type { KubeClient } from '../kube/kube-client.ts';
import { ENTRY_KINDS, type EntryKind, KIND_PLURAL, keyOfName, objectName } from './store-kube-names.ts';
import { API_PATH, type EntryObject, type EntrySpec, latestOps, type LogObject, type LogSpec, resolveKey, STORE_LABEL, toKv } from './store-kube-log.ts';

/** A change of one entry object, as its watch saw it. */
interface ObjectEvent {
  readonly kind: EntryKind;
  readonly name: string;
  readonly deleted: boolean;
  readonly spec: EntrySpec;
  readonly seq: number;
}

/** What the view needs of its store. */
export interface KubeStoreViewComponents {
  readonly kube: KubeClient;
  /** A fresh read of the StoreLog. */
  readonly readLog: () => Promise<LogObject>;
  /** Aborts when the store closes: no object watches begin after it. */
  readonly closed: AbortSignal;
}

/** The keys of one store at one revision, brought up to the log's revision before each read. */
export class KubeStoreView {
  readonly #kube: KubeClient;
  /** The store's tag (store-kube-names.ts): the entry objects' name prefix and STORE_LABEL value. */
  readonly #tag: string;
  readonly #readLog: () => Promise<LogObject>;
  readonly #closed: AbortSignal;
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

  constructor(components: KubeStoreViewComponents, init: { readonly tag: string }) {
    this.#kube = components.kube;
    this.#readLog = components.readLog;
    this.#closed = components.closed;
    this.#tag = init.tag;
  }

  /** The entry at `key` as of the last {@link sync}. */
  get(key: string): KvEntry | undefined {
    return this.#view.get(key);
  }

  /** The entries under `prefix` as of the last {@link sync}, in key order. */
  list(prefix: string): KvList {
    this.#sorted ??= [...this.#view.keys()].sort();
    const entries: KvEntry[] = [];
    for (let i = lowerBound(this.#sorted, prefix); i < this.#sorted.length && this.#sorted[i]!.startsWith(prefix); i++) entries.push(this.#view.get(this.#sorted[i]!)!);
    return { entries, revision: this.#rev };
  }

  /** Stops the watches of the entry objects. */
  close(): void {
    this.#objectWatch.abort();
  }

  /**
   * Brings the view to the log's revision as of a read of the log begun after this call, or later: reads are
   * linearizable, as if they read the objects and the log. Concurrent callers share the reads of the log.
   */
  sync(): Promise<void> {
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
    if (this.#closed.aborted) return;
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
}
