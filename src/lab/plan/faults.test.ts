import { test } from 'node:test';
import assert from 'node:assert/strict';
import { LAB_FAULTS, type LabFaultKind, type LabFaultTarget, type LabFaultTargetOf, parseFaultList, peerCutRuleset, planFault, uplinkCutRuleset } from './faults.ts';
import { lostOutsideWindows, policyChangeSeen, sampleStats, windowsFor } from './fault-samples.ts';
import { judgeFault, renderFaults } from './fault-results.ts';
import { planLab } from './plan.ts';
import { DEFAULT_LAB_SPEC, type LabSpec } from './spec.ts';
import { labPolicyDenies, labPolicySites } from './policy.ts';

const plan = (spec: LabSpec) => planLab({ spec, runId: '0abc', dir: '/run/atoll-lab/0abc', bootstrapToken: 'bootstrap-token-0123456789', adminToken: 'admin-token-0123456789', relayToken: 'relay-token-0123456789' });
/** The target `planFault` gives for `kind`, narrowed to that kind; fails the test when the fault is skipped. */
function targetOf<K extends LabFaultKind>(p: ReturnType<typeof plan>, kind: K, pods?: 'cri' | 'direct' | 'kubernetes'): LabFaultTargetOf<K> {
  const t = planFault(p, kind, pods);
  if ('skipped' in t || t.kind !== kind) assert.fail(`${kind}: expected a target, got ${JSON.stringify(t)}`);
  return t as LabFaultTargetOf<K>;
}
const pair = { from: 'x', to: 'y' };

test('--faults: all, none, a list in the canonical order, unknown names named', () => {
  assert.deepEqual(parseFaultList('all').faults, LAB_FAULTS.filter((f) => !['statefulset-recreate', 'crash-offline', 'policy-offline', 'node-reboot-offline', 'agent-roll', 'node-delete'].includes(f)), 'the faults through Kubernetes only with --kubernetes');
  assert.deepEqual(parseFaultList('all', { kubernetes: true }).faults, [...LAB_FAULTS]);
  assert.match(parseFaultList('agent-roll').problems[0] ?? '', /needs --kubernetes/);
  assert.deepEqual(parseFaultList('none').faults, []);
  assert.deepEqual(parseFaultList('pod-recreate,controller-kill,pod-recreate'), { faults: ['controller-kill', 'pod-recreate'], problems: [] });
  assert.match(parseFaultList('controller-kill,relay-restart').problems[0] ?? '', /unknown fault "relay-restart"/);
});

