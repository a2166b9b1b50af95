/**
 * The tunnel's datagram path on namespaces: two node namespaces joined by a veth underlay (MTU 1500), each with a TUN
 * device and a pod behind a veth with the pods' usual MTU of 1450, one tunnel process per node with a pinned TLS
 * stream and the datagram path. Checks that pods talk over datagrams (their superpackets split to the inner MTU),
 * that spoofed sources and bad datagrams are dropped and counted and never answered, and that a TCP flow moves to the
 * stream when UDP is blocked and back when it is not, without breaking; and that a node restarted with no stream to
 * its peer (the relay and the controller away) rebuilds the datagram path from its local state by hellos.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { dumpNetns, inNetns, leftoverNetns, rootSkipReason, sh } from '../../harness/netns.ts';
import { until } from '../../harness/wait.ts';
import { PROJECT_NODE } from '../../src/lab/agent-process.ts';
import type { DatagramPathStats } from '../../src/adapters/tunnel/datagram-path-types.ts';
import { makeTunnelSide, removeTunnelBed, startTunnelNode, tunnelSpecOf, tunnelStats, type TunnelSide as Side, wireTunnelBed } from '../support/tunnel-bed.ts';
import { HELLO_LEN } from '../../src/core/tunnel/hello.ts';

const TUN = 'atltun0';
const PORT = 7410;
const UDP_PORT = 7411;

interface Stats {
  endpoint: { droppedBadSource: number; forwardedIn: number; forwardedOut: number };
  stream?: { framesSent: number; framesReceived: number };
  connected: boolean;
  path: string;
  udp: DatagramPathStats;
}

const statsOf = (s: Side) => tunnelStats<Stats>(s);

describe('cross-site tunnel datagram path', { skip: rootSkipReason(), timeout: 180_000 }, () => {
  const dir = mkdtempSync(join(tmpdir(), 'atoll-tunnel-udp-'));
  const sides: Side[] = [];
  const report: string[] = [];

  const startTunnel = (self: Side, peer: Side, role: 'listen' | 'dial' | 'alone') => startTunnelNode(self, {
    ...tunnelSpecOf(self, peer, TUN), udp: { host: self.underlay, port: UDP_PORT, underlayMtu: 1500 }, udpStatePath: join(dir, `${self.id}.udp-state.json`),
    ...(role === 'listen' ? { listen: { host: self.underlay, port: PORT } } : role === 'dial' ? { dial: { host: peer.underlay, port: PORT } } : {}),
  });

  before(async () => {
    const a = makeTunnelSide(dir, 'a', 1, '10.211');
    const b = makeTunnelSide(dir, 'b', 2, '10.211');
    sides.push(a, b);
    wireTunnelBed(a, b, 1450);
    startTunnel(b, a, 'listen');
    await until('node b to listen', () => statsOf(b) !== undefined, 15_000);
    startTunnel(a, b, 'dial');
    await until('both ends to use the datagram path', () => sides.every((s) => statsOf(s)?.path === 'udp'), 15_000);
    sh('ip', ['-n', a.node, 'route', 'add', b.block, 'dev', TUN]);
    sh('ip', ['-n', b.node, 'route', 'add', a.block, 'dev', TUN]);
  });

  after(() => {
    removeTunnelBed(sides);
    rmSync(dir, { recursive: true, force: true });
    if (report.length > 0) process.stdout.write(`# tunnel datagram path:\n${report.map((l) => `#   ${l}`).join('\n')}\n`);
    assert.deepEqual(leftoverNetns().filter((n) => n.includes('-tn') || n.includes('-tp')), []);
  });

  const diag = () => sides.map((s) => `${dumpNetns(s.node)}\n# tunnel ${s.id} log:\n${s.log}\n# stats ${JSON.stringify(statsOf(s))}`).join('\n');

  test('the TUN device gets the inner MTU; pods ping both ways over datagrams', async () => {
    const [a, b] = sides as [Side, Side];
    assert.match(sh('ip', ['-n', a.node, 'link', 'show', TUN]), /mtu 1430 /);
    const sent0 = statsOf(a)!.udp.sent;
    const frames0 = statsOf(a)!.stream?.framesSent ?? 0;
    const r = inNetns(a.pod, 'ping', ['-c3', '-i0.2', '-W2', b.podIp]);
    assert.equal(r.status, 0, `ping: ${r.stdout}${r.stderr}\n${diag()}`);
    await until('the datagrams to be counted', () => statsOf(a)!.udp.sent >= sent0 + 3, 3000).catch(() => assert.fail(diag()));
    assert.equal(statsOf(a)!.udp.dropped.sendFailed, 0, diag());
    assert.equal(statsOf(a)!.stream?.framesSent ?? 0, frames0, 'a ping took the stream');
  });

  test('a TCP transfer from a pod with MTU 1450 crosses as datagrams (path MTU discovery to 1430, segments split)', () => {
    const [a, b] = sides as [Side, Side];
    const server = spawn('ip', ['netns', 'exec', b.pod, 'timeout', '40', 'iperf3', '-s', '-1', '-B', b.podIp], { stdio: 'ignore' });
    try {
      spawnSync('sleep', ['0.5']);
      const sent0 = statsOf(a)!.udp.sent;
      const r = inNetns(a.pod, 'iperf3', ['-c', b.podIp, '-J', '-t', '4', '--connect-timeout', '3000'], 30_000);
      assert.equal(r.status, 0, `iperf3: ${r.stdout.slice(-400)}${r.stderr}\n${diag()}`);
      const sum = JSON.parse(r.stdout).end.sum_received as { bits_per_second: number; bytes: number };
      report.push(`iperf3 single stream over datagrams, 4 s: ${(sum.bits_per_second / 1e9).toFixed(2)} Gbit/s; node a: ${JSON.stringify(statsOf(a)!.udp)}`);
      assert.ok(sum.bytes > 10 * 1024 * 1024, `only ${sum.bytes} bytes`);
      assert.ok(statsOf(a)!.udp.sent - sent0 > sum.bytes / 1500, diag());
    } finally {
      server.kill('SIGKILL');
    }
  });

  test('spoofed sources over datagrams are dropped and counted', async () => {
    const [a, b] = sides as [Side, Side];
    const dropped0 = statsOf(a)!.endpoint.droppedBadSource;
    const r = inNetns(b.node, 'ping', ['-c2', '-i0.2', '-W1', '-I', b.underlay, a.podIp]);
    assert.notEqual(r.status, 0);
    await until('the drops to be counted', () => statsOf(a)!.endpoint.droppedBadSource >= dropped0 + 2, 3000);
    assert.equal(statsOf(b)!.path, 'udp');
  });

  test('garbage, truncated and forged datagrams on the UDP port are dropped, counted by reason, never answered', async () => {
    const [a, b] = sides as [Side, Side];
    const d0 = statsOf(a)!.udp.dropped;
    const code = `const s = require('node:dgram').createSocket('udp4'); let answers = 0; s.on('message', () => answers++);
      s.bind(0, '${b.underlay}', async () => {
        const send = (buf) => new Promise((r) => s.send(buf, ${UDP_PORT}, '${a.underlay}', r));
        await send(Buffer.alloc(5));
        const g = Buffer.alloc(200, 7); await send(g);
        const h = Buffer.alloc(200); h[0] = 1; h.writeUInt32BE(12345, 4); await send(h);
        setTimeout(() => { console.log(answers); s.close(); }, 500);
      });`;
    const r = inNetns(b.node, PROJECT_NODE, ['-e', code]);
    assert.equal(r.status, 0, r.stderr);
    assert.equal(r.stdout.trim(), '0', 'something answered');
    await until('the drops to be counted', () => {
      const d = statsOf(a)!.udp.dropped;
      return d.truncated === d0.truncated + 1 && d.badType === d0.badType + 1 && d.unknownKey === d0.unknownKey + 1;
    }, 3000);
  });

  test('a TCP flow moves to the stream when UDP is blocked and back when it is not, without breaking', async () => {
    const [a, b] = sides as [Side, Side];
    const server = spawn('ip', ['netns', 'exec', b.pod, 'timeout', '70', 'iperf3', '-s', '-1', '-B', b.podIp], { stdio: 'ignore' });
    const block = `table inet atoll-test-udp {\n chain in {\n  type filter hook input priority 0;\n  udp dport ${UDP_PORT} drop\n }\n}\n`;
    try {
      spawnSync('sleep', ['0.5']);
      const client = spawn('ip', ['netns', 'exec', a.pod, 'iperf3', '-c', b.podIp, '-J', '-t', '22', '-i', '1', '--connect-timeout', '3000'], { stdio: ['ignore', 'pipe', 'pipe'] });
      let out = '';
      client.stdout.on('data', (d) => (out += d));
      const done = new Promise<number | null>((r) => client.on('exit', r));
      after(() => {
        if (client.exitCode === null) client.kill('SIGKILL');
      });
      const seen = new Set<string>();
      const watch = setInterval(() => seen.add(statsOf(a)?.path ?? '?'), 100);
      try {
        await new Promise((r) => setTimeout(r, 3000));
        const frames0 = statsOf(a)!.stream?.framesSent ?? 0;
        const nft = spawnSync('ip', ['netns', 'exec', b.node, 'nft', '-f', '-'], { input: block, encoding: 'utf8' });
        assert.equal(nft.status, 0, nft.stderr);
        await until('node a to fall back to the stream', () => statsOf(a)!.path === 'direct', 8000);
        // TCP inside retransmits with backoff while the datagrams are lost (about 3 s), then on the stream
        await until('the stream to carry the flow while UDP is blocked', () => (statsOf(a)!.stream?.framesSent ?? 0) > frames0 + 100, 10_000);
        inNetns(b.node, 'nft', ['delete', 'table', 'inet', 'atoll-test-udp']);
        await until('node a to take the datagram path again', () => statsOf(a)!.path === 'udp', 8000);
      } finally {
        clearInterval(watch);
      }
      const code = await done;
      assert.equal(code, 0, `iperf3 failed: ${out.slice(-400)}\n${diag()}`);
      const intervals = (JSON.parse(out).intervals as { sum: { bytes: number } }[]).map((i) => i.sum.bytes);
      report.push(`flow across path moves, bytes per second: ${intervals.map((x) => (x / 1e6).toFixed(0)).join(' ')} MB; paths seen: ${[...seen].join(', ')}`);
      // the move to the stream waits for the datagram path to be declared dead (3 s): TCP retransmits meanwhile
      assert.ok(intervals.slice(-3).every((x) => x > 0), `no progress after the moves: ${intervals.join(' ')}`);
      assert.deepEqual([...seen].sort(), ['direct', 'udp']);
    } finally {
      inNetns(b.node, 'nft', ['delete', 'table', 'inet', 'atoll-test-udp']);
      server.kill('SIGKILL');
    }
  });

  test('a node restarted with no stream to its peer finds it again by hellos, from its local state', async () => {
    const [a, b] = sides as [Side, Side];
    const b0 = statsOf(b)!.udp;
    a.proc?.kill('SIGKILL');
    await new Promise((r) => a.proc?.once('exit', r));
    rmSync(a.statsFile, { force: true });
    const t0 = performance.now();
    startTunnel(a, b, 'alone');
    await until('node a to take the datagram path again, with no stream', () => statsOf(a)?.path === 'udp', 15_000).catch(() => assert.fail(diag()));
    const healedMs = Math.round(performance.now() - t0);
    sh('ip', ['-n', a.node, 'route', 'replace', b.block, 'dev', TUN]);
    const r = inNetns(a.pod, 'ping', ['-c3', '-i0.2', '-W2', b.podIp]);
    assert.equal(r.status, 0, `ping: ${r.stdout}${r.stderr}\n${diag()}`);
    const sa = statsOf(a)!;
    const sb = statsOf(b)!.udp;
    report.push(`restarted node back on the datagram path ${healedMs} ms after its start (process start included); hellos a sent ${sa.udp.hellosSent}, b sent ${sb.hellosSent - b0.hellosSent}`);
    assert.equal(sa.connected, false, 'node a has no stream');
    assert.ok(sa.udp.helloKeys >= 1 && sb.helloKeys >= b0.helloKeys + 1, 'both ends agreed on keys by hellos');
    assert.ok(sa.udp.hellosSent <= 10 && sb.hellosSent - b0.hellosSent <= 10, `too many hellos: ${sa.udp.hellosSent}, ${sb.hellosSent - b0.hellosSent}`);
  });

  test('hellos with a key no peer has are dropped unverified, never answered', async () => {
    const [a, b] = sides as [Side, Side];
    const d0 = statsOf(a)!.udp.dropped;
    const code = `const s = require('node:dgram').createSocket('udp4'); let answers = 0; s.on('message', () => answers++);
      s.bind(0, '${b.underlay}', async () => {
        const h = Buffer.alloc(${HELLO_LEN}); h[0] = 3; h.fill(9, 12);
        for (let i = 0; i < 5; i++) await new Promise((r) => s.send(h, ${UDP_PORT}, '${a.underlay}', r));
        setTimeout(() => { console.log(answers); s.close(); }, 500);
      });`;
    const r = inNetns(b.node, PROJECT_NODE, ['-e', code]);
    assert.equal(r.status, 0, r.stderr);
    assert.equal(r.stdout.trim(), '0', 'something answered');
    await until('the drops to be counted', () => statsOf(a)!.udp.dropped.helloUnknownPeer === d0.helloUnknownPeer + 5, 3000);
  });
});
