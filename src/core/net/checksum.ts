/** The Internet checksum's pieces (RFC 1071), for headers rebuilt in userspace (segmenting and merging TCP). Pure. */

/** The ones'-complement sum's raw total of the big-endian 16-bit words of `b[off, off + len)` (len even). */
export function sum16(b: Uint8Array, off: number, len: number): number {
  let s = 0;
  for (let i = 0; i < len; i += 2) s += (b[off + i]! << 8) | b[off + i + 1]!;
  return s;
}

/** Folds the carries of a raw sum into 16 bits (not yet complemented). */
export function fold(s: number): number {
  while (s > 0xffff) s = (s & 0xffff) + Math.floor(s / 0x10000);
  return s;
}
