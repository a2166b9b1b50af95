import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { createSocket } from 'node:dgram';
import { closeSync } from 'node:fs';
import type { Server } from 'node:tls';
import { DATAGRAM_TYPE } from '../../core/tunnel/datagram.ts';
import type { ControlMessage, UdpKeyAck, UdpKeyMessage } from '../../core/tunnel/messages.ts';
import { KeptRegion } from './datagram-native.ts';
import { deriveDatagramKey } from './datagram-keys.ts';
import { DatagramPath } from './datagram-path.ts';
import type { DatagramPathInit } from './datagram-path-types.ts';
import { selfSignedTunnelCert, spkiPin } from '../pki.ts';
import { dialTunnel, listenTunnel } from './tunnel-dial.ts';
import type { TunnelStream } from './tunnel-stream.ts';
import { referenceSeal } from '../../../test/support/datagram-reference.ts';
import { until } from '../../../harness/wait.ts';

function credentials(name: string) {
  const keyPem = generateKeyPairSync('ed25519').privateKey.export({ type: 'pkcs8', format: 'pem' }) as string;
  const certPem = selfSignedTunnelCert(keyPem, name);
  return { keyPem, certPem, pin: spkiPin(certPem) };
}

/** A packet as the TUN device gives it: a virtio header (no GSO) and `n` bytes of IP packet. */
function packet(n: number, fill: number): Uint8Array {
  return new Uint8Array(10 + n).fill(fill, 10);
}

/** The datagram path's last resort in the loopback tests: a peer silent for longer gets nothing. */
const LAST_RESORT_TEST_MS = 2500;

