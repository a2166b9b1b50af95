import assert from 'node:assert/strict';
import { test } from 'node:test';
import { agentRestarts, ATOLL_POD_WATCH_TEMPLATE, kubernetesLine, labChartValues, labWorkloadObjects, labNodeLabels, labPodObject, labServiceBackends, labServiceObject, parseAtollPodLine } from './kubernetes.ts';
import type { LabNode } from './plan.ts';

test('cloud nodes carry their site; edge nodes their site, community and the edge role', () => {
  assert.deepEqual(labNodeLabels({ site: 'cloud', community: '' }), { 'atoll.dev/site': 'cloud' });
  assert.deepEqual(labNodeLabels({ site: 'a', community: 'edge' }), { 'atoll.dev/site': 'a', 'atoll.dev/community': 'edge', 'openyurt.io/is-edge-worker': 'true' });
});

test('a lab pod is bound to its node, carries its labels and never pulls its image', () => {
  const pod = labPodObject({ name: 'a-1-p1', node: 'a-1', labels: { 'atoll.dev/lab-role': 'web' } }, 'localhost/atoll-pause:test') as { metadata: { namespace: string; labels: Record<string, string> }; spec: { nodeName: string; containers: { imagePullPolicy: string }[] } };
  assert.deepEqual(pod.metadata.labels, { 'app.kubernetes.io/part-of': 'atoll-lab', 'atoll.dev/lab-role': 'web' });
  assert.equal(pod.spec.nodeName, 'a-1');
  assert.equal(pod.metadata.namespace, 'lab');
  assert.equal(pod.spec.containers[0]?.imagePullPolicy, 'Never');
});

test('the Service\'s backends are the pods of the last site with pods', () => {
  const nodes = [{ name: 'cloud-1', site: 'cloud' }, { name: 'a-1', site: 'a' }, { name: 'a-2', site: 'a' }];
  const pods = [{ name: 'cloud-1-p1', node: 'cloud-1' }, { name: 'a-1-p1', node: 'a-1' }, { name: 'a-2-p1', node: 'a-2' }];
  assert.deepEqual(labServiceBackends(pods, nodes).map((p) => p.name), ['a-1-p1', 'a-2-p1']);
  assert.deepEqual(labServiceBackends(pods.slice(0, 1), nodes).map((p) => p.name), ['cloud-1-p1']);
});

test('the Service selects the backends\' label on the probe\'s port', () => {
  const svc = labServiceObject(7777) as { spec: { selector: Record<string, string>; ports: { port: number }[] } };
  assert.deepEqual(svc.spec.selector, { 'atoll.dev/lab-service': 'lab-echo' });
  assert.equal(svc.spec.ports[0]?.port, 7777);
});

test('the Kubernetes view in one line: Nodes Ready, Pods Running, the Service\'s endpoints and answers', () => {
  const view = { server: 'https://192.0.2.2:6443', nodes: [{ ready: true, kubeletVersion: 'v1.34.4' }, { ready: false }], pods: [{ phase: 'Running' }, { phase: 'Pending' }] };
  assert.equal(kubernetesLine(view), 'Kubernetes v1.34.4 at 192.0.2.2:6443: 1/2 Nodes Ready, 1/2 Pods Running');
  assert.equal(kubernetesLine(view, { clusterIp: '10.96.0.9', port: 7777, probes: [{ ok: true }, { ok: false }] }),
    'Kubernetes v1.34.4 at 192.0.2.2:6443: 1/2 Nodes Ready, 1/2 Pods Running, Service 10.96.0.9:7777 answered 1/2');
  assert.match(kubernetesLine(view, { clusterIp: '10.96.0.9', port: 7777, backends: ['b-1-p1', 'b-2-p1'], probes: [{ ok: true }] }),
    /, Service 10\.96\.0\.9:7777 \(endpoints b-1-p1, b-2-p1\) answered 1\/1$/);
});

