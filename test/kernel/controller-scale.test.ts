/**
 * Hundreds of agents joining at once (harness/join-simulator.ts, run inside the cloud namespace), with the
 * controller dying in the middle: the embedded-store controller is SIGKILLed and started again; of two replicas over
 * a three-member etcd, or over the Kubernetes store (a real kube-apiserver in the cloud namespace), the leader is
 * SIGKILLed and the other takes over. Every node must end up joined with its
 * own blocks: no block leased twice (in the agents' answers and in the controller's `atoll ipam show`/`check`).
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { PROJECT_NODE } from '../../src/lab/agent-process.ts';
import { BOOTSTRAP_TOKEN, type ControllerProc, TestCloud } from '../../harness/cloud.ts';
import { type EtcdCluster, etcdSkipReason, startEtcdCluster } from '../../harness/etcd.ts';
import { type ControlPlane, startControlPlane } from '../../harness/kube.ts';
import type { SimulationProgress, SimulationReport } from '../../harness/join-simulator.ts';
import { leftoverNetns, rootSkipReason } from '../../harness/netns.ts';
import { until } from '../../harness/wait.ts';

const SIMULATOR = fileURLToPath(new URL('../../harness/join-simulator.ts', import.meta.url));
const NODES = Number(process.env.ATOLL_SCALE_NODES ?? '500');
const DEADLINE_MS = 70_000;

type PrintedReport = Omit<SimulationReport, 'joinDoneMs' | 'reportDoneMs' | 'joinRequestMs' | 'reportRequestMs'> & { requestMsP50: number; requestMsP99: number };

interface IpamShow {
  readonly nodes: { name: string; blocks: string[] }[];
  readonly problems: unknown[];
}

/** A running simulator inside the cloud namespace; `done` resolves with its report. */
interface Simulation {
  readonly proc: ChildProcess;
  readonly done: Promise<PrintedReport>;
  /** The latest progress line. */
  progress: SimulationProgress;
}