describe('datagram path on loopback', () => {
  const a = credentials('node-a');
  const b = credentials('node-b');
  let server: Server | undefined;
  const streams: TunnelStream[] = [];
  const got: Record<string, Uint8Array[]> = { a: [], b: [] };
  const offers: UdpKeyMessage[] = [];
  let pa: DatagramPath;
  let pb: DatagramPath;
  let sa: TunnelStream;
  let sb: TunnelStream;

  before(async () => {
    const accepted: TunnelStream[] = [];
    const l = await listenTunnel({ host: '127.0.0.1', port: 0, credentials: b, acceptPin: (pin) => pin === a.pin, onStream: (s) => accepted.push(s) });
    server = l.server;
    sa = await dialTunnel({ host: '127.0.0.1', port: l.port, credentials: a, peerPin: b.pin });
    await until('the stream to be accepted', () => accepted.length > 0, 10_000, 5);
    sb = accepted[0] as TunnelStream;
    streams.push(sa, sb);
    const make = (me: 'a' | 'b', stream: TunnelStream) => new DatagramPath(
      { streamOf: () => stream, publicHost: () => '', onPacket: (_peer, pkt) => got[me]!.push(pkt.slice()) },
      { host: '127.0.0.1', port: 0, underlayMtu: 1500, keepaliveMs: 100, deadAfterMs: 1000, lastResortMs: LAST_RESORT_TEST_MS, rekey: { packets: 300, ms: 60_000 } },
    );
    pa = make('a', sa);
    pb = make('b', sb);
    await pa.start();
    await pb.start();
    pa.setPeers([{ id: 'b', pin: b.pin }]);
    pb.setPeers([{ id: 'a', pin: a.pin }]);
    sa.on('control', (m: ControlMessage) => (m.t === 'udp-key' || m.t === 'udp-key-ack') && pa.onControl('b', sa, m));
    sb.on('control', (m: ControlMessage) => {
      if (m.t === 'udp-key') offers.push(m);
      if (m.t === 'udp-key' || m.t === 'udp-key-ack') pb.onControl('a', sb, m);
    });
    pa.offerKey('b', sa);
    pb.offerKey('a', sb);
    await until('the datagram path to be usable both ways', () => pa.usable('b') && pb.usable('a'), 10_000, 20);
  });

  after(() => {
    pa?.close();
    pb?.close();
    for (const s of streams) s.close();
    server?.close();
  });

  test('packets cross as datagrams both ways once flushed; a superpacket-sized packet that cannot be split is left to the stream', async () => {
    for (let i = 0; i < 50; i++) assert.equal(pa.send('b', packet(1000, i)), true);
    pa.flush();
    assert.equal(pb.send('a', packet(1430, 7)), true, 'the largest inner packet fits one datagram');
    // the fallback sends what was queued first (no flush() here), so a flow's packets keep their order
    assert.equal(pb.send('a', packet(1431, 7)), false, 'one byte more does not, and is not a TCP superpacket');
    await until('the packets to arrive', () => got.b!.length === 50 && got.a!.length === 1, 5000, 10);
    assert.deepEqual(got.b!.map((p) => p[10]), Array.from({ length: 50 }, (_, i) => i));
    assert.equal(pb.stats.fallbacks, 1);
  });

  test('keys rotate after the packet limit without losing a packet', async () => {
    const before = got.b!.length;
    const firstOffers = offers.length;
    for (let round = 0; round < 8; round++) {
      for (let i = 0; i < 100; i++) pa.send('b', packet(200, 1));
      pa.flush();
      await new Promise((r) => setTimeout(r, 150));
    }
    await until('every packet to arrive', () => got.b!.length === before + 800, 5000, 10);
    assert.ok(offers.length >= firstOffers + 2, `keys offered: ${offers.length - firstOffers}`);
    assert.equal(Object.values(pb.stats.dropped).reduce((x, y) => x + y, 0), 0, JSON.stringify(pb.stats.dropped));
  });

  test('bad input is dropped, counted by reason and never answered', async () => {
    const raw = createSocket('udp4');
    after(() => raw.close()); // also when an assertion fails: an open socket would keep the test process alive
    const answers: Buffer[] = [];
    raw.on('message', (m) => answers.push(m));
    await new Promise<void>((r) => raw.bind(0, '127.0.0.1', () => r()));
    const to = (buf: Uint8Array) => new Promise<void>((r) => raw.send(buf, pb.port, '127.0.0.1', () => r()));
    const offer = offers.at(-1) as UdpKeyMessage;
    const key = deriveDatagramKey(sb, offer.salt, offer.id);
    const sealed = (type: number, counter: number, k: Uint8Array = key, keyId = offer.id) => referenceSeal(k, type, keyId, counter, packet(90, 3));
    const d0 = { ...pb.stats.dropped };
    await to(randomBytes(7));
    await to(Object.assign(randomBytes(100), { 0: 0x55 }));
    await to(sealed(DATAGRAM_TYPE.data, 5_000_000, key, offer.id ^ 1));
    const forged = sealed(DATAGRAM_TYPE.data, 5_000_001);
    forged[50]! ^= 1;
    await to(forged);
    await to(sealed(DATAGRAM_TYPE.data, 5_000_002, randomBytes(32)));
    await to(sealed(DATAGRAM_TYPE.data, 0));
    const received = got.a!.length;
    await to(sealed(DATAGRAM_TYPE.data, 5_000_003));
    await until('every bad datagram to be counted', () => pb.stats.dropped.unknownAddress > d0.unknownAddress, 3000, 10);
    const delta = Object.fromEntries(Object.entries(pb.stats.dropped).map(([k, v]) => [k, v - d0[k as keyof typeof d0]]));
    assert.deepEqual(delta, { truncated: 1, badType: 1, unknownKey: 1, replayed: 1, badTag: 2, unknownAddress: 1, badPayload: 0, sendFailed: 0,
      helloMalformed: 0, helloUnknownPeer: 0, helloBadSignature: 0, helloReplayed: 0, helloLimited: 0, helloUnsaved: 0 });
    assert.equal(got.a!.length, received, 'a valid datagram from an unknown address was delivered');
    await new Promise((r) => setTimeout(r, 300));
    assert.deepEqual(answers, [], 'something was answered');
    assert.equal(pb.usable('a'), true, 'bad input does not disturb the path');
  });

  test('a peer gone silent: send leaves its packets to the streams; without a stream that lives, sendAnyway still sends them (its keeper may be queueing them) until the last resort runs out', async () => {
    // b's agent goes; a socket bound on its port stands for its keeper's, which queues what comes
    const port = pb.port;
    pb.close();
    const goneAt = performance.now();
    // the descriptor closes once the pool thread that waits on it wakes
    const bound = async () => {
      for (;;) {
        const sock = createSocket('udp4');
        const err = await new Promise<Error | undefined>((r) => {
          sock.once('error', r);
          sock.bind(port, '127.0.0.1', () => r(undefined));
        });
        if (!err) return sock;
        sock.close();
        if (performance.now() - goneAt > 2000) throw err;
        await new Promise((r) => setTimeout(r, 20));
      }
    };
    const kept = await bound();
    after(() => kept.close());
    const queued: Buffer[] = [];
    kept.on('message', (m) => queued.push(m));
    await until('the path to b to turn unusable', () => !pa.usable('b'), 3000, 10);
    assert.equal(pa.send('b', packet(100, 1)), false, 'not usable: the streams would carry it');
    assert.equal(pa.sendAnyway('b', packet(100, 2)), true, 'nothing else reaches b: it goes all the same');
    pa.flush();
    await until('the datagram to reach b\'s socket', () => queued.some((m) => m[0] === DATAGRAM_TYPE.data), 3000, 10);
    const data = queued.filter((m) => m[0] === DATAGRAM_TYPE.data);
    assert.deepEqual(data.map((m) => m.length), [16 + 10 + 100 + 16], 'one datagram: its header, the packet as the TUN device gave it (virtio header first) sealed, the tag');
    assert.equal(pa.stats.sentAnyway, 1);
    assert.equal(pa.sendAnyway('b', packet(100, 4), { silentMs: 0 }), false, 'a stream that lives carries it');
    assert.equal(pa.sendAnyway('b', packet(100, 5), { silentMs: 1000 }), true, 'one silent for a dead interval does not: it goes all the same');
    pa.flush();
    assert.equal(pa.stats.sentAnyway, 2);
    await new Promise((r) => setTimeout(r, Math.max(0, LAST_RESORT_TEST_MS - (performance.now() - goneAt)) + 100));
    assert.equal(pa.sendAnyway('b', packet(100, 3)), false, 'not heard for longer than the last resort: dropped');
    assert.equal(pa.stats.sentAnyway, 2);
  });
});

