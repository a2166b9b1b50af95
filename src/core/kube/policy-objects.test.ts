import { test } from 'node:test';
import assert from 'node:assert/strict';
import { keepNamespace, keepPod, namespaceFromKube, podFromKube, policyFromKube } from './policy-objects.ts';

// the API reference's example policy ("NetworkPolicy", Kubernetes concepts), as the API server returns it
const example = {
  apiVersion: 'networking.k8s.io/v1',
  kind: 'NetworkPolicy',
  metadata: { name: 'test-network-policy', namespace: 'default' },
  spec: {
    podSelector: { matchLabels: { role: 'db' } },
    policyTypes: ['Ingress', 'Egress'],
    ingress: [{
      from: [
        { ipBlock: { cidr: '172.17.0.0/16', except: ['172.17.1.0/24'] } },
        { namespaceSelector: { matchLabels: { project: 'myproject' } } },
        { podSelector: { matchLabels: { role: 'frontend' } } },
      ],
      ports: [{ protocol: 'TCP', port: 6379 }],
    }],
    egress: [{ to: [{ ipBlock: { cidr: '10.0.0.0/24' } }], ports: [{ protocol: 'TCP', port: 5978 }] }],
  },
};

test('the API reference example converts rule for rule', () => {
  const out = policyFromKube(example);
  assert.deepEqual(out?.problems, []);
  assert.deepEqual(out?.policy, {
    namespace: 'default',
    name: 'test-network-policy',
    podSelector: { matchLabels: { role: 'db' } },
    policyTypes: ['Ingress', 'Egress'],
    ingress: [{
      peers: [{ ipBlock: { cidr: '172.17.0.0/16', except: ['172.17.1.0/24'] } }, { namespaceSelector: { matchLabels: { project: 'myproject' } } }, { podSelector: { matchLabels: { role: 'frontend' } } }],
      ports: [{ protocol: 'TCP', port: 6379 }],
    }],
    egress: [{ peers: [{ ipBlock: { cidr: '10.0.0.0/24', except: [] } }], ports: [{ protocol: 'TCP', port: 5978 }] }],
  });
});

test('policyTypes default as the API documents; protocol defaults to TCP; named ports and endPort', () => {
  const ingressOnly = policyFromKube({ metadata: { name: 'p', namespace: 'x' }, spec: { podSelector: {}, ingress: [{ ports: [{ port: 'http' }] }] } });
  assert.deepEqual(ingressOnly?.policy.policyTypes, ['Ingress']);
  assert.deepEqual(ingressOnly?.policy.ingress, [{ peers: [], ports: [{ protocol: 'TCP', port: 'http' }] }]);
  const withEgress = policyFromKube({ metadata: { name: 'p', namespace: 'x' }, spec: { podSelector: {}, egress: [{ ports: [{ protocol: 'UDP', port: 53, endPort: 54 }] }] } });
  assert.deepEqual(withEgress?.policy.policyTypes, ['Ingress', 'Egress']);
  assert.deepEqual(withEgress?.policy.egress, [{ peers: [], ports: [{ protocol: 'UDP', port: 53, endPort: 54 }] }]);
  // deny all: an empty podSelector and no rules
  assert.deepEqual(policyFromKube({ metadata: { name: 'deny', namespace: 'x' }, spec: { podSelector: {} } })?.policy, { namespace: 'x', name: 'deny', podSelector: {}, policyTypes: ['Ingress'], ingress: [], egress: [] });
});

