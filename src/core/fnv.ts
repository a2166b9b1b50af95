/** 32-bit FNV-1a, for short stable names derived from longer keys. Pure, and stable across runs and versions. */
export function fnv1a(text: string, seed = 0x811c9dc5): number {
  let h = seed >>> 0;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h >>> 0;
}

/** `n` as `width` lowercase hex digits (its low digits when longer). */
export function hex(n: number, width: number): string {
  return n.toString(16).padStart(width, '0').slice(-width);
}