describe('datagram keys agreed by hellos', () => {
  test('make a pending offer stale: its late ack brings a fresh offer, never a switch to a key the peer may let go of', async () => {
    const a = credentials('node-a');
    const b = credentials('node-b');
    const got: Uint8Array[] = [];
    const toB: ControlMessage[] = [];
    const toA: ControlMessage[] = [];
    // a's only stream to b is silent (its NAT rebooted, say): an offer made on it waits there, and hellos rebuild the
    // path; both ends of the stream export the same keying material
    const stream = (out: ControlMessage[]) => ({
      alive: true, silentMs: 1e9, remote: { host: '127.0.0.1', port: 1 },
      exportKeyingMaterial: (n: number) => Buffer.alloc(n, 7), sendControl: (m: ControlMessage) => out.push(m),
    }) as unknown as TunnelStream;
    const atA = stream(toB);
    const atB = stream(toA);
    const memory = () => ({ port: 0, generation: 0, peers: {} as Record<string, { pin: string; endpoint?: string }> });
    const sa = memory();
    const sb = memory();
    const init = (keyPem: string) => ({ host: '127.0.0.1', port: 0, underlayMtu: 1500, keepaliveMs: 100, deadAfterMs: 1000, identityKeyPem: keyPem });
    const pa = new DatagramPath({ streamOf: () => atA, publicHost: () => '', onPacket: () => {}, state: { load: () => sa, save: () => {} } }, init(a.keyPem));
    const pb = new DatagramPath({ streamOf: () => undefined, publicHost: () => '', onPacket: (_p, pkt) => got.push(pkt.slice()), state: { load: () => sb, save: () => {} } }, init(b.keyPem));
    after(() => {
      pa.close();
      pb.close();
    });
    pa.bind();
    pb.bind();
    sa.peers.b = { pin: b.pin, endpoint: `127.0.0.1:${pb.port}` };
    sb.peers.a = { pin: a.pin, endpoint: `127.0.0.1:${pa.port}` };
    pa.setPeers([{ id: 'b', pin: b.pin }]);
    pb.setPeers([{ id: 'a', pin: a.pin }]);
    pa.offerKey('b', atA);
    const offers = () => toB.filter((m): m is UdpKeyMessage => m.t === 'udp-key');
    assert.equal(offers().length, 1, 'an offer waits on the silent stream');
    pa.run();
    pb.run();
    await until('hellos to agree on keys both ways', () => pa.usable('b') && pb.usable('a'), 10_000, 20);
    assert.ok(pa.stats.helloKeys >= 1 && pb.stats.helloKeys >= 1);
    // the stream comes back: b gets the old offer after the hellos' key (so it would expire that one), acks it, late
    pb.onControl('a', atB, offers()[0] as UdpKeyMessage);
    const ack = toA.find((m) => m.t === 'udp-key-ack');
    assert.ok(ack && ack.t === 'udp-key-ack');
    pa.onControl('b', atA, ack);
    assert.equal(offers().length, 2, 'a answers the stale ack with a fresh offer, not a switch');
    const send = async (n: number) => {
      const before = got.length;
      for (let i = 0; i < n; i++) assert.equal(pa.send('b', packet(100, i)), true);
      pa.flush();
      await until(`${n} packets to arrive under a key b has`, () => got.length === before + n, 5000, 10)
        .catch(() => assert.fail(`b got ${got.length - before} of ${n}; dropped ${JSON.stringify(pb.stats.dropped)}`));
    };
    await send(10);
    pb.onControl('a', atB, offers()[1] as UdpKeyMessage);
    const fresh = toA.filter((m) => m.t === 'udp-key-ack').at(-1);
    assert.ok(fresh && fresh.t === 'udp-key-ack' && fresh.id === offers()[1]?.id);
    pa.onControl('b', atA, fresh);
    await send(10);
    assert.equal(pb.stats.dropped.unknownKey, 0);
    assert.equal(offers().length, 2, 'one fresh offer, no churn');
  });
});

