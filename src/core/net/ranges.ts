/**
 * Sets of IPv4 addresses as sorted, disjoint, non-adjacent ranges: what an nftables interval set holds. Pure.
 */
import { type Cidr, cidrSize, formatIpv4 } from './ipv4.ts';

/** Addresses `first` to `last`, both included, as unsigned 32-bit numbers. */
export interface Range {
  readonly first: number;
  readonly last: number;
}

export function rangeOfCidr(c: Cidr): Range {
  return { first: c.base, last: c.base + cidrSize(c) - 1 };
}

/** Sorts and merges overlapping and adjacent ranges. */
export function normalizeRanges(ranges: readonly Range[]): Range[] {
  const sorted = [...ranges].sort((a, b) => a.first - b.first);
  const out: Range[] = [];
  for (const r of sorted) {
    const last = out[out.length - 1];
    if (last && r.first <= last.last + 1) {
      if (r.last > last.last) out[out.length - 1] = { first: last.first, last: r.last };
    } else {
      out.push(r);
    }
  }
  return out;
}

/** `from` without the addresses of `minus`; both normalised. */
export function subtractRanges(from: readonly Range[], minus: readonly Range[]): Range[] {
  const cut = normalizeRanges(minus);
  const out: Range[] = [];
  for (const r of normalizeRanges(from)) {
    let first = r.first;
    for (const m of cut) {
      if (m.last < first || m.first > r.last) continue;
      if (m.first > first) out.push({ first, last: m.first - 1 });
      first = m.last + 1;
      if (first > r.last) break;
    }
    if (first <= r.last) out.push({ first, last: r.last });
  }
  return out;
}

/** Whether a normalised range list holds `ip` (binary search). */
export function rangesContain(ranges: readonly Range[], ip: number): boolean {
  let lo = 0;
  let hi = ranges.length - 1;
  while (lo <= hi) {
    const mid = (lo + hi) >>> 1;
    const r = ranges[mid] as Range;
    if (ip < r.first) hi = mid - 1;
    else if (ip > r.last) lo = mid + 1;
    else return true;
  }
  return false;
}

/** One range as nftables writes an interval set element: an address, a prefix when aligned, else `a-b`. */
export function formatRange(r: Range): string {
  if (r.first === r.last) return formatIpv4(r.first);
  const size = r.last - r.first + 1;
  const bits = 32 - Math.log2(size);
  if (Number.isInteger(bits) && r.first % size === 0) return `${formatIpv4(r.first)}/${bits}`;
  return `${formatIpv4(r.first)}-${formatIpv4(r.last)}`;
}
