/**
 * The watches of the Kubernetes store (src/adapters/store/store-kube.ts): each watcher gets the StoreLog's history
 * after the revision it asks for, then follows the StoreLog through one Kubernetes watch per store, shared by all its
 * watchers (a controller streams to every agent). A gap larger than the history rejects STORE_COMPACTED; an API
 * server away for more than 30 s (WATCH_RETRY_MS) rejects STORE_UNAVAILABLE.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import type { WatchEvent } from '../../core/cluster/store.ts';
import { AtollError, atollError } from '../../core/errors.ts';
import type { KubeClient } from '../kube/kube-client.ts';
import { API_PATH, type LogObject, type LogSpec } from './store-kube-log.ts';
import { storeError } from './store-kube-lease.ts';

/** How long a watch keeps trying to reach the API server before it rejects. */
const WATCH_RETRY_MS = 30_000;

/** One {@link StoreLogWatch.watch}, as the shared watch of the StoreLog feeds it. */
interface LogWatcher {
  /** Delivers what `spec` holds after the revision this watcher is at (or ends it: a gap, or its handler threw). */
  deliver(spec: LogSpec): void;
  /** Ends the watch: resolved without `err`, rejected with it. */
  end(err?: unknown): void;
}

/** What the watches need of their store. */
export interface StoreLogWatchComponents {
  readonly kube: KubeClient;
  /** A fresh read of the StoreLog. */
  readonly readLog: () => Promise<LogObject>;
  /** Throws STORE_UNAVAILABLE once the store is closed. */
  readonly assertOpen: () => void;
  /** Aborts when the store closes. */
  readonly closed: AbortSignal;
}

/** The watchers of one store, and the one Kubernetes watch of its StoreLog that feeds them all. */
export class StoreLogWatch {
  /** The StoreLog's name. */
  readonly name: string;
  readonly #kube: KubeClient;
  readonly #readLog: () => Promise<LogObject>;
  readonly #assertOpen: () => void;
  readonly #closed: AbortSignal;
  readonly #watchers = new Set<LogWatcher>();
  /** Stops the shared watch of the StoreLog; undefined while none runs. */
  #follower: AbortController | undefined;

  constructor(components: StoreLogWatchComponents, init: { readonly name: string }) {
    this.#kube = components.kube;
    this.#readLog = components.readLog;
    this.#assertOpen = components.assertOpen;
    this.#closed = components.closed;
    this.name = init.name;
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
    const signal = AbortSignal.any([stop.signal, this.#closed]);
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
      if (this.#watchers.size > 0 && !this.#closed.aborted) this.#follow();
    })();
  }

  /** Ends every watch with `err`. */
  endAll(err: unknown): void {
    for (const w of [...this.#watchers]) w.end(err);
  }
}
