import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { AgentStatus, StatusNode } from './agent-status.ts';
import { renderStatus } from './agent-status.ts';
import { renderTrace, resolvePodRef, type TracePath, tracePath } from './trace.ts';
import type { TunnelPeerStatus } from '../tunnel/status.ts';

const node = (name: string, site: string, community: string, role: string, block: string, address: string): StatusNode =>
  ({ name, site, community, role, addresses: [address], blocks: [block], agentVersion: '0.1.0' });

const self = node('a-1', 'a', 'blue', 'edge', '10.244.1.0/26', '10.1.0.2');
const peer = (name: string, mode: string, path: TunnelPeerStatus['path'], extra: Partial<TunnelPeerStatus> = {}): TunnelPeerStatus =>
  ({ name, role: 'edge', mode, path, txBytes: 0, rxBytes: 0, txPackets: 0, rxPackets: 0, since: 1_000_000, ...extra });

function status(over: Partial<AgentStatus> = {}): AgentStatus {
  return {
    version: '0.1.0', startedAt: 1_000_000, now: 1_060_000, ready: true, node: self,
    controller: { state: 'connected', lastError: '' },
    ipam: { blocks: self.blocks, usage: { capacity: 62, allocated: 2, reserved: 1, free: 59 }, allocations: { existing: 0, sticky: 1, fresh: 2, reclaimed: 0 },
      pods: [{ ip: '10.244.1.2', namespace: 'default', name: 'web' }, { ip: '10.244.1.3', namespace: 'default', name: 'db' }, { ip: '10.244.1.4', namespace: 'default', name: 'old', releasedAt: 1 }] },
    overlay: { vtepAddress: '10.244.1.0', sitePeers: [{ name: 'a-2', path: 'vxlan' }, { name: 'a-3', path: 'direct' }], remotePeers: ['cloud-1', 'b-1', 'c-1', 'd-1', 'e-1', 'f-1'] },
    tunnel: {
      role: 'edge', relay: { address: '198.51.100.5:8476', connected: true },
      peers: [peer('cloud-1', 'dial', 'direct', { role: 'cloud', rttMs: 3 }), peer('b-1', 'punch', 'direct'), peer('c-1', 'punch', 'relayed', { punch: { attempts: 3, successes: 0, lastError: 'timed out' } }),
        peer('d-1', 'punch', 'down', { punch: { attempts: 2, successes: 0, lastError: 'timed out' } })],
      skipped: [{ name: 'e-1', reason: 'edge in community red, not ours (blue): not allowed' }], dropped: { badSource: 0 },
    },
    nodes: [self, node('a-2', 'a', 'blue', 'edge', '10.244.2.0/26', '10.1.0.3'), node('a-3', 'a', 'blue', 'edge', '10.244.3.0/26', '10.1.0.4'),
      node('cloud-1', 'cloud', '', 'cloud', '10.244.4.0/26', '192.0.2.10'), node('b-1', 'b', 'blue', 'edge', '10.244.5.0/26', '10.2.0.2'),
      node('c-1', 'c', 'blue', 'edge', '10.244.6.0/26', '10.3.0.2'), node('d-1', 'd', 'blue', 'edge', '10.244.7.0/26', '10.4.0.2'),
      node('e-1', 'e', 'red', 'edge', '10.244.8.0/26', '10.5.0.2'), node('f-1', 'f', 'blue', 'edge', '10.244.9.0/26', '10.6.0.2')],
    ...over,
  };
}

