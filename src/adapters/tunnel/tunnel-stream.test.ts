import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { generateKeyPairSync } from 'node:crypto';
import { type AddressInfo, createServer, type Socket } from 'node:net';
import type { Server } from 'node:tls';
import { FRAME_HEADER } from '../../core/tunnel/frame.ts';
import { AtollError } from '../../core/errors.ts';
import type { ControlMessage } from '../../core/tunnel/messages.ts';
import { selfSignedTunnelCert, spkiPin } from '../pki.ts';
import type { TunnelCredentials } from './tunnel-credentials.ts';
import { dialTunnel, joinCircuit, listenTunnel, punchTunnel } from './tunnel-dial.ts';
import type { TunnelStream } from './tunnel-stream.ts';
import { freePort } from '../../../harness/ports.ts';
import { until } from '../../../harness/wait.ts';

function credentials(name: string): TunnelCredentials & { pin: string } {
  const keyPem = generateKeyPairSync('ed25519').privateKey.export({ type: 'pkcs8', format: 'pem' }) as string;
  const certPem = selfSignedTunnelCert(keyPem, name);
  assert.equal(spkiPin(certPem), spkiPin(keyPem), 'the pin of the certificate is the pin of its key');
  return { keyPem, certPem, pin: spkiPin(certPem) };
}

/** A packet with FRAME_HEADER bytes of headroom in front of it, as the TUN reader hands them out. */
function packet(n: number, fill: number): Buffer {
  return Buffer.alloc(FRAME_HEADER + n, fill).subarray(FRAME_HEADER);
}

