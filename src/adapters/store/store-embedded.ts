/**
 * The {@link ClusterStore} of a single controller: an in-memory sorted map, made durable by a write-ahead log and
 * snapshots in one directory.
 *
 * Why: a small cluster (or a lab) should not need an etcd to run; one controller with a local disk is enough, as long
 * as a crash never loses a transaction it reported as done and never leaves half of one.
 *
 * The directory's files (`wal.log`, `snapshot.json`, `LOCK`) are written and read back by store-embedded-files.ts.
 *
 * Watches are served from the last `historyLimit` events kept in memory, like etcd's history before compaction.
 *
 * Transactions are decided one at a time, in memory, and made durable together: those decided while the log is being
 * written and fdatasynced go into the next write and share its one fdatasync (a group commit, as databases do). Each
 * still resolves, and its changes reach readers and watchers, only once its line is on disk. One fdatasync per
 * transaction capped a joining cluster at what the disk syncs per second (two transactions a join).
 */
import { mkdirSync } from 'node:fs';
import { open, unlink, type FileHandle } from 'node:fs/promises';
import { join } from 'node:path';
import type { ClusterStore, KvEntry, KvList, LeaderElection, TxnCompare, TxnOp, TxnResult, WatchEvent } from '../../core/cluster/store.ts';
import { AtollError, atollError } from '../../core/errors.ts';
import { Mutex } from '../../core/mutex.ts';
import { lowerBound } from '../../core/sorted.ts';
import type { Clock, Logger } from '../../core/ports.ts';
import { checkTxnOps } from './store-txn-check.ts';
import { acquireLock, applyOps, encodeLogLine, ignoreMissing, load, type Loaded, LOG_FILE, releaseLock, SNAPSHOT_TMP, writeSnapshot } from './store-embedded-files.ts';

export interface EmbeddedStoreOptions {
  readonly clock?: Clock;
  /** Receives a warning when a snapshot fails (the log keeps every transaction, so nothing is lost). */
  readonly logger?: Logger;
  /** Take a snapshot once the log is larger than this (default 8 MiB). */
  readonly maxLogBytes?: number;
  /** Take a snapshot at the first transaction this long after the last one (default 10 minutes). */
  readonly snapshotIntervalMs?: number;
  /** Events kept for watches (default 10,000); a watch from before them gets STORE_COMPACTED. */
  readonly historyLimit?: number;
}

/** A transaction decided and waiting for the log. */
interface Queued {
  readonly rev: number;
  readonly changes: readonly TxnOp[];
  readonly resolve: (r: TxnResult) => void;
  readonly reject: (err: unknown) => void;
}

interface Watcher {
  readonly prefix: string;
  readonly onEvent: (events: readonly WatchEvent[]) => void;
  readonly fail: (err: unknown) => void;
}

export class EmbeddedStore implements ClusterStore {
  readonly dir: string;
  readonly #entries: Map<string, KvEntry>;
  /** The keys of #entries in sorted order, for prefix listings. */
  readonly #sorted: string[];
  #revision: number;
  /** Events with modRevision > #historyStart are all in #history. */
  #history: WatchEvent[];
  #historyStart: number;
  readonly #watchers = new Set<Watcher>();
  readonly #mutex = new Mutex();
  /** Transactions decided and not yet written, in revision order. */
  readonly #queue: Queued[] = [];
  /** The revision of the last transaction decided (ahead of #revision while some wait for the log). */
  #decidedRevision: number;
  /** Keys that decided transactions change: their modRevision once those are written (0: deleted), and the last such transaction. */
  readonly #decided = new Map<string, { readonly modRevision: number; readonly rev: number }>();
  /** The writing of the queue, while it runs. */
  #writing: Promise<void> | undefined;
  readonly #log: FileHandle;
  #logBytes: number;
  #lastSnapshotAt: number;
  /** Why the store refuses work: closed, or a failed log write left the log's end unknown. */
  #broken: string | undefined;
  readonly #clock: Clock;
  readonly #logger: Logger | undefined;
  readonly #maxLogBytes: number;
  readonly #snapshotIntervalMs: number;
  readonly #historyLimit: number;

