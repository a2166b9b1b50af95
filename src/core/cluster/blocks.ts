/**
 * Which of the cluster CIDRs' node blocks are free, and auditing leases. Pure.
 */
import { type Cidr, cidrContains, cidrSize, cidrsOverlap } from '../net/ipv4.ts';
import type { BlockLease } from './model.ts';

/**
 * The cluster's blocks and which of them are taken, for the replica that leases them: taking a free one costs the
 * same at 100,000 leases as at 100, where listing the leases and scanning from the first block for every lease cost
 * a step per lease (5,000 nodes: 33 s to join). A cursor moves on past each block taken and wraps at the end, so a
 * released block is not handed out again at once either. The store stays the judge: a lease is a create of the
 * block's key that fails when it exists, so a stale view here costs a retry, never a block leased twice.
 */
export class FreeBlocks {
  readonly #segments: readonly { readonly base: number; readonly count: number }[];
  readonly #step: number;
  readonly #bits: number;
  readonly #total: number;
  readonly #taken = new Set<number>();
  #cursor = 0;

  constructor(clusterCidrs: readonly Cidr[], blockBits: number) {
    this.#bits = blockBits;
    this.#step = 2 ** (32 - blockBits);
    this.#segments = clusterCidrs.filter((c) => blockBits >= c.bits).map((c) => ({ base: c.base, count: 2 ** (blockBits - c.bits) }));
    this.#total = this.#segments.reduce((n, s) => n + s.count, 0);
  }

  /** Blocks taken (leased, or being leased). */
  get taken(): number {
    return this.#taken.size;
  }

  /** Starts over from the leases in the store: every block that overlaps one is taken. */
  reset(leased: Iterable<Cidr>): void {
    this.#taken.clear();
    for (const c of leased) this.mark(c);
  }

  /** Marks every block overlapping `c` taken (a lease made elsewhere, or of another block size). */
  mark(c: Cidr): void {
    for (const i of this.#indices(c)) this.#taken.add(i);
  }

  /** Marks every block overlapping `c` free again (its lease is gone). */
  release(c: Cidr): void {
    for (const i of this.#indices(c)) this.#taken.delete(i);
  }

  /** The next free block after the last one taken (wrapping), now taken; undefined when every block is. */
  take(): Cidr | undefined {
    for (let k = 0; k < this.#total; k++) {
      const i = (this.#cursor + k) % this.#total;
      if (this.#taken.has(i)) continue;
      this.#taken.add(i);
      this.#cursor = (i + 1) % this.#total;
      return { base: this.#baseOf(i), bits: this.#bits };
    }
    return undefined;
  }

  #baseOf(index: number): number {
    let i = index;
    for (const s of this.#segments) {
      if (i < s.count) return s.base + i * this.#step;
      i -= s.count;
    }
    throw new RangeError(`block index ${index} is past the last block`); // cannot happen: take() keeps it below #total
  }

  /** The indices of the blocks overlapping `c`. */
  *#indices(c: Cidr): Generator<number> {
    let offset = 0;
    for (const s of this.#segments) {
      const lo = Math.max(c.base, s.base);
      const hi = Math.min(c.base + cidrSize(c), s.base + s.count * this.#step);
      if (lo < hi) {
        const first = Math.floor((lo - s.base) / this.#step);
        const last = Math.ceil((hi - s.base) / this.#step);
        for (let i = first; i < last; i++) yield offset + i;
      }
      offset += s.count;
    }
  }
}

export interface LeaseProblem {
  readonly kind: 'leak' | 'conflict';
  readonly cidr: string;
  readonly message: string;
}

/**
 * Audits leases: a lease held by a node that is not registered is a leak; two leases that overlap, or a lease
 * outside the cluster CIDRs, is a conflict.
 */
export function auditLeases(leases: readonly (BlockLease & { block: Cidr })[], nodes: ReadonlySet<string>, clusterCidrs: readonly Cidr[]): LeaseProblem[] {
  const out: LeaseProblem[] = [];
  const sorted = [...leases].sort((a, b) => a.block.base - b.block.base || a.block.bits - b.block.bits);
  for (const l of sorted) {
    if (!nodes.has(l.node)) out.push({ kind: 'leak', cidr: l.cidr, message: `block ${l.cidr} is leased to ${l.node}, which is not registered` });
    if (!clusterCidrs.some((c) => cidrContains(c, l.block.base) && l.block.bits >= c.bits)) {
      out.push({ kind: 'conflict', cidr: l.cidr, message: `block ${l.cidr} (node ${l.node}) lies outside the cluster CIDRs` });
    }
  }
  for (let i = 0; i < sorted.length; i++) {
    for (let j = i + 1; j < sorted.length; j++) {
      const a = sorted[i] as (typeof sorted)[0];
      const b = sorted[j] as (typeof sorted)[0];
      if (b.block.base >= a.block.base + cidrSize(a.block)) break;
      if (cidrsOverlap(a.block, b.block)) {
        out.push({ kind: 'conflict', cidr: b.cidr, message: `block ${b.cidr} (node ${b.node}) overlaps ${a.cidr} (node ${a.node})` });
      }
    }
  }
  return out;
}