const cases: [string, string, TracePath, RegExp][] = [
  ['same node', '10.244.1.3', 'same node', /delivers it to default\/db/],
  ['same site over VXLAN', '10.244.2.9', 'vxlan', /VXLAN to node a-2 at its VTEP \(underlay 10\.1\.0\.3\)/],
  ['same site, direct route', '10.244.3.9', 'direct route', /direct route via node a-3's underlay address 10\.1\.0\.4/],
  ['to the cloud', '10.244.4.9', 'tunnel direct', /direct TLS stream to node cloud-1 \(this node dialled it, rtt 3\.0 ms\)/],
  ['hole-punched', '10.244.5.9', 'tunnel hole-punched', /hole-punched TLS stream/],
  ['relayed', '10.244.6.9', 'tunnel relayed', /through relay 198\.51\.100\.5:8476.*hole punching failed: timed out/],
  ['peer down', '10.244.7.9', 'broken', /peer d-1 is down since 1970-01-01T00:16:40\.000Z \(60 s ago\); hole punching failed \(timed out, as behind a symmetric NAT\)/],
  ['communities differ', '10.244.8.9', 'not allowed', /communities differ: blue here, red there/],
  ['not in the plan yet', '10.244.9.9', 'broken', /not in this node's tunnel plan yet/],
  ['an address no node of its view holds (an edge node is sent its site, its community and the clouds)', '10.99.0.1', 'not allowed', /no node of this node's view holds a block containing 10\.99\.0\.1/],
  ['a free address of this node', '10.244.1.4', 'broken', /no pod has it now/],
];

for (const [name, to, path, text] of cases) {
  test(`trace: ${name}`, () => {
    const t = tracePath(status(), '10.244.1.2', to);
    assert.equal(t.path, path);
    assert.match(renderTrace(t).join('\n'), text);
  });
}

test('trace: a node that sees every node (a cloud node) knows no owner of an address: broken', () => {
  const cloud = node('cloud-1', 'cloud', '', 'cloud', '10.244.4.0/26', '192.0.2.10');
  const st = status({ node: cloud, ipam: { ...status().ipam, blocks: cloud.blocks, pods: [{ ip: '10.244.4.2', namespace: 'default', name: 'api' }] } });
  const t = tracePath(st, '10.244.4.2', '10.99.0.1');
  assert.equal(t.path, 'broken');
  assert.match(renderTrace(t).join('\n'), /no block owner/);
});

test('trace: a down peer with the relay down says both', () => {
  const st = status();
  const t = tracePath({ ...st, tunnel: { ...st.tunnel!, relay: { address: '198.51.100.5:8476', connected: false } } }, '10.244.1.2', '10.244.7.9');
  assert.match(t.reason ?? '', /the relay 198\.51\.100\.5:8476 is not connected: it breaks at this node's tunnel, before d-1/);
});

test('trace: a node without a tunnel cannot reach beyond its site', () => {
  assert.match(tracePath(status({ tunnel: null }), '10.244.1.2', '10.244.4.9').reason ?? '', /outside this node's site and this node runs no tunnel/);
});

test('resolvePodRef: addresses as they are, namespace/name of live pods on this node', () => {
  assert.equal(resolvePodRef('10.9.9.9', status()), '10.9.9.9');
  assert.equal(resolvePodRef('default/db', status()), '10.244.1.3');
  assert.equal(resolvePodRef('default/old', status()), undefined);
  assert.equal(resolvePodRef('kube-system/db', status()), undefined);
});

test('renderStatus: link, blocks, peers by path, versions', () => {
  const text = renderStatus(status({ controller: { state: 'offline', lastError: 'connect ECONNREFUSED', offlineSince: 1_030_000 } })).join('\n');
  assert.match(text, /controller OFFLINE for 30s: connect ECONNREFUSED \(working from saved state\)/);
  assert.match(text, /addresses 2 in use, 1 reserved, 59 free of 62; sticky re-uses 1/);
  assert.match(text, /tunnel {4}4 peers: 0 udp, 1 direct, 1 hole-punched, 1 relayed, 1 down; 1 without a path/);
  assert.match(text, /cluster {3}9 nodes; agent versions 0\.1\.0 x9/);
  assert.match(text, /^policy {4}off$/m);
  const on = (policy: NonNullable<ReturnType<typeof status>['policy']>) => renderStatus({ ...status(), policy }).join('\n');
  assert.match(on({ policies: 0, isolatedPods: 0, hasView: false }), /^policy {4}on, no view yet \(the ruleset in the kernel, if any, stays in force\)$/m);
  assert.match(on({ policies: 3, isolatedPods: 2, hasView: true, appliedAt: status().now - 5_000 }), /^policy {4}3 policies for this node's pods, 2 pods isolated, applied 5s ago$/m, 'an older agent: no names, no revision');
  assert.match(on({ policies: 2, names: ['x/allow-web', 'x/deny-all'], revision: '0123456789ab', isolatedPods: 2, hasView: true }), /^policy {4}2 policies for this node's pods \(x\/allow-web, x\/deny-all\), revision 0123456789ab, 2 pods isolated$/m);
  assert.match(on({ policies: 12, names: ['x/p0', 'x/p1'], revision: '0123456789ab', isolatedPods: 0, hasView: true }), /\(x\/p0, x\/p1, and 10 more\), revision/);
});

test('renderStatus: peers on the datagram path count as udp, dialled or punched', () => {
  const st = status();
  const peers = [peer('cloud-1', 'dial', 'udp', { role: 'cloud' }), peer('b-1', 'punch', 'udp'), peer('c-1', 'punch', 'udp'), peer('d-1', 'punch', 'down')];
  const text = renderStatus({ ...st, tunnel: { ...st.tunnel!, peers, skipped: [] } }).join('\n');
  assert.match(text, /^tunnel {4}4 peers: 3 udp, 0 direct, 0 hole-punched, 0 relayed, 1 down$/m);
});

test('trace with the controller\'s view: agreement, a node outside an edge node\'s view, or an agent that is behind', () => {
  const view = status().nodes.map((n) => ({ name: n.name, blocks: n.blocks }));
  assert.equal(tracePath(status(), '10.244.1.2', '10.244.2.9', view).controller, 'the controller agrees: node a-2 holds 10.244.2.9');
  const outside = tracePath(status({ controller: { state: 'offline', lastError: 'x' } }), '10.244.1.2', '10.99.0.1', [...view, { name: 'z-1', blocks: ['10.99.0.0/26'] }]);
  assert.equal(outside.path, 'not allowed');
  assert.match(renderTrace(outside).join('\n'), /controller: the controller says node z-1 holds 10\.99\.0\.1, which this agent does not know: a node outside this node's view \(another site and community\), or one it has not heard of yet \(this agent's controller link is offline\)/);
  const cloud = node('cloud-1', 'cloud', '', 'cloud', '10.244.4.0/26', '192.0.2.10');
  const fromCloud = status({ node: cloud, controller: { state: 'offline', lastError: 'x' }, ipam: { ...status().ipam, blocks: cloud.blocks, pods: [{ ip: '10.244.4.2', namespace: 'default', name: 'api' }] } });
  const behind = tracePath(fromCloud, '10.244.4.2', '10.99.0.1', [...view, { name: 'z-1', blocks: ['10.99.0.0/26'] }]);
  assert.equal(behind.path, 'broken');
  assert.match(renderTrace(behind).join('\n'), /controller: the controller says node z-1 holds 10\.99\.0\.1, but this agent does not know it: its view is behind \(this agent's controller link is offline\)/);
  assert.equal(tracePath(status(), '10.244.1.2', '10.99.0.1', view).controller, 'the controller agrees: no node holds 10.99.0.1');
});