  private constructor(dir: string, loaded: Loaded, log: FileHandle, opts: EmbeddedStoreOptions) {
    this.dir = dir;
    this.#entries = loaded.entries;
    this.#sorted = [...loaded.entries.keys()].sort();
    this.#revision = loaded.revision;
    this.#decidedRevision = loaded.revision;
    this.#history = loaded.history;
    this.#historyStart = loaded.snapshotRevision;
    this.#log = log;
    this.#logBytes = loaded.logBytes;
    this.#clock = opts.clock ?? Date.now;
    this.#logger = opts.logger;
    this.#maxLogBytes = opts.maxLogBytes ?? 8 * 1024 * 1024;
    this.#snapshotIntervalMs = opts.snapshotIntervalMs ?? 10 * 60_000;
    this.#historyLimit = opts.historyLimit ?? 10_000;
    this.#lastSnapshotAt = this.#clock();
    this.#trimHistory();
  }

  /**
   * Opens (creating if needed) the store in `dir`: takes the directory lock, loads the snapshot, replays the log.
   * @throws AtollError STORE_UNAVAILABLE when another live process holds the directory, when the snapshot or the log
   *   is damaged (naming the file and line), or when the directory cannot be read or written.
   */
  static async open(dir: string, opts: EmbeddedStoreOptions = {}): Promise<EmbeddedStore> {
    try {
      mkdirSync(dir, { recursive: true, mode: 0o700 });
    } catch (cause) {
      throw atollError('STORE_UNAVAILABLE', `cannot create the store directory ${dir}`, 'check the path and its permissions', cause);
    }
    acquireLock(dir);
    try {
      await unlink(join(dir, SNAPSHOT_TMP)).catch(ignoreMissing);
      const loaded = await load(dir);
      const log = await open(join(dir, LOG_FILE), 'a', 0o600);
      return new EmbeddedStore(dir, loaded, log, opts);
    } catch (err) {
      releaseLock(dir);
      throw err instanceof AtollError
        ? err
        : atollError('STORE_UNAVAILABLE', `cannot open the store in ${dir}`, 'check that the directory is readable and writable', err);
    }
  }

