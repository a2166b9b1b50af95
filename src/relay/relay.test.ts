/**
 * The relay on loopback: registered members connect with their own keys; relayed packets and control messages go
 * only between pairs the relay may connect, each arriving with the origin's id; unknown keys are refused; every
 * connection learns its observed address. The controller is absent (the relay works from its saved registry).
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { generateKeyPairSync } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { NodeRecord } from '../core/cluster/model.ts';
import { FRAME_HEADROOM, peerIdOfPin, pinOfPeerId } from '../core/tunnel/frame.ts';
import { ClusterStateFile } from '../adapters/cluster-state-file.ts';
import { jsonLogger } from '../adapters/json-logger.ts';
import { dialTunnel, selfSignedTunnelCert, spkiPin, type TunnelCredentials, type TunnelStream } from '../adapters/tunnel-stream.ts';
import { freePort } from '../../test/support/ports.ts';
import { Relay } from './relay.ts';

function credentials(name: string): TunnelCredentials & { pin: string } {
  const keyPem = generateKeyPairSync('ed25519').privateKey.export({ type: 'pkcs8', format: 'pem' }) as string;
  const certPem = selfSignedTunnelCert(keyPem, name);
  return { keyPem, certPem, pin: spkiPin(certPem) };
}

const node = (name: string, pin: string, community: string, role = 'edge'): NodeRecord => ({
  name, identity: '', site: name, community, addresses: [], observedAddress: '', vtepMac: '', tunnelKey: pin, agentVersion: '',
  annotations: { 'atoll.dev/role': role }, blocks: [], registeredAt: 0, updatedAt: 0,
});

/** A packet with the headroom a relayed frame needs, as the TUN reader hands them out. */
const packet = (fill: number, n = 100) => Buffer.alloc(FRAME_HEADROOM + n, fill).subarray(FRAME_HEADROOM);
const settle = () => new Promise((r) => setTimeout(r, 150));

describe('relay', () => {
  const dir = mkdtempSync(join(tmpdir(), 'atoll-relay-test-'));
  const [a, b, c] = [credentials('a-1'), credentials('b-1'), credentials('c-1')];
  let relay: Relay;
  let port = 0;
  const streams: TunnelStream[] = [];

  before(async () => {
    new ClusterStateFile(join(dir, 'registry.json')).save({ blocks: [], revision: 7, peers: [node('a-1', a.pin, 'x'), node('b-1', b.pin, 'x'), node('c-1', c.pin, 'y')] });
    port = await freePort();
    // the controller URL points at a closed loopback port: the relay keeps its saved registry and retries quietly
    relay = new Relay({ listenHost: '127.0.0.1', listenPort: port, dataDir: dir, controller: { urls: [`https://127.0.0.1:${await freePort()}`], caCertHash: `sha256:${'0'.repeat(64)}`, token: 'relay-token-0123456789' } },
      jsonLogger({ level: 'error' }));
    await relay.start();
  });

  after(() => {
    for (const s of streams) s.close();
    relay?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  const join_ = async (who: TunnelCredentials) => {
    const s = await dialTunnel({ host: '127.0.0.1', port, credentials: who, peerPin: relay.pin });
    streams.push(s);
    const observed = new Promise<Record<string, unknown>>((resolve) => s.once('control', resolve));
    s.sendControl({ t: 'hello' });
    return { s, observed: await observed };
  };

  test('members learn their observed address; packets and control go between one community only, with the origin id', async () => {
    const sa = await join_(a);
    const sb = await join_(b);
    const sc = await join_(c);
    assert.equal(sa.observed.t, 'observed');
    assert.equal(sa.observed.host, '127.0.0.1');
    assert.ok(typeof sa.observed.port === 'number' && sa.observed.port > 0 && sa.observed.port !== port, 'our own (client) port, as the relay sees it');
    await settle();
    assert.equal(relay.stats.connected, 3);
    const gotB: [string, number, number][] = [];
    const gotC: string[] = [];
    sb.s.on('relayed', (id: Uint8Array, p: Uint8Array) => gotB.push([pinOfPeerId(id), p.length, p[0] as number]));
    sb.s.on('relayed-control', (id: Uint8Array, m: { t: string }) => gotB.push([pinOfPeerId(id), -1, m.t.length]));
    sc.s.on('relayed', (id: Uint8Array) => gotC.push(pinOfPeerId(id)));
    assert.ok(sa.s.sendRelayed(peerIdOfPin(b.pin), packet(7)));
    assert.ok(sa.s.sendRelayedControl(peerIdOfPin(b.pin), { t: 'punch' }));
    assert.ok(sa.s.sendRelayed(peerIdOfPin(c.pin), packet(8)), 'sent, but the relay must not carry it: c is in another community');
    await settle();
    assert.deepEqual(gotB, [[a.pin, 100, 7], [a.pin, -1, 5]]);
    assert.deepEqual(gotC, []);
    assert.equal(relay.stats.forwardedControl, 1);
    assert.equal(relay.stats.droppedNotAllowed, 1);
    // a superpacket-sized frame spans several TLS records: the relay assembles it in its pool and gives it back
    const big: number[] = [];
    sb.s.on('relayed', (_id: Uint8Array, p: Uint8Array) => big.push(p.length, p.every((x) => x === 6) ? 1 : 0));
    assert.ok(sa.s.sendRelayed(peerIdOfPin(b.pin), packet(6, 60_000)));
    await settle();
    assert.deepEqual(big.slice(-2), [60_000, 1], 'the whole packet, unchanged');
    assert.equal(relay.framesHeld, 0, 'every assembled frame went back to the pool once written');
    assert.equal(relay.stats.forwardedPackets, 2);
    sb.s.close();
    await settle();
    assert.ok(sa.s.sendRelayed(peerIdOfPin(b.pin), packet(9)));
    await settle();
    assert.equal(relay.stats.droppedNoDestination, 1, 'b left the relay');
  });

  test('a key that is not registered is refused', async () => {
    const intruder = credentials('intruder');
    const before = relay.stats.refused;
    const s = await dialTunnel({ host: '127.0.0.1', port, credentials: intruder, peerPin: relay.pin }).catch((e: unknown) => e);
    if (!(s instanceof Error)) await new Promise((r) => (s as TunnelStream).once('close', r));
    await settle();
    assert.equal(relay.stats.refused, before + 1);
  });
});