test('fault targets: the first edge site, its first node and pod; samples only pairs that should work', () => {
  const p = plan(DEFAULT_LAB_SPEC);
  const agent = targetOf(p, 'agent-restart');
  assert.equal(agent.node, 'a-1');
  assert.deepEqual(agent.samples, [{ from: 'cloud-1-p1', to: 'a-1-p1' }, { from: 'a-1-p1', to: 'cloud-1-p1' }, { from: 'a-2-p1', to: 'a-1-p1' }, { from: 'a-1-p1', to: 'a-1-p2' }]);
  assert.deepEqual(agent.strict?.lossFree, agent.samples, 'the keeper holds the datagram path: no sample may lose a packet');
  assert.equal(targetOf(plan({ ...DEFAULT_LAB_SPEC, tunnelUdp: false }), 'agent-restart').strict, undefined, 'over the streams alone the restart costs its gap');
  const blocked = plan({ ...DEFAULT_LAB_SPEC, edges: DEFAULT_LAB_SPEC.edges.map((e, i) => (i === 0 ? { ...e, udpBlocked: true } : e)) });
  assert.equal(targetOf(blocked, 'agent-restart').strict, undefined, 'nor where UDP is blocked');
  const ctl = targetOf(p, 'controller-kill');
  assert.equal(ctl.lossless, true);
  assert.equal(targetOf(p, 'pod-recreate').pod, 'a-1-p1');
  const relay = targetOf(p, 'relay-kill');
  assert.deepEqual(relay.flows, [{ from: 'a-1-p1', to: 'b-1-p1' }], 'a hole-punched pair keeps a TCP flow through the relay kill');
  const mixed = targetOf(plan({ ...DEFAULT_LAB_SPEC, edges: [...DEFAULT_LAB_SPEC.edges, { name: 'c', nodes: 1, community: 'edge', nat: 'symmetric', uplink: {} }] }), 'relay-kill');
  assert.deepEqual(mixed.flows, [{ from: 'a-1-p1', to: 'b-1-p1' }, { from: 'a-1-p1', to: 'c-1-p1' }], 'and a relayed pair');
  const cut = targetOf(p, 'direct-path-cut');
  assert.deepEqual([cut.site, cut.peerAddress, cut.flows], ['a', '198.51.100.12', [{ from: 'a-1-p1', to: 'b-1-p1' }]]);
  assert.match(peerCutRuleset('198.51.100.12'), /ip saddr 198\.51\.100\.12 drop\n {4}ip daddr 198\.51\.100\.12 drop/);
  const offline = targetOf(plan({ ...DEFAULT_LAB_SPEC, edges: [...DEFAULT_LAB_SPEC.edges, { name: 'c', nodes: 1, community: 'edge', nat: 'symmetric', uplink: {} }] }), 'offline-restart');
  assert.equal(offline.node, 'a-1');
  assert.deepEqual(offline.samples.map((s) => s.to), ['cloud-1-p1', 'b-1-p1', 'c-1-p1', 'a-2-p1'], 'a tunnel pair of every kind, and its site');
  assert.deepEqual(planFault(plan({ ...DEFAULT_LAB_SPEC, edges: DEFAULT_LAB_SPEC.edges.slice(0, 1) }), 'relay-kill'), { kind: 'relay-kill', skipped: 'no edge <-> edge pair: nothing uses the relay' });
  assert.match(targetOf(p, 'pod-recreate').description, /\(CNI DEL\).*\(CNI ADD\)/);
  assert.match(targetOf(p, 'pod-recreate', 'cri').description, /StopPodSandbox, RemovePodSandbox\).*\(RunPodSandbox/);
  assert.equal(targetOf(p, 'uplink-cut').site, 'a');
  const cloudOnly = plan({ ...DEFAULT_LAB_SPEC, edges: [] });
  assert.deepEqual(planFault(cloudOnly, 'uplink-flap'), { kind: 'uplink-flap', skipped: 'no edge site' });
  assert.equal(targetOf(cloudOnly, 'agent-restart').node, 'cloud-2');
});

test('uplink cut ruleset: its own table, drops forwarding in and out of the uplink', () => {
  assert.equal(uplinkCutRuleset('up0'), [
    'table ip atoll-lab-fault', 'delete table ip atoll-lab-fault', 'table ip atoll-lab-fault {', '  comment "atoll lab: uplink cut (fault)"', '  chain forward {',
    '    type filter hook forward priority filter - 10; policy accept;', '    iifname "up0" drop', '    oifname "up0" drop', '  }', '}', ''].join('\n'));
});

test('sample stats: loss, late replies, longest gap, convergence from the heal', () => {
  const r = (seq: number, atMs: number, rttMs = 1) => ({ seq, atMs, rttMs });
  assert.deepEqual(sampleStats(pair, [r(1, 100), r(2, 200), r(3, 300)], 4, 0), { ...pair, sent: 3, received: 3, lossPct: 0, late: 0, maxGapMs: 100, convergenceMs: 0 });
  // 3 and 4 lost, healed at 450, 5 answered at 520
  assert.deepEqual(sampleStats(pair, [r(1, 100), r(2, 200), r(5, 520), r(6, 600)], 6, 450), { ...pair, sent: 6, received: 4, lossPct: 33.3, late: 0, maxGapMs: 320, convergenceMs: 70 });
  // queued through a cut: nothing lost, but 2 and 3 came back late
  assert.deepEqual(sampleStats(pair, [r(1, 100), r(2, 3100, 2900), r(3, 3100, 2800), r(4, 3150)], 4, 3000), { ...pair, sent: 4, received: 4, lossPct: 0, late: 2, maxGapMs: 3000, convergenceMs: 150 });
  // never answered again
  assert.equal(sampleStats(pair, [r(1, 100)], 30, 450).convergenceMs, undefined);
});

