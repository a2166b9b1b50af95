import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import {
  DATAGRAM_HEADER, DATAGRAM_OVERHEAD, DATAGRAM_TAG, DATAGRAM_TYPE, forEachSegment, innerMtu, MAX_COUNTER, parseDatagramHeader, rekeyDue,
  ReplayWindow, writeDatagramHeader, writeNonce,
} from './datagram.ts';

describe('datagram header and nonce', () => {
  test('a header round-trips; the nonce is 4 zero bytes and the counter', () => {
    const buf = new Uint8Array(DATAGRAM_HEADER + DATAGRAM_TAG + 1);
    writeDatagramHeader(buf, DATAGRAM_TYPE.data, 0xdeadbeef, 2 ** 40 + 5);
    assert.deepEqual(parseDatagramHeader(buf), { type: DATAGRAM_TYPE.data, keyId: 0xdeadbeef, counter: 2 ** 40 + 5 });
    const nonce = new Uint8Array(12).fill(9);
    writeNonce(nonce, 2 ** 40 + 5);
    assert.deepEqual([...nonce], [0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 5]);
  });

  test('garbage is told apart before any cryptography', () => {
    assert.equal(parseDatagramHeader(new Uint8Array(DATAGRAM_HEADER + DATAGRAM_TAG)), 'truncated');
    const buf = new Uint8Array(64);
    writeDatagramHeader(buf, DATAGRAM_TYPE.keepalive, 1, 1);
    assert.equal(typeof parseDatagramHeader(buf), 'object');
    assert.equal(parseDatagramHeader(Object.assign(buf.slice(), { 0: 7 })), 'badType');
    assert.equal(parseDatagramHeader(Object.assign(buf.slice(), { 2: 1 })), 'badType');
    const high = buf.slice();
    writeDatagramHeader(high, DATAGRAM_TYPE.data, 1, MAX_COUNTER);
    assert.equal(parseDatagramHeader(high), 'badType');
  });

  test('the inner MTU leaves room for IP, UDP, our header, the virtio header and the tag', () => {
    assert.equal(DATAGRAM_OVERHEAD, 20 + 8 + 16 + 10 + 16);
    assert.equal(innerMtu(1500), 1430);
  });

  test('rekey after the packet or time limit, whichever first', () => {
    const limits = { packets: 100, ms: 1000 };
    assert.equal(rekeyDue(99, 999, limits), false);
    assert.equal(rekeyDue(100, 0, limits), true);
    assert.equal(rekeyDue(0, 1000, limits), true);
  });
});

describe('replay window', () => {
  test('in order, out of order inside the window, duplicates and too old', () => {
    const w = new ReplayWindow();
    for (const c of [0, 1, 2, 5, 4]) assert.equal(w.accept(c), true, `counter ${c}`);
    assert.equal(w.ok(3), true);
    for (const c of [0, 2, 4, 5]) assert.equal(w.ok(c), false, `counter ${c} again`);
    assert.equal(w.accept(5), false);
    assert.equal(w.accept(ReplayWindow.SIZE + 4), true);
    assert.equal(w.ok(4), false, 'a counter a whole window below the top is too old');
    assert.equal(w.ok(5), false, 'inside the window and seen');
    assert.equal(w.ok(6), true, 'inside the window and never seen');
    assert.equal(w.ok(ReplayWindow.SIZE + 4), false);
  });

  test('a jump far ahead clears the bitmap; slots reused by the slide are free again', () => {
    const w = new ReplayWindow();
    for (let c = 0; c < ReplayWindow.SIZE; c++) w.accept(c);
    assert.equal(w.accept(10 * ReplayWindow.SIZE), true);
    assert.equal(w.ok(10 * ReplayWindow.SIZE - 1), true);
    assert.equal(w.accept(10 * ReplayWindow.SIZE - 1), true);
    assert.equal(w.ok(10 * ReplayWindow.SIZE - 1), false);
    const v = new ReplayWindow();
    v.accept(3);
    v.accept(3 + ReplayWindow.SIZE - 1);
    assert.equal(v.ok(3), false);
    v.accept(3 + ReplayWindow.SIZE); // 3 leaves the window
    assert.equal(v.ok(3), false, 'below the window');
    assert.equal(v.ok(4), true);
  });

  test('ok never changes the window: forged counters cannot move it', () => {
    const w = new ReplayWindow();
    w.accept(10);
    assert.equal(w.ok(1_000_000), true);
    assert.equal(w.ok(9), true);
    assert.equal(w.accept(9), true);
  });
});

