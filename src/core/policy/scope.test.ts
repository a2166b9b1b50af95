import { test } from 'node:test';
import assert from 'node:assert/strict';
import { diffPolicyView, HeldPolicyView, PolicyPeers, policyRevision, type PolicyWorld, type ViewPod } from './scope.ts';
import { keyOf, type NetworkPolicy } from './model.ts';

const pod = (ns: string, name: string, node: string, ip: string, labels: Record<string, string> = { app: name }, ports: ViewPod['ports'] = []): ViewPod => ({ namespace: ns, name, node, ip, labels, ports });
const pol = (ns: string, name: string, over: Partial<NetworkPolicy> = {}): NetworkPolicy => ({ namespace: ns, name, podSelector: {}, policyTypes: ['Ingress'], ingress: [], egress: [], ...over });

function world(pods: ViewPod[], policies: NetworkPolicy[]): PolicyWorld {
  return {
    pods: new Map(pods.map((p) => [keyOf(p), p])),
    policies: new Map(policies.map((p) => [keyOf(p), p])),
    namespaces: new Map(['shop', 'db', 'other'].map((n) => [n, { name: n, labels: { team: n } }])),
  };
}

const pods = [
  pod('shop', 'web', 'edge-1', '10.1.0.2'),
  pod('shop', 'cache', 'edge-2', '10.1.1.2'),
  pod('db', 'pg', 'cloud-1', '10.2.0.2', { app: 'pg' }, [{ name: 'sql', protocol: 'TCP', port: 5432 }]),
  pod('db', 'backup', 'edge-9', '10.9.0.2', { app: 'pg' }),
  pod('other', 'x', 'edge-1', '10.1.0.3'),
  pod('other', 'y', 'cloud-1', '10.2.0.3'),
];
const policies = [
  pol('shop', 'web-to-db', { policyTypes: ['Egress'], egress: [{ peers: [{ namespaceSelector: { matchLabels: { team: 'db' } } }], ports: [] }] }),
  pol('db', 'pg-from-shop', { podSelector: { matchLabels: { app: 'pg' } }, ingress: [{ peers: [{ namespaceSelector: { matchLabels: { team: 'shop' } } }], ports: [] }] }),
  pol('other', 'named-out', { policyTypes: ['Egress'], egress: [{ peers: [{ ipBlock: { cidr: '10.2.0.0/16', except: [] } }], ports: [{ protocol: 'TCP', port: 'sql' }] }] }),
];
// edge-1 reaches the cloud and edge-2 (its community), not edge-9 (another community)
const reachableFromEdge1 = (node: string) => node === 'cloud-1' || node === 'edge-2';

test("a node gets its pods, its namespaces' policies and the reachable pods they name; nothing else", () => {
  const peers = new PolicyPeers(world(pods, policies));
  const view = peers.viewOf('edge-1', reachableFromEdge1);
  assert.deepEqual(view.policies.map(keyOf), ['other/named-out', 'shop/web-to-db']);
  // db/backup is named by web-to-db but runs where edge-1 cannot reach; shop/cache is named by nothing edge-1 holds;
  // other/y is in the ipBlock but has no port named sql
  assert.deepEqual(view.pods.map(keyOf), ['db/pg', 'other/x', 'shop/web']);
  assert.deepEqual(view.namespaces.map((n) => n.name), ['db', 'other', 'shop']);
  const cloud = peers.viewOf('cloud-1', () => true);
  assert.deepEqual(cloud.policies.map(keyOf), ['db/pg-from-shop', 'other/named-out'], 'other/y runs there');
  assert.deepEqual(cloud.pods.map(keyOf), ['db/pg', 'other/y', 'shop/cache', 'shop/web']);
  assert.deepEqual(peers.viewOf('edge-7', () => true).pods, [], 'a node without pods gets no pod and no policy');
});

test('the diff carries only what changed, and a held view that applies it equals the new view', () => {
  const before = new PolicyPeers(world(pods, policies)).viewOf('edge-1', reachableFromEdge1);
  const moved = pods.map((p) => (keyOf(p) === 'db/pg' ? { ...p, labels: { app: 'pg', tier: 'gold' } } : p));
  const after = new PolicyPeers(world([...moved, pod('db', 'pg2', 'cloud-1', '10.2.0.9')], policies.filter((p) => keyOf(p) !== 'other/named-out'))).viewOf('edge-1', reachableFromEdge1);
  const lines = diffPolicyView(before, after);
  assert.deepEqual(lines.map((l) => JSON.stringify(l).slice(0, 40)), [
    '{"type":"delete","policy":"other/named-o',
    '{"type":"put","pod":{"namespace":"db","n',
    '{"type":"put","pod":{"namespace":"db","n',
  ]);
  const held = new HeldPolicyView(before);
  for (const l of lines) held.apply(l);
  assert.deepEqual(held.view(), after);
  assert.deepEqual(diffPolicyView(after, after), [], 'nothing changed, nothing sent');
  held.apply({ type: 'snapshot', policies: [], namespaces: [], pods: [] });
  assert.deepEqual(held.view(), { policies: [], namespaces: [], pods: [] });
});

test('a policy revision is the policies\' content: the same however they are ordered or built, another when one changes', () => {
  const p = (name: string, over: Partial<NetworkPolicy> = {}): NetworkPolicy => ({ namespace: 'x', name, podSelector: { matchLabels: { app: 'web' } }, policyTypes: ['Ingress'], ingress: [], egress: [], ...over });
  const rev = policyRevision([p('a'), p('b')]);
  assert.match(rev, /^[0-9a-f]{12}$/);
  assert.equal(policyRevision([p('b'), p('a')]), rev, 'order');
  // the same policy, its keys in another order (as a decoder or another producer may build it)
  const reordered = JSON.parse(JSON.stringify({ egress: [], ingress: [], policyTypes: ['Ingress'], podSelector: { matchLabels: { app: 'web' } }, name: 'b', namespace: 'x' })) as NetworkPolicy;
  assert.equal(policyRevision([p('a'), reordered]), rev, 'key order');
  assert.notEqual(policyRevision([p('a'), p('b', { podSelector: { matchLabels: { app: 'api' } } })]), rev);
  assert.notEqual(policyRevision([p('a')]), rev);
  // a held view's policies after a snapshot and a put give the revision of the same policies sent whole
  const held = new HeldPolicyView({ policies: [p('a')], namespaces: [], pods: [] });
  held.apply({ type: 'put', policy: p('b') });
  assert.equal(policyRevision(held.view().policies), rev);
});