describe('hellos on a disk that refuses the datagram state (issue #39)', () => {
  test('no hello carries a generation that is not on disk, and none of the peer\'s is taken unsaved; once the disk takes writes, the path is rebuilt', async () => {
    const a = credentials('node-a');
    const b = credentials('node-b');
    const memory = () => ({ port: 0, generation: 0, peers: {} as Record<string, { pin: string; endpoint?: string; seenGeneration?: number }> });
    // a's disk: what it holds, and whether it refuses writes
    const disk = { full: true, saved: memory(), fails: 0 };
    const sb = memory();
    const init = (keyPem: string) => ({ host: '127.0.0.1', port: 0, underlayMtu: 1500, keepaliveMs: 100, deadAfterMs: 1000, identityKeyPem: keyPem });
    const save = (st: unknown) => {
      if (disk.full) {
        disk.fails++;
        throw Object.assign(new Error('ENOSPC: no space left on device, write'), { code: 'ENOSPC' });
      }
      disk.saved = structuredClone(st) as typeof disk.saved;
    };
    const pa = new DatagramPath({ streamOf: () => undefined, publicHost: () => '', onPacket: () => {}, state: { load: () => disk.saved, save, path: '/data/tunnel-udp.json' } }, init(a.keyPem));
    const pb = new DatagramPath({ streamOf: () => undefined, publicHost: () => '', onPacket: () => {}, state: { load: () => sb, save: () => {} } }, init(b.keyPem));
    after(() => {
      pa.close();
      pb.close();
    });
    pa.bind();
    pb.bind();
    disk.saved.peers.b = { pin: b.pin, endpoint: `127.0.0.1:${pb.port}` };
    sb.peers.a = { pin: a.pin, endpoint: `127.0.0.1:${pa.port}` };
    pa.setPeers([{ id: 'b', pin: b.pin }]);
    pb.setPeers([{ id: 'a', pin: a.pin }]);
    pa.run();
    pb.run();
    // b sends hellos (a's address is on record); a gets them but can neither take b's generation nor send its own
    await until('a to get b\'s hellos', () => pa.stats.hellosReceived >= 2, 10_000, 20);
    assert.equal(pa.stats.hellosSent, 0, 'a hello left with a generation that is not on disk');
    assert.ok(pa.stats.dropped.helloUnsaved >= 2, 'b\'s hellos are dropped, not taken unsaved');
    assert.equal(disk.saved.generation, 0);
    assert.ok(disk.fails >= 2);
    assert.equal(pa.usable('b'), false);
    disk.full = false;
    await until('hellos to agree on keys once the disk takes writes', () => pa.usable('b') && pb.usable('a'), 10_000, 20);
    assert.ok(disk.saved.generation >= 1, 'the generation a used is on disk');
    assert.ok((disk.saved.peers.b?.seenGeneration ?? -1) >= 1, 'the generation of b that a took is on disk');
  });
});

