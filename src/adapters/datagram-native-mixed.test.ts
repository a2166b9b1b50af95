import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { DatagramKey } from './aead.ts';
import { forEachSegment, writeDatagramHeader, writeNonce, ReplayWindow } from '../core/tunnel/datagram.ts';
import { DatagramSender, ipv4Number, OpenKeyTable, SealKey } from './datagram-native.ts';
import { UdpBatchSocket } from './udp-batch.ts';
const key = randomBytes(32);
// C -> old
const k = new SealKey(key, 77); const plain = randomBytes(1400);
for (let i = 0; i < 100; i++) {
  const d = k.sealOne(1, plain); const nonce = new Uint8Array(12); writeNonce(nonce, i);
  const out = new Uint8Array(2000); assert.equal(new DatagramKey(key, 'open').open(nonce, d, out), 1400); assert.deepEqual(out.subarray(0,1400), new Uint8Array(plain));
}
// old -> C, and superpacket segments equal, via sockets
const table = new OpenKeyTable(); table.add(78, 1, key); table.add(77, 2, key);
const rx = new UdpBatchSocket({ host: '127.0.0.1', port: 0, bufferBytes: 1 << 22 });
const tx = new UdpBatchSocket({ host: '127.0.0.1', port: 0, bufferBytes: 1 << 22 }); tx.start(() => {});
const s = new DatagramSender(tx.fd);
const got: Uint8Array[] = [];
rx.start((n) => { const r = table.open(rx.ring, n, 0, { truncated: 0, badType: 0, unknownKey: 0, replayed: 0, badTag: 0, unknownAddress: 0, badPayload: 0 }); for (let i = 0; i < r.handed; i++) { const x = table.result(i); got.push(rx.ringBytes.slice(x.offset, x.offset + x.length)); } });
const old = new DatagramKey(key, 'seal');
for (let i = 0; i < 50; i++) { const out = new Uint8Array(16 + 500 + 16); writeDatagramHeader(out, 1, 78, i); const nonce = new Uint8Array(12); writeNonce(nonce, i); old.seal(nonce, out, plain.subarray(0, 500)); s.sendRaw(ipv4Number('127.0.0.1')!, rx.port, out); }
await new Promise((r) => setTimeout(r, 300));
assert.equal(got.length, 50); assert.ok(got.every((g) => Buffer.from(g).equals(plain.subarray(0, 500))));
got.length = 0;
function superpacket(payload: number, gsoSize: number, flags: number): Uint8Array { const ihl = 20, thl = 32; const pkt = new Uint8Array(10 + ihl + thl + payload); pkt[0] = 1; pkt[1] = 1; pkt[4] = gsoSize & 255; pkt[5] = gsoSize >> 8; pkt.set([0x45, 0, 0, 0, 0x12, 0x34, 0x40, 0, 64, 6, 0, 0, 10, 1, 0, 2, 10, 2, 0, 3], 10); pkt.set([0x9c, 0x40, 0x14, 0x51, 0xff, 0xff, 0xff, 0xf0, 0, 0, 0, 1, (thl / 4) << 4, flags, 0xff, 0xff], 30); for (let i = 62; i < pkt.length; i++) pkt[i] = randomBytes(1)[0]!; return pkt; }
let total = 0;
for (const [len, gso] of [[60000, 1378], [5000, 1000], [1378*3+1, 1378], [64000, 536], [200, 1378]] as const) {
  const pkt = superpacket(len, gso, 0x19 | 0x80); const ref: Uint8Array[] = [];
  assert.ok(forEachSegment(pkt, 1430, new Uint8Array(2000), (seg) => ref.push(seg.slice())));
  const n = s.send(k, ipv4Number('127.0.0.1')!, rx.port, 1, pkt, 1430); s.flush(); assert.equal(n, ref.length);
  await new Promise((r) => setTimeout(r, 200));
  assert.equal(got.length, ref.length); got.forEach((g, i) => assert.deepEqual(g, ref[i])); total += got.length; got.length = 0;
}
// replay window: random sequences agree with the TS ReplayWindow
const w = new ReplayWindow(); table.add(99, 0, key);
for (let i = 0; i < 200000; i++) { const c = Math.floor(Math.random() * 10000) + Math.floor(i / 10); const acc = Math.random() < 0.5; const a = acc ? w.accept(c) : w.ok(c); const b = table.window(99, c, acc) === 1; assert.equal(a, b, `counter ${c}`); }
console.log('mixed ok: 100 C->old, 50 old->C, superpacket segments equal', total, '200k window ops agree');
s.free(); tx.close(); rx.close(); table.free(); k.free();
