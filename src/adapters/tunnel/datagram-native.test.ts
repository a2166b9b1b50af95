import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash, createPublicKey, generateKeyPairSync, randomBytes } from 'node:crypto';
import { readFileSync, realpathSync } from 'node:fs';
import { DATAGRAM_HEADER, DATAGRAM_TAG, DATAGRAM_TYPE, type DatagramDrop, type DatagramType, MAX_COUNTER } from '../../core/tunnel/datagram.ts';
import { HELLO_DERIVED, HELLO_LEN, HELLO_TYPE, type HelloDrop, writeHello } from '../../core/tunnel/hello.ts';
import { referenceOpen, referenceSeal } from '../../../test/support/datagram-reference.ts';
import { DatagramSender, ipv4Number, nativeCryptoOrigin, OpenKeyTable, SealKey } from './datagram-native.ts';
import { UdpBatchSocket } from './udp-batch.ts';
import { until } from '../../../harness/wait.ts';

const WINDOW = 2048;
const LOOPBACK = ipv4Number('127.0.0.1') as number;

const noDrops = (): Record<DatagramDrop | HelloDrop, number> => ({
  truncated: 0, badType: 0, unknownKey: 0, replayed: 0, badTag: 0, unknownAddress: 0, badPayload: 0,
  helloMalformed: 0, helloUnknownPeer: 0, helloBadSignature: 0, helloReplayed: 0, helloLimited: 0, helloUnsaved: 0,
});

/**
 * A receiving socket opened by a native key table (TCP segments merged unless `merge` is false), and a sending one with
 * a native sender, on loopback. `deferred`: the receiver starts reading at `start()`, so that what was sent before
 * lies in the socket and comes in one ring.
 */
function loop(opts: { merge?: boolean; deferred?: boolean; onHello?: (peer: number) => void } = {}) {
  const table = new OpenKeyTable();
  const rx = new UdpBatchSocket({ host: '127.0.0.1', port: 0, bufferBytes: 1 << 22 });
  const tx = new UdpBatchSocket({ host: '127.0.0.1', port: 0, bufferBytes: 1 << 22 });
  const sender = new DatagramSender(tx.fd);
  const got: { kind: number; peer: number; bytes: Uint8Array; datagrams: number; plain: number }[] = [];
  const dropped = noDrops();
  let seen = 0;
  let spared = 0;
  let rings = 0;
  // as the datagram path does: each pass stops after a hello, whose handling (`onHello`) may add keys
  const start = () => rx.start((n) => {
    rings++;
    for (let more = false, done = false; !done; more = true) {
      const r = table.open(rx.ring, n, 1000, dropped, opts.merge ?? true, more);
      done = r.done;
      seen += r.seen;
      spared += r.spared;
      for (let i = 0; i < r.handed; i++) {
        const d = table.result(i);
        got.push({ kind: d.kind, peer: d.peer, bytes: rx.ringBytes.slice(d.offset, d.offset + d.length), datagrams: d.datagrams, plain: d.bytes });
        if (d.kind === HELLO_TYPE) opts.onHello?.(d.peer);
      }
    }
  });
  if (!opts.deferred) start();
  tx.start(() => {});
  return {
    table, rx, sender, got, dropped, seen: () => seen, spared: () => spared, rings: () => rings, start,
    close() {
      sender.free();
      tx.close();
      rx.close();
      table.free();
    },
  };
}

/** A new key in `l`'s table (id 1, peer tag 5) and its sending half, freed after the test. */
function keyed(l: ReturnType<typeof loop>): SealKey {
  const key = randomBytes(32);
  l.table.add(1, 5, key);
  const k = new SealKey(key, 1);
  after(() => k.free());
  return k;
}

/**
 * A loop whose table holds a key (id 9, peer tag 1), and `send` for datagrams made elsewhere (test/support/
 * datagram-reference.ts) to its receiving socket, as they come; closed after the test.
 */
