/**
 * The relay on loopback: registered members connect with their own keys and learn their observed address and the
 * circuit port; control messages go only between pairs the relay may connect, each arriving with the origin's id;
 * circuits are offered only to such pairs, and their two ends then talk TLS end to end through the relay; unknown
 * keys and unknown circuit tokens are refused. The controller is absent (the relay works from its saved registry).
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { generateKeyPairSync } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { NodeRecord } from '../core/cluster/model.ts';
import { FRAME_HEADER, pinOfPeerId, peerIdOfPin } from '../core/tunnel/frame.ts';
import { ClusterStateFile } from '../adapters/node/cluster-state-file.ts';
import { jsonLogger } from '../adapters/ops/json-logger.ts';
import { selfSignedTunnelCert, spkiPin } from '../adapters/pki.ts';
import type { TunnelCredentials } from '../adapters/tunnel/tunnel-credentials.ts';
import { dialTunnel, joinCircuit } from '../adapters/tunnel/tunnel-dial.ts';
import type { TunnelStream } from '../adapters/tunnel/tunnel-stream.ts';
import type { ControlMessage, PeerMessage } from '../core/tunnel/messages.ts';
import { freePort } from '../../harness/ports.ts';
import { until } from '../../harness/wait.ts';
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

/** The next control message on `s` of type `t`. */
const nextControl = <T extends ControlMessage['t']>(s: TunnelStream, t: T) => new Promise<Extract<ControlMessage, { t: T }>>((resolve) => {
  const on = (m: ControlMessage) => {
    if (m.t !== t) return;
    s.off('control', on);
    resolve(m as Extract<ControlMessage, { t: T }>);
  };
  s.on('control', on);
});

