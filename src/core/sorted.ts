/**
 * Binary search in a sorted array of strings. Pure. The order is `Array.prototype.sort`'s default, by UTF-16 code
 * units (the `<` of strings, as `compareText` in ./order.ts), which is how the stores keep their keys.
 */

/**
 * The index of the first string of `sorted` that is not below `key`: where `key` is, or would be inserted to keep the
 * order; `sorted.length` when every string is below it. With equal strings, the first of them.
 * Precondition: `sorted` is in ascending code-unit order (as `[...].sort()` leaves it). O(log n).
 */
export function lowerBound(sorted: readonly string[], key: string): number {
  let lo = 0;
  let hi = sorted.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (sorted[mid]! < key) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}