test('judging a fault: ok when the matrix after works and every sample recovered; the table', () => {
  const target: LabFaultTarget = { kind: 'controller-kill', description: 'd', samples: [pair], flows: [], lossless: true };
  const m = { ok: true, shouldWork: 6, working: 6 };
  const stats = sampleStats(pair, [{ seq: 1, atMs: 0 }, { seq: 2, atMs: 100 }], 2, 0);
  const ok = judgeFault(target, { before: m, after: m, samples: [stats], heldMs: 2000, durationMs: 3000, notes: [] });
  assert.equal(ok.ok, true);
  assert.equal(ok.convergenceMs, 0);
  const bad = judgeFault(target, { before: m, after: { ok: false, shouldWork: 6, working: 4 }, samples: [sampleStats(pair, [{ seq: 1, atMs: 0 }], 20, 0)], heldMs: 2000, durationMs: 3000, notes: [] });
  assert.equal(bad.ok, false);
  assert.equal(bad.convergenceMs, undefined);
  assert.match((bad.notes ?? []).join('; '), /no reply again from x -> y; 2 of 6 cells that should work fail after the fault; 94.7% loss/);
  const broken = judgeFault(target, { before: m, after: m, samples: [stats], heldMs: 2000, durationMs: 3000, notes: [],
    flows: [{ ...pair, survived: true, sentBytes: 400, echoedBytes: 400, maxGapMs: 120 }, { from: 'y', to: 'x', survived: false, sentBytes: 200, echoedBytes: 100, maxGapMs: 3000, error: 'ECONNRESET' }] });
  assert.equal(broken.ok, false);
  assert.deepEqual(broken.notes, ['the TCP flow y -> x broke (ECONNRESET)']);
  const table = renderFaults([ok, bad, { kind: 'uplink-cut', description: 'u', skipped: 'no edge site', ok: true }]);
  assert.equal(table[0], 'fault            result   before  after     held  convergence   loss  longest gap  pod start  notes');
  assert.match(table[1] ?? '', /^controller-kill  ok          6\/6    6\/6  2000 ms         0 ms     0%       100 ms          -$/);
  assert.match(table[3] ?? '', /^uplink-cut\s+skipped .* no edge site$/);
});

test('judging a fault: its own matrix before is reported as measured, and a broken one is named', () => {
  const target: LabFaultTarget = { kind: 'agent-restart', node: 'a-1', description: 'd', samples: [pair], flows: [], lossless: false };
  const stats = sampleStats(pair, [{ seq: 1, atMs: 0 }, { seq: 2, atMs: 100 }], 2, 0);
  const before = { ok: false, shouldWork: 100, working: 97 };
  const after = { ok: true, shouldWork: 100, working: 100 };
  const r = judgeFault(target, { before, after, matrixMs: { before: 2100, after: 2300 }, samples: [stats], heldMs: 500, durationMs: 9000, notes: [] });
  assert.deepEqual([r.before, r.after, r.matrixMs], [before, after, { before: 2100, after: 2300 }]);
  assert.equal(r.ok, false);
  assert.deepEqual(r.notes, ['3 of 100 cells that should work failed already before the fault']);
  assert.match(renderFaults([r])[1] ?? '', /^agent-restart\s+FAIL\s+97\/100\s+100\/100 /);
});

test('with --kubernetes, pod-recreate goes through the API and node-reboot is skipped (a cut-off kubelet cannot confirm a deletion)', () => {
  const p = plan(DEFAULT_LAB_SPEC);
  const recreate = planFault(p, 'pod-recreate', 'kubernetes');
  assert.ok(!('skipped' in recreate) && recreate.description.includes('through the API'));
  const reboot = planFault(p, 'node-reboot', 'kubernetes');
  assert.ok('skipped' in reboot && reboot.skipped.includes('kubelet'));
});

test('with --kubernetes, the faults that kill the controller, the relay or an agent kill the chart\'s container, which its kubelet starts again', () => {
  const p = plan(DEFAULT_LAB_SPEC);
  for (const kind of ['controller-kill', 'relay-kill', 'agent-restart', 'offline-restart'] as const) {
    const k8s = planFault(p, kind, 'kubernetes');
    const own = planFault(p, kind, 'cri');
    assert.ok(!('skipped' in k8s) && !('skipped' in own), kind);
    assert.match(k8s.description, /container/, kind);
    assert.doesNotMatch(own.description, /container/, kind);
    assert.deepEqual([k8s.samples, k8s.lossless, k8s.strict], [own.samples, own.lossless, own.strict], `${kind}: the same samples and expectations either way`);
  }
  assert.match(targetOf(p, 'offline-restart', 'kubernetes').description, /scaled to 0/);
  for (const kind of ['direct-path-cut', 'uplink-cut', 'uplink-flap'] as const) assert.ok(!('skipped' in planFault(p, kind, 'kubernetes')), kind);
});