function forging() {
  const l = loop();
  after(() => l.close());
  const key = randomBytes(32);
  l.table.add(9, 1, key);
  const send = (d: Uint8Array) => assert.equal(l.sender.sendRaw(LOOPBACK, l.rx.port, d), 0);
  return { l, key, send };
}

/** A packet as the TUN device gives it: a virtio header (no GSO) and `n` bytes of IP packet. */
function packet(n: number, fill: number): Uint8Array {
  return new Uint8Array(10 + n).fill(fill, 10);
}

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

const be32 = (n: number): number[] => [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255];

function csum(b: Uint8Array, off: number, len: number, init = 0): number {
  let s = init;
  for (let i = 0; i < len; i += 2) s += (b[off + i]! << 8) | (i + 1 < len ? b[off + i + 1]! : 0);
  while (s > 0xffff) s = (s & 0xffff) + (s >>> 16);
  return s;
}

/** A TCP/IPv4 superpacket (GSO TCPV4) with 12 bytes of TCP options (timestamps), sequence `seq` from port `srcPort`. */
function flowPacket(payload: number, gsoSize: number, flags: number, seq: number, srcPort = 0x9c40): Uint8Array {
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
 * The segments `pkt` is cut into, as atoll_dp_send cuts it (tested above) and as far as merging reads them: no GSO,
 * each its IP length, id and checksum, sequence number, FIN/PSH on the last only.
 */
function cut(pkt: Uint8Array): Uint8Array[] {
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
    const sum = ~csum(s, 10, 20) & 0xffff;
    s[20] = sum >> 8;
    s[21] = sum & 255;
    const seq = (((pkt[34]! << 24) >>> 0) + (pkt[35]! << 16) + (pkt[36]! << 8) + pkt[37]! + i * gso) >>> 0;
    s.set([seq >>> 24, (seq >> 16) & 255, (seq >> 8) & 255, seq & 255], 34);
    if (off + n < pkt.length) s[43]! &= ~0x09;
    out.push(s);
  }
  return out;
}

