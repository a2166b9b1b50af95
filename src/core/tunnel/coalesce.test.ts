import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { TcpCoalescer } from './coalesce.ts';

/** A TCP/IPv4 superpacket as a TUN device hands it (GSO TCPV4), with 12 bytes of TCP options (timestamps). */
function superpacket(payload: number, gsoSize: number, flags = 0x18, seq = 1000, srcPort = 0x9c40): Uint8Array {
  const pkt = new Uint8Array(10 + 20 + 32 + payload);
  pkt.set([1, 1, 52, 0, gsoSize & 255, gsoSize >> 8, 20, 0, 16, 0], 0);
  const total = 52 + payload;
  pkt.set([0x45, 0, total >> 8, total & 255, 0x12, 0x34, 0x40, 0, 64, 6, 0, 0, 10, 1, 0, 2, 10, 2, 0, 3], 10);
  pkt.set([srcPort >> 8, srcPort & 255, 0x14, 0x51, seq >>> 24, (seq >> 16) & 255, (seq >> 8) & 255, seq & 255, 0, 0, 0, 1, 0x80, flags, 0xff, 0xff, 0, 0, 0, 0,
    1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2], 30);
  for (let i = 62; i < pkt.length; i++) pkt[i] = i * 13 & 255;
  return pkt;
}

/**
 * The segments the sender cuts `pkt` into (native/atoll-dp.c, tested in src/adapters/datagram-native.test.ts), as far
 * as the coalescer reads them: no GSO, each its IP length and id, sequence number, FIN/PSH on the last only.
 */
function segments(pkt: Uint8Array): Uint8Array[] {
  const gso = pkt[4]! | (pkt[5]! << 8);
  const out: Uint8Array[] = [];
  for (let off = 62, i = 0; off < pkt.length; off += gso, i++) {
    const n = Math.min(gso, pkt.length - off);
    const s = new Uint8Array(62 + n);
    s.set(pkt.subarray(0, 62));
    s.set(pkt.subarray(off, off + n), 62);
    s.fill(0, 0, 10);
    s[0] = 1;
    s[6] = 20;
    s[8] = 16;
    s[12] = (52 + n) >> 8;
    s[13] = (52 + n) & 255;
    s[15] = (0x34 + i) & 255;
    s[20] = 0;
    s[21] = 0;
    let sum = 0;
    for (let j = 0; j < 20; j += 2) sum += (s[10 + j]! << 8) | s[11 + j]!;
    while (sum > 0xffff) sum = (sum & 0xffff) + (sum >>> 16);
    s[20] = ~sum >> 8 & 255;
    s[21] = ~sum & 255;
    const seq = (((pkt[34]! << 24) >>> 0) + (pkt[35]! << 16) + (pkt[36]! << 8) + pkt[37]! + i * gso) >>> 0;
    s.set([seq >>> 24, (seq >> 16) & 255, (seq >> 8) & 255, seq & 255], 34);
    if (off + n < pkt.length) s[43]! &= ~0x09;
    out.push(s);
  }
  return out;
}

function coalesce(pkts: Uint8Array[]): Uint8Array[] {
  const out: Uint8Array[] = [];
  const c = new TcpCoalescer((p) => out.push(p.slice()));
  for (const p of pkts) c.push(p);
  c.flush();
  return out;
}

function ipChecksumOk(p: Uint8Array): boolean {
  let s = 0;
  for (let i = 0; i < 20; i += 2) s += (p[10 + i]! << 8) | p[11 + i]!;
  while (s > 0xffff) s = (s & 0xffff) + (s >>> 16);
  return s === 0xffff;
}

describe('TCP segment coalescing', () => {
  test('the segments of a superpacket merge back into it: same bytes after the headers, GSO TCPV4 with the segment size', () => {
    const sp = superpacket(30 * 1366 + 500, 1366);
    const [merged, ...rest] = coalesce(segments(sp));
    assert.equal(rest.length, 0);
    assert.ok(merged);
    assert.equal(merged.length, sp.length);
    assert.deepEqual([...merged.subarray(0, 10)], [1, 1, 52, 0, 1366 & 255, 1366 >> 8, 20, 0, 16, 0]);
    assert.deepEqual(merged.subarray(62), sp.subarray(62));
    assert.deepEqual(merged.subarray(30, 46), sp.subarray(30, 46), 'ports, sequence, acknowledgement, flags (PSH back on), window');
    assert.equal((merged[12]! << 8) | merged[13]!, sp.length - 10);
    assert.ok(ipChecksumOk(merged));
  });

  test('another flow, a gap, a SYN or a short segment end the superpacket; what cannot merge passes on unchanged', () => {
    const a = segments(superpacket(4 * 1366, 1366, 0x10, 1000));
    const b = segments(superpacket(2 * 1366, 1366, 0x10, 5000, 0x1111));
    const syn = superpacket(0, 1366, 0x02);
    syn[1] = 0;
    const gap = segments(superpacket(2 * 1366, 1366, 0x10, 1000 + 5 * 1366));
    const out = coalesce([a[0]!, a[1]!, b[0]!, a[2]!, syn, ...gap]);
    assert.deepEqual(out.map((p) => p.length - 62), [2 * 1366, 1366, 1366, 0, 2 * 1366]);
    assert.deepEqual(out[3], syn);
    const short = segments(superpacket(2 * 1366 + 10, 1366, 0x10));
    assert.deepEqual(coalesce([...short, ...segments(superpacket(1366, 1366, 0x10, 1000 + 2 * 1366 + 10))]).map((p) => p.length - 62), [2 * 1366 + 10, 1366]);
  });

  test('a single packet is passed on as it came', () => {
    const one = segments(superpacket(700, 1366))[0]!;
    assert.deepEqual(coalesce([one]), [one]);
  });
});