test('the chart\'s values for the lab: its pod range, the controller on every cloud node\'s address, the relay on the first, the operations ports its faults probe', () => {
  const nodes = [
    { name: 'cloud-1', site: 'cloud', community: '', underlay: '192.0.2.11' }, { name: 'cloud-2', site: 'cloud', community: '', underlay: '192.0.2.12' },
    { name: 'a-1', site: 'a', community: 'edge', underlay: '10.0.1.11' }, { name: 'b-1', site: 'b', community: 'edge', underlay: '10.0.2.11' },
  ] as unknown as LabNode[];
  assert.deepEqual(labChartValues({ nodes, spec: {} }, '0.1.0'), {
    image: { tag: '0.1.0' }, clusterCidrs: ['10.100.0.0/16'], blockBits: 26, community: 'edge',
    controller: { replicas: 2, urls: ['https://192.0.2.11:7443', 'https://192.0.2.12:7443'], nodeDeleteGraceSeconds: 10 },
    relay: { address: '192.0.2.11:8476', nodeSelector: { 'kubernetes.io/hostname': 'cloud-1' } },
    metrics: { agentPort: 9470, controllerPort: 9471, relayPort: 9472 },
  });
  const mixed = nodes.map((n) => (n.name === 'b-1' ? { ...n, community: 'other' } : n));
  assert.equal(labChartValues({ nodes: mixed, spec: {} }, '0.1.0').community, '', 'sites of different communities: the Node labels say it');
  assert.deepEqual(labChartValues({ nodes, spec: { tunnelUdp: false } }, '0.1.0').agent, { udp: false }, '--no-udp: the chart\'s agents on streams only');
  assert.deepEqual(labChartValues({ nodes, spec: {} }, '0.1.0', { networkPolicy: true }).networkPolicy, { enabled: true }, '--policy: the chart\'s agents enforce NetworkPolicy');
  assert.throws(() => labChartValues({ nodes: nodes.slice(2), spec: {} }, '0.1.0'), /no cloud node/);
});

test('the workloads: a Deployment and a StatefulSet with a replica per node, spread one pod per node, never pulling', () => {
  type Obj = { kind: string; metadata: { name: string; namespace: string }; spec: { replicas?: number; serviceName?: string; clusterIP?: string; template?: { spec: { topologySpreadConstraints: { maxSkew: number; topologyKey: string; whenUnsatisfiable: string }[]; containers: { imagePullPolicy: string }[] } } } };
  const objs = labWorkloadObjects({ nodes: 6, image: 'localhost/atoll-pause:test' }) as Obj[];
  assert.deepEqual(objs.map((o) => `${o.kind}/${o.metadata.namespace}/${o.metadata.name}`), ['Deployment/lab/lab-web', 'Service/lab/lab-db', 'StatefulSet/lab/lab-db']);
  const [dep, svc, sts] = objs as [Obj, Obj, Obj];
  assert.equal(dep.spec.replicas, 6);
  assert.equal(sts.spec.replicas, 6);
  assert.equal(sts.spec.serviceName, 'lab-db');
  assert.equal(svc.spec.clusterIP, 'None');
  for (const o of [dep, sts]) {
    assert.deepEqual(o.spec.template?.spec.topologySpreadConstraints[0], { maxSkew: 1, topologyKey: 'kubernetes.io/hostname', whenUnsatisfiable: 'DoNotSchedule', labelSelector: { matchLabels: { 'app.kubernetes.io/name': o.metadata.name } } });
    assert.equal(o.spec.template?.spec.containers[0]?.imagePullPolicy, 'Never');
  }
});

test('agent restarts in a roll: from the old pod\'s deletion to its successor ready, per node', () => {
  const line = (at: number, pod: string, node: string, deleting: boolean, ready: string) => parseAtollPodLine(`${pod}|${node}|${deleting ? '2026-11-24T06:00:00Z' : ''}|${ready}`, at);
  const seen = [
    line(0, 'agent-x', 'a-1', false, 'True'), line(0, 'agent-y', 'a-2', false, 'True'), // the list the watch starts with
    line(10, 'agent-x', 'a-1', true, 'True'), line(20, 'agent-x', 'a-1', true, 'False'), line(30, 'agent-x', 'a-1', true, 'False'), // stopping, then gone
    line(35, 'agent-x2', '', false, ''), line(40, 'agent-x2', 'a-1', false, 'False'), line(50, 'agent-x2', 'a-1', false, 'True'),
    line(60, 'agent-y', 'a-2', true, 'True'), line(70, 'agent-y2', 'a-2', false, 'False'),
  ];
  assert.ok(seen.every((s) => s !== undefined));
  assert.deepEqual(agentRestarts(seen.filter((s) => s !== undefined)), [{ node: 'a-1', fromMs: 10, toMs: 50 }, { node: 'a-2', fromMs: 60 }], 'a-2\'s successor not seen ready yet');
  assert.equal(parseAtollPodLine('garbage', 1), undefined);
  assert.equal(parseAtollPodLine('|||', 1), undefined);
  assert.equal(parseAtollPodLine('a\tb\tc\td', 1), undefined, 'tabs: kubectl\'s watch aligns them into spaces');
  assert.match(ATOLL_POD_WATCH_TEMPLATE, /deletionTimestamp/);
});