test('the fault table notes the Service count when there is one (--kubernetes), and nothing otherwise', () => {
  const base = { kind: 'pod-recreate' as const, description: 'd', ok: true, heldMs: 0, convergenceMs: 5, lossPct: 0, maxGapMs: 0 };
  assert.match(renderFaults([{ ...base, service: { answered: 4, of: 4 } }])[1] ?? '', /Service 4\/4$/);
  assert.doesNotMatch(renderFaults([base])[1] ?? '', /Service/);
});

test('the faults through Kubernetes: the StatefulSet pod on the target node, a pod crashed while its site is cut, the agents rolled', () => {
  const p = plan(DEFAULT_LAB_SPEC);
  const workloads = [{ name: 'lab-db-0', node: 'cloud-1', workload: 'statefulset' as const }, { name: 'lab-db-3', node: 'a-1', workload: 'statefulset' as const }, { name: 'lab-web-x', node: 'a-1', workload: 'deployment' as const }];
  const sts = planFault(p, 'statefulset-recreate', 'kubernetes', workloads);
  assert.ok(!('skipped' in sts) && sts.kind === 'statefulset-recreate');
  assert.equal(sts.pod, 'lab-db-3');
  assert.deepEqual(sts.samples, [{ from: 'cloud-1-p1', to: 'lab-db-3' }, { from: 'a-2-p1', to: 'lab-db-3' }, { from: 'a-1-p1', to: 'lab-db-3' }, { from: 'lab-db-3', to: 'cloud-1-p1' }]);
  assert.ok('skipped' in planFault(p, 'statefulset-recreate', 'kubernetes', []), 'no StatefulSet pod there');
  const crash = planFault(p, 'crash-offline', 'kubernetes');
  assert.ok(!('skipped' in crash) && crash.kind === 'crash-offline');
  assert.deepEqual([crash.site, crash.node, crash.pod], ['a', 'a-1', 'a-1-p1']);
  const roll = planFault(p, 'agent-roll', 'kubernetes');
  assert.ok(!('skipped' in roll) && roll.kind === 'agent-roll');
  assert.deepEqual(roll.samples, [{ from: 'cloud-1-p1', to: 'a-1-p1' }, { from: 'a-1-p1', to: 'cloud-1-p1' }, { from: 'cloud-1-p1', to: 'b-1-p1' }, { from: 'a-1-p1', to: 'a-2-p1' }]);
  assert.deepEqual(roll.strict?.lossFree, roll.samples, 'the keepers hold the datagram path and the same-site pair rides the kernel: a roll may cost nothing');
  const streams = planFault(plan({ ...DEFAULT_LAB_SPEC, tunnelUdp: false }), 'agent-roll', 'kubernetes');
  assert.ok(!('skipped' in streams));
  assert.deepEqual(streams.strict?.lossFree, [{ from: 'a-1-p1', to: 'a-2-p1' }], 'over the streams alone the tunnel pairs may lose packets while an end restarts');
  for (const kind of ['statefulset-recreate', 'crash-offline', 'agent-roll'] as const) assert.ok('skipped' in planFault(p, kind, 'cri', workloads), `${kind} needs --kubernetes`);
});

