import { test } from 'node:test';
import assert from 'node:assert/strict';
import { policyPods, sandboxPodOf, type SandboxPod, unknownLocalPods } from './local-pods.ts';
import { compilePolicies, decide } from './compile.ts';
import { keyOf, type NetworkPolicy } from './model.ts';
import type { ViewPod } from './scope.ts';
import type { IpamRecord } from '../ipam/sticky-pool.ts';
import { parseIpv4 } from '../net/ipv4.ts';

const NODE = 'edge-1';
const vpod = (ns: string, name: string, node: string, ip: string, labels: Record<string, string>): ViewPod => ({ namespace: ns, name, node, ip, labels, ports: [] });
const rec = (ns: string, name: string, ip: string, containerId = `sb-${name}`): IpamRecord => ({ namespace: ns, name, ip: parseIpv4(ip) as number, containerId, ifName: 'eth0' });
const sandbox = (ns: string, name: string, labels: Record<string, string>): SandboxPod => ({ namespace: ns, name, uid: `uid-${name}`, labels });

test("a sandbox's pod is its metadata and the pod's labels, without the three the kubelet adds", () => {
  const labels = { role: 'db', 'io.kubernetes.pod.name': 'db-0', 'io.kubernetes.pod.namespace': 'x', 'io.kubernetes.pod.uid': 'u1', 'io.kubernetes.other': 'kept' };
  assert.deepEqual(sandboxPodOf({ namespace: 'x', name: 'db-0', uid: 'u1' }, labels), { namespace: 'x', name: 'db-0', uid: 'u1', labels: { role: 'db', 'io.kubernetes.other': 'kept' } });
});

test('only records the view holds no pod of this node for are asked about; pods without a Kubernetes identity never', () => {
  const view = [vpod('x', 'known', NODE, '10.1.0.2', {}), vpod('x', 'moved', 'edge-2', '10.1.1.9', {}), vpod('x', 'remote', 'edge-2', '10.1.1.2', {})];
  const active = [rec('x', 'known', '10.1.0.2'), rec('x', 'moved', '10.1.0.3'), rec('x', 'new', '10.1.0.4'), rec('', 'sb-raw', '10.1.0.5')];
  assert.deepEqual(unknownLocalPods(view, active, NODE).map(keyOf), ['x/moved', 'x/new']);
});

const cases: { name: string; view: ViewPod[]; active: IpamRecord[]; classified: [string, SandboxPod][]; pods: string[]; local: string[] }[] = [
  {
    name: 'a view pod of this node takes the address of its record (sticky, known while offline)',
    view: [vpod('x', 'a', NODE, '10.1.0.9', { role: 'db' })],
    active: [rec('x', 'a', '10.1.0.2')],
    classified: [],
    pods: ['x/a 10.1.0.2 role=db'],
    local: ['x/a'],
  },
  {
    name: 'a pod the view does not know is classified from its sandbox',
    view: [vpod('x', 'web', 'edge-2', '10.1.1.2', { role: 'web' })],
    active: [rec('x', 'db', '10.1.0.3')],
    classified: [['sb-db', sandbox('x', 'db', { role: 'db' })]],
    pods: ['x/web 10.1.1.2 role=web', 'x/db 10.1.0.3 role=db'],
    local: ['x/db'],
  },
  {
    name: 'one not classified (yet, or never) is left out, as without the CRI',
    view: [],
    active: [rec('x', 'db', '10.1.0.3')],
    classified: [],
    pods: [],
    local: [],
  },
  {
    name: "a sandbox under another namespace/name than the record's is not taken",
    view: [],
    active: [rec('x', 'db', '10.1.0.3')],
    classified: [['sb-db', sandbox('x', 'other', { role: 'db' })]],
    pods: [],
    local: [],
  },
  {
    name: 'a pod the view places on another node, running here, is the local one (its sandbox labels, its address)',
    view: [vpod('x', 'db-0', 'edge-2', '10.1.1.7', { role: 'old' })],
    active: [rec('x', 'db-0', '10.1.0.4')],
    classified: [['sb-db-0', sandbox('x', 'db-0', { role: 'db' })]],
    pods: ['x/db-0 10.1.0.4 role=db'],
    local: ['x/db-0'],
  },
  {
    name: 'a classification of a pod the view knows on this node is not used: the view is last known truth',
    view: [vpod('x', 'a', NODE, '10.1.0.2', { role: 'db' })],
    active: [rec('x', 'a', '10.1.0.2')],
    classified: [['sb-a', sandbox('x', 'a', { role: 'web' })]],
    pods: ['x/a 10.1.0.2 role=db'],
    local: ['x/a'],
  },
];

for (const c of cases) {
  test(`merge: ${c.name}`, () => {
    const out = policyPods({ viewPods: c.view, active: c.active, classified: new Map(c.classified), nodeName: NODE });
    assert.deepEqual(out.pods.map((p) => `${keyOf(p)} ${p.ip} ${Object.entries(p.labels).map(([k, v]) => `${k}=${v}`).join(',')}`), c.pods);
    assert.deepEqual([...out.local].sort(), c.local);
  });
}

test('a pod classified from its sandbox is isolated by the policy that selects its labels, and named as a peer', () => {
  const policy: NetworkPolicy = { namespace: 'x', name: 'db-from-web', podSelector: { matchLabels: { role: 'db' } }, policyTypes: ['Ingress'], ingress: [{ peers: [{ podSelector: { matchLabels: { role: 'web' } } }], ports: [] }], egress: [] };
  const active = [rec('x', 'db', '10.1.0.3'), rec('x', 'web', '10.1.0.4'), rec('x', 'other', '10.1.0.5')];
  const classified = new Map([['sb-db', sandbox('x', 'db', { role: 'db' })], ['sb-web', sandbox('x', 'web', { role: 'web' })], ['sb-other', sandbox('x', 'other', { role: 'other' })]]);
  const compile = (known: ReadonlyMap<string, SandboxPod>) => {
    const { pods, local } = policyPods({ viewPods: [], active, classified: known, nodeName: NODE });
    return compilePolicies({ policies: [policy], namespaces: [{ name: 'x', labels: {} }], pods, local });
  };
  const plan = compile(classified);
  const tcp = (src: string) => decide(plan, { src: parseIpv4(src) as number, dst: parseIpv4('10.1.0.3') as number, protocol: 'tcp', port: 80 }).allowed;
  assert.deepEqual([tcp('10.1.0.4'), tcp('10.1.0.5')], [true, false]);
  assert.equal(compile(new Map()).pods.length, 0, 'without the classification nothing is isolated');
});
