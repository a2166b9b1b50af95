import { test } from 'node:test';
import assert from 'node:assert/strict';
import { diffOverlay, planOverlay, renderOverlayDiff, sameSite, type OverlayNode, type OverlayPeer, type OverlaySettings } from './plan.ts';
import { renderNftRuleset } from './nft.ts';
import { type Cidr, parseCidr } from '../net/ipv4.ts';

const c = (s: string) => parseCidr(s) as Cidr;
const self: OverlayNode = { name: 'a', site: '', underlay: '192.0.2.10', vtepMac: '0a:00:00:00:00:0a', blocks: [c('10.100.0.0/27')] };
const peer = (name: string, over: Partial<OverlayPeer>): OverlayPeer => ({ name, site: '', underlay: '192.0.2.11', vtepMac: '0a:00:00:00:00:0b', blocks: [c('10.100.0.32/27')], reachable: true, ...over });
const settings: OverlaySettings = { device: 'atoll.1', underlayNet: c('192.0.2.0/24'), underlayDevice: 'eth0', directRouting: 'never' };

test('site: labels decide when both are set, else the probe', () => {
  assert.equal(sameSite({ ...self, site: 'x' }, peer('b', { site: 'x', reachable: false })), true);
  assert.equal(sameSite({ ...self, site: 'x' }, peer('b', { site: 'y', reachable: true })), false);
  assert.equal(sameSite(self, peer('b', { reachable: true })), true);
  assert.equal(sameSite(self, peer('b', { reachable: false })), false);
});

test('VXLAN peers get fdb, neighbour and one onlink route per block (golden)', () => {
  const plan = planOverlay(self, [peer('b', { blocks: [c('10.100.0.32/27'), c('10.100.1.0/27')] }), peer('z', { reachable: false, underlay: '198.51.100.7' })], settings);
  assert.equal(plan.vtepAddress, '10.100.0.0/32');
  assert.deepEqual(plan.sitePeers, [{ name: 'b', path: 'vxlan' }]);
  assert.deepEqual(plan.remotePeers, ['z']);
  const lines = renderOverlayDiff(diffOverlay(plan, { routes: [], neighbours: [], fdb: [] }));
  assert.deepEqual(lines, {
    ip: [
      'neigh replace 10.100.0.32 lladdr 0a:00:00:00:00:0b dev atoll.1 nud permanent',
      'route add 10.100.0.32/27 via 10.100.0.32 dev atoll.1 onlink proto 44',
      'route add 10.100.1.0/27 via 10.100.0.32 dev atoll.1 onlink proto 44',
    ],
    bridge: ['fdb replace 0a:00:00:00:00:0b dev atoll.1 dst 192.0.2.11 self permanent'],
  });
});

test('direct routing for peers on the same L2 segment', () => {
  const plan = planOverlay(self, [peer('b', {}), peer('far', { underlay: '203.0.113.5', site: '', reachable: true })], { ...settings, directRouting: 'auto' });
  assert.deepEqual(plan.sitePeers, [{ name: 'b', path: 'direct' }, { name: 'far', path: 'vxlan' }]);
  assert.deepEqual(plan.routes[0], { dst: '10.100.0.32/27', via: '192.0.2.11', dev: 'eth0', onlink: false });
});

test('the diff removes what is no longer wanted and leaves the rest', () => {
  const want = planOverlay(self, [peer('b', {})], settings);
  const stale = planOverlay(self, [peer('gone', { underlay: '192.0.2.99', vtepMac: '0a:00:00:00:00:99', blocks: [c('10.100.2.0/27')] })], settings);
  const d = diffOverlay(want, { routes: [...want.routes, ...stale.routes], neighbours: want.neighbours, fdb: [...want.fdb, ...stale.fdb] });
  assert.deepEqual(renderOverlayDiff(d), {
    ip: ['route del 10.100.2.0/27 via 10.100.2.0 dev atoll.1 proto 44'],
    bridge: ['fdb del 0a:00:00:00:00:99 dev atoll.1 dst 192.0.2.99 self'],
  });
});

test('the nftables ruleset is one atomic transaction with sets (golden)', () => {
  assert.equal(renderNftRuleset({ localBlocks: [c('10.100.0.0/27')], clusterCidrs: [c('10.100.0.0/16')] }), [
    'table ip atoll',
    'delete table ip atoll',
    'table ip atoll {',
    '  comment "managed by atoll; do not edit"',
    '  set local_pods { type ipv4_addr; flags interval; elements = { 10.100.0.0/27 }; }',
    '  set cluster { type ipv4_addr; flags interval; elements = { 10.100.0.0/16 }; }',
    '  chain postrouting {',
    '    type nat hook postrouting priority srcnat; policy accept;',
    '    ip saddr @local_pods ip daddr != @cluster masquerade comment "pod traffic leaving the cluster"',
    '  }',
    '}',
    '',
  ].join('\n'));
});
