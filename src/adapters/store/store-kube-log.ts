/**
 * The Kubernetes store's objects as data, and what its log says, pure: the API group and labels, the shapes of the
 * entry objects (IPBlock, NodeRegistration, StoreEntry) and of the StoreLog, what a key holds with the log laid over
 * its object, and how a batch of transactions is evaluated against the log and the objects read. No requests: the
 * store (src/adapters/store/store-kube.ts), its view (store-kube-view.ts) and its watch (store-kube-watch.ts) do the
 * I/O.
 */
import type { KvEntry, TxnCompare, TxnOp, TxnResult } from '../../core/cluster/store.ts';
import type { KubeObject } from '../kube/kube-client.ts';

export const API_GROUP = 'atoll.dev';
export const API_VERSION = `${API_GROUP}/v1alpha1`;
export const API_PATH = `/apis/${API_VERSION}`;
/** Label on every entry object: the tag of the store it belongs to. */
export const STORE_LABEL = `${API_GROUP}/store`;
/** Label on an IPBlock: the node its value names, so `kubectl get ipblocks -l atoll.dev/node=NODE` works. */
export const NODE_LABEL = `${API_GROUP}/node`;

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

/** The newest op on each key in a history, with its revision. */
export type Latest = Map<string, { readonly op: LogOp; readonly revision: number }>;

/** One transaction of a batch, as {@link evaluate} sees it. */
export interface TxnRequest {
  readonly compares: readonly TxnCompare[];
  readonly ops: readonly TxnOp[];
}

/**
 * Evaluates a batch in order against the objects read and the log laid over them, each transaction seeing the
 * ones before it: the results, and the transactions to commit (one revision each, only ops that change something).
 */
export function evaluate(batch: readonly TxnRequest[], log: LogSpec, objects: ReadonlyMap<string, EntryObject | undefined>): { results: TxnResult[]; txns: LogTxn[] } {
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

export function toKv(s: EntrySpec): KvEntry {
  return { key: s.key, value: s.value, createRevision: s.createRevision, modRevision: s.modRevision };
}