/** A TCP/IPv4 superpacket as the TUN device hands it: virtio header (GSO TCPV4, gso_size) and one IP packet. */
function superpacket(payload: number, gsoSize: number, flags: number): Uint8Array {
  const ihl = 20;
  const thl = 32;
  const pkt = new Uint8Array(10 + ihl + thl + payload);
  pkt[0] = 1;
  pkt[1] = 1;
  pkt[4] = gsoSize & 255;
  pkt[5] = gsoSize >> 8;
  const ip = 10;
  pkt.set([0x45, 0, 0, 0, 0x12, 0x34, 0x40, 0, 64, 6, 0, 0, 10, 1, 0, 2, 10, 2, 0, 3], ip);
  const tcp = ip + ihl;
  pkt.set([0x9c, 0x40, 0x14, 0x51, 0xff, 0xff, 0xff, 0xf0, 0, 0, 0, 1, (thl / 4) << 4, flags, 0xff, 0xff], tcp);
  for (let i = tcp + thl; i < pkt.length; i++) pkt[i] = i * 13 & 255;
  return pkt;
}

function csum(b: Uint8Array, off: number, len: number, init = 0): number {
  let s = init;
  for (let i = 0; i < len; i += 2) s += (b[off + i]! << 8) | (i + 1 < len ? b[off + i + 1]! : 0);
  while (s > 0xffff) s = (s & 0xffff) + (s >>> 16);
  return s;
}

describe('superpacket segmentation', () => {
  const scratch = new Uint8Array(2000);

  test('a packet that fits is passed on as it is; one that cannot be split is refused', () => {
    const small = superpacket(100, 1000, 0x18);
    const out: Uint8Array[] = [];
    assert.equal(forEachSegment(small, 1430, scratch, (s) => out.push(s)), true);
    assert.equal(out[0], small);
    const udpish = superpacket(3000, 1000, 0x18);
    udpish[1] = 0;
    assert.equal(forEachSegment(udpish, 1430, scratch, () => assert.fail('emitted')), false);
    assert.equal(forEachSegment(superpacket(3000, 1400, 0x18), 1430, scratch, () => assert.fail('emitted')), false, 'segments above the inner MTU');
  });

  test('segments carry consecutive sequence numbers, their own lengths, ids and checksums, and the flags in the right places', () => {
    const gso = 1378;
    const pkt = superpacket(3 * gso + 100, gso, 0x80 | 0x18 | 0x01); // CWR, PSH+ACK, FIN
    const segs: Uint8Array[] = [];
    assert.equal(forEachSegment(pkt, 1430, scratch, (s) => segs.push(s.slice())), true);
    assert.deepEqual(segs.map((s) => s.length - 10), [gso + 52, gso + 52, gso + 52, 152]);
    let payload = 0;
    segs.forEach((s, i) => {
      assert.equal(s[0], 1, 'NEEDS_CSUM');
      assert.equal(s[1], 0, 'no GSO');
      assert.equal(s[6]! | (s[7]! << 8), 20, 'csum_start');
      assert.equal(s[8]! | (s[9]! << 8), 16, 'csum_offset');
      const ip = 10;
      assert.equal((s[ip + 2]! << 8) | s[ip + 3]!, s.length - 10);
      assert.equal((s[ip + 4]! << 8) | s[ip + 5]!, 0x1234 + i);
      assert.equal(csum(s, ip, 20), 0xffff, 'IP header checksum');
      const tcp = ip + 20;
      const seq = ((s[tcp + 4]! << 24) >>> 0) + (s[tcp + 5]! << 16) + (s[tcp + 6]! << 8) + s[tcp + 7]!;
      assert.equal(seq, (0xfffffff0 + i * gso) >>> 0, 'sequence (wrapping)');
      assert.equal(s[tcp + 13], i === 0 ? 0x80 | 0x10 : i === 3 ? 0x18 | 0x01 : 0x10);
      // completing the partial checksum as the kernel does gives a valid TCP checksum
      const tcpLen = s.length - tcp;
      const full = ~csum(s, tcp, tcpLen) & 0xffff;
      const check = s.slice();
      check[tcp + 16] = full >> 8;
      check[tcp + 17] = full & 255;
      const pseudo = new Uint8Array(12);
      pseudo.set(s.subarray(ip + 12, ip + 20));
      pseudo[9] = 6;
      pseudo[10] = tcpLen >> 8;
      pseudo[11] = tcpLen & 255;
      assert.equal(csum(check, tcp, tcpLen, csum(pseudo, 0, 12)), 0xffff, 'TCP checksum');
      assert.deepEqual(s.subarray(tcp + 32), pkt.subarray(10 + 52 + payload, 10 + 52 + payload + s.length - tcp - 32));
      payload += s.length - tcp - 32;
    });
    assert.equal(payload, 3 * gso + 100);
  });
});
