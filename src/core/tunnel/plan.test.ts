import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { NodeRecord } from '../cluster/model.ts';
import { planTunnel, relayAllows, selectPeers, relayMembers, renderTunnelRouteDiff, tunnelRoutes, tunnelSourceAddress } from './plan.ts';

const node = (name: string, role: string | undefined, over: Partial<NodeRecord> = {}): NodeRecord => ({
  name, identity: '', site: name.split('-')[0] as string, community: '', addresses: [`192.0.2.${name.length}`], observedAddress: '', vtepMac: '',
  tunnelKey: role ? `sha256:${name}` : '', agentVersion: '', annotations: role ? { 'atoll.dev/role': role } : {}, blocks: ['10.100.0.0/26'],
  registeredAt: 0, updatedAt: 0, ...over,
});

test('tunnel plan: an edge dials cloud peers, a cloud node accepts edge peers; keyless, blockless and same-site peers are left out', () => {
  const peers = [
    node('cloud-1', 'cloud', { addresses: ['192.0.2.11'], blocks: ['10.100.1.0/26'], annotations: { 'atoll.dev/role': 'cloud', 'atoll.dev/tunnel-port': '9000' } }),
    node('b-1', 'edge', { blocks: ['10.100.2.0/26'] }),
    node('c-1', undefined, { blocks: ['10.100.3.0/26'] }),
    node('cloud-2', 'cloud', { blocks: [] }),
    node('a-2', 'edge', { blocks: ['10.100.4.0/26'] }),
  ];
  const remote = new Set(['cloud-1', 'b-1', 'c-1', 'cloud-2']);
  const edge = planTunnel({ name: 'a-1', role: 'edge', port: 8475, community: '', relay: true }, peers, remote);
  assert.deepEqual(edge.peers.map((p) => [p.name, p.dial]), [['cloud-1', { host: '192.0.2.11', port: 9000 }]]);
  assert.deepEqual(edge.skipped.map((s) => s.name), ['b-1', 'c-1', 'cloud-2']);
  assert.deepEqual(tunnelRoutes(edge), ['10.100.1.0/26']);
  const cloud = planTunnel({ name: 'cloud-3', role: 'cloud', port: 8475, community: '', relay: true }, peers, new Set(['b-1', 'a-2', 'cloud-1']));
  assert.deepEqual(cloud.peers.map((p) => [p.name, p.pin, p.mode]), [['a-2', 'sha256:a-2', 'accept'], ['b-1', 'sha256:b-1', 'accept']]);
  assert.match(cloud.skipped.find((s) => s.name === 'cloud-1')?.reason ?? '', /cloud <-> cloud/);
});

test('tunnel plan: edge <-> edge only inside one community and with a relay; the first name initiates', () => {
  const peers = [
    node('b-1', 'edge', { community: 'blue', blocks: ['10.100.2.0/26'] }),
    node('a-9', 'edge', { community: 'blue', blocks: ['10.100.5.0/26'] }),
    node('c-1', 'edge', { community: 'red', blocks: ['10.100.3.0/26'] }),
    node('d-1', 'edge', { blocks: ['10.100.4.0/26'] }),
  ];
  const remote = new Set(peers.map((p) => p.name));
  const plan = planTunnel({ name: 'a-1', role: 'edge', port: 8475, community: 'blue', relay: true }, peers, remote);
  assert.deepEqual(plan.peers.map((p) => [p.name, p.mode, p.initiator]), [['a-9', 'punch', true], ['b-1', 'punch', true]]);
  assert.deepEqual(tunnelRoutes(plan), ['10.100.5.0/26', '10.100.2.0/26']);
  assert.deepEqual(plan.skipped.map((s) => s.name), ['c-1', 'd-1']);
  assert.match(plan.skipped[0]?.reason ?? '', /community red, not ours \(blue\): not allowed/);
  const late = planTunnel({ name: 'b-2', role: 'edge', port: 8475, community: 'blue', relay: true }, peers, remote);
  assert.deepEqual(late.peers.map((p) => [p.name, p.initiator]), [['a-9', false], ['b-1', false]]);
  const lonely = planTunnel({ name: 'a-1', role: 'edge', port: 8475, community: '', relay: true }, peers, remote);
  assert.deepEqual(lonely.peers, []);
  const noRelay = planTunnel({ name: 'a-1', role: 'edge', port: 8475, community: 'blue', relay: false }, peers, remote);
  assert.deepEqual(noRelay.peers, []);
  assert.match(noRelay.skipped[0]?.reason ?? '', /needs a relay/);
});

test('tunnel route diff: deletions first, only our device and protocol', () => {
  assert.deepEqual(renderTunnelRouteDiff(['10.1.0.0/26', '10.2.0.0/26'], ['10.2.0.0/26', '10.3.0.0/26'], 'atoll.tun'), [
    'route del 10.3.0.0/26 dev atoll.tun proto 44',
    'route add 10.1.0.0/26 dev atoll.tun proto 44',
  ]);
});

test('relay: members are nodes with a role and a key; it carries edge pairs of one community and pairs with a cloud node', () => {
  const m = relayMembers([
    node('a-1', 'edge', { community: 'blue' }), node('b-1', 'edge', { community: 'blue' }), node('c-1', 'edge', { community: 'red' }),
    node('d-1', 'edge'), node('e-1', 'edge'), node('cloud-1', 'cloud'), node('x-1', undefined),
  ]);
  const by = new Map(m.map((x) => [x.name, x]));
  assert.deepEqual(m.map((x) => x.name), ['a-1', 'b-1', 'c-1', 'd-1', 'e-1', 'cloud-1']);
  const allows = (a: string, b: string) => relayAllows(by.get(a)!, by.get(b)!);
  assert.equal(allows('a-1', 'b-1'), true);
  assert.equal(allows('a-1', 'c-1'), false);
  assert.equal(allows('d-1', 'e-1'), false, 'no community: no edge <-> edge path');
  assert.equal(allows('d-1', 'cloud-1'), true);
  assert.equal(allows('a-1', 'a-1'), false);
});

test('the node\'s own traffic into the tunnel leaves from its VTEP address (its first block\'s network address)', () => {
  assert.equal(tunnelSourceAddress({ blocks: ['10.100.0.64/26', '10.100.1.0/26'] }), '10.100.0.64/32');
  assert.equal(tunnelSourceAddress({ blocks: [] }), undefined);
  assert.equal(tunnelSourceAddress(undefined), undefined);
});

test('peer selection: the cluster\'s record of this node wins over the configuration; remote by site labels, else by the overlay\'s probes', () => {
  const own = { name: 'a-1', site: 'conf', community: 'conf-c' };
  const peers = [node('a-1', 'edge', { site: 'a', community: 'blue' }), node('a-2', 'edge'), node('b-1', 'edge'), node('x-1', 'edge', { site: '' }), node('y-1', 'edge', { site: '' })];
  const sel = selectPeers(own, peers, ['x-1']);
  assert.equal(sel.self?.name, 'a-1');
  assert.equal(sel.site, 'a');
  assert.equal(sel.community, 'blue');
  // a-2 shares the site a; b-1 is labelled elsewhere; x-1 and y-1 have no label, so the probes decide
  assert.deepEqual([...sel.remote].sort(), ['b-1', 'x-1']);
  // not registered yet: the configuration, and an unlabelled site leaves every peer to the probes
  const early = selectPeers({ name: 'a-9', site: '', community: 'c' }, peers, ['b-1']);
  assert.equal(early.self, undefined);
  assert.deepEqual([early.site, early.community, [...early.remote]], ['', 'c', ['b-1']]);
});
