/**
 * `atoll lab run` end to end, as a user runs it: a small cloud and four NATed edge sites from namespaces, a real
 * controller, relay and agents, pods through the real atoll-cni (by containerd's CRI where containerd is installed,
 * and by direct CNI calls with `--pods direct`), the connectivity matrix, faults, and nothing of the run left
 * afterwards (namespace, process, mount, cgroup, file).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ATOLL_BIN } from '../../src/lab/agent-process.ts';
import type { LabCell } from '../../src/lab/plan/report.ts';
import type { LabFaultResult } from '../../src/lab/plan/fault-results.ts';
import { rootSkipReason } from '../../harness/netns.ts';
import { runAtoll } from '../support/atoll-cli.ts';

/** What `--pods auto` picks here. */
const hasContainerd = ['/usr/bin/containerd', '/usr/sbin/runc', '/bin/busybox', '/usr/lib/cni/loopback'].every((p) => existsSync(p));

interface Report {
  readonly runId: string;
  readonly prefix: string;
  readonly podCreation: string;
  readonly pods: readonly { name: string; netns: string; sandboxId: string; addMs?: number }[];
  readonly containerds: readonly { node: string; pid: number; cgroupParent: string }[];
  readonly processes: readonly { role: string; pid: number }[];
  readonly cells: readonly LabCell[];
  readonly verdict: { ok: boolean; shouldWork: number; working: number; blocked: number };
  readonly faults: readonly LabFaultResult[];
  readonly cleanup: { leftovers: readonly string[] };
}

/** Processes whose command line names `text`. */
function processesNaming(text: string): string[] {
  return readdirSync('/proc').filter((p) => /^\d+$/.test(p)).flatMap((pid) => {
    try {
      const cmd = readFileSync(`/proc/${pid}/cmdline`, 'utf8').replaceAll('\0', ' ');
      return cmd.includes(text) ? [`${pid}: ${cmd}`] : [];
    } catch {
      return [];
    }
  });
}

/**
 * Every kind of path in one small lab: cloud 1 node; edge a (2 nodes, VXLAN between them) and b behind
 * endpoint-independent NATs in community "x" (a <-> b hole-punched); c behind a symmetric NAT in "x" (relayed);
 * d in no community (blocked from the other edges, reaches the cloud).
 */
const SPEC = {
  cloudNodes: 1, podsPerNode: 1, sameSite: 'vxlan',
  edges: [
    { name: 'a', nodes: 2, community: 'x', nat: 'endpoint-independent', uplink: {} },
    { name: 'b', nodes: 1, community: 'x', nat: 'endpoint-independent', uplink: {} },
    { name: 'c', nodes: 1, community: 'x', nat: 'symmetric', uplink: {} },
    { name: 'd', nodes: 1, community: '', nat: 'endpoint-independent', uplink: {} },
  ],
};