describe('native datagram path (bin/libatoll-dp.so)', () => {
  test('AES-GCM binds to the OpenSSL inside Node (the one node:crypto uses), no second libcrypto loaded', () => {
    const { path, version } = nativeCryptoOrigin();
    assert.equal(realpathSync(path), realpathSync(process.execPath), `bound to ${path}`);
    assert.equal(version.split(' ')[1], process.versions.openssl, version);
    assert.doesNotMatch(readFileSync('/proc/self/maps', 'utf8'), /libcrypto\.so/);
  });

  test('the wire format: sealed natively opens with an independent implementation, and the other way round', async () => {
    const key = randomBytes(32);
    const k = new SealKey(key, 0xdeadbeef);
    const plain = randomBytes(300);
    const d0 = k.sealOne(DATAGRAM_TYPE.data, plain);
    const d1 = k.sealOne(DATAGRAM_TYPE.keepalive, plain.subarray(0, 1));
    assert.deepEqual(referenceOpen(key, d0), { type: 1, keyId: 0xdeadbeef, counter: 0, plain });
    assert.deepEqual(referenceOpen(key, d1), { type: 2, keyId: 0xdeadbeef, counter: 1, plain: plain.subarray(0, 1) });
    assert.deepEqual(Buffer.from(d0), referenceSeal(key, 1, 0xdeadbeef, 0, plain), 'byte for byte');
    assert.equal(k.counter, 2);
    k.free();
    k.free();

    const l = loop();
    after(() => l.close());
    assert.equal(l.table.add(7, 42, key), true);
    assert.equal(l.table.add(7, 43, key), false, 'an id is taken once');
    const high = 2 ** 40 + 5;
    assert.equal(l.sender.sendRaw(LOOPBACK, l.rx.port, referenceSeal(key, 1, 7, high, plain)), 0);
    await until('the datagram', () => l.got.length === 1, 5000);
    assert.deepEqual(l.got[0], { kind: 1, peer: 42, bytes: new Uint8Array(plain), datagrams: 1, plain: 300 });
  });

  test('a GSO run is cut back into its datagrams (the shorter last one included), each opened; a superpacket is cut into segments', async () => {
    const l = loop({ merge: false });
    after(() => l.close());
    const k = keyed(l);
    const lengths = [1200, 1200, 1200, 1200, 700];
    lengths.forEach((n, i) => assert.equal(l.sender.send(k, LOOPBACK, l.rx.port, DATAGRAM_TYPE.data, packet(n, i + 1), 1430), 1));
    assert.deepEqual(l.sender.flush(), { failed: 0, errno: 0, copies: 0 });
    await until('5 datagrams', () => l.got.length >= 5, 5000);
    assert.deepEqual(l.got.map((g) => g.bytes.length - 10), lengths);
    assert.ok(l.got.every((g, i) => g.peer === 5 && g.bytes.subarray(10).every((b) => b === i + 1)));
    assert.ok(l.rx.stats.buffers < 5, `UDP_GRO merged nothing: ${JSON.stringify(l.rx.stats)}`);

    // segmentation: consecutive sequence numbers, their own lengths, ids and checksums, the flags in the right places
    l.got.length = 0;
    const gso = 1378;
    const pkt = superpacket(3 * gso + 100, gso, 0x80 | 0x18 | 0x01); // CWR, PSH+ACK, FIN
    assert.equal(l.sender.send(k, LOOPBACK, l.rx.port, DATAGRAM_TYPE.data, pkt, 1430), 4);
    l.sender.flush();
    await until('4 segments', () => l.got.length >= 4, 5000);
    const segs = l.got.map((g) => g.bytes);
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


    // what cannot be split is refused, and nothing of it queued
    const udpish = superpacket(3000, 1000, 0x18);
    udpish[1] = 0;
    assert.equal(l.sender.send(k, LOOPBACK, l.rx.port, DATAGRAM_TYPE.data, udpish, 1430), -1);
    assert.equal(l.sender.send(k, LOOPBACK, l.rx.port, DATAGRAM_TYPE.data, superpacket(3000, 1400, 0x18), 1430), -1, 'segments above the inner MTU');
    assert.equal(l.sender.send(k, LOOPBACK, l.rx.port, DATAGRAM_TYPE.data, packet(1431, 0), 1430), -1, 'one byte above, not a superpacket');
    assert.equal(l.sender.send(k, LOOPBACK, l.rx.port, DATAGRAM_TYPE.data, packet(100, 0), 65_000), -1, 'an inner MTU no datagram can carry');
  });

  test('TCP segments of one flow come back merged into the superpacket they were cut from, with its checksums', async () => {
    const l = loop({ deferred: true });
    after(() => l.close());
    const k = keyed(l);
    const gso = 1378;
    const sp = superpacket(30 * gso + 500, gso, 0x18);
    assert.equal(l.sender.send(k, LOOPBACK, l.rx.port, DATAGRAM_TYPE.data, sp, 1430), 31);
    l.sender.flush();
    l.start();
    await until('31 datagrams', () => l.seen() >= 31, 5000);
    assert.equal(l.got.length, 1, `merged into one: ${l.got.map((g) => g.datagrams).join(', ')}`);
    const [m] = l.got as [(typeof l.got)[number]];
    assert.deepEqual([m.datagrams, m.plain], [31, 31 * 62 + 30 * gso + 500]);
    assert.equal(m.bytes.length, sp.length);
    assert.deepEqual([...m.bytes.subarray(0, 10)], [1, 1, 52, 0, gso & 255, gso >> 8, 20, 0, 16, 0], 'NEEDS_CSUM, GSO TCPV4, hdr_len, gso_size, csum_start, csum_offset');
    assert.deepEqual(m.bytes.subarray(62), sp.subarray(62), 'the payload');
    assert.deepEqual(m.bytes.subarray(30, 46), sp.subarray(30, 46), 'ports, sequence (wrapping past 2^32 inside), acknowledgement, flags (PSH back on), window');
    assert.equal((m.bytes[12]! << 8) | m.bytes[13]!, sp.length - 10);
    assert.equal(csum(m.bytes, 10, 20), 0xffff, 'IP header checksum');
    const tcpLen = sp.length - 30;
    const pseudo = new Uint8Array(12);
    pseudo.set(m.bytes.subarray(22, 30));
    pseudo[9] = 6;
    pseudo[10] = tcpLen >> 8;
    pseudo[11] = tcpLen & 255;
    assert.equal((m.bytes[46]! << 8) | m.bytes[47]!, csum(pseudo, 0, 12), 'the TCP checksum field holds the pseudo-header sum, for the kernel to complete');
  });

  test('another flow, a gap, a SYN, a short segment, another source address or a keepalive end a superpacket; what cannot merge passes as it came', async () => {
    const l = loop({ deferred: true });
    const tx2 = new UdpBatchSocket({ host: '127.0.0.1', port: 0, bufferBytes: 1 << 22 });
    const sender2 = new DatagramSender(tx2.fd);
    after(() => {
      sender2.free();
      tx2.close();
      l.close();
    });
    const k = keyed(l);
    const gso = 1366;
    const a = cut(flowPacket(6 * gso, gso, 0x10, 1000));
    const b = cut(flowPacket(2 * gso, gso, 0x10, 5000, 0x1111));
    const syn = flowPacket(0, gso, 0x02, 1000);
    syn[1] = 0;
    const gap = cut(flowPacket(2 * gso, gso, 0x10, 1000 + 7 * gso));
    const short = cut(flowPacket(2 * gso + 10, gso, 0x10, 90_000));
    const after1 = cut(flowPacket(gso, gso, 0x10, 90_000 + 2 * gso + 10));
    const single = cut(flowPacket(700, gso, 0x10, 200_000))[0]!;
    const send = (s: DatagramSender, pkt: Uint8Array, type: DatagramType = DATAGRAM_TYPE.data, copies = 1) => {
      assert.equal(s.send(k, LOOPBACK, l.rx.port, type, pkt, 1430), copies);
      s.flush();
    };
    for (const p of [a[0]!, a[1]!, b[0]!, a[2]!, syn, ...gap]) send(l.sender, p);
    // below what this sender sent of the flow since the SYN (the gap): retransmissions, queued twice; their second
    // copies arrive after the first and are not handed on
    send(l.sender, a[3]!, DATAGRAM_TYPE.data, 2);
    send(sender2, a[4]!); // the same flow, next in sequence, from another address
    send(l.sender, a[5]!, DATAGRAM_TYPE.data, 2);
    send(l.sender, new Uint8Array([1]), DATAGRAM_TYPE.keepalive);
    for (const p of [...short, ...after1, single]) send(l.sender, p);
    l.start();
    await until('every datagram', () => l.seen() >= 18, 5000);
    assert.deepEqual(l.got.map((g) => [g.kind, g.bytes.length - 62, g.datagrams]), [
      [1, 2 * gso, 2], [1, gso, 1], [1, gso, 1], [1, 0, 1], [1, 2 * gso, 2], [1, gso, 1], [1, gso, 1], [1, gso, 1], [2, -61, 1],
      [1, 2 * gso + 10, 3], [1, gso, 1], [1, 700, 1],
    ]);
    assert.deepEqual(l.got[3]!.bytes, syn.subarray(0, 62), 'the SYN as it came');
    assert.deepEqual(l.got[11]!.bytes, single, 'a packet alone as it came');
    assert.deepEqual(l.dropped, noDrops());
  });

  test('an acknowledgement whose SACK blocks report new data goes twice, its copy not handed on; a duplicate SACK, data, a SYN or no SACK once', async () => {
    const l = loop({ deferred: true });
    after(() => l.close());
    const k = keyed(l);
    const ACK = 100_000;
    const block = (start: number, end: number) => [...be32(start), ...be32(end)];
    // a pure TCP/IPv4 packet as the TUN device gives it, timestamps and then `sack` as options
    const tcpPacket = (flags: number, sack: number[], payload = 0) => {
      const opts = [1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2, ...sack];
      while (opts.length % 4 !== 0) opts.push(1);
      const thl = 20 + opts.length;
      const total = 20 + thl + payload;
      const pkt = new Uint8Array(10 + total);
      pkt.set([0x45, 0, total >> 8, total & 255, 0x12, 0x34, 0x40, 0, 64, 6, 0, 0, 10, 2, 0, 3, 10, 1, 0, 2], 10);
      pkt.set([0x14, 0x51, 0x9c, 0x40, 0, 0, 0, 9, ...be32(ACK), (thl / 4) << 4, flags, 0xff, 0xff, 0, 0, 0, 0, ...opts], 30);
      return pkt;
    };
    const sackAck = tcpPacket(0x10, [1, 1, 5, 18, ...block(ACK + 3000, ACK + 4000), ...block(ACK + 1000, ACK + 2000)]);
    const once: [string, Uint8Array][] = [
      ['no SACK', tcpPacket(0x10, [])],
      ['a duplicate SACK below the acknowledgement', tcpPacket(0x10, [1, 1, 5, 18, ...block(ACK - 2000, ACK - 1000), ...block(ACK + 1000, ACK + 2000)])],
      ['a duplicate SACK inside the second block', tcpPacket(0x10, [1, 1, 5, 18, ...block(ACK + 1200, ACK + 1500), ...block(ACK + 1000, ACK + 2000)])],
      ['data', tcpPacket(0x18, [1, 1, 5, 10, ...block(ACK + 3000, ACK + 4000)], 100)],
      ['a SYN', tcpPacket(0x12, [1, 1, 5, 10, ...block(ACK + 3000, ACK + 4000)])],
      ['a FIN', tcpPacket(0x11, [1, 1, 5, 10, ...block(ACK + 3000, ACK + 4000)])],
      ['a SACK option of a bad length', tcpPacket(0x10, [5, 9, ...block(ACK + 3000, ACK + 4000).slice(0, 7)])],
    ];
    assert.equal(l.sender.send(k, LOOPBACK, l.rx.port, DATAGRAM_TYPE.data, sackAck, 1430), 2, 'a SACK acknowledgement');
    for (const [what, pkt] of once) assert.equal(l.sender.send(k, LOOPBACK, l.rx.port, DATAGRAM_TYPE.data, pkt, 1430), 1, what);
    assert.equal(l.sender.send(k, LOOPBACK, l.rx.port, DATAGRAM_TYPE.keepalive, sackAck, 1430), 1, 'a keepalive');
    assert.equal(l.sender.flush().copies, 1, 'one copy queued');
    assert.equal(l.sender.flush().copies, 0, 'and taken');
    l.start();
    await until('every datagram', () => l.seen() >= 10, 5000);
    assert.deepEqual(l.dropped, noDrops(), 'each copy under its own counter');
    assert.equal(l.spared(), 1, 'the copy set aside');
    assert.deepEqual(l.got.slice(0, 1).map((g) => [g.kind, [...g.bytes]]), [[1, [...sackAck]]], 'the copy came after the original: spared');
    assert.deepEqual(l.got.slice(1, 8).map((g) => [...g.bytes]), once.map(([, pkt]) => [...pkt]));
    assert.equal(l.got.length, 9);
  });

  test("a flow's retransmission goes twice (new data, a superpacket's or a new flow's after a SYN, once)", async () => {
    const l = loop({ deferred: true, merge: false });
    after(() => l.close());
    const k = keyed(l);
    const gso = 1366;
    const sent = (pkt: Uint8Array) => l.sender.send(k, LOOPBACK, l.rx.port, DATAGRAM_TYPE.data, pkt, 1430);
    const seg = (seq: number, n = gso) => cut(flowPacket(n, gso, 0x10, seq))[0]!;
    const start = 1000;
    assert.equal(sent(flowPacket(4 * gso, gso, 0x10, start)), 4, 'a superpacket: its segments once');
    assert.equal(sent(seg(start + 2 * gso)), 2, 'one of its segments sent again');
    assert.equal(sent(seg(start + 4 * gso)), 1, 'new data');
    assert.equal(sent(seg(start + gso)), 2, 'below what the flow sent: a retransmission');
    assert.equal(sent(seg(start + 4 * gso, 100)), 2, 'a tail probe sent again');
    assert.equal(sent(seg(start + 5 * gso)), 1, 'new data again');
    const other = cut(flowPacket(gso, gso, 0x10, start, 0x1111))[0]!;
    assert.equal(sent(other), 1, 'another flow: its own');
    const syn = flowPacket(0, gso, 0x02, 500);
    syn[1] = 0;
    assert.equal(sent(syn), 1, 'a SYN starts the flow afresh, at a lower sequence number');
    assert.equal(sent(seg(501)), 1, "the new flow's first data");
    assert.equal(sent(seg(501)), 2, 'and that again');
    assert.equal(l.sender.flush().copies, 4);
    l.start();
    await until('every datagram', () => l.seen() >= 17, 5000);
    assert.equal(l.got.length, 13, 'the four copies came after their originals and were not handed on');
    assert.equal(l.spared(), 4);
    assert.deepEqual(l.dropped, noDrops());
  });

  test('a copy is handed on when its original did not come; a copy flag on a keepalive or another flag is bad type', async () => {
    const { l, key, send } = forging();
    send(referenceSeal(key, 1, 9, 5, packet(50, 5), 1)); // counter 4 never came
    send(referenceSeal(key, 1, 9, 6, packet(50, 6)));
    send(referenceSeal(key, 1, 9, 7, packet(50, 6), 1)); // the copy of 6, which came
    send(referenceSeal(key, 2, 9, 8, new Uint8Array([1]), 1));
    send(referenceSeal(key, 1, 9, 9, packet(50, 9), 2));
    send(referenceSeal(key, 1, 9, 7, packet(50, 6), 1)); // the spared copy again: recorded, so replayed
    await until('6 datagrams seen', () => l.seen() >= 6, 5000);
    assert.deepEqual(l.got.map((g) => [g.kind, g.bytes[10]]), [[1, 5], [1, 6]]);
    assert.deepEqual(l.dropped, { ...noDrops(), badType: 2, replayed: 1 });
    assert.equal(l.spared(), 1, 'the copy of 6 only: the copy of 5 was handed on, the one of 7 again replayed');
  });

  test('bad input is dropped by reason: truncated, bad type, unknown or expired key, replayed, wrong key, tampered; a hello before hellos are on', async () => {
    const { l, key, send } = forging();
    const good = referenceSeal(key, 1, 9, 100, packet(50, 1));
    send(Object.assign(randomBytes(DATAGRAM_HEADER + DATAGRAM_TAG), { 0: 1 }));
    send(Object.assign(Buffer.from(good), { 0: 7 }));
    send(referenceSeal(key, 1, 9, MAX_COUNTER, packet(50, 1)));
    send(referenceSeal(key, 1, 10, 100, packet(50, 1)));
    send(good);
    send(good);
    send(referenceSeal(randomBytes(32), 1, 9, 101, packet(50, 1)));
    const tampered = Buffer.from(referenceSeal(key, 1, 9, 102, packet(50, 1)));
    tampered[30]! ^= 1;
    send(tampered);
    send(referenceSeal(key, 1, 9, 102, packet(50, 1)).subarray(0, 40));
    const hello = Buffer.alloc(200, 3);
    send(hello);
    await until('10 datagrams seen', () => l.seen() >= 10, 5000);
    assert.deepEqual(l.dropped, { ...noDrops(), truncated: 1, badType: 3, unknownKey: 1, replayed: 1, badTag: 3 });
    assert.deepEqual(l.got.map((g) => [g.kind, g.bytes.length]), [[1, 60]]);

    // the tampered counter did not move the window: the authentic 102 opens; an expired key opens nothing
    send(referenceSeal(key, 1, 9, 102, packet(50, 1)));
    await until('11 datagrams seen', () => l.seen() >= 11, 5000);
    assert.equal(l.got.length, 2);
    l.table.expire(9, 999);
    send(referenceSeal(key, 1, 9, 103, packet(50, 1)));
    await until('12 datagrams seen', () => l.seen() >= 12, 5000);
    assert.equal(l.dropped.unknownKey, 2);
    assert.equal(l.table.remove(9), true);
    assert.equal(l.table.remove(9), false);
    assert.equal(l.table.size, 0);
  });
});

