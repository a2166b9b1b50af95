import { test } from 'node:test';
import assert from 'node:assert/strict';
import { decide, compilePolicies } from '../../core/policy/compile.ts';
import { policyFromKube } from '../../core/kube/policy-objects.ts';
import { parseIpv4 } from '../../core/net/ipv4.ts';
import type { PolicyPod } from '../../core/policy/model.ts';
import { LAB_ROLE_LABEL, LAB_SITE_LABEL, labPolicyDenies, labPolicyLabels, labPolicyObjects, labPolicySites, labPodIsolated } from './policy.ts';
import { DEFAULT_LAB_SPEC } from './spec.ts';

const NS = 'lab';
// three pods per node on one node of the cloud and of edge sites a and b (the default lab's sites), and a workload
// pod without lab labels
const pods: PolicyPod[] = [
  ...['cloud', 'a', 'b'].flatMap((site, s) => [1, 2, 3].map((i) => ({ namespace: NS, name: `${site}-p${i}`, ip: `10.100.${s}.${i}`, labels: labPolicyLabels(site, i), ports: [] }))),
  { namespace: NS, name: 'lab-web-x', ip: '10.100.9.9', labels: { 'app.kubernetes.io/name': 'lab-web' }, ports: [] },
];
const sites = labPolicySites(DEFAULT_LAB_SPEC);

test('lab pods: the first of a node is web, the others db, each with its site; the policies guard every site\'s db pods but the last edge site\'s', () => {
  assert.deepEqual(labPolicyLabels('cloud', 1), { [LAB_SITE_LABEL]: 'cloud', [LAB_ROLE_LABEL]: 'web' });
  assert.deepEqual(labPolicyLabels('a', 3), { [LAB_SITE_LABEL]: 'a', [LAB_ROLE_LABEL]: 'db' });
  assert.deepEqual(sites, { guarded: ['cloud', 'a'], egressSite: 'a' });
  assert.deepEqual(labPolicySites({ edges: DEFAULT_LAB_SPEC.edges.slice(0, 1) }), { guarded: ['cloud'], egressSite: 'a' }, 'one edge site: it holds the Service\'s endpoints, unguarded');
  assert.equal(labPolicySites({ edges: [] }), undefined);
});

test('the lab\'s truth table is what Atoll\'s compiler makes of the same policies, cell by cell, for TCP, UDP and SCTP', () => {
  assert.ok(sites);
  const policies = labPolicyObjects(NS, sites).map((o) => {
    const converted = policyFromKube(o);
    assert.ok(converted && converted.problems.length === 0, 'the lab\'s policies convert without problems');
    return converted.policy;
  });
  // every pod local: the plan holds every pod's chains, so decide() judges both ends of each pair
  const plan = compilePolicies({ policies, namespaces: [{ name: NS, labels: { 'kubernetes.io/metadata.name': NS } }], pods, local: new Set(pods.map((p) => `${NS}/${p.name}`)) });
  assert.deepEqual(plan.pods.map((p) => p.pod).sort(), pods.filter((p) => labPodIsolated(p.labels, sites)).map((p) => `${NS}/${p.name}`).sort(), 'labPodIsolated names the pods the compiler isolates');
  const denied = new Map<string, number>();
  for (const from of pods) {
    for (const to of pods) {
      if (from === to) continue;
      const expected = labPolicyDenies(from.labels, to.labels, sites);
      for (const [protocol, port] of [['tcp', 7000], ['udp', 53], ['sctp', 9]] as const) {
        const d = decide(plan, { src: parseIpv4(from.ip) as number, dst: parseIpv4(to.ip) as number, protocol, port });
        assert.equal(d.allowed, expected === undefined, `${from.name} -> ${to.name} ${protocol}: the lab expects ${expected ?? 'allowed'}, the compiler says ${d.deniedAt ?? 'allowed'}`);
      }
      if (expected) denied.set(expected, (denied.get(expected) ?? 0) + 1);
    }
  }
  // into each of the 4 guarded db pods (cloud-p2, cloud-p3, a-p2, a-p3) from the 6 other sources that are no web
  // pods (4 x 6); from a's web pod to the 3 cloud pods
  assert.deepEqual(Object.fromEntries(denied), { 'db-from-web': 24, 'edge-web-egress': 3 }, 'both policies deny pairs (not a vacuous pass)');
  assert.equal(labPolicyDenies(labPolicyLabels('b', 2), labPolicyLabels('a', 2), sites), 'db-from-web', 'between edge sites');
  assert.equal(labPolicyDenies(labPolicyLabels('cloud', 3), labPolicyLabels('cloud', 2), sites), 'db-from-web', 'on one node');
  assert.equal(labPolicyDenies(labPolicyLabels('a', 2), labPolicyLabels('b', 2), sites), undefined, 'the last edge site\'s db pods are unguarded');
  assert.equal(labPolicyDenies({}, labPolicyLabels('cloud', 2), sites), 'db-from-web', 'a pod without lab labels is no web pod');
});
