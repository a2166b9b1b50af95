/**
 * A local cache of one kind of Kubernetes object, kept by list + watch as client-go's reflector does: list, then
 * watch from the list's resourceVersion (with bookmarks, which keep the resume point fresh); when a watch ends, resume
 * from the last resourceVersion seen; on 410 Gone (STORE_COMPACTED) list again; on other errors back off (1 s doubling
 * to 30 s) and retry. No polling. Consumers read the cache and are told that something changed; they reconcile
 * level-triggered from the cache, so a missed event heals at the next pass.
 */
import { asAtollError } from '../../core/errors.ts';
import type { Logger } from '../../core/ports.ts';
import { Backoff } from '../../core/retry.ts';
import { sleep } from '../timers.ts';
import type { KubeClient, KubeObject } from './kube-client.ts';

export interface ReflectorInit<T extends KubeObject = KubeObject> {
  /** The collection path, e.g. /api/v1/nodes. */
  readonly path: string;
  readonly labelSelector?: string;
  /** What the log calls these objects. */
  readonly what: string;
  /**
   * What the cache keeps of each object (all of it when absent): a reflector over every Pod of a large cluster keeps
   * the few fields it reads, not megabytes of specs.
   */
  readonly keep?: (o: T) => T;
}

/** How the cache names an object: `namespace/name` for a namespaced one, `name` for a cluster-wide one. */
function cacheKey(o: KubeObject): string {
  return o.metadata.namespace ? `${o.metadata.namespace}/${o.metadata.name}` : o.metadata.name;
}

export class Reflector<T extends KubeObject> {
  readonly #kube: KubeClient;
  readonly #log: Logger;
  readonly #init: ReflectorInit<T>;
  readonly #items = new Map<string, T>();
  readonly #listeners = new Set<() => void>();
  #synced = false;
  #syncedWaiters: (() => void)[] = [];
  #loop: Promise<void> | undefined;

  constructor(components: { kube: KubeClient; log: Logger }, init: ReflectorInit<T>) {
    this.#kube = components.kube;
    this.#log = components.log;
    this.#init = init;
  }

  /** Starts listing and watching until `signal` aborts. */
  start(signal: AbortSignal): void {
    this.#loop ??= this.#run(signal);
  }

  /** Resolves once the first list has filled the cache (or `signal` aborts). */
  synced(signal: AbortSignal): Promise<void> {
    if (this.#synced || signal.aborted) return Promise.resolve();
    return new Promise((resolve) => {
      this.#syncedWaiters.push(resolve);
      signal.addEventListener('abort', () => resolve(), { once: true });
    });
  }

  get hasSynced(): boolean {
    return this.#synced;
  }

  /** The object named `name` (`namespace/name` for a namespaced kind). */
  get(name: string): T | undefined {
    return this.#items.get(name);
  }

  list(): T[] {
    return [...this.#items.values()];
  }

  /** Calls `fn` after every change to the cache (a list or a watch event). */
  onChange(fn: () => void): void {
    this.#listeners.add(fn);
  }

  async stopped(): Promise<void> {
    await this.#loop;
  }

  async #run(signal: AbortSignal): Promise<void> {
    let rv = '';
    const backoff = new Backoff({ minMs: 1000, maxMs: 30_000 }, sleep);
    while (!signal.aborted) {
      try {
        if (rv === '') {
          const list = await this.#kube.list<T>(this.#init.path, { labelSelector: this.#init.labelSelector, signal });
          this.#items.clear();
          for (const o of list.items) this.#items.set(cacheKey(o), this.#keep(o));
          rv = list.resourceVersion;
          this.#markSynced();
          this.#changed();
        }
        await this.#kube.watch<T>(this.#init.path, rv, (e) => {
          rv = e.object.metadata.resourceVersion ?? rv;
          if (e.type === 'BOOKMARK') return;
          if (e.type === 'DELETED') this.#items.delete(cacheKey(e.object));
          else this.#items.set(cacheKey(e.object), this.#keep(e.object));
          this.#changed();
        }, { labelSelector: this.#init.labelSelector, signal });
        backoff.reset();
      } catch (err) {
        if (signal.aborted) break;
        const e = asAtollError(err);
        if (e.code === 'STORE_COMPACTED') {
          this.#log.info(`${this.#init.what}: watch too old; listing again`, { rv });
          rv = '';
          continue;
        }
        this.#log.warn(`${this.#init.what}: list/watch failed; retrying`, { code: e.code, err: e.message, retryInMs: backoff.delayMs });
        await backoff.wait(signal);
      }
    }
  }

  #keep(o: T): T {
    return this.#init.keep ? this.#init.keep(o) : o;
  }

  #markSynced(): void {
    if (this.#synced) return;
    this.#synced = true;
    for (const w of this.#syncedWaiters.splice(0)) w();
  }

  #changed(): void {
    for (const fn of this.#listeners) {
      try {
        fn();
      } catch (err) {
        this.#log.error(`${this.#init.what}: a change handler failed`, { err: asAtollError(err).message });
      }
    }
  }
}