test('atoll lab run: every path (VXLAN, tunnel direct, hole-punched, relayed, not allowed) over its route, faults incl. the relay kill healed, nothing left', { skip: rootSkipReason(), timeout: 200_000 }, async () => {
  const tmp = mkdtempSync(join(tmpdir(), 'atoll-lab-e2e-'));
  try {
    const json = join(tmp, 'report.json');
    const svg = join(tmp, 'lab.svg');
    const specFile = join(tmp, 'spec.json');
    writeFileSync(specFile, JSON.stringify(SPEC));
    const res = await runAtoll(['lab', 'run', '--spec', specFile, '--faults', 'controller-kill,relay-kill,direct-path-cut,agent-restart,offline-restart,pod-recreate', '--json', json, '--svg', svg], 170_000);
    assert.equal(res.code, 0, res.out);
    if (hasContainerd) {
      assert.match(res.out, /pods will be created by containerd's CRI \(containerd is installed\)/);
      assert.match(res.out, /pods: 6 created by containerd's CRI .*RunPodSandbox median \d+ ms/);
      assert.match(res.out, /containerd: 6 private instances, one per node/);
    } else {
      assert.match(res.out, /pods: 6 created by direct CNI calls to atoll-cni/);
    }
    assert.match(res.out, /^PASS: /m);
    const report = JSON.parse(readFileSync(json, 'utf8')) as Report;
    assert.equal(report.cells.length, 30);
    if (hasContainerd) {
      assert.match(report.podCreation, /^containerd's CRI/);
      assert.equal(report.containerds.length, 6);
      for (const p of report.pods) {
        assert.match(p.netns, /\/containerd\/state\/.*\/netns\/cni-/, `${p.name}: the netns path its sandbox reports`);
        assert.match(p.sandboxId, /^[0-9a-f]{64}$/);
      }
    }
    const blocked = 8; // d <-> a-1, a-2, b-1, c-1, both ways
    assert.deepEqual(report.verdict, { ...report.verdict, ok: true, shouldWork: 30 - blocked, working: 30 - blocked, blocked });

    const want: Record<string, [string, string]> = {
      'a-1>a-2': ['vxlan', 'vxlan'], 'cloud-1>a-1': ['tunnel direct', 'tunnel'], 'd-1>cloud-1': ['tunnel direct', 'tunnel'],
      'a-1>b-1': ['tunnel hole-punched', 'tunnel'], 'b-1>a-2': ['tunnel hole-punched', 'tunnel'],
      'a-2>c-1': ['tunnel relayed', 'tunnel relayed'], 'c-1>b-1': ['tunnel relayed', 'tunnel relayed'],
      'd-1>a-1': ['not allowed', 'default route'], 'c-1>d-1': ['not allowed', 'default route'],
    };
    for (const [pair, [path, route]] of Object.entries(want)) {
      const [from, to] = pair.split('>');
      const c = report.cells.find((x) => x.fromNode === from && x.toNode === to) ?? assert.fail(`no cell ${pair}`);
      assert.deepEqual([c.path, c.route], [path, route], `${pair}: ${JSON.stringify(c)}`);
      if (path === 'not allowed') assert.ok(!c.ping.ok && !c.tcp.ok && c.verdict === 'blocked as expected', JSON.stringify(c));
      else assert.ok(c.verdict === 'ok' && c.ping.ok && c.tcp.ok, JSON.stringify(c));
    }

    // the faults: each healed, the whole matrix working before and after, loss and convergence measured
    assert.deepEqual(report.faults.map((f) => f.kind), ['controller-kill', 'relay-kill', 'direct-path-cut', 'agent-restart', 'offline-restart', 'pod-recreate']);
    const all = { ok: true, shouldWork: 22, working: 22 };
    for (const f of report.faults) {
      assert.equal(f.ok, true, JSON.stringify(f));
      assert.deepEqual([f.before, f.after], [all, all], f.kind);
      assert.ok(f.convergenceMs !== undefined && f.convergenceMs < 15_000, `${f.kind}: convergence ${f.convergenceMs}`);
      assert.ok(f.lossPct !== undefined && (f.samples ?? []).length > 0 && (f.samples ?? []).every((s) => s.sent > 0), f.kind);
      assert.ok(f.matrixMs && f.matrixMs.before > 0 && f.matrixMs.after > 0, `${f.kind}: its own matrix before and after`);
    }
    const [controllerKill, relayKill, pathCut, agentRestart, offlineRestart, podRecreate] = report.faults as [LabFaultResult, LabFaultResult, LabFaultResult, LabFaultResult, LabFaultResult, LabFaultResult];
    assert.ok((controllerKill.lossPct ?? 100) <= 5, `the agents work on while the controller is down: ${controllerKill.lossPct}% loss`);
    // the relay killed: the hole-punched flow does not notice; the relayed one pauses, survives and catches up
    const [punched, relayed] = relayKill.flows ?? [];
    assert.deepEqual([punched?.from, punched?.to, relayed?.from, relayed?.to], ['a-1-p1', 'b-1-p1', 'a-1-p1', 'c-1-p1']);
    assert.ok(punched?.survived && punched.maxGapMs < 1000, `hole-punched flow: ${JSON.stringify(punched)}`);
    assert.ok(relayed?.survived && relayed.maxGapMs >= 1000, `relayed flow (it waits out the relay's absence, then catches up): ${JSON.stringify(relayed)}`);
    // the direct path cut: the hole-punched pair moves to the relay and back to direct; its TCP flow rides it out
    const cutFlow = pathCut.flows?.[0];
    assert.ok(cutFlow?.survived && cutFlow.maxGapMs >= 1000 && cutFlow.maxGapMs < 8000, `flow across the cut: ${JSON.stringify(cutFlow)}`);
    assert.ok(pathCut.pathsBackMs !== undefined, 'direct again after the heal');
    for (const f of report.faults) assert.ok(f.pathsBackMs !== undefined, `${f.kind}: every tunnel pair back on its path`);
    assert.match(agentRestart.description, /agent of a-1 killed/);
    // an agent restarted while the controller is down rebuilds its tunnels (cloud, hole-punched, relayed) from local state
    assert.deepEqual(offlineRestart.samples?.map((x) => x.to), ['cloud-1-p1', 'b-1-p1', 'c-1-p1', 'a-2-p1']);
    assert.ok(offlineRestart.samples?.every((x) => x.convergenceMs !== undefined), JSON.stringify(offlineRestart));
    assert.equal(podRecreate.podStartMs?.length, 1);
    assert.match(res.out, /^PASS: every fault healed/m);
    for (const [role, n] of [['controller (restarted)', 2], ['relay (restarted)', 1], ['agent a-1 (restarted)', 2]] as const) assert.equal(report.processes.filter((p) => p.role === role).length, n, role);

    // the picture: every node and pod, nothing failed
    const picture = readFileSync(svg, 'utf8');
    assert.match(picture, /^<\?xml [^>]*>\n<svg /);
    assert.match(picture, /Atoll lab [0-9a-f]{4}: 22\/22 cells ok, 0 FAIL, 8 blocked as expected/);
    for (const name of ['cloud-1', 'a-1', 'a-2', 'b-1', 'c-1', 'd-1', 'cloud-1-p1', 'a-1-p1', 'c-1-p1']) assert.ok(picture.includes(`>${name}`), name);
    assert.ok(!picture.includes(' failed"'), 'no pair drawn as failed');

    // nothing of the run is left
    const runDir = `/run/atoll-lab/${report.runId}`;
    assert.deepEqual(report.cleanup.leftovers, []);
    assert.deepEqual(readdirSync('/var/run/netns').filter((n) => n.startsWith(report.prefix)), []);
    assert.deepEqual(processesNaming(runDir), []);
    assert.ok(report.processes.length >= 10, 'controller, relay and six agents were recorded, and the restarted ones');
    for (const p of report.processes) assert.ok(!existsSync(`/proc/${p.pid}`) || !(readFileSync(`/proc/${p.pid}/cmdline`, 'utf8').includes(runDir)), `${p.role} (pid ${p.pid}) still runs`);
    const mounts = readFileSync('/proc/self/mountinfo', 'utf8').split('\n').filter((l) => l.includes(report.prefix) || l.includes(runDir));
    assert.deepEqual(mounts, []);
    assert.equal(existsSync(runDir), false);
    for (const c of report.containerds) {
      assert.ok(!existsSync(`/proc/${c.pid}`) || !readFileSync(`/proc/${c.pid}/cmdline`, 'utf8').includes(runDir), `containerd of ${c.node} (pid ${c.pid}) still runs`);
      const cgroups = ['', ...readdirSync('/sys/fs/cgroup')].filter((h) => existsSync(join('/sys/fs/cgroup', h, c.cgroupParent)));
      assert.deepEqual(cgroups, [], `cgroup ${c.cgroupParent} of ${c.node} is left`);
    }
    assert.equal(existsSync(`${runDir}.json`), false);
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
});

test('atoll lab refuses an impossible spec before touching anything', async () => {
  const res = await runAtoll(['lab', 'run', '--pods-per-node', '0'], 20_000);
  assert.equal(res.code, 1, res.out);
  assert.match(res.out, /pods per node must be 1 to 50, not 0/);
  assert.match(res.out, /LAB_SPEC_INVALID/);
});

test('atoll lab refuses clearly when not root', { skip: rootSkipReason() || (existsSync('/usr/bin/setpriv') ? false : 'needs setpriv') }, async () => {
  assert.equal((await runAtoll(['version'], 30_000)).code, 0); // the bundle is built as root first
  const res = await new Promise<{ code: number | null; out: string }>((resolve) => {
    const child = spawn('setpriv', ['--reuid=65534', '--regid=65534', '--clear-groups', ATOLL_BIN, 'lab', 'run'], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (out += d.toString()));
    child.on('close', (code) => resolve({ code, out }));
  });
  assert.equal(res.code, 1, res.out);
  assert.match(res.out, /atoll lab must run as root/);
  assert.match(res.out, /LAB_PREREQUISITE_MISSING/);
});

test('uplink delay: by netem, or the lab\'s delay line where the kernel has none; pod round trips grow by it; nothing left', { skip: rootSkipReason(), timeout: 150_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'atoll-lab-delay-'));
  try {
    const json = join(dir, 'report.json');
    const res = await runAtoll(['lab', 'run', '--cloud-nodes', '1', '--edge-sites', '2', '--nodes-per-site', '1', '--pods-per-node', '1', '--delay', 'a=15',
      '--faults', 'none', '--pods', 'direct', '--json', json], 120_000);
    assert.equal(res.code, 0, res.out);
    const report = JSON.parse(readFileSync(json, 'utf8')) as Report & { uplinkDelayBy: string };
    if (report.uplinkDelayBy === 'delay-line') assert.match(res.out, /delay line: uplink of a, 15 ms/);
    const rtt = (from: string, to: string) => report.cells.find((c) => c.from === from && c.to === to)?.ping.rttMs ?? NaN;
    // a's uplink adds 15 ms each way: every round trip from a takes at least 30 ms, which no machine beats; b's uplink
    // adds nothing: b's round trip to the cloud is shorter than a's by more than half of that, measured in the same
    // run, so a loaded machine (which slows both) does not break it as a fixed upper band would
    for (const to of ['b-1-p1', 'cloud-1-p1']) assert.ok(rtt('a-1-p1', to) >= 30, `a-1-p1 -> ${to}: ${rtt('a-1-p1', to)} ms\n${res.out}`);
    assert.ok(rtt('b-1-p1', 'cloud-1-p1') + 15 < rtt('a-1-p1', 'cloud-1-p1'),
      `b-1-p1 -> cloud-1-p1: ${rtt('b-1-p1', 'cloud-1-p1')} ms against a-1-p1 -> cloud-1-p1: ${rtt('a-1-p1', 'cloud-1-p1')} ms`);
    const runId = /^atoll lab ([0-9a-f]{4}):/m.exec(res.out)?.[1];
    assert.ok(runId, res.out);
    assert.deepEqual(readdirSync('/var/run/netns').filter((n) => n.startsWith(`atl-lab-${runId}-`)), []);
    assert.deepEqual(processesNaming(`/run/atoll-lab/${runId}`), [], 'the delay lines and agents are stopped');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