describe('datagram path with a kept region', () => {
  const a = credentials('node-a');
  const b = credentials('node-b');
  // each end's stream hands its control messages to the other end; both export the same keying material
  const stream = (deliver: (m: UdpKeyMessage | UdpKeyAck) => void) => ({
    alive: true, silentMs: 0, remote: { host: '127.0.0.1', port: 1 },
    exportKeyingMaterial: (n: number) => Buffer.alloc(n, 7),
    sendControl: (m: ControlMessage) => (m.t === 'udp-key' || m.t === 'udp-key-ack') && setImmediate(() => deliver(m)),
  }) as unknown as TunnelStream;
  const described = () => (JSON.parse(Buffer.from(KeptRegion.read(64 * 1024) ?? []).toString()) as { peers: { id: string; usable: boolean; heard?: number }[] }).peers;
  /** Paths a and b, their streams handing each other the control messages, bound, keyed and running. */
  const pair = (initA: DatagramPathInit, initB: DatagramPathInit) => {
    const atA: TunnelStream = stream((m) => pb.onControl('a', atB, m));
    const atB: TunnelStream = stream((m) => pa.onControl('b', atA, m));
    const pa = new DatagramPath({ streamOf: () => atA, publicHost: () => '', onPacket: () => {} }, initA);
    const pb = new DatagramPath({ streamOf: () => atB, publicHost: () => '', onPacket: () => {} }, initB);
    pa.bind();
    pb.bind();
    pa.setPeers([{ id: 'b', pin: b.pin }]);
    pb.setPeers([{ id: 'a', pin: a.pin }]);
    pa.offerKey('b', atA);
    pb.offerKey('a', atB);
    pa.run();
    pb.run();
    return { pa, pb };
  };

  test('the description turns usable with the path, not at the next tick: an agent killed in between takes back a usable path', async () => {
    // a (kept) keeps alive once a second, b ten times as often: a turns usable when b's keepalive answering a's first
    // one comes, about 0.9 s before a's next tick
    const fd = KeptRegion.create(16, 64 * 1024);
    const { pa, pb } = pair({ host: '127.0.0.1', port: 0, underlayMtu: 1500, keepaliveMs: 1000, deadAfterMs: 3000, kept: true },
      { host: '127.0.0.1', port: 0, underlayMtu: 1500, keepaliveMs: 100, deadAfterMs: 3000 });
    after(() => {
      pa.close();
      pb.close();
      KeptRegion.detach(); // after the keys in its slots were freed
      closeSync(fd);
    });
    await until('a\'s path to b to turn usable', () => pa.usable('b'), 10_000, 2);
    assert.deepEqual(described().map((p) => [p.id, p.usable]), [['b', true]]);
  });

  test('a path that was not usable when the agent went is taken back with when its peer was last heard: the next process still sends to it when nothing else does', async () => {
    const fd = KeptRegion.create(16, 64 * 1024);
    const init = { host: '127.0.0.1', port: 0, underlayMtu: 1500, keepaliveMs: 100, deadAfterMs: 500 };
    const { pa, pb } = pair({ ...init, kept: true }, init);
    const restarted: DatagramPath[] = [];
    after(() => {
      for (const d of restarted) d.close();
      pb.close();
      KeptRegion.detach();
      closeSync(fd);
    });
    await until('the path to turn usable both ways', () => pa.usable('b') && pb.usable('a'), 10_000, 5);
    pb.close();
    const goneAt = Date.now();
    await until('a\'s path to b to be given up, and described so', () => !pa.usable('b') && described()[0]?.usable === false, 5000, 10);
    const heard = described()[0]?.heard ?? 0;
    assert.ok(heard > goneAt - 1000 && heard <= goneAt, `last heard ${goneAt - heard} ms before b went`);
    // the agent goes, leaving its keys and the description to its next process
    await pa.closeKeeping();
    const next = new DatagramPath({ streamOf: () => undefined, publicHost: () => '', onPacket: () => {} }, { ...init, kept: true });
    restarted.push(next);
    next.bind();
    assert.equal(next.restored, 1);
    assert.equal(next.usable('b'), false, 'taken back as not usable');
    assert.equal(next.sendAnyway('b', packet(100, 1)), true, 'but heard lately: nothing else reaching b, it goes all the same');
  });
});