  /** A key that a transaction decided to change is read once that transaction is on disk. */
  async get(key: string): Promise<KvEntry | undefined> {
    this.#assertUsable();
    while (this.#decided.has(key) && this.#writing) await this.#writing.catch(() => {});
    this.#assertUsable();
    return this.#entries.get(key);
  }

  async list(prefix: string): Promise<KvList> {
    this.#assertUsable();
    while ([...this.#decided.keys()].some((k) => k.startsWith(prefix)) && this.#writing) await this.#writing.catch(() => {});
    this.#assertUsable();
    const entries: KvEntry[] = [];
    for (let i = lowerBound(this.#sorted, prefix); i < this.#sorted.length; i++) {
      const key = this.#sorted[i]!;
      if (!key.startsWith(prefix)) break;
      entries.push(this.#entries.get(key)!);
    }
    return { entries, revision: this.#revision };
  }

  /**
   * Evaluates `compares` and decides `ops` against the store as its decided transactions leave it; the changed ops
   * are appended to the log and fdatasynced (with the others decided meanwhile) before the memory map, the watchers
   * and the caller see them.
   * @throws AtollError STORE_UNAVAILABLE when the store is closed or the log write failed (the store then refuses
   *   further work: reopen it, which replays whatever reached the disk).
   */
  async txn(compares: readonly TxnCompare[], ops: readonly TxnOp[]): Promise<TxnResult> {
    checkTxnOps(ops);
    this.#assertUsable();
    const modRevisionOf = (key: string) => this.#decided.get(key)?.modRevision ?? this.#entries.get(key)?.modRevision ?? 0;
    for (const c of compares) {
      if (modRevisionOf(c.key) !== c.modRevision) return { succeeded: false, revision: this.#revision };
    }
    // Only what changes something is logged, in a fixed shape (the log's checksum is over its JSON).
    const changes = ops.flatMap((op): TxnOp[] => op.type === 'put'
      ? [{ type: 'put', key: op.key, value: op.value }]
      : modRevisionOf(op.key) !== 0 ? [{ type: 'delete', key: op.key }] : []);
    if (changes.length === 0) return { succeeded: true, revision: this.#revision };
    const rev = ++this.#decidedRevision;
    for (const c of changes) this.#decided.set(c.key, { modRevision: c.type === 'put' ? rev : 0, rev });
    return new Promise<TxnResult>((resolve, reject) => {
      this.#queue.push({ rev, changes, resolve, reject });
      this.#startWriting();
    });
  }

  #startWriting(): void {
    if (this.#writing || this.#queue.length === 0) return;
    this.#writing = this.#mutex.run(() => this.#writeQueue()).finally(() => {
      this.#writing = undefined;
      this.#startWriting(); // decided after the last batch ended and before this ran
    });
  }

  /** Writes the queue in batches, one append and one fdatasync each, until it is empty. */
  async #writeQueue(): Promise<void> {
    while (this.#queue.length > 0) {
      const batch = this.#queue.splice(0);
      try {
        this.#assertUsable();
        await this.#append(batch);
      } catch (err) {
        // those decided after them were decided on top of them: none is kept
        for (const q of [...batch, ...this.#queue.splice(0)]) q.reject(err);
        this.#decided.clear();
        this.#decidedRevision = this.#revision;
        return;
      }
      for (const q of batch) {
        this.#notify(this.#apply(q.rev, q.changes));
        for (const c of q.changes) if (this.#decided.get(c.key)?.rev === q.rev) this.#decided.delete(c.key);
      }
      // a transaction that makes the log due for a snapshot returns after it, as before group commits
      await this.#maybeSnapshot();
      for (const q of batch) q.resolve({ succeeded: true, revision: q.rev });
    }
  }

  /** The kept history after `afterRevision` is delivered before this returns, then each commit as it happens. */
  watch(prefix: string, afterRevision: number, onEvent: (events: readonly WatchEvent[]) => void, signal: AbortSignal): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      if (signal.aborted) return resolve();
      if (this.#broken !== undefined) return reject(this.#unusable());
      if (afterRevision < this.#historyStart) {
        return reject(atollError('STORE_COMPACTED', `the store in ${this.dir} keeps events after revision ${this.#historyStart} only; a watch asked for those after ${afterRevision}`,
          'list the keys again and watch from the revision of that listing'));
      }
      const watcher: Watcher = {
        prefix,
        onEvent,
        fail: (err) => {
          this.#watchers.delete(watcher);
          signal.removeEventListener('abort', stop);
          reject(err);
        },
      };
      const stop = () => {
        this.#watchers.delete(watcher);
        resolve();
      };
      signal.addEventListener('abort', stop, { once: true });
      this.#watchers.add(watcher);
      // The backlog, one call per revision; later commits arrive through #notify, after it.
      let batch: WatchEvent[] = [];
      for (const e of this.#history) {
        if (e.modRevision <= afterRevision || !e.key.startsWith(prefix)) continue;
        if (batch.length > 0 && batch[0]!.modRevision !== e.modRevision) {
          if (!deliver(watcher, batch)) return;
          batch = [];
        }
        batch.push(e);
      }
      if (batch.length > 0) deliver(watcher, batch);
    });
  }

  /** Waits for the running transaction, closes the log, ends every watch with STORE_UNAVAILABLE, frees the lock. */
  close(): Promise<void> {
    return this.#mutex.run(async () => {
      if (this.#broken === 'closed') return;
      this.#broken = 'closed';
      for (const w of [...this.#watchers]) w.fail(this.#unusable());
      await this.#log.close();
      releaseLock(this.dir);
    });
  }

  /** Appends the batch's lines in one write and fdatasyncs once. */
  async #append(batch: readonly Queued[]): Promise<void> {
    const lines = batch.map((q) => encodeLogLine(q.rev, q.changes)).join('');
    const revs = batch.length === 1 ? `revision ${batch[0]!.rev}` : `revisions ${batch[0]!.rev} to ${batch.at(-1)!.rev}`;
    try {
      await this.#log.appendFile(lines);
      await this.#log.datasync();
    } catch (cause) {
      this.#broken = `a write to ${join(this.dir, LOG_FILE)} failed at ${revs}`;
      throw atollError('STORE_UNAVAILABLE', `cannot append ${revs} to ${join(this.dir, LOG_FILE)}; the transactions may or may not be on disk`,
        'check the disk (space, errors), then restart the controller: reopening replays whatever reached the log', cause);
    }
    this.#logBytes += Buffer.byteLength(lines);
  }

  #apply(rev: number, ops: readonly TxnOp[]): WatchEvent[] {
    const events = applyOps(this.#entries, rev, ops, (key, added) => {
      const i = lowerBound(this.#sorted, key);
      if (added) this.#sorted.splice(i, 0, key);
      else this.#sorted.splice(i, 1);
    });
    this.#revision = rev;
    this.#history.push(...events);
    this.#trimHistory();
    return events;
  }

  #notify(events: readonly WatchEvent[]): void {
    for (const w of [...this.#watchers]) {
      const mine = events.filter((e) => e.key.startsWith(w.prefix));
      if (mine.length > 0) deliver(w, mine);
    }
  }

  /** Drops whole revisions from the front of the history until it fits `historyLimit`, with slack to amortise. */
  #trimHistory(): void {
    if (this.#history.length <= this.#historyLimit + Math.ceil(this.#historyLimit / 10)) return;
    let cut = this.#history.length - this.#historyLimit;
    const lastDropped = this.#history[cut - 1]!.modRevision;
    while (cut < this.#history.length && this.#history[cut]!.modRevision === lastDropped) cut++;
    this.#history = this.#history.slice(cut);
    this.#historyStart = lastDropped;
  }

  async #maybeSnapshot(): Promise<void> {
    if (this.#logBytes < this.#maxLogBytes && this.#clock() - this.#lastSnapshotAt < this.#snapshotIntervalMs) return;
    try {
      await writeSnapshot(this.dir, this.#revision, [...this.#entries.values()]);
      await this.#log.truncate(0);
      await this.#log.datasync();
      this.#logBytes = 0;
      this.#lastSnapshotAt = this.#clock();
    } catch (err) {
      // The log still holds every transaction; the next transaction tries again.
      this.#logger?.warn('store snapshot failed; the log keeps growing until one succeeds', { dir: this.dir, revision: this.#revision, error: String(err) });
    }
  }

  #assertUsable(): void {
    if (this.#broken !== undefined) throw this.#unusable();
  }

  #unusable(): Error {
    return this.#broken === 'closed'
      ? atollError('STORE_UNAVAILABLE', `the store in ${this.dir} is closed`, 'open it again')
      : atollError('STORE_UNAVAILABLE', `the store in ${this.dir} stopped after an error: ${this.#broken}`, 'fix the disk, then restart the controller');
  }
}

/**
 * Leadership for the single controller of an {@link EmbeddedStore}: it leads at once and until it resigns. Only
 * one process can open the store's directory, so there is nobody to lead against.
 */
export class EmbeddedLeader implements LeaderElection {
  readonly #id: string;
  #term: AbortController | undefined;

  constructor(init: { readonly id: string }) {
    this.#id = init.id;
  }

  async campaign(signal: AbortSignal): Promise<{ readonly lost: AbortSignal }> {
    signal.throwIfAborted();
    this.#term ??= new AbortController();
    return { lost: this.#term.signal };
  }

  async leader(): Promise<string | undefined> {
    return this.#term === undefined ? undefined : this.#id;
  }

  async resign(): Promise<void> {
    this.#term?.abort(atollError('STORE_UNAVAILABLE', `controller ${this.#id} resigned its leadership`, 'campaign again to lead'));
    this.#term = undefined;
  }
}

/** Calls the watcher; a throwing callback ends its watch with that error. False when it threw. */
function deliver(w: Watcher, events: readonly WatchEvent[]): boolean {
  try {
    w.onEvent(events);
    return true;
  } catch (err) {
    w.fail(err);
    return false;
  }
}
