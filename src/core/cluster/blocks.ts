/**
 * Carving cluster CIDRs into node blocks, and auditing leases. Pure.
 */
import { type Cidr, cidrContains, cidrSize, cidrsOverlap, formatCidr } from '../net/ipv4.ts';
import type { BlockLease } from './model.ts';

/** The blocks of `blockBits` in each cluster CIDR, in address order. */
export function* carveBlocks(clusterCidrs: readonly Cidr[], blockBits: number): Generator<Cidr> {
  for (const c of clusterCidrs) {
    if (blockBits < c.bits) continue;
    const step = 2 ** (32 - blockBits);
    for (let base = c.base; base < c.base + cidrSize(c); base += step) yield { base, bits: blockBits };
  }
}

/** The first block not in `leased` (formatted CIDRs), or undefined when the cluster CIDRs are used up. */
export function firstFreeBlock(clusterCidrs: readonly Cidr[], blockBits: number, leased: ReadonlySet<string>): Cidr | undefined {
  for (const b of carveBlocks(clusterCidrs, blockBits)) if (!leased.has(formatCidr(b))) return b;
  return undefined;
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