test('node-reboot-offline: with --openyurt, the first edge node rebooted while its site is cut off, its pods watched from the site and another edge site', () => {
  const p = plan(DEFAULT_LAB_SPEC);
  const without = planFault(p, 'node-reboot-offline', 'kubernetes');
  assert.ok('skipped' in without && without.skipped.includes('--openyurt'), 'a kubelet cut off gets its pods back only from an edge cache');
  const f = planFault(p, 'node-reboot-offline', 'kubernetes', [], undefined, { openyurt: true });
  assert.ok(!('skipped' in f) && f.kind === 'node-reboot-offline');
  assert.deepEqual([f.site, f.node], ['a', 'a-1']);
  assert.deepEqual(f.vxlan, [{ from: 'a-2-p1', to: 'a-1-p1' }, { from: 'a-1-p1', to: 'a-2-p1' }], 'the site\'s other node, over VXLAN');
  assert.ok(f.punched.length === 2 && f.punched.every((x) => [x.from, x.to].some((pod) => pod.startsWith('b-'))), 'edge to edge, hole-punched');
  assert.deepEqual(f.samples, [...f.vxlan, ...f.punched]);
  assert.ok(f.cloud.length > 0 && !f.lossless);
  assert.ok('skipped' in planFault(p, 'node-reboot-offline', 'cri', [], undefined, { openyurt: true }), 'it goes through Kubernetes');
});

test('node-delete takes the last node of the first edge site (not the other faults\' target), sampled between nodes that stay, without loss', () => {
  const p = plan(DEFAULT_LAB_SPEC);
  const f = planFault(p, 'node-delete', 'kubernetes');
  assert.ok(!('skipped' in f) && f.kind === 'node-delete');
  assert.equal(f.node, 'a-2');
  assert.equal(f.lossless, true);
  assert.ok(f.samples.length > 0 && f.samples.every((s) => !s.from.startsWith('a-2') && !s.to.startsWith('a-2')), JSON.stringify(f.samples));
  const one = plan({ ...DEFAULT_LAB_SPEC, edges: DEFAULT_LAB_SPEC.edges.map((e) => ({ ...e, nodes: 1 })) });
  assert.ok('skipped' in planFault(one, 'node-delete', 'kubernetes'), 'a single-node edge site is the other faults\' target');
  assert.ok('skipped' in planFault(p, 'node-delete', 'cri'));
});

test('the faults of a site cut off from the cloud (#16): its hole-punched pairs both ways and a VXLAN pair that may lose nothing; they need the datagram path', () => {
  const streams = plan({ ...DEFAULT_LAB_SPEC, tunnelUdp: false });
  for (const kind of ['offline-restart-all', 'nat-reboot-offline', 'clock-jump', 'readdress-offline'] as const) {
    const f = planFault(streams, kind);
    assert.ok('skipped' in f && f.skipped.includes('--no-udp'), kind);
  }
  const p = plan(DEFAULT_LAB_SPEC);
  const all = targetOf(p, 'offline-restart-all');
  assert.equal(all.site, 'a');
  assert.deepEqual(all.nodes, ['a-1', 'a-2']);
  assert.equal(all.watcher, 'b-1');
  assert.deepEqual(all.cloud, ['198.51.100.2', '192.0.2.0/24']);
  assert.deepEqual(all.strict?.lossFree, [{ from: 'a-1-p1', to: 'a-2-p1' }]);
  assert.deepEqual(all.samples.slice(0, 3), [{ from: 'a-1-p1', to: 'b-1-p1' }, { from: 'a-2-p1', to: 'b-1-p1' }, { from: 'b-1-p1', to: 'a-1-p1' }]);
  assert.ok(all.samples.every((s) => s.from !== s.to));
  assert.deepEqual(targetOf(p, 'clock-jump').nodes, ['a-1', 'a-2']);
  const moved = targetOf(p, 'readdress-offline');
  assert.deepEqual(moved.moves, [{ site: 'a', from: '198.51.100.11/24', to: '198.51.100.111/24' }, { site: 'b', from: '198.51.100.12/24', to: '198.51.100.112/24' }]);
  assert.deepEqual([moved.watcher, moved.watched], ['b-1', 'a-1']);
  for (const kind of ['offline-restart-all', 'nat-reboot-offline', 'readdress-offline'] as const) {
    assert.deepEqual(targetOf(p, kind, 'kubernetes').samples, targetOf(p, kind).samples, `${kind} with --kubernetes: the same samples`);
  }
  assert.match(targetOf(p, 'offline-restart-all', 'kubernetes').description, /its container, by its kubelet without the API/);
  const jump = planFault(p, 'clock-jump', 'kubernetes');
  assert.ok('skipped' in jump && jump.skipped.includes('libfaketime'), 'the image has no libfaketime');
  assert.match(peerCutRuleset(all.cloud, 'cut off from the cloud'), /ip saddr 198\.51\.100\.2 drop\n {4}ip daddr 198\.51\.100\.2 drop\n {4}ip saddr 192\.0\.2\.0\/24 drop/);
});