describe('pinned TLS tunnel stream', () => {
  const a = credentials('node-a');
  const b = credentials('node-b');
  const servers: Server[] = [];
  const refusals: string[] = [];
  const accepted: TunnelStream[] = [];
  let port = 0;

  after(() => {
    for (const s of accepted) s.close();
    for (const s of servers) s.close();
  });

  test('peers with each other\'s pins exchange framed packets in order', async () => {
    const l = await listenTunnel({
      host: '127.0.0.1', port: 0, credentials: b, acceptPin: (pin) => pin === a.pin,
      onStream: (s) => accepted.push(s), onRefused: (r) => refusals.push(r),
    });
    servers.push(l.server);
    port = l.port;
    const client = await dialTunnel({ host: '127.0.0.1', port, credentials: a, peerPin: b.pin });
    await until('the listener to accept the stream', () => accepted.length > 0, 10_000, 5);
    const server = accepted[0] ?? assert.fail('the server accepted no stream');
    assert.equal(server.peerPin, a.pin);
    const got: number[][] = [];
    server.on('frame', (p: Uint8Array) => got.push([p.length, p[0]!, p[p.length - 1]!]));
    // three packets back to back in one buffer, each with its headroom (as the TUN reader leaves them), then one alone
    const sizes = [1, 1500, 65_545, 40];
    const slab = Buffer.alloc(3 * FRAME_HEADER + 1 + 1500 + 65_545);
    let at = 0;
    const pkts = sizes.slice(0, 3).map((n, i) => {
      const p = slab.subarray(at + FRAME_HEADER, at + FRAME_HEADER + n).fill(i + 1);
      at += FRAME_HEADER + n;
      return p;
    });
    let sent = 0;
    assert.ok(client.sendAll([...pkts, packet(40, 4)], () => sent++));
    await until('the frames to arrive', () => got.length >= sizes.length, 10_000, 5);
    assert.deepEqual(got, sizes.map((n, i) => [n, i + 1, i + 1]));
    assert.equal(client.stats.framesSent, 4);
    assert.equal(client.stats.bytesSent, 1 + 1500 + 65_545 + 40);
    assert.equal(sent, 1, 'the batch is reported done once');
    client.close();
    assert.equal(client.sendAll([packet(10, 9)], () => sent++), false, 'a closed stream takes nothing');
    assert.equal(sent, 1);
  });

  test('the listener refuses a client whose key is not pinned', async () => {
    const intruder = credentials('intruder');
    const before = refusals.length;
    const s = await dialTunnel({ host: '127.0.0.1', port, credentials: intruder, peerPin: b.pin }).catch((e: unknown) => e);
    if (!(s instanceof Error)) await new Promise((r) => (s as TunnelStream).on('close', r));
    await until('the listener to report the refusal', () => refusals.length > before, 10_000, 5);
    assert.equal(refusals.length, before + 1);
    assert.match(refusals.at(-1)!, new RegExp(intruder.pin));
  });

  test('a control message that does not decode closes the stream with TUNNEL_MESSAGE_INVALID; valid ones arrive typed', async () => {
    const client = await dialTunnel({ host: '127.0.0.1', port, credentials: a, peerPin: b.pin });
    await new Promise((r) => setTimeout(r, 50));
    const server = accepted.at(-1) ?? assert.fail('the server accepted no stream');
    const got: ControlMessage[] = [];
    server.on('control', (m: ControlMessage) => got.push(m));
    const closed = new Promise<Error | undefined>((r) => server.once('close', r));
    client.sendControl({ t: 'hello' });
    client.sendControl({ t: 'circuit', to: 'node-b' } as unknown as ControlMessage);
    const err = await closed;
    assert.deepEqual(got, [{ t: 'hello' }]);
    assert.ok(err instanceof AtollError);
    assert.equal(err.code, 'TUNNEL_MESSAGE_INVALID');
    assert.match(err.message, /"circuit" message has to "node-b", not a key pin .*, no n/);
    client.close();
  });

  test('the dialler refuses a listener whose key is not the pinned one', async () => {
    await assert.rejects(dialTunnel({ host: '127.0.0.1', port, credentials: a, peerPin: a.pin }), /is not the pinned/);
  });

  // Simultaneous open itself needs two NATs that drop early SYNs (on loopback each SYN meets a closed port and a
  // reset); the lab's edge <-> edge cells prove it (test/e2e/lab.test.ts). Here: the TLS part and the deadline.
  test('a punched connection runs TLS with the peer pinned (here against a listener), keepalive gives the RTT', async () => {
    const accepted: TunnelStream[] = [];
    const l = await listenTunnel({ host: '127.0.0.1', port: 0, credentials: b, acceptPin: () => true, onStream: (st) => accepted.push(st), streamOptions: { keepaliveMs: 50 } });
    servers.push(l.server);
    const common = { host: '127.0.0.1', port: l.port, credentials: a, tlsRole: 'client', deadlineMs: 3000, streamOptions: { keepaliveMs: 50 } } as const;
    const st = await punchTunnel({ ...common, localPort: await freePort(), peerPin: b.pin });
    try {
      assert.equal(st.peerPin, b.pin);
      await until('a keepalive answer', () => st.rttMs !== undefined, 10_000, 5);
      assert.ok(st.rttMs !== undefined && st.rttMs >= 0 && Number.isFinite(st.rttMs), `keepalive round trip ${st.rttMs}`);
      assert.equal(accepted[0]?.peerPin, a.pin);
    } finally {
      st.close();
      for (const x of accepted) x.close();
    }
    await assert.rejects(punchTunnel({ ...common, localPort: await freePort(), peerPin: a.pin }), /is not the pinned/);
  });

  test('an idle stream stays alive on each end\'s own pings: one in ten asks for a pong, the round trip', async () => {
    const accepted: TunnelStream[] = [];
    // 20 ms pings, dead after 150 ms of silence: without its own pings (or the peer's) a stream dies within the test
    const streamOptions = { keepaliveMs: 20, deadAfterMs: 150 };
    const l = await listenTunnel({ host: '127.0.0.1', port: 0, credentials: b, acceptPin: () => true, onStream: (st) => accepted.push(st), streamOptions });
    servers.push(l.server);
    const st = await dialTunnel({ host: '127.0.0.1', port: l.port, credentials: a, peerPin: b.pin, streamOptions });
    try {
      await until('the listener to accept the stream', () => accepted.length > 0, 10_000, 5);
      const peer = accepted[0] as TunnelStream;
      const sent: string[] = [];
      const send = peer.sendControl.bind(peer);
      peer.sendControl = (m: ControlMessage) => {
        sent.push(m.t === 'ping' && m.quiet ? 'quiet ping' : m.t);
        return send(m);
      };
      await new Promise((r) => setTimeout(r, 600));
      assert.ok(st.alive && peer.alive, 'both ends alive after 4 dead intervals');
      assert.ok(st.rttMs !== undefined, 'the first ping asked for a pong');
      const count = (t: string) => sent.filter((x) => x === t).length;
      assert.ok(count('quiet ping') >= 15, `quiet pings sent: ${count('quiet ping')}`);
      assert.ok(count('ping') >= 1 && count('ping') <= count('quiet ping') / 5, `pings asking for a pong: ${count('ping')} of ${sent.length}`);
      assert.ok(count('pong') >= 1 && count('pong') <= count('quiet ping') / 5, `pongs sent: ${count('pong')} (the other end's pings: about as many as ours)`);
    } finally {
      st.close();
      for (const x of accepted) x.close();
    }
  });

  test('hole punching gives up at its deadline when nobody answers', async () => {
    const t0 = performance.now();
    await assert.rejects(punchTunnel({ host: '127.0.0.1', port: await freePort(), localPort: await freePort(), credentials: a, peerPin: b.pin, tlsRole: 'client', deadlineMs: 600 }), /failed within 600 ms/);
    assert.ok(performance.now() - t0 < 2000);
  });

  test('a dial, a circuit join or a punch in flight gives up at once when its signal aborts (an agent stopping is not held by it)', async () => {
    // a listener that accepts and never speaks: every handshake would wait out its 10 s timeout
    const silent = createServer(() => undefined);
    const held: Socket[] = [];
    silent.on('connection', (c) => held.push(c));
    await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve));
    const port = (silent.address() as AddressInfo).port;
    try {
      const giveUp = async (what: string, dial: (signal: AbortSignal) => Promise<TunnelStream>) => {
        const abort = new AbortController();
        const t0 = performance.now();
        const done = dial(abort.signal);
        setTimeout(() => abort.abort(), 200);
        await assert.rejects(done, (err: AtollError) => err.code === 'TUNNEL_UNREACHABLE' && /given up, the dial was stopped/.test(err.message), what);
        assert.ok(performance.now() - t0 < 2000, `${what} gave up ${Math.round(performance.now() - t0)} ms after it began`);
      };
      await giveUp('a dial', (signal) => dialTunnel({ host: '127.0.0.1', port, credentials: a, peerPin: b.pin, signal }));
      await giveUp('a circuit join as the client', (signal) => joinCircuit({ host: '127.0.0.1', port, token: 't1', credentials: a, peerPin: b.pin, tlsRole: 'client', signal }));
      await giveUp('a circuit join as the server', (signal) => joinCircuit({ host: '127.0.0.1', port, token: 't2', credentials: a, peerPin: b.pin, tlsRole: 'server', signal }));
      await giveUp('a punch', async (signal) => punchTunnel({ host: '127.0.0.1', port, localPort: await freePort(), credentials: a, peerPin: b.pin, tlsRole: 'client', deadlineMs: 10_000, signal }));
      const aborted = new AbortController();
      aborted.abort();
      await assert.rejects(dialTunnel({ host: '127.0.0.1', port, credentials: a, peerPin: b.pin, signal: aborted.signal }), /given up/, 'already aborted');
    } finally {
      for (const c of held) c.destroy();
      silent.close();
    }
  });
});