/**
 * Two datagram paths `a` and `b` on loopback whose every datagram goes through a middlebox socket (each end's udp-key
 * names the box's port), with streams faked for the keys; `forward(msg, to)` passes a datagram on (or not). The paths
 * are started, peered and keyed; usable both ways on return. Closed after the test.
 */
async function throughBox(init: DatagramPathInit, forward: (box: ReturnType<typeof createSocket>, msg: Buffer, to: number) => void): Promise<{ pa: DatagramPath; pb: DatagramPath }> {
  const a = credentials('node-a');
  const b = credentials('node-b');
  const box = createSocket('udp4');
  await new Promise<void>((r) => box.bind(0, '127.0.0.1', () => r()));
  const boxPort = box.address().port;
  const real: { a?: number; b?: number } = {};
  box.on('message', (msg, from) => {
    const to = from.port === real.a ? real.b : from.port === real.b ? real.a : undefined;
    if (to !== undefined) forward(box, msg, to);
  });
  const stream = (me: 'a' | 'b', deliver: (m: UdpKeyMessage | UdpKeyAck) => void) => ({
    alive: true, silentMs: 0, remote: { host: '127.0.0.1', port: 1 },
    exportKeyingMaterial: (n: number) => Buffer.alloc(n, 7),
    sendControl: (m: ControlMessage) => {
      if (m.t === 'udp-key') {
        real[me] = m.port;
        setImmediate(() => deliver({ ...m, port: boxPort }));
      } else if (m.t === 'udp-key-ack') {
        setImmediate(() => deliver(m));
      }
    },
  }) as unknown as TunnelStream;
  const atA: TunnelStream = stream('a', (m) => pb.onControl('a', atB, m));
  const atB: TunnelStream = stream('b', (m) => pa.onControl('b', atA, m));
  const pa = new DatagramPath({ streamOf: () => atA, publicHost: () => '', onPacket: () => {} }, init);
  const pb = new DatagramPath({ streamOf: () => atB, publicHost: () => '', onPacket: () => {} }, init);
  after(() => {
    pa.close();
    pb.close();
    box.close();
  });
  await pa.start();
  await pb.start();
  pa.setPeers([{ id: 'b', pin: b.pin }]);
  pb.setPeers([{ id: 'a', pin: a.pin }]);
  assert.equal(pa.statusOf('b')?.rttMs, undefined, 'no round trip before an echo came back');
  pa.offerKey('b', atA);
  pb.offerKey('a', atB);
  await until('the path to be usable both ways, through the middlebox', () => pa.usable('b') && pb.usable('a'), 10_000, 5);
  return { pa, pb };
}

describe('keepalives: one byte, but one in FULL_KEEPALIVE_EVERY padded to the full size', () => {
  test('an idle path sends mostly one-byte keepalives; a path that drops full-size datagrams falls back after the full ones\' interval, not the dead one, and comes back', async () => {
    // the middlebox drops datagrams longer than `limit` (a path with a smaller MTU that sends no ICMP back)
    let limit = Infinity;
    let lengths: number[] = [];
    // 50 ms ticks: a full-size keepalive every 500 ms per end, a path dead after 300 ms of silence or 3 s without a
    // full-size one
    const { pa, pb } = await throughBox({ host: '127.0.0.1', port: 0, underlayMtu: 1500, keepaliveMs: 50, deadAfterMs: 300 }, (box, msg, to) => {
      lengths.push(msg.length);
      if (msg.length <= limit) box.send(msg, to, '127.0.0.1');
    });

    lengths = [];
    await new Promise((r) => setTimeout(r, 1000));
    const full = lengths.filter((n) => n > 1000).length;
    assert.ok(lengths.length >= 30, `keepalives seen: ${lengths.length}`);
    assert.ok(full >= 2 && full <= lengths.length / 5, `${full} of ${lengths.length} keepalives were full-size`);
    assert.ok(lengths.every((n) => n > 1000 || n < 64), `lengths: ${[...new Set(lengths)].join(', ')}`);

    limit = 200;
    const cut = performance.now();
    await new Promise((r) => setTimeout(r, 900));
    assert.ok(pa.usable('b') && pb.usable('a'), 'the one-byte keepalives still cross: three dead intervals later the path holds');
    await until('the path to fall back on both ends', () => !pa.usable('b') && !pb.usable('a'), 10_000, 10);
    const fell = performance.now() - cut;
    assert.ok(fell >= 2500 && fell < 4500, `fell back after ${fell.toFixed(0)} ms (full-size keepalives due every 500, given up after 3000)`);

    limit = Infinity;
    await until('the path to come back', () => pa.usable('b') && pb.usable('a'), 5000, 10);
  });
});