test('loss windows: a run of lost packets counts only when it lies outside every window', () => {
  const replies = (seqs: number[], at: (s: number) => number) => seqs.map((seq) => ({ seq, atMs: at(seq), rttMs: 1 }));
  const at = (s: number) => s * 100 + 1;
  // packets 11..20 lost while an agent restarted from 1000 to 1900 (+ 1 s grace)
  const r = replies([...Array.from({ length: 10 }, (_, i) => i + 1), ...Array.from({ length: 10 }, (_, i) => i + 21)], at);
  assert.equal(lostOutsideWindows(r, [{ fromMs: 1000, toMs: 2900, label: 'restart' }], 100).lost, 0);
  assert.equal(lostOutsideWindows(r, [{ fromMs: 1500, toMs: 2900, label: 'restart' }], 100).lost, 10, 'the loss began before the window');
  assert.equal(lostOutsideWindows(r, [{ fromMs: 1201, toMs: 2900, label: 'restart' }], 100).lost, 0, 'a packet that left just before the window opened');
  assert.equal(lostOutsideWindows(r, [{ fromMs: 1202, toMs: 2900, label: 'restart' }], 100).lost, 10, 'but not two intervals before');
  assert.equal(lostOutsideWindows(r, [{ fromMs: 1000, toMs: 1500, label: 'restart' }], 100).lost, 10, 'and ended after it');
  assert.deepEqual(lostOutsideWindows(r, [], 100), { lost: 10, runs: [{ fromMs: 1001, toMs: 2100, lost: 10 }] });
  assert.equal(lostOutsideWindows(replies([3, 4, 5], at), [], 100).lost, 0, 'the warm-up before the first reply does not count');
});

test('loss windows of a node excuse only samples with an end on it', () => {
  const windows = [{ fromMs: 0, toMs: 1, label: 'a-1\'s agent', nodes: ['a-1'] }, { fromMs: 2, toMs: 3, label: 'b-1\'s agent', nodes: ['b-1'] }, { fromMs: 4, toMs: 5, label: 'the NAT reboot' }];
  assert.deepEqual(windowsFor(windows, ['cloud-1', 'a-1']).map((w) => w.label), ['a-1\'s agent', 'the NAT reboot']);
  assert.deepEqual(windowsFor(windows, ['cloud-1', 'cloud-2']).map((w) => w.label), ['the NAT reboot']);
});

test('judging a fault with strict samples: a VXLAN pair may lose nothing, the others nothing outside the windows', () => {
  const target = targetOf(plan(DEFAULT_LAB_SPEC), 'nat-reboot-offline');
  const m = { ok: true, shouldWork: 10, working: 10 };
  const sample = (from: string, to: string, sent: number, received: number, lostOutside: number) => ({
    from, to, sent, received, lossPct: 0, late: 0, maxGapMs: 0, convergenceMs: 0, lostOutsideWindows: lostOutside, outsideRuns: lostOutside ? [{ fromMs: 1000, toMs: 1400, lost: lostOutside }] : [],
  });
  const windows = [{ fromMs: 2000, toMs: 7000, label: 'the NAT reboot' }];
  const judge = (samples: ReturnType<typeof sample>[]) => judgeFault(target, { before: m, after: m, samples, heldMs: 1, durationMs: 1, notes: [], windows });
  assert.equal(judge([sample('a-1-p1', 'b-1-p1', 100, 90, 0), sample('a-1-p1', 'a-2-p1', 100, 100, 0)]).ok, true);
  assert.deepEqual(judge([sample('a-1-p1', 'b-1-p1', 100, 90, 3), sample('a-1-p1', 'a-2-p1', 100, 99, 0)]).notes, [
    'a-1-p1 -> b-1-p1 lost 3 packets outside the fault\'s allowed windows (3 from +1.0 s to +1.4 s; allowed: the NAT reboot +2.0 to +7.0 s)', 'a-1-p1 -> a-2-p1 lost 1 packets; it should lose none']);
});