describe('hellos in the native table', () => {
  /** A node's tunnel key as a hello carries it (SPKI DER) and its pin. */
  const node = () => {
    const spki = new Uint8Array(createPublicKey(generateKeyPairSync('ed25519').privateKey).export({ type: 'spki', format: 'der' }));
    return { spki, pin: `sha256:${createHash('sha256').update(spki).digest('hex')}` };
  };
  /** A hello from `spki` with a zero signature: the table checks layout and key, not signatures. */
  const hello = (spki: Uint8Array, derived = false) => writeHello(1, spki, randomBytes(32), undefined, derived);

  test('only the hellos of peers\' keys pass, with the peer\'s tag; the rest are dropped by reason before JavaScript', async () => {
    const l = loop();
    after(() => l.close());
    const send = (d: Uint8Array) => assert.equal(l.sender.sendRaw(LOOPBACK, l.rx.port, d), 0);
    const peers = Array.from({ length: 5 }, (_, i) => ({ ...node(), tag: 20 + i }));
    const stranger = node();
    let sent = 0;
    const settle = async () => until(`${sent} datagrams seen`, () => l.seen() >= sent, 5000);
    const sendCounted = (d: Uint8Array) => {
      send(d);
      sent++;
    };

    sendCounted(hello(peers[0]!.spki));
    await settle();
    assert.deepEqual(l.dropped, { ...noDrops(), badType: 1 }, 'hellos are off until the pins are set');

    l.table.setHelloPins([...peers, { pin: 'sha1:not-ours', tag: 99 }]);
    for (const p of [...peers].reverse()) sendCounted(hello(p.spki, true));
    sendCounted(hello(stranger.spki));
    sendCounted(hello(peers[0]!.spki).subarray(0, HELLO_LEN - 1));
    sendCounted(Buffer.concat([hello(peers[0]!.spki), Buffer.alloc(1)]));
    sendCounted(Object.assign(hello(peers[0]!.spki), { 1: HELLO_DERIVED | 2 }));
    sendCounted(Object.assign(hello(peers[0]!.spki), { 3: 1 }));
    await settle();
    assert.deepEqual(l.got.map((g) => [g.kind, g.peer, g.bytes.length]), [...peers].reverse().map((p) => [3, p.tag, HELLO_LEN]));
    assert.deepEqual(l.dropped, { ...noDrops(), badType: 1, helloUnknownPeer: 1, helloMalformed: 4 });

    // the set is replaced, not added to
    l.table.setHelloPins([peers[2]!]);
    sendCounted(hello(peers[0]!.spki));
    sendCounted(hello(peers[2]!.spki));
    await settle();
    assert.deepEqual(l.got.slice(5).map((g) => g.peer), [peers[2]!.tag]);
    assert.equal(l.dropped.helloUnknownPeer, 2);
  });

  test('a hello ends a pass: the datagrams behind it in the same ring open under the key its handling adds, in order', async () => {
    // the peer that answers our hello seals under the keys it agreed at once: its answer and its next packets come
    // in one ring when the receiver is busy (an agent just restarted); opened in one pass, they were unknownKey drops
    const peer = { ...node(), tag: 7 };
    const key = randomBytes(32);
    const l = loop({ deferred: true, onHello: (tag) => l.table.add(42, tag, key) });
    after(() => l.close());
    l.table.setHelloPins([peer]);
    const send = (d: Uint8Array) => assert.equal(l.sender.sendRaw(LOOPBACK, l.rx.port, d), 0);
    send(referenceSeal(key, 1, 42, 1, packet(50, 1)));
    send(hello(peer.spki, true));
    send(referenceSeal(key, 1, 42, 2, packet(50, 2)));
    send(referenceSeal(key, 1, 42, 3, packet(50, 3)));
    l.start();
    await until('4 datagrams seen', () => l.seen() >= 4, 5000);
    assert.equal(l.rings(), 1, 'the four came in one ring');
    assert.deepEqual(l.got.map((g) => [g.kind, g.peer, g.kind === HELLO_TYPE ? 0 : g.bytes[10]]), [[HELLO_TYPE, 7, 0], [1, 7, 2], [1, 7, 3]]);
    assert.deepEqual(l.dropped, { ...noDrops(), unknownKey: 1 }, 'only the one before the hello, under a key not yet known');
  });
});

