/**
 * The one rule on transaction ops that both stores enforce before doing anything: every key non-empty and named at
 * most once. etcd refuses a transaction that puts or deletes one key twice ("duplicate key given in txn request"),
 * so the embedded store refuses it too, and code written against either behaves the same on the other.
 */
import type { TxnOp } from '../../core/cluster/store.ts';
import { atollError } from '../../core/errors.ts';

/** @throws AtollError INTERNAL (a caller bug) naming the empty or repeated key. */
export function checkTxnOps(ops: readonly TxnOp[]): void {
  const seen = new Set<string>();
  for (const op of ops) {
    if (op.key === '') throw atollError('INTERNAL', `a store transaction has a ${op.type} of the empty key`, 'give every op a non-empty key');
    if (seen.has(op.key)) throw atollError('INTERNAL', `a store transaction names key ${op.key} twice`, 'merge the ops on that key into one');
    seen.add(op.key);
  }
}