test('a part that cannot be read closes: the peer or port goes, a rule left empty goes, each reported with a code', () => {
  const out = policyFromKube({
    metadata: { name: 'odd', namespace: 'x' },
    spec: {
      podSelector: { matchExpressions: [{ key: 'a', operator: 'Near' }] },
      ingress: [
        { from: [{ podSelector: { matchLabels: { a: 1 } } }] },
        { from: [{}, { podSelector: { matchLabels: { a: 'b' } } }], ports: [{ protocol: 'ICMP', port: 1 }, { port: 80 }] },
        { ports: [{ protocol: 'TCP', port: 70000 }] },
      ],
    },
  });
  assert.deepEqual(out?.policy.podSelector, {}, 'an unreadable policy selector selects every pod of the namespace');
  assert.deepEqual(out?.policy.ingress, [{ peers: [{ podSelector: { matchLabels: { a: 'b' } } }], ports: [{ protocol: 'TCP', port: 80 }] }]);
  assert.deepEqual(out?.problems.map((p) => [p.code, p.detail?.part]), [
    ['POLICY_UNSUPPORTED', 'spec.podSelector'],
    ['POLICY_UNSUPPORTED', 'spec.ingress[0].from[0]'],
    ['POLICY_UNSUPPORTED', 'spec.ingress[1].from[0]'],
    ['POLICY_UNSUPPORTED', 'spec.ingress[1].ports[0]'],
    ['POLICY_UNSUPPORTED', 'spec.ingress[2].ports[0]'],
  ]);
  assert.match(out?.problems[3]?.message ?? '', /NetworkPolicy x\/odd: spec.ingress\[1\].ports\[0\] has protocol "ICMP", not TCP, UDP or SCTP; that port matches nothing/);
});

test('pods: only those holding a cluster address, with their named container ports', () => {
  const pod = (over: Record<string, unknown>, status: Record<string, unknown> = { podIP: '10.1.0.5', phase: 'Running' }) => ({ metadata: { namespace: 'x', name: 'a', labels: { app: 'web' } }, spec: { nodeName: 'n1', containers: [{ ports: [{ name: 'http', containerPort: 8080 }, { containerPort: 9 }, { name: 'dns', containerPort: 53, protocol: 'UDP' }] }], ...over }, status });
  assert.deepEqual(podFromKube(pod({})), { node: 'n1', pod: { namespace: 'x', name: 'a', ip: '10.1.0.5', labels: { app: 'web' }, ports: [{ name: 'http', protocol: 'TCP', port: 8080 }, { name: 'dns', protocol: 'UDP', port: 53 }] } });
  assert.equal(podFromKube(pod({ hostNetwork: true })), undefined);
  assert.equal(podFromKube(pod({}, { phase: 'Pending' })), undefined, 'no address yet');
  assert.equal(podFromKube(pod({}, { podIP: '10.1.0.5', phase: 'Succeeded' })), undefined, 'finished: its address may be handed out again');
  assert.deepEqual(namespaceFromKube({ metadata: { name: 'x', labels: { 'kubernetes.io/metadata.name': 'x' } } }), { name: 'x', labels: { 'kubernetes.io/metadata.name': 'x' } });
});

test('what the controller keeps of a Pod and a Namespace reads the same as the whole object', () => {
  const full = {
    metadata: { namespace: 'x', name: 'a', labels: { app: 'web' }, resourceVersion: '7', annotations: { big: 'x'.repeat(1000) }, managedFields: [{}] },
    spec: { nodeName: 'n1', containers: [{ name: 'c', image: 'i', env: [{ name: 'A', value: 'b' }], ports: [{ name: 'http', containerPort: 8080 }] }], volumes: [{}] },
    status: { podIP: '10.1.0.5', phase: 'Running', conditions: [{}] },
  };
  const kept = keepPod(full);
  assert.deepEqual(podFromKube(kept), podFromKube(full));
  assert.ok(JSON.stringify(kept).length < 300, JSON.stringify(kept));
  assert.equal(kept.metadata.resourceVersion, '7', 'the watch resumes from it');
  assert.deepEqual(podFromKube(keepPod({ ...full, spec: { ...full.spec, hostNetwork: true } })), undefined);
  const ns = { metadata: { name: 'x', labels: { team: 'a' }, resourceVersion: '3', annotations: { a: 'b' } } };
  assert.deepEqual(namespaceFromKube(keepNamespace(ns)), namespaceFromKube(ns));
});
