/**
 * IPv4 addresses and prefixes as plain numbers. Pure: no I/O, no `node:` imports.
 */

/** An IPv4 prefix such as 10.244.1.0/24, normalised so that `base` has no host bits. */
export interface Cidr {
  readonly base: number;
  readonly bits: number;
}

const IPV4 = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/;

/** Parses dotted-quad IPv4 text; returns undefined when it is not one. */
export function parseIpv4(text: string): number | undefined {
  const m = IPV4.exec(text);
  if (!m) return undefined;
  let n = 0;
  for (let i = 1; i <= 4; i++) {
    const octet = Number(m[i]);
    if (octet > 255) return undefined;
    n = n * 256 + octet;
  }
  return n;
}

export function formatIpv4(n: number): string {
  return `${(n >>> 24) & 255}.${(n >>> 16) & 255}.${(n >>> 8) & 255}.${n & 255}`;
}

function maskOf(bits: number): number {
  return bits === 0 ? 0 : (0xffffffff << (32 - bits)) >>> 0;
}

/**
 * Parses `a.b.c.d/n`. With `strict`, host bits must be zero (a network, not an interface address).
 * Returns undefined when the text is not a prefix.
 */
export function parseCidr(text: string, strict = true): Cidr | undefined {
  const slash = text.indexOf('/');
  if (slash < 0) return undefined;
  const ip = parseIpv4(text.slice(0, slash));
  const bitsText = text.slice(slash + 1);
  if (ip === undefined || !/^\d{1,2}$/.test(bitsText)) return undefined;
  const bits = Number(bitsText);
  if (bits > 32) return undefined;
  const base = (ip & maskOf(bits)) >>> 0;
  if (strict && base !== ip) return undefined;
  return { base, bits };
}

export function formatCidr(c: Cidr): string {
  return `${formatIpv4(c.base)}/${c.bits}`;
}

export function cidrSize(c: Cidr): number {
  return 2 ** (32 - c.bits);
}

export function cidrContains(c: Cidr, ip: number): boolean {
  return ((ip & maskOf(c.bits)) >>> 0) === c.base;
}

export function cidrsOverlap(a: Cidr, b: Cidr): boolean {
  const bits = Math.min(a.bits, b.bits);
  const m = maskOf(bits);
  return ((a.base & m) >>> 0) === ((b.base & m) >>> 0);
}

/** The gateway of a pod block: its first usable address. */
export function gatewayOf(c: Cidr): number {
  return c.base + 1;
}

/**
 * Addresses a block hands to pods: all but the network address, the gateway and the broadcast address.
 * Blocks smaller than /30 have none.
 */
export function podRange(c: Cidr): { first: number; last: number } | undefined {
  if (c.bits > 30) return undefined;
  return { first: c.base + 2, last: c.base + cidrSize(c) - 2 };
}
