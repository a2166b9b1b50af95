/**
 * `atoll lab run` end to end, as a user runs it: a small cloud and one NATed edge site from namespaces, a real
 * controller and agents, pods through the real atoll-cni (by containerd's CRI where containerd is installed, and
 * by direct CNI calls with `--pods direct`), the connectivity matrix, and nothing of the run left afterwards
 * (namespace, process, mount, cgroup, file).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ATOLL_BIN } from '../../src/lab/agent-process.ts';
import type { LabCell } from '../../src/core/lab/report.ts';
import type { LabFaultResult } from '../../src/core/lab/faults.ts';
import { rootSkipReason } from '../support/netns.ts';

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
  readonly verdict: { ok: boolean; shouldWork: number; working: number; waitingForTunnel: number };
  readonly faults: readonly LabFaultResult[];
  readonly cleanup: { leftovers: readonly string[] };
}

function run(args: readonly string[], timeoutMs: number): Promise<{ code: number | null; out: string }> {
  return new Promise((resolve) => {
    const child = spawn(ATOLL_BIN, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (out += d.toString()));
    // SIGTERM: the lab removes itself before it exits
    const timer = setTimeout(() => child.kill('SIGTERM'), timeoutMs);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, out });
    });
  });
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

test('atoll lab run: cloud 1 node + edge a 2 nodes, 1 pod each: same-site cells over VXLAN, cloud <-> edge through the tunnel, faults healed, nothing left', { skip: rootSkipReason(), timeout: 120_000 }, async () => {
  const tmp = mkdtempSync(join(tmpdir(), 'atoll-lab-e2e-'));
  try {
    const json = join(tmp, 'report.json');
    const started = Date.now();
    const res = await run(['lab', 'run', '--cloud-nodes', '1', '--edge-sites', '1', '--nodes-per-site', '2', '--pods-per-node', '1', '--faults', 'controller-kill,agent-restart,pod-recreate', '--json', json], 90_000);
    assert.equal(res.code, 0, res.out);
    assert.ok(Date.now() - started < 60_000, `took ${Date.now() - started} ms`);
    if (hasContainerd) {
      assert.match(res.out, /pods will be created by containerd's CRI \(containerd is installed\)/);
      assert.match(res.out, /pods: 3 created by containerd's CRI .*RunPodSandbox median \d+ ms/);
      assert.match(res.out, /containerd: 3 private instances, one per node/);
    } else {
      assert.match(res.out, /pods: 3 created by direct CNI calls to atoll-cni/);
    }
    assert.match(res.out, /^PASS: /m);
    const report = JSON.parse(readFileSync(json, 'utf8')) as Report;
    assert.equal(report.cells.length, 6);
    if (hasContainerd) {
      assert.match(report.podCreation, /^containerd's CRI/);
      assert.equal(report.containerds.length, 3);
      for (const p of report.pods) {
        assert.match(p.netns, /\/containerd\/state\/.*\/netns\/cni-/, `${p.name}: the netns path its sandbox reports`);
        assert.match(p.sandboxId, /^[0-9a-f]{64}$/);
      }
    }
    assert.deepEqual(report.verdict, { ...report.verdict, ok: true, shouldWork: 6, working: 6, waitingForTunnel: 0 });

    const sameSite = report.cells.filter((c) => c.fromNode.startsWith('a-') && c.toNode.startsWith('a-'));
    assert.equal(sameSite.length, 2);
    for (const c of sameSite) {
      assert.equal(c.path, 'vxlan', `${c.from} -> ${c.to}`);
      assert.equal(c.route, 'vxlan', `${c.from} -> ${c.to}: the node's kernel routes it over the VXLAN device`);
      assert.equal(c.verdict, 'ok', JSON.stringify(c));
      assert.ok(c.ping.ok && c.ping.rttMs !== undefined && c.tcp.ok && c.tcp.connectMs !== undefined, JSON.stringify(c));
    }
    const crossSite = report.cells.filter((c) => !sameSite.includes(c));
    for (const c of crossSite) {
      assert.equal(c.path, 'tunnel direct', `${c.from} -> ${c.to}`);
      assert.equal(c.route, 'tunnel', `${c.from} -> ${c.to}: the node's kernel routes it into the TUN device`);
      assert.equal(c.verdict, 'ok', JSON.stringify(c));
      assert.ok(c.ping.ok && c.tcp.ok, JSON.stringify(c));
    }

    // the faults: each healed, the whole matrix working before and after, loss and convergence measured
    assert.deepEqual(report.faults.map((f) => f.kind), ['controller-kill', 'agent-restart', 'pod-recreate']);
    for (const f of report.faults) {
      assert.equal(f.ok, true, JSON.stringify(f));
      assert.deepEqual([f.before, f.after], [{ ok: true, shouldWork: 6, working: 6 }, { ok: true, shouldWork: 6, working: 6 }], f.kind);
      assert.ok(f.convergenceMs !== undefined && f.convergenceMs < 15_000, `${f.kind}: convergence ${f.convergenceMs}`);
      assert.ok(f.lossPct !== undefined && (f.samples ?? []).length > 0 && (f.samples ?? []).every((s) => s.sent > 0), f.kind);
    }
    const [controllerKill, agentRestart, podRecreate] = report.faults as [LabFaultResult, LabFaultResult, LabFaultResult];
    assert.ok((controllerKill.lossPct ?? 100) <= 5, `the agents work on while the controller is down: ${controllerKill.lossPct}% loss`);
    assert.match(agentRestart.description, /agent of a-1 killed/);
    assert.equal(podRecreate.podStartMs?.length, 1);
    assert.match(res.out, /^PASS: every fault healed/m);
    assert.equal(report.processes.filter((p) => p.role === 'controller (restarted)').length, 1);
    assert.equal(report.processes.filter((p) => p.role === 'agent a-1 (restarted)').length, 1);

    // nothing of the run is left
    const runDir = `/run/atoll-lab/${report.runId}`;
    assert.deepEqual(report.cleanup.leftovers, []);
    assert.deepEqual(readdirSync('/var/run/netns').filter((n) => n.startsWith(report.prefix)), []);
    assert.deepEqual(processesNaming(runDir), []);
    assert.ok(report.processes.length >= 6, 'controller and three agents were recorded, and the restarted ones');
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
  const res = await run(['lab', 'run', '--pods-per-node', '0'], 20_000);
  assert.equal(res.code, 1, res.out);
  assert.match(res.out, /pods per node must be 1 to 50, not 0/);
  assert.match(res.out, /LAB_SPEC_INVALID/);
});

test('atoll lab refuses clearly when not root', { skip: rootSkipReason() || (existsSync('/usr/bin/setpriv') ? false : 'needs setpriv') }, async () => {
  assert.equal((await run(['version'], 30_000)).code, 0); // the bundle is built as root first
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

test('uplink delay: applied where the kernel has netem, else refused naming netem with nothing created', { skip: rootSkipReason(), timeout: 120_000 }, async () => {
  const res = await run(['lab', 'run', '--cloud-nodes', '1', '--edge-sites', '1', '--nodes-per-site', '1', '--pods-per-node', '1', '--delay', '5', '--faults', 'none', '--pods', 'direct'], 90_000);
  if (res.code === 1 && /netem qdisc/.test(res.out)) {
    assert.match(res.out, /CONFIG_NET_SCH_NETEM/);
    assert.match(res.out, /refused: nothing was created/);
  } else {
    assert.equal(res.code, 0, res.out);
    assert.match(res.out, /pods: 2 created by direct CNI calls to atoll-cni/);
  }
  const runId = /^atoll lab ([0-9a-f]{4}):/m.exec(res.out)?.[1];
  assert.ok(runId, res.out);
  assert.deepEqual(readdirSync('/var/run/netns').filter((n) => n.startsWith(`atl-lab-${runId}-`)), []);
  assert.equal(existsSync(`/run/atoll-lab/${runId}.json`), false);
});
