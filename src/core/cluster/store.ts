/**
 * The controller's store port: a versioned key/value store with compare-and-swap transactions and watches, the
 * shape etcd v3 has. Every controller decision (a node record, a block lease) is one transaction, so two controller
 * replicas, or two leaders during a failover, can never both hand out one block.
 *
 * Implementations: src/adapters/store/store-embedded.ts (one controller, crash-safe files) and src/adapters/store/store-etcd.ts
 * (etcd v3). One contract suite (test/integration/store-contract.test.ts) runs against both.
 */

/** One stored key. Revisions are store-wide, strictly increasing, starting at 1. */
export interface KvEntry {
  readonly key: string;
  readonly value: string;
  /** Revision of the transaction that created the key (since its last deletion). */
  readonly createRevision: number;
  /** Revision of the transaction that last changed the key. */
  readonly modRevision: number;
}

/** A transaction guard: the key's current modRevision must equal `modRevision` (0 = the key must not exist). */
export interface TxnCompare {
  readonly key: string;
  readonly modRevision: number;
}

export type TxnOp = { readonly type: 'put'; readonly key: string; readonly value: string } | { readonly type: 'delete'; readonly key: string };

export interface TxnResult {
  /** True when every compare held and the ops were applied atomically; false when nothing was applied. */
  readonly succeeded: boolean;
  /** The store revision after the transaction (unchanged when it did not succeed or changed nothing). */
  readonly revision: number;
}

export interface WatchEvent {
  readonly type: 'put' | 'delete';
  readonly key: string;
  /** The new value for a put; empty for a delete. */
  readonly value: string;
  readonly modRevision: number;
}

export interface KvList {
  readonly entries: readonly KvEntry[];
  /** The store revision the listing reflects. */
  readonly revision: number;
}

export interface ClusterStore {
  /** The entry at `key`, if any. */
  get(key: string): Promise<KvEntry | undefined>;
  /** Every entry whose key starts with `prefix`, sorted by key, and the revision the listing reflects. */
  list(prefix: string): Promise<KvList>;
  /**
   * Applies `ops` atomically if every compare holds. Durable when it resolves with succeeded = true.
   * @throws AtollError STORE_UNAVAILABLE when the store cannot be reached (the outcome is then unknown: re-read).
   */
  txn(compares: readonly TxnCompare[], ops: readonly TxnOp[]): Promise<TxnResult>;
  /**
   * Calls `onEvent` for every change under `prefix` with modRevision > `afterRevision`, in revision order, until
   * `signal` aborts. Rejects with STORE_COMPACTED when the store no longer holds the history asked for (re-list).
   */
  watch(prefix: string, afterRevision: number, onEvent: (events: readonly WatchEvent[]) => void, signal: AbortSignal): Promise<void>;
  close(): Promise<void>;
}

/**
 * Leadership among controller replicas. `campaign` resolves once this replica leads; `lost` aborts when the
 * leadership ends (lease expired, store unreachable), after which the replica must stop writing and campaign again.
 */
export interface LeaderElection {
  campaign(signal: AbortSignal): Promise<{ readonly lost: AbortSignal }>;
  /** The identity of the current leader, if any (e.g. its API URL), for redirects. */
  leader(): Promise<string | undefined>;
  resign(): Promise<void>;
}
