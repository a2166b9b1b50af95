/**
 * The cloud controller's throughput and memory, and the agent's idle memory, in one run on one machine:
 *   throughput  registrations/s and block allocations/s through the real HTTPS API, for each store side by side
 *               (embedded; etcd with 1 member; etcd with 3 members; the Kubernetes store on a real kube-apiserver):
 *               a real controller process (`bin/atoll controller`) on 127.0.0.1, and simulated agents
 *               (harness/join-simulator.ts) in this process;
 *   controller  VmRSS and VmHWM of the controller process holding `--rss-nodes` registered nodes (default 5,000);
 *   agent       VmRSS of a real idle agent (harness/agent.ts) without and with a controller, against an empty
 *               Node process (`node -e "setInterval(()=>{},1e9)"`), which is what Node itself costs.
 * With `--reference PATH` (another checkout's `bin/atoll`), every throughput run of a store and the controller memory
 * are measured with both controllers, ours first in even runs and the reference first in odd ones, and the report
 * adds the ratio ours / reference per run (median, min and max).
 * bench/README.md explains what is measured and why.
 *
 * Usage: node bench/controller.ts [--smoke] [--nodes N] [--runs R] [--concurrency C] [--stores embedded,etcd1,etcd3,kubernetes]
 *        [--rss-nodes M] [--rss-store S] [--agent-samples K] [--no-agent] [--reference PATH [--reference-label TEXT]]
 *        [--json FILE] [--timeout SECONDS]
 */
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { accessSync, constants, existsSync, mkdtempSync, readFileSync, realpathSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, release, tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { adminRequest } from '../src/adapters/node/controller-client.ts';
import { ATOLL_BIN, PROJECT_NODE } from '../src/lab/agent-process.ts';
import { TestAgent } from '../harness/agent.ts';
import { type ControllerProc, TestCloud } from '../harness/cloud.ts';
import { type EtcdCluster, etcdSkipReason, startEtcdCluster } from '../harness/etcd.ts';
import { type ControlPlane, startControlPlane } from '../harness/kube.ts';
import { simulateJoins, type SimulationReport } from '../harness/join-simulator.ts';
import { delNetns, isRoot, leftoverNetns, RUN_PREFIX } from '../harness/netns.ts';
import { intOption, median, nearestRank, parseBenchArgs, removeRunTempDirs } from './common.ts';
import { ADMIN_TOKEN, BOOTSTRAP_TOKEN, type Controller, startController, stopController } from './controller-process.ts';

const AGENT_RSS_TARGET_MIB = 80;
const KIB_PER_MIB = 1024;

// ---------------------------------------------------------------------------------------------------------------
// Options

type StoreKey = 'embedded' | 'etcd1' | 'etcd3' | 'kubernetes';
const STORE_KEYS: readonly StoreKey[] = ['embedded', 'etcd1', 'etcd3', 'kubernetes'];
const STORE_LABEL: Record<StoreKey, string> = { embedded: 'embedded', etcd1: 'etcd, 1 member', etcd3: 'etcd, 3 members', kubernetes: 'kubernetes (CRDs)' };
const MANIFEST = join(import.meta.dirname, '..', 'deploy', 'atoll.yaml');

/** A build whose `bin/atoll controller` is measured: this checkout's ("ours"), or another one's (`--reference`). */
interface Build {
  readonly side: 'ours' | 'reference';
  readonly bin: string;
  /** How the report names it: "ours", or the reference's `--reference-label` (its commit by default). */
  readonly label: string;
}

const OURS: Build = { side: 'ours', bin: ATOLL_BIN, label: 'ours' };

interface Options {
  readonly smoke: boolean;
  readonly nodes: number;
  readonly runs: number;
  readonly concurrency: number;
  readonly stores: readonly StoreKey[];
  readonly rssNodes: number;
  readonly rssStore: StoreKey;
  readonly agentSamples: number;
  readonly settleMs: number;
  readonly agent: boolean;
  /** The build to compare ours with, run for run; none without `--reference`. */
  readonly reference: Build | undefined;
  readonly json: string | undefined;
  readonly timeoutS: number;
}

const USAGE = `usage: node bench/controller.ts [options]
  --smoke              tiny run for CI: 50 nodes, 1 run per store, 300 nodes for the RSS, 2 agent samples
  --nodes N            simulated agents per throughput run (default 500)
  --runs R             throughput runs per store, interleaved across stores (default 3)
  --concurrency C      requests in flight from the simulated agents (default 64)
  --stores LIST        stores to compare, of embedded,etcd1,etcd3,kubernetes (default all; etcd needs the etcd binary,
                       kubernetes the control plane of scripts/k8s.sh, built the first time)
  --rss-nodes M        registered nodes the controller holds when its memory is read (default 5000; 0 skips)
  --rss-store S        the store of that controller (default embedded)
  --agent-samples K    VmRSS samples per process, 1 s apart, after it settled (default 5)
  --no-agent           skip the agent memory part (it needs root)
  --reference PATH     also measure the controller of another build, the bin/atoll of another checkout (set up with
                       scripts/setup.sh): each throughput run of a store is made with ours and with it, ours first in
                       even runs, and the report adds ours / reference (median of the runs' ratios, min-max); the
                       controller memory is read for both
  --reference-label T  its name in the report (default: its checkout's commit, git rev-parse --short HEAD; else PATH)
  --json FILE          write every sample and summary to FILE
  --timeout SECONDS    abort (and clean up) after this long (default 3600; 300 with --smoke)`;

function parseOptions(argv: readonly string[]): Options {
  const values = parseBenchArgs(argv, USAGE, {
    nodes: { type: 'string' },
    runs: { type: 'string' },
    concurrency: { type: 'string' },
    stores: { type: 'string' },
    'rss-nodes': { type: 'string' },
    'rss-store': { type: 'string', default: 'embedded' },
    'agent-samples': { type: 'string' },
    'no-agent': { type: 'boolean', default: false },
    reference: { type: 'string' },
    'reference-label': { type: 'string' },
  });
  const smoke = values.smoke;
  const int = intOption(USAGE);
  const store = (s: string): StoreKey => {
    if (!(STORE_KEYS as readonly string[]).includes(s)) throw new Error(`unknown store "${s}"; the stores are ${STORE_KEYS.join(', ')}\n${USAGE}`);
    return s as StoreKey;
  };
  return {
    smoke,
    nodes: int('nodes', values.nodes, smoke ? 50 : 500, 1),
    runs: int('runs', values.runs, smoke ? 1 : 3, 1),
    concurrency: int('concurrency', values.concurrency, 64, 1),
    stores: (values.stores ?? STORE_KEYS.join(',')).split(',').filter(Boolean).map(store),
    rssNodes: int('rss-nodes', values['rss-nodes'], smoke ? 300 : 5000, 0),
    rssStore: store(values['rss-store']),
    agentSamples: int('agent-samples', values['agent-samples'], smoke ? 2 : 5, 1),
    settleMs: smoke ? 2000 : 5000,
    agent: !values['no-agent'],
    reference: referenceBuild(values.reference, values['reference-label']),
    json: values.json,
    timeoutS: int('timeout', values.timeout, smoke ? 300 : 3600, 1),
  };
}

/**
 * The `--reference` build: PATH made absolute, named by `label` or else by the commit of the checkout it is the
 * `bin/atoll` of (the directory above `bin/`, when that is a git checkout's top level), or else by PATH.
 * @throws Error when PATH is not an executable file, or a label is given without PATH.
 */
function referenceBuild(path: string | undefined, label: string | undefined): Build | undefined {
  if (path === undefined) {
    if (label !== undefined) throw new Error(`--reference-label needs --reference PATH\n${USAGE}`);
    return undefined;
  }
  const bin = resolve(path);
  try {
    accessSync(bin, constants.X_OK);
    if (!statSync(bin).isFile()) throw new Error('not a file');
  } catch (err) {
    throw new Error(`--reference ${path}: not an executable file (${err instanceof Error ? err.message : String(err)}); give the bin/atoll of a checkout set up with scripts/setup.sh`, { cause: err });
  }
  return { side: 'reference', bin, label: label ?? checkoutCommit(bin) ?? path };
}

/** The short commit of the git checkout whose `bin/` holds `bin`, or undefined when it is not in one. */
function checkoutCommit(bin: string): string | undefined {
  const root = dirname(dirname(realpathSync(bin)));
  const git = (args: readonly string[]) => spawnSync('git', ['-C', root, ...args], { encoding: 'utf8' });
  const top = git(['rev-parse', '--show-toplevel']);
  if (top.status !== 0 || realpathSync(top.stdout.trim()) !== root) return undefined;
  const head = git(['rev-parse', '--short', 'HEAD']);
  return head.status === 0 ? head.stdout.trim() : undefined;
}

// ---------------------------------------------------------------------------------------------------------------
// Resources: every process, etcd cluster, namespace and directory this run creates, and their removal

class Fixture {
  readonly dir: string = mkdtempSync(join(tmpdir(), `${RUN_PREFIX}cbench-`));
  readonly procs = new Set<ChildProcess>();
  readonly etcd = new Map<StoreKey, EtcdCluster>();
  kube: ControlPlane | undefined;
  kubeToken = '';
  /** Name prefixes whose Node objects exist on the control plane (registerNodes). */
  readonly kubeNodes = new Set<string>();
  readonly agents = new Set<TestAgent>();
  cloud: TestCloud | undefined;
  #cleaned: Promise<void> | undefined;

  /** Idempotent: kills our processes by pid, stops etcd, removes namespaces and directories. */
  cleanup(): Promise<void> {
    this.#cleaned ??= this.#cleanup();
    return this.#cleaned;
  }

  async #cleanup(): Promise<void> {
    for (const p of this.procs) if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
    for (const a of this.agents) await a.cleanup().catch((e: unknown) => process.stderr.write(`bench: agent cleanup failed: ${String(e)}\n`));
    for (const e of this.etcd.values()) await e.stop().catch((err: unknown) => process.stderr.write(`bench: etcd cleanup failed: ${String(err)}\n`));
    await this.kube?.stop().catch((err: unknown) => process.stderr.write(`bench: control plane cleanup failed: ${String(err)}\n`));
    await this.cloud?.cleanup().catch((e: unknown) => process.stderr.write(`bench: cloud cleanup failed: ${String(e)}\n`));
    if (isRoot()) for (const ns of leftoverNetns()) delNetns(ns); // only names with this process's unique prefix
    rmSync(this.dir, { recursive: true, force: true });
    removeRunTempDirs();
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Memory of a process, from /proc

interface Mem {
  readonly rssKiB: number;
  readonly hwmKiB: number;
}

function memOf(pid: number): Mem {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const field = (name: string) => Number(new RegExp(`^${name}:\\s+(\\d+) kB`, 'm').exec(status)?.[1] ?? NaN);
  return { rssKiB: field('VmRSS'), hwmKiB: field('VmHWM') };
}

/** `count` samples of VmRSS, `everyMs` apart; and VmHWM at the end. */
async function sampleMem(pid: number, count: number, everyMs = 1000): Promise<{ rssKiB: number[]; hwmKiB: number }> {
  const rssKiB: number[] = [];
  for (let i = 0; i < count; i++) {
    if (i > 0) await sleep(everyMs);
    rssKiB.push(memOf(pid).rssKiB);
  }
  return { rssKiB, hwmKiB: memOf(pid).hwmKiB };
}

/**
 * The store's sections of a controller configuration; etcd clusters and the Kubernetes control plane are started
 * once and shared (one prefix, or one StoreLog and Lease, a run).
 */
async function storeConfig(fx: Fixture, store: StoreKey): Promise<Record<string, unknown>> {
  if (store === 'embedded') return { store: { type: 'embedded' } };
  if (store === 'kubernetes') {
    if (!fx.kube) {
      fx.kube = await startControlPlane(fx.dir);
      fx.kube.kubectl(['apply', '--server-side', '-f', MANIFEST]);
      fx.kube.kubectl(['wait', '--for=condition=Established', '--timeout=60s', 'crd', '--all']);
      fx.kubeToken = fx.kube.kubectl(['create', 'token', 'atoll-controller', '-n', 'atoll-system', '--duration=24h']).trim();
    }
    // as installed: the manifest's CRDs and RBAC, the controller's service account
    return { store: { type: 'kubernetes', leaseName: `bench-${randomBytes(4).toString('hex')}` }, kubernetes: { kubeconfig: fx.kube.kubeconfig(fx.kubeToken, 'atoll-controller') } };
  }
  let etcd = fx.etcd.get(store);
  if (!etcd) {
    etcd = await startEtcdCluster({ members: store === 'etcd1' ? 1 : 3, dir: fx.dir });
    fx.etcd.set(store, etcd);
  }
  return { store: { type: 'etcd', endpoints: etcd.endpoints, prefix: `/bench-${randomBytes(4).toString('hex')}/` } };
}

interface IpamReport {
  readonly nodes: { name: string; blocks: string[] }[];
  readonly problems: unknown[];
}

/** Every block the controller leases, checked: none twice, no problem reported. */
async function leasedBlocks(c: Controller): Promise<number> {
  const report = (await adminRequest(c.url, c.caPem, ADMIN_TOKEN, 'GET', '/v1/ipam')) as IpamReport;
  const all = report.nodes.flatMap((n) => n.blocks);
  if (new Set(all).size !== all.length) throw new Error(`the controller leases a block twice: ${JSON.stringify(report).slice(0, 2000)}`);
  if (report.problems.length > 0) throw new Error(`ipam problems: ${JSON.stringify(report.problems).slice(0, 2000)}`);
  return all.length;
}

// ---------------------------------------------------------------------------------------------------------------
// Throughput

interface ThroughputRun {
  readonly store: StoreKey;
  /** Only with --reference: which controller ran. */
  readonly build?: Build['side'];
  readonly run: number;
  readonly nodes: number;
  readonly joinPhaseMs: number;
  readonly reportPhaseMs: number;
  readonly registrationsPerS: number;
  /** Blocks leased in the report phase (one per node, more if a timed-out report was retried). */
  readonly allocations: number;
  readonly allocationsPerS: number;
  readonly joinRequestMs: number[];
  readonly reportRequestMs: number[];
  readonly attempts: number;
  readonly controllerHwmKiB: number;
}

/**
 * On the Kubernetes store the controller admits only agents whose Node exists (as kubelets would have registered
 * them): create `count` Nodes named as the simulator names its agents. Once per prefix (ours and the reference join
 * the same Nodes in a run, so both controllers follow the same set). Nothing for the other stores.
 */
function registerNodes(fx: Fixture, store: StoreKey, prefix: string, count: number): void {
  if (store !== 'kubernetes' || !fx.kube || fx.kubeNodes.has(prefix)) return;
  fx.kubeNodes.add(prefix);
  const width = String(count - 1).length;
  const items = Array.from({ length: count }, (_, i) => ({ apiVersion: 'v1', kind: 'Node', metadata: { name: `${prefix}${String(i).padStart(width, '0')}` } }));
  fx.kube.kubectl(['create', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items }));
}

/**
 * One run: a fresh controller of `build` (and store prefix); `nodes` agents join at once, then, once all have joined,
 * each reports free = 0 and gets a second block. The two phases are timed apart.
 */
async function throughputRun(fx: Fixture, store: StoreKey, run: number, opts: Options, build: Build = OURS): Promise<ThroughputRun> {
  const config = await storeConfig(fx, store);
  registerNodes(fx, store, `b${run}-`, opts.nodes);
  const c = await startController(fx, `${store}-run${run}${build.side === 'reference' ? '-ref' : ''}`, config, build.bin);
  try {
    const report: SimulationReport = await simulateJoins({
      urls: [c.url], caPem: c.caPem, token: BOOTSTRAP_TOKEN, count: opts.nodes, prefix: `b${run}-`, deadlineMs: 900_000,
      concurrency: opts.concurrency, secondBlock: true, phased: true, requestTimeoutMs: 120_000,
    });
    if (report.failed > 0) throw new Error(`${report.failed} simulated agents failed against ${STORE_LABEL[store]}: ${JSON.stringify(report.errors.slice(0, 5))}`);
    const leased = await leasedBlocks(c);
    const joinPhaseMs = report.joinPhaseMs ?? NaN;
    const reportPhaseMs = report.reportPhaseMs ?? NaN;
    const allocations = leased - report.joined;
    return {
      store, ...(opts.reference ? { build: build.side } : {}), run, nodes: opts.nodes, joinPhaseMs, reportPhaseMs,
      registrationsPerS: report.joined / (joinPhaseMs / 1000), allocations, allocationsPerS: allocations / (reportPhaseMs / 1000),
      joinRequestMs: report.joinRequestMs, reportRequestMs: report.reportRequestMs, attempts: report.attempts, controllerHwmKiB: memOf(c.pid).hwmKiB,
    };
  } finally {
    await stopController(fx, c);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Controller memory holding many nodes

interface ControllerMemory {
  readonly store: StoreKey;
  /** Only with --reference: which controller ran. */
  readonly build?: Build['side'];
  readonly nodes: number;
  readonly idleAtStart: { rssKiB: number[]; hwmKiB: number };
  readonly registerMs: number;
  readonly holding: { rssKiB: number[]; hwmKiB: number };
}

async function controllerMemory(fx: Fixture, opts: Options, build: Build = OURS): Promise<ControllerMemory> {
  const config = await storeConfig(fx, opts.rssStore);
  registerNodes(fx, opts.rssStore, 'm-', opts.rssNodes);
  const c = await startController(fx, `rss-${opts.rssStore}${build.side === 'reference' ? '-ref' : ''}`, config, build.bin);
  try {
    await sleep(opts.settleMs);
    const idleAtStart = await sampleMem(c.pid, opts.agentSamples);
    const t0 = performance.now();
    const report = await simulateJoins({ urls: [c.url], caPem: c.caPem, token: BOOTSTRAP_TOKEN, count: opts.rssNodes, prefix: 'm-', deadlineMs: 3_600_000, concurrency: opts.concurrency, requestTimeoutMs: 120_000 });
    if (report.failed > 0) throw new Error(`${report.failed} of ${opts.rssNodes} agents failed to join: ${JSON.stringify(report.errors.slice(0, 5))}`);
    const registerMs = performance.now() - t0;
    const leased = await leasedBlocks(c);
    if (leased !== opts.rssNodes) throw new Error(`${leased} blocks leased to ${opts.rssNodes} nodes`);
    await sleep(opts.settleMs);
    const holding = await sampleMem(c.pid, opts.agentSamples);
    return { store: opts.rssStore, ...(opts.reference ? { build: build.side } : {}), nodes: opts.rssNodes, idleAtStart, registerMs, holding };
  } finally {
    await stopController(fx, c);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Agent idle memory

interface ProcessMemory {
  readonly what: string;
  readonly rssKiB: number[];
  readonly hwmKiB: number;
  readonly target: boolean;
}

async function referenceMemory(fx: Fixture, opts: Options, flags: readonly string[], what: string): Promise<ProcessMemory> {
  const proc = spawn(PROJECT_NODE, [...flags, '-e', 'setInterval(()=>{},1e9)'], { stdio: 'ignore' });
  fx.procs.add(proc);
  try {
    await sleep(opts.settleMs);
    const m = await sampleMem(proc.pid as number, opts.agentSamples);
    return { what, ...m, target: false };
  } finally {
    proc.kill('SIGKILL');
    fx.procs.delete(proc);
  }
}

function agentBlocks(agent: TestAgent): string[] {
  const path = join(agent.dataDir, 'cluster-state.json');
  return existsSync(path) ? ((JSON.parse(readFileSync(path, 'utf8')) as { blocks?: string[] }).blocks ?? []) : [];
}

/** A real agent, started and left alone until idle; with `cloud`, it joins a controller there first. */
async function agentMemory(fx: Fixture, opts: Options, withController: boolean): Promise<ProcessMemory> {
  const agent = new TestAgent({ name: withController ? 'rssc' : 'rssa', podCidrs: withController ? [] : ['10.77.0.0/24'], config: { resyncPeriod: 60 } });
  fx.agents.add(agent);
  try {
    if (withController) {
      fx.cloud ??= new TestCloud();
      const ctl: ControllerProc = await fx.cloud.startController('rss-agent-ctl', { port: 17481 });
      const ip = fx.cloud.connect(agent.netns);
      agent.rewriteConfig({ controller: { ...fx.cloud.controllerConfig([ctl]), usagePeriod: 10 }, underlayAddresses: [ip] });
    }
    await agent.start();
    if (withController) {
      const deadline = Date.now() + 30_000;
      while (agentBlocks(agent).length === 0) {
        if (Date.now() > deadline) throw new Error(`the agent got no block from the controller within 30 s:\n${agent.dump()}`);
        await sleep(100);
      }
    }
    await sleep(opts.settleMs);
    const m = await sampleMem(agent.pid as number, opts.agentSamples);
    return { what: withController ? 'agent, joined to a controller' : 'agent, no controller', ...m, target: true };
  } finally {
    await agent.cleanup();
    fx.agents.delete(agent);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Statistics and the report

/** Aligned columns under a head: the first `leftColumns` left-aligned, the rest right-aligned. */
function table(head: readonly string[], rows: readonly (readonly string[])[], leftColumns = 1): string {
  const widths = head.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const line = (r: readonly string[]) => r.map((c, i) => (i < leftColumns ? c.padEnd(widths[i] ?? 0) : c.padStart(widths[i] ?? 0))).join('  ').trimEnd();
  return [line(head), widths.map((w) => '-'.repeat(w)).join('  '), ...rows.map(line)].join('\n');
}

const mib = (kib: number) => (kib / KIB_PER_MIB).toFixed(1);
const f0 = (n: number) => (Number.isFinite(n) ? n.toFixed(0) : '-');

const THROUGHPUT_HEAD = ['registrations/s', 'join p50 ms', 'join p99 ms', 'allocations/s', 'alloc p50 ms', 'alloc p99 ms', 'ctl VmHWM MiB'];

/** The throughput columns of some runs: medians over the runs, latency percentiles over all their requests. */
function throughputCells(runs: readonly ThroughputRun[]): string[] {
  const joins = runs.flatMap((r) => r.joinRequestMs);
  const reports = runs.flatMap((r) => r.reportRequestMs);
  return [f0(median(runs.map((r) => r.registrationsPerS))), f0(median(joins)), f0(nearestRank(joins, 99)),
    f0(median(runs.map((r) => r.allocationsPerS))), f0(median(reports)), f0(nearestRank(reports, 99)), mib(median(runs.map((r) => r.controllerHwmKiB)))];
}

function throughputTable(runs: readonly ThroughputRun[], stores: readonly StoreKey[]): string {
  return table(['store', ...THROUGHPUT_HEAD], stores.map((s) => [STORE_LABEL[s], ...throughputCells(runs.filter((r) => r.store === s))]));
}

/** A ratio ours / reference over runs: each run's, and their median, min and max. */
interface Ratio {
  readonly perRun: number[];
  readonly median: number;
  readonly min: number;
  readonly max: number;
}

interface StoreRatios {
  readonly registrationsPerS: Ratio;
  readonly allocationsPerS: Ratio;
}

/** Ours / reference of each run of `store` that both made (a run is paired by its index). */
function storeRatios(runs: readonly ThroughputRun[], store: StoreKey): StoreRatios {
  const side = (b: Build['side']) => new Map(runs.filter((r) => r.store === store && r.build === b).map((r) => [r.run, r]));
  const ours = side('ours');
  const reference = side('reference');
  const pairs = [...ours].flatMap(([run, o]) => {
    const r = reference.get(run);
    return r ? [[o, r] as const] : [];
  });
  const ratio = (of: (r: ThroughputRun) => number): Ratio => {
    const perRun = pairs.map(([o, r]) => of(o) / of(r));
    return { perRun, median: median(perRun), min: Math.min(...perRun), max: Math.max(...perRun) };
  };
  return { registrationsPerS: ratio((r) => r.registrationsPerS), allocationsPerS: ratio((r) => r.allocationsPerS) };
}

const f2 = (n: number) => (Number.isFinite(n) ? n.toFixed(2) : '-');
const ratioCell = (r: Ratio) => `${f2(r.median)} (${f2(r.min)}-${f2(r.max)})`;

/** Per store: ours, the reference, and ours / reference of registrations/s and allocations/s. */
function comparisonTable(runs: readonly ThroughputRun[], stores: readonly StoreKey[], reference: Build, ratios: Readonly<Record<string, StoreRatios>>): string {
  const rows = stores.flatMap((s) => {
    const ratio = ratios[s] as StoreRatios;
    const of = (b: Build['side']) => throughputCells(runs.filter((r) => r.store === s && r.build === b));
    return [
      [STORE_LABEL[s], OURS.label, ...of('ours')],
      ['', reference.label, ...of('reference')],
      ['', `${OURS.label} / ${reference.label}`, ratioCell(ratio.registrationsPerS), '', '', ratioCell(ratio.allocationsPerS), '', '', ''],
    ];
  });
  return table(['store', 'controller', ...THROUGHPUT_HEAD], rows, 2);
}

/** VmRSS and VmHWM just started and holding the nodes, of one controller or side by side (columns named by label). */
function memoryTable(sides: readonly (readonly [string, ControllerMemory])[]): string {
  const col = (what: string) => sides.map(([label]) => (sides.length > 1 ? `${what} ${label}` : what));
  const cells = (of: (m: ControllerMemory) => { rssKiB: number[]; hwmKiB: number }) => [
    ...sides.map(([, m]) => mib(median(of(m).rssKiB))), ...sides.map(([, m]) => mib(of(m).hwmKiB))];
  const nodes = sides[0]?.[1].nodes ?? 0;
  return table(['controller process', ...col('VmRSS MiB'), ...col('VmHWM MiB')], [
    ['just started, no node', ...cells((m) => m.idleAtStart)],
    [`holding ${nodes} nodes`, ...cells((m) => m.holding)],
  ]);
}

// ---------------------------------------------------------------------------------------------------------------
// Main

async function main(argv: readonly string[]): Promise<number> {
  const opts = parseOptions(argv);
  const fx = new Fixture();
  const abort = (code: number, why: string) => {
    process.stderr.write(`bench: ${why}; cleaning up\n`);
    void fx.cleanup().finally(() => process.exit(code));
  };
  process.once('SIGINT', () => abort(130, 'interrupted'));
  process.once('SIGTERM', () => abort(143, 'terminated'));
  const timer = setTimeout(() => abort(2, `timed out after ${opts.timeoutS} s`), opts.timeoutS * 1000);
  timer.unref();

  const etcdMissing = etcdSkipReason();
  const stores = opts.stores.filter((s) => !s.startsWith('etcd') || !etcdMissing);
  const skipped = opts.stores.filter((s) => !stores.includes(s)).map((s) => `${STORE_LABEL[s]} (${etcdMissing})`);
  const machine = { cpus: cpus().length, cpu: cpus()[0]?.model, kernel: release(), node: spawnSync(PROJECT_NODE, ['--version'], { encoding: 'utf8' }).stdout.trim(),
    etcd: etcdMissing ? undefined : /etcd Version: (\S+)/.exec(spawnSync('etcd', ['--version'], { encoding: 'utf8' }).stdout)?.[1], loadAtStart: loadavg() };
  process.stdout.write(`# controller bench: ${opts.nodes} simulated agents x ${opts.runs} run(s) per store, ${opts.concurrency} requests in flight; ` +
    `${machine.cpus} CPUs, node ${machine.node}, etcd ${machine.etcd ?? '-'}, load ${machine.loadAtStart.map((l) => l.toFixed(2)).join(' ')}\n`);
  if (skipped.length > 0) process.stdout.write(`# skipped: ${skipped.join('; ')}\n`);
  const ref = opts.reference;
  if (ref) process.stdout.write(`# ours: ${OURS.bin}; reference ${ref.label}: ${ref.bin}; each run of a store is made with both, ours first in even runs\n`);

  try {
    const runs: ThroughputRun[] = [];
    for (let run = 0; run < opts.runs; run++) {
      // interleaved, and the store order rotates each run, so drift and background load hit every store alike; with
      // a reference, each store's run is made with both controllers back to back, which goes first alternating
      for (let i = 0; i < stores.length; i++) {
        const store = stores[(i + run) % stores.length] as StoreKey;
        const builds = !ref ? [OURS] : run % 2 === 0 ? [OURS, ref] : [ref, OURS];
        for (const build of builds) {
          const r = await throughputRun(fx, store, run, opts, build);
          runs.push(r);
          process.stdout.write(`#   run ${run + 1} ${STORE_LABEL[store]}${ref ? `, ${build.label}` : ''}: ${f0(r.registrationsPerS)} registrations/s, ${f0(r.allocationsPerS)} allocations/s (${r.allocations} blocks)\n`);
        }
      }
    }
    process.stdout.write(`\n## Throughput through the API (${opts.nodes} agents join at once, then each gets a second block; medians of ${opts.runs} run(s))\n\n`);
    const ratios = ref ? Object.fromEntries(stores.map((s) => [s, storeRatios(runs, s)])) : undefined;
    process.stdout.write(`${ref && ratios ? comparisonTable(runs, stores, ref, ratios) : throughputTable(runs, stores)}\n`);
    if (ref) process.stdout.write(`(${OURS.label} / ${ref.label}: the median of the ${opts.runs} run(s)' ratios, and their min-max)\n`);

    let ctlMem: ControllerMemory | undefined;
    let refMem: ControllerMemory | undefined;
    if (opts.rssNodes > 0 && stores.includes(opts.rssStore)) {
      ctlMem = await controllerMemory(fx, opts);
      if (ref) refMem = await controllerMemory(fx, opts, ref);
      const sides: [string, ControllerMemory][] = [[OURS.label, ctlMem], ...(ref && refMem ? [[ref.label, refMem] as [string, ControllerMemory]] : [])];
      process.stdout.write(`\n## Controller memory (${STORE_LABEL[ctlMem.store]} store; median of ${opts.agentSamples} VmRSS samples)\n\n`);
      process.stdout.write(`${memoryTable(sides)}\n`);
      for (const [label, m] of sides) {
        process.stdout.write(`(${sides.length > 1 ? `${label}: ` : ''}registering the ${m.nodes} nodes took ${(m.registerMs / 1000).toFixed(1)} s: ${f0(m.nodes / (m.registerMs / 1000))} registrations/s on average)\n`);
      }
    }

    const procs: ProcessMemory[] = [];
    if (opts.agent && !isRoot()) process.stdout.write('\n# agent memory skipped: needs root (network namespaces)\n');
    else if (opts.agent) {
      procs.push(await referenceMemory(fx, opts, [], 'node -e "setInterval(()=>{},1e9)"'));
      procs.push(await referenceMemory(fx, opts, ['--max-semi-space-size=1'], 'the same, with bin/atoll\'s --max-semi-space-size=1'));
      procs.push(await agentMemory(fx, opts, false));
      procs.push(await agentMemory(fx, opts, true));
      process.stdout.write(`\n## Idle memory (median of ${opts.agentSamples} VmRSS samples, 1 s apart, after ${opts.settleMs / 1000} s settling)\n\n`);
      process.stdout.write(`${table(['process', 'VmRSS MiB', 'VmHWM MiB', `target <= ${AGENT_RSS_TARGET_MIB} MiB`], procs.map((p) => [p.what, mib(median(p.rssKiB)), mib(p.hwmKiB),
        p.target ? (median(p.rssKiB) <= AGENT_RSS_TARGET_MIB * KIB_PER_MIB ? 'PASS' : 'MISS') : '']))}\n`);
    }

    if (opts.json) {
      // with a reference: `throughput` holds both controllers' runs in the order made (each with its `build`),
      // `reference` its memory and the ratios ours / reference per store
      const reference = ref && { bin: ref.bin, label: ref.label, ratios, controllerMemory: refMem };
      writeFileSync(opts.json, JSON.stringify({ options: opts, machine: { ...machine, loadAtEnd: loadavg() }, skipped, throughput: runs, controllerMemory: ctlMem, reference, idleMemory: procs }, null, 2));
    }
    process.stdout.write(`\n# load at end ${loadavg().map((l) => l.toFixed(2)).join(' ')}\n`);
    return 0;
  } finally {
    clearTimeout(timer);
    await fx.cleanup();
    if (isRoot()) {
      const left = leftoverNetns();
      if (left.length > 0) process.stderr.write(`bench: namespaces left behind: ${left.join(' ')}\n`);
    }
  }
}

main(process.argv.slice(2)).then((code) => {
  process.exitCode = code;
}, (err: unknown) => {
  process.stderr.write(`bench: ${err instanceof Error ? err.stack ?? err.message : String(err)}\n`);
  process.exitCode = 1;
});
