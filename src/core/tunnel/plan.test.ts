import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { NodeRecord } from '../cluster/model.ts';
import { planTunnel, renderTunnelRouteDiff, tunnelRoutes } from './plan.ts';

const node = (name: string, role: string | undefined, over: Partial<NodeRecord> = {}): NodeRecord => ({
  name, identity: '', site: name.split('-')[0] as string, community: '', addresses: [`192.0.2.${name.length}`], observedAddress: '', vtepMac: '',
  tunnelKey: role ? `sha256:${name}` : '', agentVersion: '', annotations: role ? { 'atoll.dev/role': role } : {}, blocks: ['10.100.0.0/26'],
  registeredAt: 0, updatedAt: 0, ...over,
});

test('tunnel plan: an edge dials cloud peers, a cloud node accepts edge peers; edge <-> edge, keyless, blockless and same-site peers are left out', () => {
  const peers = [
    node('cloud-1', 'cloud', { addresses: ['192.0.2.11'], blocks: ['10.100.1.0/26'], annotations: { 'atoll.dev/role': 'cloud', 'atoll.dev/tunnel-port': '9000' } }),
    node('b-1', 'edge', { blocks: ['10.100.2.0/26'] }),
    node('c-1', undefined, { blocks: ['10.100.3.0/26'] }),
    node('cloud-2', 'cloud', { blocks: [] }),
    node('a-2', 'edge', { blocks: ['10.100.4.0/26'] }),
  ];
  const remote = new Set(['cloud-1', 'b-1', 'c-1', 'cloud-2']);
  const edge = planTunnel({ name: 'a-1', role: 'edge', port: 8475 }, peers, remote);
  assert.deepEqual(edge.peers.map((p) => [p.name, p.dial]), [['cloud-1', { host: '192.0.2.11', port: 9000 }]]);
  assert.deepEqual(edge.skipped.map((s) => s.name), ['b-1', 'c-1', 'cloud-2']);
  assert.deepEqual(tunnelRoutes(edge), ['10.100.1.0/26']);
  const cloud = planTunnel({ name: 'cloud-3', role: 'cloud', port: 8475 }, peers, new Set(['b-1', 'a-2', 'cloud-1']));
  assert.deepEqual(cloud.peers.map((p) => [p.name, p.pin, p.dial]), [['a-2', 'sha256:a-2', undefined], ['b-1', 'sha256:b-1', undefined]]);
});

test('tunnel route diff: deletions first, only our device and protocol', () => {
  assert.deepEqual(renderTunnelRouteDiff(['10.1.0.0/26', '10.2.0.0/26'], ['10.2.0.0/26', '10.3.0.0/26'], 'atoll.tun'), [
    'route del 10.3.0.0/26 dev atoll.tun proto 44',
    'route add 10.1.0.0/26 dev atoll.tun proto 44',
  ]);
});