describe('relay', () => {
  const dir = mkdtempSync(join(tmpdir(), 'atoll-relay-test-'));
  const [a, b, c] = [credentials('a-1'), credentials('b-1'), credentials('c-1')];
  let relay: Relay;
  let port = 0;
  let circuitPort = 0;
  const streams: TunnelStream[] = [];

  before(async () => {
    new ClusterStateFile(join(dir, 'registry.json')).save({ blocks: [], revision: 7, peers: [node('a-1', a.pin, 'x'), node('b-1', b.pin, 'x'), node('c-1', c.pin, 'y')] });
    [port, circuitPort] = [await freePort(), await freePort()];
    // the controller URL points at a closed loopback port: the relay keeps its saved registry and retries quietly
    relay = new Relay({ listenHost: '127.0.0.1', listenPort: port, circuitPort, dataDir: dir,
      controller: { urls: [`https://127.0.0.1:${await freePort()}`], caCertHash: `sha256:${'0'.repeat(64)}`, token: 'relay-token-0123456789' } },
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
    const observed = nextControl(s, 'observed');
    s.sendControl({ t: 'hello' });
    return { s, observed: await observed };
  };

  test('members learn their observed address and the circuit port; control messages go between one community only', async () => {
    const sa = await join_(a);
    const sb = await join_(b);
    const sc = await join_(c);
    assert.equal(sa.observed.host, '127.0.0.1');
    assert.ok(typeof sa.observed.port === 'number' && sa.observed.port > 0 && sa.observed.port !== port, 'our own (client) port, as the relay sees it');
    assert.equal(sa.observed.circuitPort, circuitPort);
    await until('the three members on the relay', () => relay.stats.connected >= 3, 10_000, 5);
    assert.equal(relay.stats.connected, 3);
    const gotB: string[] = [];
    const gotC: string[] = [];
    sb.s.on('relayed-control', (id: Uint8Array, m: PeerMessage) => gotB.push(`${pinOfPeerId(id) === a.pin ? 'a' : '?'} ${m.t}`));
    sc.s.on('relayed-control', (id: Uint8Array, m: PeerMessage) => gotC.push(m.t));
    const punch = { t: 'punch', n: 'p1', host: '127.0.0.1', port: 20_000 } as const;
    assert.ok(sa.s.sendRelayedControl(peerIdOfPin(b.pin), punch));
    assert.ok(sa.s.sendRelayedControl(peerIdOfPin(c.pin), punch), 'sent, but the relay must not carry it: c is in another community');
    // a's two messages are handled in order: once both are counted, b's was forwarded and c's was not
    await until('the relay to handle both messages', () => relay.stats.forwardedControl + relay.stats.droppedNotAllowed >= 2 && gotB.length > 0, 10_000, 5);
    assert.deepEqual(gotB, ['a punch']);
    assert.deepEqual(gotC, []);
    assert.equal(relay.stats.forwardedControl, 1);
    assert.equal(relay.stats.droppedNotAllowed, 1);

    // a circuit: offered to a and b, joined by both, TLS end to end with each other's key through it
    const offered = nextControl(sb.s, 'circuit-join');
    const ready = nextControl(sa.s, 'circuit-ready');
    sa.s.sendControl({ t: 'circuit', to: b.pin, n: 'n1' });
    const [mine, theirs] = await Promise.all([ready, offered]);
    assert.equal(mine.n, 'n1');
    assert.equal(theirs.from, a.pin);
    const [ca, cb] = await Promise.all([
      joinCircuit({ host: '127.0.0.1', port: circuitPort, token: mine.token, credentials: a, peerPin: b.pin, tlsRole: 'client' }),
      joinCircuit({ host: '127.0.0.1', port: circuitPort, token: theirs.token, credentials: b, peerPin: a.pin, tlsRole: 'server' }),
    ]);
    streams.push(ca, cb);
    const got = new Promise<Uint8Array>((resolve) => cb.once('frame', (p: Uint8Array) => resolve(Uint8Array.from(p))));
    const pkt = Buffer.alloc(FRAME_HEADER + 60_000, 9).subarray(FRAME_HEADER);
    assert.ok(ca.sendAll([pkt], () => {}));
    const arrived = await got;
    assert.equal(arrived.length, 60_000);
    assert.ok(arrived.every((x) => x === 9), 'the packet arrived unchanged');
    assert.equal(relay.circuits.joined, 1);
    assert.equal(relay.circuits.open, 1);
    assert.ok(relay.circuits.bytes > 60_000, 'the relay carried the (encrypted) bytes');
    ca.close();
    await until('one end closing to close the circuit and its other end', () => relay.circuits.open === 0 && !cb.alive, 10_000, 5);

    // no circuit across communities, nor to a node that is not on the relay
    const refused = nextControl(sa.s, 'circuit-refused');
    sa.s.sendControl({ t: 'circuit', to: c.pin, n: 'n2' });
    assert.equal((await refused).n, 'n2');
    sb.s.close();
    await until('b to leave the relay', () => relay.stats.connected === 2, 10_000, 5);
    const gone = nextControl(sa.s, 'circuit-refused');
    sa.s.sendControl({ t: 'circuit', to: b.pin, n: 'n3' });
    assert.equal((await gone).n, 'n3');
    assert.equal(relay.stats.circuitsOffered, 1);
  });

  test('a key that is not registered is refused, and so is a circuit connection with an unknown token', async () => {
    const intruder = credentials('intruder');
    const before = relay.stats.refused;
    const s = await dialTunnel({ host: '127.0.0.1', port, credentials: intruder, peerPin: relay.pin }).catch((e: unknown) => e);
    if (!(s instanceof Error)) await new Promise((r) => (s as TunnelStream).once('close', r));
    await until('the relay to count the refusal', () => relay.stats.refused > before, 10_000, 5);
    assert.equal(relay.stats.refused, before + 1);

    const bad = relay.circuits.badToken;
    const sock = connect({ host: '127.0.0.1', port: circuitPort });
    sock.on('error', () => undefined);
    sock.write(`${'ab'.repeat(16)}\n`);
    await new Promise((r) => sock.once('close', r));
    assert.equal(relay.circuits.badToken, bad + 1);
  });
});