function startSimulation(cloud: TestCloud, ca: string, urls: readonly string[], prefix: string, extra: readonly string[] = []): Simulation {
  const proc = spawn('ip', ['netns', 'exec', cloud.netns, PROJECT_NODE, SIMULATOR, '--urls', urls.join(','), '--ca', ca, '--token', BOOTSTRAP_TOKEN,
    '--count', String(NODES), '--prefix', prefix, '--deadline-ms', String(DEADLINE_MS), '--progress-ms', '100', ...extra], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let errText = '';
  let partial = '';
  const done = new Promise<PrintedReport>((resolve, reject) => {
    proc.on('close', (code) => {
      try {
        resolve(JSON.parse(out) as PrintedReport);
      } catch {
        reject(new Error(`the simulator exited with ${code} and no report:\n${out}\n${errText}`));
      }
    });
  });
  const sim: Simulation = { proc, done, progress: { joined: 0, reported: 0, ms: 0 } };
  proc.stdout?.on('data', (d: Buffer) => {
    out += d.toString();
  });
  proc.stderr?.on('data', (d: Buffer) => {
    partial += d.toString();
    const lines = partial.split('\n');
    partial = lines.pop() ?? '';
    for (const line of lines) {
      try {
        const p = (JSON.parse(line) as { progress?: SimulationProgress }).progress;
        if (p) sim.progress = p;
        else errText += `${line}\n`;
      } catch {
        errText += `${line}\n`;
      }
    }
  });
  return sim;
}


/** What the simulator's report says about blocks: each node holds one or more, none held twice. */
function checkReport(report: PrintedReport, minBlocks: number): void {
  const summary = JSON.stringify({ ...report, blocks: `(${Object.keys(report.blocks).length} nodes)` });
  assert.equal(report.failed, 0, summary);
  assert.equal(report.joined, NODES, summary);
  assert.deepEqual(report.duplicates, {}, summary);
  assert.equal(Object.keys(report.blocks).length, NODES);
  for (const [node, blocks] of Object.entries(report.blocks)) assert.ok(blocks.length >= minBlocks, `${node} holds ${blocks.join(' ') || 'no block'}`);
}

/** What the controller says: the same nodes, each block leased once, each node's answered blocks really its own. */
function checkController(cloud: TestCloud, c: ControllerProc, report: PrintedReport, minBlocks: number): void {
  const show = cloud.cli(['ipam', 'show', '--json', '--controller-config', c.configPath]);
  assert.equal(show.code, 0, show.out);
  const ipam = JSON.parse(show.out) as IpamShow;
  assert.deepEqual(ipam.problems, []);
  assert.equal(ipam.nodes.length, NODES, 'node count');
  const owner = new Map<string, string>();
  for (const n of ipam.nodes) {
    assert.ok(n.blocks.length >= minBlocks, `${n.name} holds ${n.blocks.join(' ') || 'no block'} on the controller`);
    for (const b of n.blocks) {
      assert.equal(owner.get(b), undefined, `block ${b} is leased to ${owner.get(b)} and ${n.name}`);
      owner.set(b, n.name);
    }
  }
  for (const [node, blocks] of Object.entries(report.blocks)) {
    for (const b of blocks) assert.equal(owner.get(b), node, `${node} was answered ${b}, which the controller leases to ${owner.get(b) ?? 'nobody'}`);
  }
  const check = cloud.cli(['ipam', 'check', '--controller-config', c.configPath]);
  assert.equal(check.code, 0, check.out);
}

function caOf(pkiDir: string): string {
  return join(pkiDir, 'ca.crt');
}

describe(`${NODES} agents join an embedded-store controller that is restarted midway`, { skip: rootSkipReason(), timeout: 180_000 }, () => {
  let cloud: TestCloud;
  let controller: ControllerProc;
  let sim: Simulation | undefined;

  before(async () => {
    cloud = new TestCloud();
    controller = await cloud.startController('ctl', { port: 17461 });
  });

  after(async () => {
    if (sim && sim.proc.exitCode === null && sim.proc.signalCode === null) sim.proc.kill('SIGKILL');
    await cloud?.cleanup();
    assert.deepEqual(leftoverNetns(), []);
  });

  test('all join, every node holds a block, no block twice', async () => {
    const t0 = Date.now();
    const s = startSimulation(cloud, caOf(join(controller.dir, 'pki')), [controller.url], 'emb-');
    sim = s;
    await until('a third of the nodes to join', () => s.progress.joined >= NODES / 3 || s.proc.exitCode !== null, 60_000);
    const joinedAtKill = s.progress.joined;
    await cloud.stopController(controller, 'SIGKILL');
    const killedAt = Date.now() - t0;
    await cloud.restartController(controller);
    const restartedAt = Date.now() - t0;
    const report = await s.done;
    process.stdout.write(`# embedded: killed at ${killedAt} ms with ${joinedAtKill}/${NODES} joined, serving again at ${restartedAt} ms; ` +
      `all done at ${report.ms} ms after ${report.attempts} requests (p50 ${report.requestMsP50} ms, p99 ${report.requestMsP99} ms); errors ${JSON.stringify(report.errors.slice(0, 3))}\n`);
    assert.ok(joinedAtKill > 0 && joinedAtKill < NODES, `the controller died midway (${joinedAtKill} joined before)`);
    assert.ok(report.errors.some((e) => e.code === 'CONTROLLER_UNREACHABLE'), 'the agents saw the controller go away');
    checkReport(report, 1);
    checkController(cloud, controller, report, 1);
  });
});

/**
 * The storm with the leader killed -9 midway: waits for a leader, starts `NODES` simulated agents (each asking for a
 * second block), kills the leader once a third have joined, and checks that everything joined through the other
 * replica with no block leased twice and `atoll ipam check` clean.
 */
async function stormWithLeaderKilled(cloud: TestCloud, pkiDir: string, controllers: ControllerProc[], label: string, prefix: string, started: (s: Simulation) => void): Promise<PrintedReport> {
  const leader = () => controllers.find((c) => c.proc?.exitCode === null && cloud.health(c)?.leader === true);
  await until('a leader', () => leader() !== undefined, 20_000, 200);
  const t0 = Date.now();
  const s = startSimulation(cloud, caOf(pkiDir), controllers.map((c) => c.url), prefix, ['--second-block']);
  started(s);
  await until('a third of the nodes to join', () => s.progress.joined >= NODES / 3 || s.proc.exitCode !== null, 60_000);
  const old = leader() as ControllerProc;
  const joinedAtKill = s.progress.joined;
  await cloud.stopController(old, 'SIGKILL');
  const killedAt = Date.now() - t0;
  const report = await s.done;
  const survivor = controllers.find((c) => c !== old) as ControllerProc;
  process.stdout.write(`# ${label}: killed leader ${old.url} at ${killedAt} ms with ${joinedAtKill}/${NODES} joined; all done at ${report.ms} ms ` +
    `after ${report.attempts} requests (p50 ${report.requestMsP50} ms, p99 ${report.requestMsP99} ms); errors ${JSON.stringify(report.errors.slice(0, 3))}\n`);
  assert.ok(joinedAtKill > 0 && joinedAtKill < NODES, `the leader died midway (${joinedAtKill} joined before)`);
  assert.equal(cloud.health(survivor)?.leader, true, 'the other replica leads');
  assert.equal(report.reported, NODES);
  checkReport(report, 2);
  checkController(cloud, survivor, report, 2);
  return report;
}

describe(`${NODES} agents join two controllers over etcd; the leader is killed midway`, { skip: rootSkipReason() || etcdSkipReason(), timeout: 180_000 }, () => {
  let cloud: TestCloud;
  let etcd: EtcdCluster;
  let pkiDir: string;
  const controllers: ControllerProc[] = [];
  let sim: Simulation | undefined;

  before(async () => {
    cloud = new TestCloud();
    etcd = await startEtcdCluster({ members: 3, dir: cloud.dir, netns: cloud.netns });
    const store = { type: 'etcd', endpoints: etcd.endpoints, prefix: `/atoll-${randomBytes(3).toString('hex')}/`, leaseTtlSeconds: 2 };
    pkiDir = join(cloud.dir, 'shared-pki');
    for (const [name, port] of [['ctl-a', 17471], ['ctl-b', 17472]] as const) {
      controllers.push(await cloud.startController(name, { port, store, extra: { pkiDir } }));
    }
  });

  after(async () => {
    if (sim && sim.proc.exitCode === null && sim.proc.signalCode === null) sim.proc.kill('SIGKILL');
    await etcd?.stop();
    await cloud?.cleanup();
    assert.deepEqual(leftoverNetns(), []);
  });

  test('all join and get a second block, no block twice, ipam check clean', async () => {
    await stormWithLeaderKilled(cloud, pkiDir, controllers, 'etcd', 'etc-', (s) => { sim = s; });
  });
});

describe(`${NODES} agents join two controllers over the Kubernetes store; the leader is killed midway`, { skip: rootSkipReason(), timeout: 240_000 }, () => {
  let cloud: TestCloud;
  let cp: ControlPlane;
  let pkiDir: string;
  const controllers: ControllerProc[] = [];
  let sim: Simulation | undefined;

  before(async () => {
    cloud = new TestCloud();
    cp = await startControlPlane(cloud.dir, { netns: cloud.netns });
    // installed as users install it: the manifest's CRDs and RBAC; the controllers run as its service account
    cp.kubectl(['apply', '--server-side', '-f', fileURLToPath(new URL('../../deploy/atoll.yaml', import.meta.url))]);
    cp.kubectl(['wait', '--for=condition=Established', '--timeout=60s', 'crd', '--all']);
    // the kubelets would have registered a Node for every agent (the controller admits only those)
    const width = String(NODES - 1).length;
    const nodes = Array.from({ length: NODES }, (_, i) => ({ apiVersion: 'v1', kind: 'Node', metadata: { name: `k8s-${String(i).padStart(width, '0')}` } }));
    cp.kubectl(['create', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: nodes }));
    const store = { type: 'kubernetes', leaseName: `atoll-${randomBytes(3).toString('hex')}`, leaseDurationSeconds: 3 };
    const token = cp.kubectl(['create', 'token', 'atoll-controller', '-n', 'atoll-system', '--duration=1h']).trim();
    const kubernetes = { kubeconfig: cp.kubeconfig(token, 'atoll-controller') };
    pkiDir = join(cloud.dir, 'shared-pki');
    for (const [name, port] of [['ctl-a', 17491], ['ctl-b', 17492]] as const) {
      controllers.push(await cloud.startController(name, { port, store, extra: { pkiDir, kubernetes } }));
    }
  });

  after(async () => {
    if (sim && sim.proc.exitCode === null && sim.proc.signalCode === null) sim.proc.kill('SIGKILL');
    await cp?.stop();
    await cloud?.cleanup();
    assert.deepEqual(leftoverNetns(), []);
  });

  test('all join and get a second block, no block twice, ipam check clean', async () => {
    const report = await stormWithLeaderKilled(cloud, pkiDir, controllers, 'kubernetes', 'k8s-', (s) => { sim = s; });
    // The same view from kubectl: one IPBlock per leased block, each labelled with its node.
    const blocks = JSON.parse(cp.kubectl(['get', 'ipblocks', '-o', 'json'])) as { items: { spec: { key: string }; metadata: { labels?: Record<string, string> } }[] };
    assert.equal(blocks.items.length, Object.values(report.blocks).flat().length);
    assert.ok(blocks.items.every((b) => b.metadata.labels?.['atoll.dev/node']?.startsWith('k8s-')));
  });
});
