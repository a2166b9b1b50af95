/**
 * A {@link ClusterStore} that reports how long each operation took (for the store latency histogram), passing
 * everything else through unchanged. Watches are long-lived and not timed.
 */
import type { ClusterStore, KvEntry, KvList, TxnCompare, TxnOp, TxnResult, WatchEvent } from '../core/cluster/store.ts';

export type StoreOperation = 'get' | 'list' | 'txn';

/** Told of each finished operation: which, whether it failed, and its duration in seconds. */
export type StoreObserver = (op: StoreOperation, failed: boolean, seconds: number) => void;

export class TimedStore implements ClusterStore {
  readonly #store: ClusterStore;
  readonly #observe: StoreObserver;

  constructor(store: ClusterStore, observe: StoreObserver) {
    this.#store = store;
    this.#observe = observe;
  }

  async #timed<T>(op: StoreOperation, run: () => Promise<T>): Promise<T> {
    const t0 = performance.now();
    let failed = true;
    try {
      const r = await run();
      failed = false;
      return r;
    } finally {
      this.#observe(op, failed, (performance.now() - t0) / 1000);
    }
  }

  get(key: string): Promise<KvEntry | undefined> {
    return this.#timed('get', () => this.#store.get(key));
  }

  list(prefix: string): Promise<KvList> {
    return this.#timed('list', () => this.#store.list(prefix));
  }

  txn(compares: readonly TxnCompare[], ops: readonly TxnOp[]): Promise<TxnResult> {
    return this.#timed('txn', () => this.#store.txn(compares, ops));
  }

  watch(prefix: string, afterRevision: number, onEvent: (events: readonly WatchEvent[]) => void, signal: AbortSignal): Promise<void> {
    return this.#store.watch(prefix, afterRevision, onEvent, signal);
  }

  close(): Promise<void> {
    return this.#store.close();
  }
}
