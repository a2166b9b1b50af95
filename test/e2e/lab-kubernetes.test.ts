/**
 * `atoll lab run --kubernetes --policy`, reduced: one cloud node and two edge sites of one NATed node each, with a real
 * control plane in the cloud and a real kubelet and kube-proxy per node (the edge kubelets through their NATs), Atoll
 * installed through its chart with NetworkPolicy on (the image imported into each node's containerd; agents,
 * controller and relay as the chart's pods, none of them a process of the lab's own), the lab's pods (two per node)
 * created through the API, the lab's NetworkPolicies applied (src/lab/plan/policy.ts: here the db pods of the cloud
 * and of site a accept only web pods, and a's web pod sends to nothing in the cloud), the matrix with the pairs they
 * deny blocked at either end over the tunnel, three faults (agent-restart: a's agent container killed, the pairs the
 * policies deny on its node pinged throughout; pod-recreate: the Pod deleted and applied again under its name;
 * policy-offline: db-from-web deleted while site a is cut off from the cloud), the ClusterIP Service (before and after
 * each), the workloads (a Deployment and a StatefulSet with a pod on each node, the matrix between their pods), and
 * nothing of the run left. Needs root, containerd, the Kubernetes binaries (make k8s) and the image (make image;
 * scripts/test.sh builds it); skips otherwise.
 *
 * The Service's endpoints are on the last edge site (b): the cloud node and pods reach them over the tunnel (the
 * node's own packets leave with its VTEP address), site a's hole-punched.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ATOLL_IMAGE_TAG, atollImageTarball } from '../../src/lab/lab-kube-install.ts';
import type { LabFaultResult } from '../../src/lab/plan/fault-results.ts';
import type { KubernetesView } from '../../src/lab/lab-kube.ts';
import type { ServiceCheck } from '../../src/lab/lab-kube-service.ts';
import type { LabPodInfo } from '../../src/lab/lab-pods.ts';
import { rootSkipReason } from '../../harness/netns.ts';
import { runAtoll } from '../support/atoll-cli.ts';

const hasContainerd = ['/usr/bin/containerd', '/usr/sbin/runc', '/bin/busybox', '/usr/lib/cni/loopback'].every((p) => existsSync(p));

interface Report {
  readonly runId: string;
  readonly prefix: string;
  readonly podCreation: string;
  readonly processes: readonly { role: string; pid: number }[];
  readonly verdict: { ok: boolean; shouldWork: number; working: number };
  readonly cells: readonly { from: string; to: string; verdict: string; deniedBy?: string }[];
  readonly timingsMs: { readonly policyInForce?: number };
  readonly faults: readonly LabFaultResult[];
  readonly kubernetes: KubernetesView;
  readonly atoll: { readonly image: string; readonly caCertHash: string };
  readonly service: ServiceCheck;
  readonly workloads: {
    readonly deployment: readonly LabPodInfo[];
    readonly statefulSet: readonly LabPodInfo[];
    readonly verdict: { ok: boolean; shouldWork: number; working: number };
  };
  readonly cleanup: { leftovers: readonly string[] };
}

const skip = rootSkipReason() || (hasContainerd ? false : 'needs containerd, runc, busybox-static and the CNI loopback plugin')
  || (existsSync(atollImageTarball(ATOLL_IMAGE_TAG)) ? false : `needs the image ${atollImageTarball(ATOLL_IMAGE_TAG)} (make image)`);

test('atoll lab run --kubernetes --policy --openyurt: nodes registered with their labels, edge kubelets behind yurthub, Atoll installed through its chart, pods through the API, NetworkPolicies in force, matrix, agent-restart, pod-recreate, policy-offline, Service, workloads; nothing left', { skip, timeout: 500_000 }, async () => {
  const tmp = mkdtempSync(join(tmpdir(), 'atoll-labk8s-'));
  const started = Date.now();
  try {
    const json = join(tmp, 'report.json');
    const { out } = await runAtoll(['lab', 'run', '--kubernetes', '--policy', '--openyurt', '--cloud-nodes', '1', '--edge-sites', '2', '--nodes-per-site', '1', '--pods-per-node', '2',
      '--faults', 'pod-recreate,agent-restart,policy-offline', '--json', json], 460_000);
    assert.ok(existsSync(json), `no report; output:\n${out}`);
    const report = JSON.parse(readFileSync(json, 'utf8')) as Report;

    assert.match(report.podCreation, /Kubernetes API/);
    const nodes = new Map(report.kubernetes.nodes.map((n) => [n.name, n]));
    assert.deepEqual([...nodes.keys()].sort(), ['a-1', 'b-1', 'cloud-1']);
    assert.ok([...nodes.values()].every((n) => n.ready && n.kubeletVersion === 'v1.34.4'), out);
    for (const site of ['a', 'b']) {
      assert.deepEqual(nodes.get(`${site}-1`)?.labels, { 'atoll.dev/site': site, 'atoll.dev/community': 'edge', 'openyurt.io/is-edge-worker': 'true', 'node-role.kubernetes.io/edge': '', 'apps.openyurt.io/nodepool': site });
    }
    assert.deepEqual(nodes.get('cloud-1')?.labels, { 'atoll.dev/site': 'cloud' });
    for (const role of ['etcd', 'kube-apiserver', 'kube-controller-manager', 'kube-scheduler', ...['a-1', 'b-1', 'cloud-1'].flatMap((n) => [`kubelet ${n}`, `kube-proxy ${n}`]), 'yurthub a-1', 'yurthub b-1']) {
      assert.ok(report.processes.some((p) => p.role === role), `${role} was recorded`);
    }

    // Atoll as users install it: the chart's pods, Ready where they belong; no agent, controller or relay of the lab's own
    const atoll = report.kubernetes.atoll;
    const on = (prefix: string) => atoll.filter((p) => p.name.startsWith(prefix) && p.ready).map((p) => p.node);
    assert.deepEqual(on('atoll-agent-cloud-'), ['cloud-1'], out);
    assert.deepEqual(on('atoll-agent-edge-').sort(), ['a-1', 'b-1'], out);
    assert.deepEqual(on('atoll-controller-'), ['cloud-1'], out);
    assert.deepEqual(on('atoll-relay-'), ['cloud-1'], out);
    assert.ok(atoll.every((p) => p.image === `atoll.dev/atoll:${ATOLL_IMAGE_TAG}`));
    assert.equal(report.atoll.image, `atoll.dev/atoll:${ATOLL_IMAGE_TAG}`);
    assert.match(report.atoll.caCertHash, /^sha256:[0-9a-f]{64}$/);
    assert.deepEqual(report.processes.filter((p) => /^(agent|controller|relay)\b/.test(p.role)), [], 'no Atoll process of the lab\'s own');

    // the policies in force on every node before the matrix; of the 30 pairs the 6 they deny are blocked (at the
    // source: a's web pod to both cloud pods; at the destination: the non-web pods to the db pods of the cloud and of a,
    // over the tunnel both ways and hole-punched from b)
    assert.ok((report.timingsMs.policyInForce ?? Infinity) < 30_000, out);
    const denied = report.cells.filter((c) => c.deniedBy).map((c) => `${c.from}>${c.to} ${c.deniedBy} ${c.verdict}`).sort();
    assert.deepEqual(denied, ['a-1-p1>cloud-1-p1 edge-web-egress blocked as expected', 'a-1-p1>cloud-1-p2 edge-web-egress blocked as expected',
      'a-1-p2>cloud-1-p2 db-from-web blocked as expected', 'b-1-p2>a-1-p2 db-from-web blocked as expected', 'b-1-p2>cloud-1-p2 db-from-web blocked as expected',
      'cloud-1-p2>a-1-p2 db-from-web blocked as expected'], out);
    assert.ok(report.verdict.ok && report.verdict.shouldWork === 24 && report.verdict.working === 24, `matrix:\n${out}`);
    assert.deepEqual(report.faults.map((f) => f.kind), ['agent-restart', 'pod-recreate', 'policy-offline'], 'the faults in their order');
    // a's agent container killed: its kubelet starts it again, and its keeper holds the datagram path meanwhile; no
    // sample loses a packet but those the agent held at the kill, and no pair the policies deny on a-1 answers
    const [restart, recreate, offline] = report.faults;
    assert.ok(restart?.ok, `agent-restart:\n${out}`);
    for (const s of restart.samples ?? []) assert.equal(s.sent - s.received, s.lostInHand ?? 0, `${s.from} -> ${s.to}:\n${out}`);
    assert.match(restart.facts?.[0] ?? '', /^agent container killed \(SIGKILL\) on a-1; running and ready again after \d+\.\d s$/);
    assert.deepEqual(restart.denied?.map((d) => `${d.from}>${d.to}`), ['cloud-1-p2>a-1-p2', 'a-1-p1>cloud-1-p1', 'a-1-p1>cloud-1-p2', 'a-1-p2>cloud-1-p2'], out);
    for (const d of restart.denied ?? []) assert.ok(d.sent >= 10 && d.received === 0, `${d.from} -> ${d.to} sent ${d.sent}, ${d.received} answered`);
    assert.ok(recreate?.ok, `pod-recreate:\n${out}`);
    // db-from-web deleted while a is cut off: b's pod into a's db pod (hole-punched, past the cut) stays blocked until
    // the heal, b's pod into the cloud's db pod opens meanwhile
    assert.ok(offline?.ok, `policy-offline:\n${out}`);
    const change = offline.policyChange;
    assert.deepEqual(change?.held.map((h) => [h.from, h.to, h.repliesBeforeHeal]), [['b-1-p2', 'a-1-p2', 0]], out);
    assert.ok(change.held.every((h) => h.openedAfterHealMs !== undefined), out);
    assert.deepEqual(change.opened.map((o) => [o.from, o.to, o.repliesBeforeChange]), [['b-1-p2', 'cloud-1-p2', 0]], out);
    assert.ok(change.opened.every((o) => (o.openedAfterChangeMs ?? Infinity) <= 5000), out);
    assert.match(offline.facts?.at(-1) ?? '', /^db-from-web applied again: the lab's policies in force on every node \d+ ms later$/);
    // the workloads' pods (3 + 3) joined the lab's 6 and the 3 nodes as the Service's clients for the faults
    for (const f of report.faults) assert.deepEqual(f.service, { answered: 15, of: 15 }, `the Service answered every pod and node after ${f.kind}`);

    assert.deepEqual(report.service.backends, ['b-1-p1', 'b-1-p2']);
    for (const from of ['cloud-1-p1', 'cloud-1-p2', 'a-1-p1', 'a-1-p2', 'b-1-p1', 'b-1-p2', 'node cloud-1', 'node a-1', 'node b-1']) {
      assert.ok(report.service.probes.find((p) => p.from === from)?.ok, `Service from ${from}:\n${out}`);
    }

    // workloads through the API: the Deployment's pods one per node, the StatefulSet's by their stable names, the matrix between them
    const w = report.workloads;
    assert.deepEqual(w.deployment.map((p) => p.node).sort(), ['a-1', 'b-1', 'cloud-1'], out);
    assert.deepEqual(w.statefulSet.map((p) => p.name), ['lab-db-0', 'lab-db-1', 'lab-db-2']);
    assert.equal(new Set(w.statefulSet.map((p) => p.node)).size, 3, 'the StatefulSet is spread over the three nodes');
    assert.ok([...w.deployment, ...w.statefulSet].every((p) => p.ip.startsWith('10.100.')), 'pod IPs from Atoll\'s range, as the API gave them');
    assert.ok(w.verdict.ok && w.verdict.shouldWork === 30 && w.verdict.working === 30, `workloads matrix:\n${out}`);

    const runDir = `/run/atoll-lab/${report.runId}`;
    assert.deepEqual(report.cleanup.leftovers, []);
    assert.deepEqual(readdirSync('/var/run/netns').filter((n) => n.startsWith(report.prefix)), []);
    for (const p of report.processes) assert.ok(!existsSync(`/proc/${p.pid}`) || !readFileSync(`/proc/${p.pid}/cmdline`, 'utf8').includes(runDir), `${p.role} (pid ${p.pid}) still runs`);
    assert.deepEqual(readFileSync('/proc/self/mountinfo', 'utf8').split('\n').filter((l) => l.includes(runDir)), []);
    assert.equal(existsSync(runDir), false);
    // the kubelet's pods have no cgroup parent: containerd put them in /k8s.io/<id>, and the run's removal took them
    const podCgroups = '/sys/fs/cgroup/memory/k8s.io';
    const left = existsSync(podCgroups) ? readdirSync(podCgroups, { withFileTypes: true }).filter((e) => e.isDirectory() && statSync(join(podCgroups, e.name)).mtimeMs >= started) : [];
    assert.deepEqual(left.map((e) => e.name), [], 'no pod cgroup of the run is left');
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
});