test('judging an agent killed with SIGKILL: samples that may lose nothing may lose what the agent held at the kill, nothing more', () => {
  const target = targetOf(plan(DEFAULT_LAB_SPEC), 'agent-restart');
  const m = { ok: true, shouldWork: 10, working: 10 };
  const [a, b] = target.samples;
  assert.ok(a && b && target.strict?.lossFree.length === target.samples.length);
  const sample = (pair: { from: string; to: string }, sent: number, received: number, lostInHand?: number) => ({
    ...pair, sent, received, lossPct: 0, late: 0, maxGapMs: 0, convergenceMs: 0, ...(lostInHand ? { lostInHand } : {}),
  });
  const judge = (samples: ReturnType<typeof sample>[]) => judgeFault(target, { before: m, after: m, samples, heldMs: 1, durationMs: 1, notes: [] });
  assert.equal(judge([sample(a, 100, 99, 1), sample(b, 100, 100)]).ok, true, 'one packet in the agent\'s hands at the kill');
  assert.deepEqual(judge([sample(a, 100, 97, 1), sample(b, 100, 99)]).notes, [
    `${a.from} -> ${a.to} lost 2 packets; it should lose none but the 1 the killed agent held`, `${b.from} -> ${b.to} lost 1 packets; it should lose none`]);
});

test('what a killed agent held: a gap at the kill\'s instant (the window of its kill), not one a moment later', () => {
  const at = (s: number) => s * 100 + 1;
  const r = [1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 12, 14, 15].map((seq) => ({ seq, atMs: at(seq), rttMs: 1 }));
  const kill = [{ fromMs: 650, toMs: 650, label: 'what a-1\'s agent held when killed', inHand: true }];
  // seq 6 went 50 ms before the kill and died in the agent; seq 13 went 650 ms after it, when the keeper held the path
  assert.deepEqual(lostOutsideWindows(r, kill, 100), { lost: 1, runs: [{ fromMs: 1201, toMs: 1400, lost: 1 }] });
});

/** The lab's policies as `planFault` gets them (`--policy`). */
function policyOf(p: ReturnType<typeof plan>): (from: string, to: string) => string | undefined {
  const sites = labPolicySites(p.spec);
  const labels = new Map(p.pods.map((x) => [x.name, x.labels]));
  if (!sites) throw new Error('the lab\'s policies need an edge site');
  return (from, to) => labPolicyDenies(labels.get(from) ?? {}, labels.get(to) ?? {}, sites);
}

test('--policy: the restarts ping the pairs the policies deny on their nodes, on paths their cut leaves up; none without policies', () => {
  const p = plan(DEFAULT_LAB_SPEC);
  const denies = policyOf(p);
  const planned = (kind: LabFaultKind) => {
    const t = planFault(p, kind, 'kubernetes', [], denies);
    assert.ok(!('skipped' in t), kind);
    return t.denied ?? [];
  };
  const restart = planned('offline-restart');
  assert.ok(restart.length > 0 && restart.every((d) => denies(d.from, d.to) !== undefined && [d.from, d.to].some((x) => x.startsWith('a-1-'))), JSON.stringify(restart));
  // a-1-p1 (a web pod of the egress site) to the cloud, and pairs into a-1-p2 (a db pod)
  assert.deepEqual(restart, [{ from: 'cloud-1-p2', to: 'a-1-p2' }, { from: 'cloud-2-p2', to: 'a-1-p2' }, { from: 'a-1-p1', to: 'cloud-1-p1' }, { from: 'a-1-p1', to: 'cloud-1-p2' }]);
  // the crash cuts the site's uplink: only pairs inside it say anything
  assert.deepEqual(planned('crash-offline'), [{ from: 'a-1-p2', to: 'a-2-p2' }, { from: 'a-2-p2', to: 'a-1-p2' }]);
  assert.ok(planned('offline-restart-all').every((d) => ![d.from, d.to].some((x) => x.startsWith('cloud-'))), 'the site is cut off from the cloud');
  assert.ok(planned('agent-restart').length > 0 && planned('agent-roll').length > 0);
  assert.equal(targetOf(p, 'offline-restart', 'kubernetes').denied, undefined, 'no policies, nothing denied');
});