describe('replay window (native, the one implementation)', () => {
  const table = new OpenKeyTable();
  after(() => table.free());
  let id = 0;
  const fresh = () => {
    table.add(++id, 0, new Uint8Array(32));
    const me = id;
    return { ok: (c: number) => table.window(me, c, false) === 1, accept: (c: number) => table.window(me, c, true) === 1 };
  };

  test('in order, out of order inside the window, duplicates and too old', () => {
    const w = fresh();
    for (const c of [0, 1, 2, 5, 4]) assert.equal(w.accept(c), true, `counter ${c}`);
    assert.equal(w.ok(3), true);
    for (const c of [0, 2, 4, 5]) assert.equal(w.ok(c), false, `counter ${c} again`);
    assert.equal(w.accept(5), false);
    assert.equal(w.accept(WINDOW + 4), true);
    assert.equal(w.ok(4), false, 'a counter a whole window below the top is too old');
    assert.equal(w.ok(5), false, 'inside the window and seen');
    assert.equal(w.ok(6), true, 'inside the window and never seen');
    assert.equal(w.ok(WINDOW + 4), false);
  });

  test('a jump far ahead clears the bitmap; slots reused by the slide are free again', () => {
    const w = fresh();
    for (let c = 0; c < WINDOW; c++) w.accept(c);
    assert.equal(w.accept(10 * WINDOW), true);
    assert.equal(w.ok(10 * WINDOW - 1), true);
    assert.equal(w.accept(10 * WINDOW - 1), true);
    assert.equal(w.ok(10 * WINDOW - 1), false);
    const v = fresh();
    v.accept(3);
    v.accept(3 + WINDOW - 1);
    assert.equal(v.ok(3), false);
    v.accept(3 + WINDOW); // 3 leaves the window
    assert.equal(v.ok(3), false, 'below the window');
    assert.equal(v.ok(4), true);
  });

  test('ok never changes the window: forged counters cannot move it', () => {
    const w = fresh();
    w.accept(10);
    assert.equal(w.ok(1_000_000), true);
    assert.equal(w.ok(9), true);
    assert.equal(w.accept(9), true);
  });

  test('counters above 2^32 (the top half of the nonce)', () => {
    const w = fresh();
    assert.equal(w.accept(2 ** 40), true);
    assert.equal(w.ok(2 ** 40 - WINDOW + 1), true);
    assert.equal(w.ok(2 ** 40 - WINDOW), false);
  });
});
