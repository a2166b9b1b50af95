import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { decodePolicyLine } from '../src/config/policy-line.ts';
import { parseIpv4 } from '../src/core/net/ipv4.ts';
import { compilePolicies } from '../src/core/policy/compile.ts';
import { policyPods } from '../src/core/policy/local-pods.ts';
import { keyOf } from '../src/core/policy/model.ts';
import { ADDED_POD_NAMESPACE, nodePolicyView, SEED, synthesize } from './policy-cluster.ts';

const NODE = 'bench-node';
const cluster = synthesize(SEED);
const view = nodePolicyView(cluster, NODE, ['seq-0', 'seq-1']);

/** What the agent compiles from the view when `records` are its active pods (src/agent/policy.ts #syncNow). */
function planWith(records: { name: string; ip: string }[]) {
  const active = records.map((r) => ({ ip: parseIpv4(r.ip) as number, namespace: ADDED_POD_NAMESPACE, name: r.name, containerId: `c-${r.name}`, ifName: 'eth0' }));
  const { pods, local } = policyPods({ viewPods: view.pods, active, classified: new Map(), nodeName: NODE });
  return compilePolicies({ policies: view.policies, namespaces: view.namespaces, pods, local });
}

describe('nodePolicyView', () => {
  test('holds the whole cluster, the local pods and the added ones on the node, and reads back as the agent reads its kept view', () => {
    assert.equal(view.policies.length, 1000);
    assert.equal(view.namespaces.length, 100);
    assert.equal(view.pods.length, 10_110 + 2);
    assert.equal(view.pods.filter((p) => p.node === NODE).length, 110 + 2);
    assert.equal(new Set(view.pods.map(keyOf)).size, view.pods.length, 'pod keys are unique');
    const line = decodePolicyLine(JSON.stringify({ type: 'snapshot', ...view }), 'the test');
    assert.equal(line.type, 'snapshot');
  });

  test('an added pod is isolated for ingress once its record gives it an address, and compiled into nothing before', () => {
    const before = planWith([]);
    const after = planWith([{ name: 'seq-0', ip: '10.78.0.5' }]);
    assert.equal(after.pods.length, before.pods.length + 1);
    const pod = after.pods.find((p) => p.pod === `${ADDED_POD_NAMESPACE}/seq-0`);
    assert.ok(pod?.ingress, 'isolated for ingress');
    assert.ok(pod.isolatedBy.ingress.length > 1, `isolated by ${pod.isolatedBy.ingress.join(', ')}`);
    assert.equal(before.pods.some((p) => p.pod.startsWith(`${ADDED_POD_NAMESPACE}/seq-`)), false);
  });
});