test('policy-offline: db-from-web deleted while edge site a is cut off; pairs into a held, pairs elsewhere opened; skipped without the policies', () => {
  const p = plan(DEFAULT_LAB_SPEC);
  const t = planFault(p, 'policy-offline', 'kubernetes', [], policyOf(p));
  assert.ok(!('skipped' in t) && t.kind === 'policy-offline');
  assert.equal(t.site, 'a');
  assert.equal(t.policy, 'db-from-web');
  assert.deepEqual(t.held, [{ from: 'a-1-p2', to: 'a-2-p2' }, { from: 'b-1-p2', to: 'a-1-p2' }], 'over VXLAN in the site, hole-punched from b');
  assert.deepEqual(t.opened, [{ from: 'cloud-1-p2', to: 'cloud-2-p2' }, { from: 'b-1-p2', to: 'cloud-1-p2' }], 'within the cloud, from b to the cloud');
  assert.deepEqual(t.samples, [...t.held, ...t.opened]);
  assert.deepEqual(t.cloud, targetOf(p, 'nat-reboot-offline').cloud);
  assert.match((planFault(p, 'policy-offline', 'kubernetes') as { skipped: string }).skipped, /needs --policy/);
  const oneSite = plan({ ...DEFAULT_LAB_SPEC, edges: DEFAULT_LAB_SPEC.edges.slice(0, 1) });
  assert.ok('skipped' in planFault(oneSite, 'policy-offline', 'kubernetes', [], policyOf(oneSite)), 'the last edge site is not guarded: nothing to delete for it');
  assert.match((planFault(p, 'policy-offline', 'cri', [], policyOf(p)) as { skipped: string }).skipped, /--kubernetes/);
});

test('judging policy-offline and the denied pairs: no reply before its time, openings within their bounds', () => {
  const target = targetOf(plan(DEFAULT_LAB_SPEC), 'agent-restart');
  const m = { ok: true, shouldWork: 10, working: 10 };
  const replies = (...at: number[]) => at.map((atMs, i) => ({ seq: i + 1, atMs }));
  const pr = (from: string, to: string, ...at: number[]) => ({ pair: { from, to }, replies: replies(...at) });
  // deleted at 1000, healed at 9000
  const seen = policyChangeSeen('db-from-web', [pr('a-1-p2', 'a-2-p2', 9400, 9500)], [pr('cloud-1-p2', 'cloud-2-p2', 1800, 1900)], 1000, 9000);
  assert.deepEqual(seen, { policy: 'db-from-web', held: [{ from: 'a-1-p2', to: 'a-2-p2', repliesBeforeHeal: 0, openedAfterHealMs: 400 }],
    opened: [{ from: 'cloud-1-p2', to: 'cloud-2-p2', repliesBeforeChange: 0, openedAfterChangeMs: 800 }] });
  const judge = (parts: Partial<Parameters<typeof judgeFault>[1]>) => judgeFault(target, { before: m, after: m, samples: [], heldMs: 1, durationMs: 1, notes: [], ...parts });
  assert.equal(judge({ policyChange: seen }).ok, true);
  const early = policyChangeSeen('db-from-web', [pr('a-1-p2', 'a-2-p2', 5000)], [pr('cloud-1-p2', 'cloud-2-p2', 500, 7000)], 1000, 9000);
  assert.deepEqual(judge({ policyChange: early }).notes, [
    'a-1-p2 -> a-2-p2 answered 1 pings while its site was cut off: the site should have kept db-from-web until the heal',
    'a-1-p2 -> a-2-p2 did not open after the heal: db-from-web\'s deletion did not reach its site',
    'cloud-1-p2 -> cloud-2-p2 answered 1 pings before db-from-web was deleted, which denied it',
    'cloud-1-p2 -> cloud-2-p2 did not open within 5 s of db-from-web\'s deletion (6000 ms)']);
  assert.equal(judge({ denied: [{ from: 'x', to: 'y', sent: 300, received: 0 }] }).ok, true);
  assert.deepEqual(judge({ denied: [{ from: 'x', to: 'y', sent: 300, received: 2, firstReplyMs: 4200 }, { from: 'y', to: 'x', sent: 0, received: 0 }] }).notes, [
    'x -> y, which the policies deny, got 2 of 300 pings answered during the fault (the first at +4.2 s)', 'the denied pair y -> x was not pinged']);
});