describe('keepalive echoes: the datagram path\'s round trip', () => {
  test('one keepalive in ECHO_EVERY asks for an echo; the answer gives the round trip through a delaying middlebox, and follows it', async () => {
    // the middlebox holds every datagram `delayMs` before passing it on
    let delayMs = 40;
    let closed = false;
    after(() => (closed = true));
    // 30 ms ticks: an echo every 300 ms per end
    const { pa, pb } = await throughBox({ host: '127.0.0.1', port: 0, underlayMtu: 1500, keepaliveMs: 30, deadAfterMs: 1000 }, (box, msg, to) => {
      setTimeout(() => closed || box.send(msg, to, '127.0.0.1'), delayMs);
    });
    await until('both ends to have a round trip', () => pa.statusOf('b')?.rttMs !== undefined && pb.statusOf('a')?.rttMs !== undefined, 5000, 10);
    for (const rtt of [pa.statusOf('b')?.rttMs, pb.statusOf('a')?.rttMs] as number[]) {
      assert.ok(rtt >= 2 * 40 - 2 && rtt < 2 * 40 + 150, `round trip ${rtt} ms through a middlebox holding each datagram 40 ms`);
    }
    delayMs = 5;
    await until('the round trip to follow the shorter delay', () => (pa.statusOf('b')?.rttMs ?? Infinity) < 40, 5000, 10);
    assert.ok((pa.statusOf('b')?.rttMs as number) >= 2 * 5 - 2);
    assert.ok(pa.usable('b') && pb.usable('a'), 'the echoes leave the path as it was');
  });
});

describe('dormant peers: a cloud node\'s edge peers that never connected cost its timers nothing (issue #34)', () => {
  test('the ticks and hellos leave peers without address, key or stream alone and save their memory once; a peer with a stream, or one offered a key later, is looked after', async () => {
    const me = credentials('cloud-1');
    const calls = new Map<string, number>();
    const streams = new Map<string, TunnelStream>();
    // never alive: an offer on it does nothing, so the tick keeps asking for the stream of a peer it looks after
    const deadStream = { alive: false, silentMs: 0 } as unknown as TunnelStream;
    streams.set('edge-1', deadStream);
    let saves = 0;
    let state = { port: 0, generation: 0, peers: {} };
    const path = new DatagramPath({
      streamOf: (id) => {
        calls.set(id, (calls.get(id) ?? 0) + 1);
        return streams.get(id);
      },
      publicHost: () => '', onPacket: () => {},
      state: { load: () => state, save: (s) => { saves++; state = s as typeof state; } },
    }, { host: '127.0.0.1', port: 0, underlayMtu: 1500, keepaliveMs: 20, deadAfterMs: 1000, identityKeyPem: me.keyPem });
    try {
      await path.start();
      const peers = Array.from({ length: 2000 }, (_, i) => ({ id: `edge-${i}`, pin: `sha256:${String(i).padStart(64, '0')}` }));
      path.setPeers(peers);
      await until('the peers remembered at the first tick', () => Object.keys(state.peers).length === 2000, 5_000, 10);
      const before = new Map(calls);
      const savesBefore = saves;
      await new Promise((r) => setTimeout(r, 300)); // 15 ticks, 1 hello pass
      assert.equal(saves, savesBefore, 'the memory is not saved again while nothing changed');
      const asked = (id: string) => (calls.get(id) ?? 0) - (before.get(id) ?? 0);
      assert.ok(asked('edge-1') >= 5, `the peer with a stream is offered a key at every tick (asked ${asked('edge-1')} times)`);
      const dormantAsks = peers.filter((p) => p.id !== 'edge-1').reduce((n, p) => n + asked(p.id), 0);
      assert.equal(dormantAsks, 0, 'no stream lookups for dormant peers');
      path.offerKey('edge-7', deadStream); // a stream came up: the tunnel offers a key at once
      const was7 = calls.get('edge-7') ?? 0;
      await until('the woken peer to be looked after', () => (calls.get('edge-7') ?? 0) >= was7 + 3, 5_000, 10);
    } finally {
      path.close();
    }
  });
});
