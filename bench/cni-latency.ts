/**
 * CNI ADD/DEL latency and peak RSS of the CNI process, side by side in one run on one machine:
 *   ours       the real `atoll-cni` native shim talking to a real `atoll agent` (harness/agent.ts);
 *   reference  Debian's `bridge` plugin with `host-local` IPAM (/usr/lib/cni).
 *
 * Each side gets its own throwaway "node" network namespace. Both plugin binaries are started by the same launcher:
 * the driver switches its main thread into the side's node namespace with setns(2), spawns the plugin (the child is
 * forked from that thread, so it lives there) and switches back. No helper process (nsenter) runs on either path.
 * Calls alternate between the sides (ours first on even iterations, the reference first on odd ones) so drift and
 * background load hit both alike. bench/README.md explains what is measured and why.
 *
 * `--policy` (issue #35's target: ADD p50 with NetworkPolicy on at most 1 ms more than with it off) compares two of
 * our agents instead, alike but for NetworkPolicy: (A) off, today's configuration; (B) on, with a kept view
 * (`policy-view.json` in its data directory, read at start) holding bench/policy-cluster.ts's synthetic cluster and,
 * as pods of B's node, every pod the run ADDs, which the cluster's policies isolate. So each ADD and DEL on B changes
 * the node's isolated pods and the agent compiles and applies its ruleset after it, in the background of the calls
 * that follow. Before timing, a pod ADDed on B must show in the agent's status (isolated pods) and in the kernel
 * (its address in the policy table's ingress map), or the run fails. No peak-RSS mode there (the same shim on both
 * sides); one at a time and C at once as without it.
 *
 * Usage: node bench/cni-latency.ts [--smoke] [--policy] [--iterations N] [--rounds R] [--concurrency C]
 *        [--rss-samples K] [--warmup W] [--json FILE] [--agent-log FILE] [--timeout SECONDS] [--enforce]
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { spawnSync } from 'node:child_process';
import { closeSync, copyFileSync, existsSync, mkdirSync, mkdtempSync, openSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, release, tmpdir } from 'node:os';
import { join } from 'node:path';
import { setImmediate as nextTurn, setTimeout as sleep } from 'node:timers/promises';
import { inNetns } from '../src/adapters/kernel/netns.ts';
import { readAgentStatus, statusSocketOf } from '../src/adapters/ops/status-socket.ts';
import type { AgentStatus } from '../src/core/ops/agent-status.ts';
import { POLICY_TABLE } from '../src/core/policy/nft.ts';
import type { NodePolicyView } from '../src/core/policy/scope.ts';
import { TestAgent } from '../harness/agent.ts';
import { addNetns, delNetns, isRoot, leftoverNetns, RUN_PREFIX } from '../harness/netns.ts';
import { cleanUpOnExit, exitStatus, fmt, intOption, nearestRank, parseBenchArgs, removeRunTempDirs, runBench, table } from './common.ts';
import { ADDED_POD_NAMESPACE, nodePolicyView, SEED, synthesize } from './policy-cluster.ts';
import { bootstrapDifference, type DifferenceInterval } from './ratio-interval.ts';
import { seeded } from './seeded.ts';

const GNU_TIME = '/usr/bin/time';
const REF_DIR = '/usr/lib/cni';
const CALL_TIMEOUT_MS = 30_000;
/** --policy: the target's allowance, ADD p50 with NetworkPolicy on minus off, one at a time. */
const POLICY_ADD_ALLOWANCE_MS = 1;
/** --policy: side B's agent compiles and applies the whole cluster before it serves; a loaded 2-core machine takes seconds. */
const POLICY_AGENT_START_MS = 120_000;
/** --policy: how long the ADDed check pod may take to show as isolated (the agent applies in the background). */
const ENFORCED_WITHIN_MS = 30_000;
const BOOTSTRAP_DRAWS = 2000;

// ---------------------------------------------------------------------------------------------------------------
// Options

interface Options {
  readonly smoke: boolean;
  readonly iterations: number;
  readonly rounds: number;
  readonly concurrency: number;
  readonly rssSamples: number;
  readonly warmup: number;
  readonly timeoutS: number;
  readonly enforce: boolean;
  readonly json: string | undefined;
  readonly agentLog: string | undefined;
  readonly metrics: boolean;
  /** Compare our agent with NetworkPolicy off (A) and on (B), no reference plugin. */
  readonly policy: boolean;
}

const USAGE = `usage: node bench/cni-latency.ts [options]
  --smoke              tiny run for CI: 10 one at a time, 1 round at once, 5 RSS samples
  --policy             two of our agents, NetworkPolicy off (A) and on (B, a kept view of bench/policy-cluster.ts's
                       1,000 policies isolating every pod ADDed), instead of ours and the reference; one at a time
                       and C at once as usual, no peak-RSS mode (--rss-samples must stay 0)
  --iterations N       one-at-a-time ADD+DEL cycles per side (default 100)
  --rounds R           rounds of C concurrent ADDs then C concurrent DELs per side (default 5)
  --concurrency C      calls at once in a round (default 30)
  --rss-samples K      ADD+DEL cycles per side under ${GNU_TIME} -f %M (default 20; 0 with --policy)
  --warmup W           unrecorded cycles per side before the one-at-a-time mode (default 3)
  --json FILE          write every sample and summary to FILE
  --agent-log FILE     keep a copy of the agent's debug log (with --policy: FILE.policy-off and FILE.policy-on)
  --timeout SECONDS    abort (and clean up) after this long (default 900; 120 with --smoke)
  --metrics            run our agent with its metrics listener on (loopback of its namespace), to compare
  --enforce            exit 1 when a target is missed (default: report only)`;

function parseOptions(argv: readonly string[]): Options {
  const values = parseBenchArgs(argv, USAGE, {
    iterations: { type: 'string' },
    rounds: { type: 'string' },
    concurrency: { type: 'string' },
    'rss-samples': { type: 'string' },
    warmup: { type: 'string' },
    enforce: { type: 'boolean', default: false },
    'agent-log': { type: 'string' },
    metrics: { type: 'boolean', default: false },
    policy: { type: 'boolean', default: false },
  });
  const smoke = values.smoke;
  const int = intOption(USAGE);
  const policy = values.policy;
  if (policy && values['rss-samples'] !== undefined && values['rss-samples'] !== '0') {
    throw new Error(`--policy has no peak-RSS mode (both sides run the same shim): leave --rss-samples out\n${USAGE}`);
  }
  return {
    smoke,
    iterations: int('iterations', values.iterations, smoke ? 10 : 100, 1),
    rounds: int('rounds', values.rounds, smoke ? 1 : 5, 0),
    concurrency: int('concurrency', values.concurrency, 30, 1),
    rssSamples: policy ? 0 : int('rss-samples', values['rss-samples'], smoke ? 5 : 20, 0),
    warmup: int('warmup', values.warmup, smoke ? 1 : 3, 0),
    timeoutS: int('timeout', values.timeout, smoke ? 120 : 900, 1),
    enforce: values.enforce,
    json: values.json,
    agentLog: values['agent-log'],
    metrics: values.metrics,
    policy,
  };
}

// ---------------------------------------------------------------------------------------------------------------
// Resources: every namespace, directory and process this run creates, and their removal

/** Everything the run creates; `cleanup()` removes it all, once, whichever way the run ends. */
class Fixture {
  readonly dir: string = mkdtempSync(join(tmpdir(), `${RUN_PREFIX}bench-`));
  readonly agents: TestAgent[] = [];
  refNs: string | undefined;
  readonly #pods = new Set<string>();
  readonly live = new Set<ChildProcess>();
  #stopping = false;
  #cleaned: Promise<void> | undefined;

  get stopping(): boolean {
    return this.#stopping;
  }

  /** A fresh pod namespace named with the run prefix; returns its full name. */
  addPodNetns(name: string): string {
    if (this.#stopping) throw new Error('the benchmark is stopping');
    const full = addNetns(name);
    this.#pods.add(full);
    return full;
  }

  delPodNetns(full: string): void {
    delNetns(full);
    this.#pods.delete(full);
  }

  /** Idempotent; kills plugin processes in flight and the agent, removes namespaces and temporary directories. */
  cleanup(): Promise<void> {
    this.#cleaned ??= this.#cleanup();
    return this.#cleaned;
  }

  async #cleanup(): Promise<void> {
    this.#stopping = true;
    for (const c of this.live) c.kill('SIGKILL');
    for (const agent of this.agents) {
      try {
        await agent.cleanup();
      } catch (e) {
        process.stderr.write(`bench: agent cleanup failed: ${String(e)}\n`);
      }
    }
    for (const p of this.#pods) delNetns(p);
    if (this.refNs) delNetns(this.refNs);
    for (const ns of leftoverNetns()) delNetns(ns); // only names with this process's unique prefix
    rmSync(this.dir, { recursive: true, force: true });
    removeRunTempDirs();
  }
}

// ---------------------------------------------------------------------------------------------------------------
// The launcher, identical for both sides

interface Call {
  /** Wall time from just before spawn to the child's exit, in ms. */
  readonly ms: number;
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
}

/**
 * Spawns `argv` inside the network namespace at `nsPath` (setns on the main thread around a synchronous spawn, no
 * helper process) and times it from spawn to exit. Kills it after CALL_TIMEOUT_MS.
 *
 * stdin is the file `stdinPath` itself, not a pipe fed by this process: a pipe's EOF would wait for this event loop,
 * which is busy while it spawns a burst of calls, and every plugin reads stdin to EOF before doing anything.
 */
function launch(fx: Fixture, nsPath: string, argv: readonly string[], env: Record<string, string>, stdinPath?: string): Promise<Call> {
  const [cmd, ...args] = argv as [string, ...string[]];
  let t0 = 0n;
  const stdin = stdinPath === undefined ? 'ignore' : openSync(stdinPath, 'r');
  let child: ChildProcess;
  try {
    child = inNetns(nsPath, () => {
      t0 = process.hrtime.bigint();
      return spawn(cmd, args, { env, stdio: [stdin, 'pipe', 'pipe'] });
    });
  } finally {
    if (typeof stdin === 'number') closeSync(stdin);
  }
  fx.live.add(child);
  return new Promise((resolve, reject) => {
    let ms = 0;
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    const timer = setTimeout(() => child.kill('SIGKILL'), CALL_TIMEOUT_MS);
    child.stdout?.on('data', (d: Buffer) => out.push(d));
    child.stderr?.on('data', (d: Buffer) => err.push(d));
    child.on('error', (e) => {
      clearTimeout(timer);
      fx.live.delete(child);
      reject(e);
    });
    child.on('exit', () => {
      ms = Number(process.hrtime.bigint() - t0) / 1e6;
    });
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      fx.live.delete(child);
      const stderr = Buffer.concat(err).toString('utf8') + (signal ? `\n(killed by ${signal})` : '');
      resolve({ ms, code: code ?? 128, stdout: Buffer.concat(out).toString('utf8'), stderr });
    });
  });
}

// ---------------------------------------------------------------------------------------------------------------
// The two sides

/** ours and reference by default; with --policy, our agent with NetworkPolicy off (A) and on (B). */
type SideKey = 'ours' | 'reference' | 'policy-off' | 'policy-on';

interface Side {
  readonly key: SideKey;
  /** The agent behind the plugin, for ours. */
  readonly agent?: TestAgent;
  /** K8S_POD_NAMESPACE of every call. */
  readonly podNamespace: string;
  /** One letter for namespace names. */
  readonly tag: string;
  /** The node namespace the plugin runs in. */
  readonly nsPath: string;
  readonly plugin: string;
  readonly cniPath: string;
  /** File holding the network configuration passed on stdin. */
  readonly config: string;
}

/** The two sides of a run: `first` is ours (or A, NetworkPolicy off) and goes first on even steps. */
interface Sides {
  readonly first: Side;
  readonly second: Side;
}

const keysOf = (opts: Options): readonly [SideKey, SideKey] => (opts.policy ? ['policy-off', 'policy-on'] : ['ours', 'reference']);

type Verb = 'ADD' | 'DEL';

interface PodRef {
  readonly containerId: string;
  readonly podName: string;
  /** Full name of the pod namespace. */
  readonly netns: string;
}

function cniEnv(side: Side, verb: Verb, pod: PodRef): Record<string, string> {
  return {
    PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
    CNI_COMMAND: verb,
    CNI_CONTAINERID: pod.containerId,
    CNI_NETNS: `/var/run/netns/${pod.netns}`,
    CNI_IFNAME: 'eth0',
    CNI_PATH: side.cniPath,
    CNI_ARGS: `IgnoreUnknown=1;K8S_POD_NAMESPACE=${side.podNamespace};K8S_POD_NAME=${pod.podName};K8S_POD_INFRA_CONTAINER_ID=${pod.containerId}`,
  };
}

/** One CNI call through the launcher; `wrap` prefixes the plugin's argv (GNU time). Throws unless it succeeded. */
async function cni(fx: Fixture, side: Side, verb: Verb, pod: PodRef, wrap: readonly string[] = []): Promise<Call> {
  const call = await launch(fx, side.nsPath, [...wrap, side.plugin], cniEnv(side, verb, pod), side.config);
  let ok = call.code === 0;
  if (ok && verb === 'ADD') {
    try {
      const res = JSON.parse(call.stdout) as { ips?: { address?: string }[] };
      ok = typeof res.ips?.[0]?.address === 'string';
    } catch {
      ok = false;
    }
  }
  if (!ok) {
    const extra = side.agent ? `\n${side.agent.dump()}` : '';
    throw new Error(`${side.key} ${verb} of ${pod.containerId} failed (exit ${call.code})\nstdout: ${call.stdout}\nstderr: ${call.stderr}${extra}`);
  }
  return call;
}

/** The smallest pod CIDR of at least /22 (at most /16) that holds every ADD of this run with room to spare. */
function oursPodCidr(opts: Options): string {
  const adds = opts.warmup + opts.iterations + opts.rounds * opts.concurrency + opts.rssSamples;
  let bits = 22;
  while (bits > 16 && 2 ** (32 - bits) - 3 < adds * 1.25) bits--;
  return `10.78.0.0/${bits}`;
}

type OurSide = 'ours' | 'policy-off' | 'policy-on';
/** Each agent's node name (and short name in its namespaces), which B's kept view puts its pods on. */
const OUR_AGENT_NAME: Record<OurSide, string> = { ours: 'bench', 'policy-off': 'poloff', 'policy-on': 'polon' };

/**
 * Our agent and its plugin. `key` policy-on turns NetworkPolicy on; `view`, written before the agent starts, is its
 * kept view (its pods' node must be OUR_AGENT_NAME[key]).
 */
async function setUpOurs(fx: Fixture, opts: Options, key: OurSide = 'ours', view?: NodePolicyView): Promise<Side> {
  // The production reconcile period (60 s) rather than the test harness's 2 s: we measure what a node would see.
  const config = { resyncPeriod: 60, ...(opts.metrics ? { metrics: {} } : {}), ...(key === 'policy-on' ? { networkPolicy: true } : {}) };
  const agent = new TestAgent({ name: OUR_AGENT_NAME[key], podCidrs: [oursPodCidr(opts)], config });
  fx.agents.push(agent);
  if (view) {
    mkdirSync(agent.dataDir, { recursive: true });
    writeFileSync(join(agent.dataDir, 'policy-view.json'), `${JSON.stringify({ type: 'snapshot', ...view })}\n`);
  }
  await agent.start(key === 'policy-on' ? POLICY_AGENT_START_MS : undefined);
  const plugin = join(agent.binDir, 'atoll-cni'); // installed by the agent at start, as on a node
  for (let waited = 0; !existsSync(plugin); waited += 50) {
    if (waited >= 5000) throw new Error(`the agent did not install ${plugin} within 5 s:\n${agent.dump()}`);
    await sleep(50);
  }
  const netconf = join(fx.dir, `${key}.json`);
  writeFileSync(netconf, agent.netconf('1.0.0'));
  const tag = { ours: 'o', 'policy-off': 'a', 'policy-on': 'b' }[key];
  const podNamespace = opts.policy ? ADDED_POD_NAMESPACE : 'bench';
  return { key, agent, podNamespace, tag, nsPath: `/var/run/netns/${agent.netns}`, plugin, cniPath: `${agent.binDir}:${REF_DIR}`, config: netconf };
}

function setUpReference(fx: Fixture): Side {
  fx.refNs = addNetns('ref-node');
  const bridge = `atr${RUN_PREFIX.slice(5, 11)}ref`; // 12 characters
  const netconf = {
    cniVersion: '1.0.0',
    name: 'ref',
    type: 'bridge',
    bridge,
    isGateway: true,
    ipMasq: false,
    ipam: { type: 'host-local', ranges: [[{ subnet: '10.79.0.0/22' }]], dataDir: join(fx.dir, 'host-local') },
  };
  const config = join(fx.dir, 'reference.json');
  writeFileSync(config, JSON.stringify(netconf));
  return { key: 'reference', podNamespace: 'bench', tag: 'r', nsPath: `/var/run/netns/${fx.refNs}`, plugin: join(REF_DIR, 'bridge'), cniPath: REF_DIR, config };
}

// ---------------------------------------------------------------------------------------------------------------
// Modes

interface Samples {
  readonly add: number[];
  readonly del: number[];
}

const emptySamples = (): Samples => ({ add: [], del: [] });
/** Every side's samples; a run fills its two. */
const perSide = (): Record<SideKey, Samples> => ({ ours: emptySamples(), reference: emptySamples(), 'policy-off': emptySamples(), 'policy-on': emptySamples() });

/** The first side first on even steps, the second first on odd ones. */
function order(sides: Sides, step: number): Side[] {
  return step % 2 === 0 ? [sides.first, sides.second] : [sides.second, sides.first];
}

const podName = (mode: string, id: string): string => `${mode}-${id}`;

function podRef(fx: Fixture, side: Side, mode: string, id: string): PodRef {
  const netns = fx.addPodNetns(`${side.tag}-${mode}-${id}`);
  return { containerId: `${mode}-${side.key}-${id}`, podName: podName(mode, id), netns };
}

/** The name of every pod a --policy run ADDs on side B (the modes below name them so), for its kept view. */
function addedPodNames(opts: Options): string[] {
  const names = [podName('check', '0')];
  for (let i = 0; i < opts.warmup + opts.iterations; i++) names.push(podName(i < opts.warmup ? 'warm' : 'seq', String(i)));
  for (let r = 0; r < opts.rounds; r++) for (let k = 0; k < opts.concurrency; k++) names.push(podName('conc', `${r}-${k}`));
  return names;
}

/** One pod's ADD then DEL on one side; the pod namespace is created and removed outside the timed part. */
async function cycle(fx: Fixture, side: Side, mode: string, id: string, wrap: readonly string[] = []): Promise<[Call, Call]> {
  const pod = podRef(fx, side, mode, id);
  try {
    const add = await cni(fx, side, 'ADD', pod, wrap);
    const del = await cni(fx, side, 'DEL', pod, wrap);
    return [add, del];
  } finally {
    fx.delPodNetns(pod.netns);
  }
}

/** `floor`: the same launcher starting /bin/true in the node namespace, the cost both sides pay before any work. */
async function oneAtATime(fx: Fixture, sides: Sides, opts: Options): Promise<{ samples: Record<SideKey, Samples>; floor: number[] }> {
  const samples = perSide();
  const floor: number[] = [];
  for (let i = 0; i < opts.warmup + opts.iterations; i++) {
    const warm = i < opts.warmup;
    for (const side of order(sides, i)) {
      const [add, del] = await cycle(fx, side, warm ? 'warm' : 'seq', String(i));
      if (warm) continue;
      samples[side.key].add.push(add.ms);
      samples[side.key].del.push(del.ms);
    }
    const t = await launch(fx, sides.first.nsPath, ['/bin/true'], {});
    if (!warm) floor.push(t.ms);
  }
  return { samples, floor };
}

/**
 * C calls at once: spawned back to back, each timed on its own. Between two spawns the event loop turns once, so an
 * early call's exit is stamped when it happens rather than after the whole burst (each spawn blocks for a fork).
 */
async function burst(fx: Fixture, side: Side, verb: Verb, pods: readonly PodRef[]): Promise<Call[]> {
  const calls: Promise<Call>[] = [];
  for (const p of pods) {
    calls.push(cni(fx, side, verb, p));
    await nextTurn();
  }
  return Promise.all(calls);
}

/** Per round and side: C concurrent ADDs, then C concurrent DELs. */
async function atOnce(fx: Fixture, sides: Sides, opts: Options): Promise<Record<SideKey, Samples>> {
  const samples = perSide();
  for (let r = 0; r < opts.rounds; r++) {
    for (const side of order(sides, r)) {
      const pods = Array.from({ length: opts.concurrency }, (_, k) => podRef(fx, side, 'conc', `${r}-${k}`));
      try {
        const adds = await burst(fx, side, 'ADD', pods);
        const dels = await burst(fx, side, 'DEL', pods);
        samples[side.key].add.push(...adds.map((c) => c.ms));
        samples[side.key].del.push(...dels.map((c) => c.ms));
      } finally {
        for (const p of pods) fx.delPodNetns(p.netns);
      }
    }
  }
  return samples;
}

/**
 * Peak RSS (KiB) of the plugin process tree per call, from GNU time's %M (wait4's ru_maxrss). `floor`: /bin/true
 * under the same wrapper, the smallest figure this method can report.
 */
async function peakRss(fx: Fixture, sides: Sides, opts: Options): Promise<{ samples: Record<SideKey, Samples>; floor: number[] }> {
  const samples = perSide();
  const floor: number[] = [];
  const out = join(fx.dir, 'time.out');
  const wrap = [GNU_TIME, '-f', '%M', '-o', out];
  const read = () => {
    const last = readFileSync(out, 'utf8').trim().split('\n').pop() ?? '';
    const kib = Number(last);
    if (!Number.isFinite(kib) || kib <= 0) throw new Error(`${GNU_TIME} wrote "${last}", not a size in KiB`);
    return kib;
  };
  for (let k = 0; k < opts.rssSamples; k++) {
    for (const side of order(sides, k)) {
      const pod = podRef(fx, side, 'rss', String(k));
      try {
        await cni(fx, side, 'ADD', pod, wrap);
        samples[side.key].add.push(read());
        await cni(fx, side, 'DEL', pod, wrap);
        samples[side.key].del.push(read());
      } finally {
        fx.delPodNetns(pod.netns);
      }
    }
    const t = await launch(fx, sides.first.nsPath, [...wrap, '/bin/true'], {});
    if (t.code !== 0) throw new Error(`${wrap.join(' ')} /bin/true failed (exit ${t.code}): ${t.stderr}`);
    floor.push(read());
  }
  return { samples, floor };
}

// ---------------------------------------------------------------------------------------------------------------
// --policy: side B enforces, or the run measures nothing

/** What a --policy run found before timing: one pod ADDed on B, isolated in the agent's plan and in the kernel. */
interface EnforcementCheck {
  readonly pod: string;
  readonly ip: string;
  /** The view B's agent holds: policies, and its isolated pods before the ADD, with the pod, after its DEL. */
  readonly policies: number;
  readonly isolatedBefore: number;
  readonly isolatedWithPod: number;
  readonly isolatedAfterDel: number;
  /** From the ADD's answer until the plan and the kernel isolated the pod (the background apply), ms. */
  readonly enforcedAfterMs: number;
}

type PolicyStatus = NonNullable<AgentStatus['policy']>;

async function policyStatus(side: Side): Promise<PolicyStatus | undefined> {
  if (!side.agent) throw new Error(`side ${side.key} runs no agent of ours`);
  return (await readAgentStatus(statusSocketOf(side.agent.socket))).policy;
}

/** Whether the policy table in the agent's namespace sends `ip` to an ingress chain of its own (`nft get element`). */
function kernelIsolates(side: Side, ip: string): boolean {
  const ns = side.agent?.netns ?? '';
  return spawnSync('ip', ['netns', 'exec', ns, 'nft', 'get', 'element', 'inet', POLICY_TABLE, 'ingress', `{ ${ip} }`], { stdio: 'ignore', timeout: 10_000 }).status === 0;
}

/** Polls `ok` every 50 ms until it holds or `ms` ran out; returns whether it held. */
async function within(ms: number, ok: () => Promise<boolean>): Promise<boolean> {
  const deadline = Date.now() + ms;
  for (;;) {
    if (await ok()) return true;
    if (Date.now() > deadline) return false;
    await sleep(50);
  }
}

/**
 * Checks the two sides are what --policy compares: A's agent enforces no NetworkPolicy; B's holds the kept view, and a
 * pod ADDed there becomes isolated in its plan (status: one more isolated pod) and in its kernel (the ingress map holds
 * its address), and stops being so after its DEL.
 * @throws Error saying which part does not hold: then B would be timed without enforcing, and the run must fail.
 */
async function checkEnforced(fx: Fixture, sides: Sides, viewPolicies: number): Promise<EnforcementCheck> {
  const off = await policyStatus(sides.first);
  if (off !== undefined) throw new Error(`side A (NetworkPolicy off) enforces NetworkPolicy: its status says ${JSON.stringify(off)}`);
  const on = sides.second;
  const before = await policyStatus(on);
  if (!before?.hasView || before.policies !== viewPolicies) {
    throw new Error(`side B (NetworkPolicy on) does not hold the kept view of ${viewPolicies} policies: its status says ${JSON.stringify(before ?? 'no policy')}\n${on.agent?.dump() ?? ''}`);
  }
  const pod = podRef(fx, on, 'check', '0');
  try {
    const add = await cni(fx, on, 'ADD', pod);
    const t0 = Date.now();
    const ip = ((JSON.parse(add.stdout) as { ips: { address: string }[] }).ips[0]?.address ?? '').split('/')[0] as string;
    let seen: PolicyStatus | undefined;
    const isolated = await within(ENFORCED_WITHIN_MS, async () => {
      seen = await policyStatus(on);
      return seen?.isolatedPods === before.isolatedPods + 1 && kernelIsolates(on, ip);
    });
    if (!isolated) {
      throw new Error(`side B (NetworkPolicy on) did not isolate pod ${on.podNamespace}/${pod.podName} (${ip}) within ${ENFORCED_WITHIN_MS} ms of its ADD: `
        + `isolated pods ${before.isolatedPods} before, ${seen?.isolatedPods ?? '?'} now (expected one more); the kernel's ingress map ${kernelIsolates(on, ip) ? 'holds' : 'lacks'} ${ip}. `
        + `Timing B now would measure nothing: check the view (bench/policy-cluster.ts nodePolicyView) and the agent log\n${on.agent?.dump() ?? ''}`);
    }
    const enforcedAfterMs = Date.now() - t0;
    const isolatedWithPod = seen?.isolatedPods ?? NaN;
    await cni(fx, on, 'DEL', pod);
    const released = await within(ENFORCED_WITHIN_MS, async () => {
      seen = await policyStatus(on);
      return seen?.isolatedPods === before.isolatedPods && !kernelIsolates(on, ip);
    });
    if (!released) throw new Error(`side B (NetworkPolicy on) still isolates ${ip} ${ENFORCED_WITHIN_MS} ms after pod ${pod.podName}'s DEL (isolated pods ${seen?.isolatedPods ?? '?'}, expected ${before.isolatedPods})`);
    return { pod: `${on.podNamespace}/${pod.podName}`, ip, policies: before.policies, isolatedBefore: before.isolatedPods, isolatedWithPod, isolatedAfterDel: seen?.isolatedPods ?? NaN, enforcedAfterMs };
  } finally {
    fx.delPodNetns(pod.netns);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Agent-side figures

interface AgentMemory {
  readonly vmRssKiB: number;
  readonly vmHwmKiB: number;
  /** VmRSS of the agent's child processes together (B's NetworkPolicy worker). */
  readonly childrenRssKiB: number;
}

function agentMemory(pid: number | undefined): AgentMemory | undefined {
  if (pid === undefined) return undefined;
  const rssOf = (p: number | string) => {
    const status = readFileSync(`/proc/${p}/status`, 'utf8');
    const field = (name: string) => Number(new RegExp(`^${name}:\\s+(\\d+) kB$`, 'm').exec(status)?.[1] ?? NaN);
    return { vmRssKiB: field('VmRSS'), vmHwmKiB: field('VmHWM') };
  };
  try {
    const children = readdirSync(`/proc/${pid}/task`).flatMap((t) => readFileSync(`/proc/${pid}/task/${t}/children`, 'utf8').trim().split(/\s+/).filter(Boolean));
    return { ...rssOf(pid), childrenRssKiB: children.reduce((n, c) => n + rssOf(c).vmRssKiB, 0) };
  } catch {
    return undefined;
  }
}

/** The agent's own handling time per call ("CNI request served" debug lines), by mode prefix of the container ID. */
function agentServed(logPath: string): Record<'seq' | 'conc', Samples> {
  const res = { seq: emptySamples(), conc: emptySamples() };
  let text = '';
  try {
    text = readFileSync(logPath, 'utf8');
  } catch {
    return res;
  }
  for (const line of text.split('\n')) {
    if (!line.includes('CNI request served')) continue;
    let rec: { verb?: string; container?: string; ms?: number };
    try {
      rec = JSON.parse(line) as typeof rec;
    } catch {
      continue;
    }
    const mode = rec.container?.split('-')[0];
    if ((mode !== 'seq' && mode !== 'conc') || typeof rec.ms !== 'number') continue;
    if (rec.verb === 'ADD') res[mode].add.push(rec.ms);
    else if (rec.verb === 'DEL') res[mode].del.push(rec.ms);
  }
  return res;
}

// ---------------------------------------------------------------------------------------------------------------
// Statistics and the report

interface Summary {
  readonly n: number;
  readonly p50: number;
  readonly p99: number;
  readonly mean: number;
  readonly min: number;
  readonly max: number;
}

/** Nearest-rank percentiles. */
function summarize(xs: readonly number[]): Summary {
  const s = [...xs].sort((a, b) => a - b);
  const n = s.length;
  if (n === 0) return { n, p50: NaN, p99: NaN, mean: NaN, min: NaN, max: NaN };
  return { n, p50: nearestRank(s, 50), p99: nearestRank(s, 99), mean: s.reduce((a, b) => a + b, 0) / n, min: s[0] as number, max: s[n - 1] as number };
}

interface Target {
  readonly what: string;
  readonly pass: boolean;
  /** The figures compared, as printed. */
  readonly value: string;
}

interface AgentFigures {
  /** "CNI request served" per mode, from the agent's log. */
  readonly served: Record<'seq' | 'conc', Samples>;
  readonly memory: { readonly before: AgentMemory | undefined; readonly after: AgentMemory | undefined };
}

interface Results {
  readonly keys: readonly [SideKey, SideKey];
  readonly sequential: Record<SideKey, Samples>;
  readonly floor: number[];
  readonly concurrent: Record<SideKey, Samples>;
  readonly rss: Record<SideKey, Samples>;
  readonly rssFloor: number[];
  /** Per side that runs our agent. */
  readonly agents: Partial<Record<SideKey, AgentFigures>>;
  /** --policy: what the check before timing found. */
  readonly enforcement?: EnforcementCheck;
}

const LABEL: Record<SideKey, string> = { ours: 'ours', reference: 'reference', 'policy-off': 'A: policy off', 'policy-on': 'B: policy on' };

function modesOf(r: Results, opts: Options): [string, Record<SideKey, Samples>][] {
  const modes: [string, Record<SideKey, Samples>][] = [['one at a time', r.sequential]];
  if (opts.rounds > 0) modes.push([`${opts.concurrency} at once`, r.concurrent]);
  return modes;
}

/** Where the difference's interval lies against the allowance: above it, at or below it, or across it (cannot tell). */
function differenceVerdict(iv: DifferenceInterval, allowance: number): string {
  if (iv.low > allowance) return `above ${allowance} ms`;
  if (iv.high <= allowance) return `at or below ${allowance} ms`;
  return `straddles ${allowance} ms: this run cannot tell (rerunning until it passes would not make it tell)`;
}

/** --policy's interval: ADD p50 on minus off, one at a time. */
function policyInterval(r: Results): DifferenceInterval {
  return bootstrapDifference(r.sequential['policy-on'].add, r.sequential['policy-off'].add, (xs) => nearestRank(xs, 50), BOOTSTRAP_DRAWS, seeded(SEED), POLICY_ADD_ALLOWANCE_MS);
}

function targets(r: Results, opts: Options): Target[] {
  const t: Target[] = [];
  if (opts.policy) {
    const on = summarize(r.sequential['policy-on'].add).p50;
    const off = summarize(r.sequential['policy-off'].add).p50;
    const iv = policyInterval(r);
    t.push({
      what: `ADD p50 with NetworkPolicy on - off <= ${POLICY_ADD_ALLOWANCE_MS} ms (one at a time)`,
      pass: on - off <= POLICY_ADD_ALLOWANCE_MS,
      value: `${fmt(on, 2)} - ${fmt(off, 2)} = ${fmt(on - off, 2)} ms; 95 % interval ${fmt(iv.low, 2)} to ${fmt(iv.high, 2)}, ${differenceVerdict(iv, POLICY_ADD_ALLOWANCE_MS).split(':')[0]}`,
    });
    return t;
  }
  for (const [label, s] of modesOf(r, opts)) {
    for (const verb of ['add', 'del'] as const) {
      const ours = summarize(s.ours[verb]).p50;
      const reference = summarize(s.reference[verb]).p50;
      t.push({ what: `ours ${verb.toUpperCase()} p50 <= reference ${verb.toUpperCase()} p50 (${label})`, pass: ours <= reference, value: `${fmt(ours, 2)} ms, reference ${fmt(reference, 2)} ms` });
    }
  }
  if (opts.rssSamples > 0) {
    const ours = summarize([...r.rss.ours.add, ...r.rss.ours.del]).p50;
    const reference = summarize([...r.rss.reference.add, ...r.rss.reference.del]).p50;
    t.push({ what: 'ours peak RSS <= reference peak RSS (median of ADD+DEL)', pass: ours <= reference, value: `${fmt(ours, 0)} KiB, reference ${fmt(reference, 0)} KiB` });
  }
  return t;
}

function report(r: Results, opts: Options, tg: readonly Target[]): string {
  const lines: string[] = [];
  const [first, second] = r.keys;
  const floor = summarize(r.floor).p50;
  if (r.enforcement) {
    const e = r.enforcement;
    lines.push(`NetworkPolicy: side B's agent holds ${e.policies} policies (bench/policy-cluster.ts, seed ${SEED}) and isolates ${e.isolatedBefore} pods of its node; `
      + `before timing, pod ${e.pod} ADDed there (${e.ip}) was isolated in its plan (${e.isolatedWithPod}) and its kernel ${e.enforcedAfterMs} ms after the ADD's answer, `
      + `and no longer after its DEL (${e.isolatedAfterDel}). Every pod B ADDs is isolated the same way; A's agent enforces none.`, '');
  }
  const compare = opts.policy ? ['B - A p50'] : ['ours/ref p50', 'same, floor subtracted'];
  const rows: string[][] = [['mode', 'verb', 'side', 'n', 'p50', 'p99', 'mean', 'min', 'max', ...compare]];
  for (const [label, s] of modesOf(r, opts)) {
    for (const verb of ['add', 'del'] as const) {
      const a = summarize(s[first][verb]).p50;
      const b = summarize(s[second][verb]).p50;
      for (const side of r.keys) {
        const m = summarize(s[side][verb]);
        let extra = compare.map(() => '');
        if (opts.policy && side === second) extra = [fmt(b - a, 2)];
        if (!opts.policy && side === first) extra = [fmt(a / b, 2), fmt((a - floor) / (b - floor), 2)];
        rows.push([label, verb.toUpperCase(), LABEL[side], String(m.n), fmt(m.p50, 2), fmt(m.p99, 2), fmt(m.mean, 2), fmt(m.min, 2), fmt(m.max, 2), ...extra]);
      }
    }
  }
  const fl = summarize(r.floor);
  rows.push(['one at a time', 'floor', '/bin/true', String(fl.n), fmt(fl.p50, 2), fmt(fl.p99, 2), fmt(fl.mean, 2), fmt(fl.min, 2), fmt(fl.max, 2), ...compare.map(() => '')]);
  lines.push('CNI latency, ms: wall time from spawn to exit of the plugin process (same launcher for both sides)', table(rows, 3), '');
  if (opts.policy) {
    const iv = policyInterval(r);
    lines.push(`  ADD p50, B - A, one at a time: ${fmt(iv.difference, 2)} ms; 95 % bootstrap interval ${fmt(iv.low, 2)} to ${fmt(iv.high, 2)} ms, ${differenceVerdict(iv, POLICY_ADD_ALLOWANCE_MS)}; `
      + `${fmt(iv.atOrBelowLimit * 100, 1)} % of resamples within ${POLICY_ADD_ALLOWANCE_MS} ms`, '');
  }

  const served: string[][] = [['mode', 'verb', 'side', 'n', 'p50', 'p99', 'mean', 'min', 'max']];
  for (const side of r.keys) {
    const fig = r.agents[side];
    if (!fig) continue;
    for (const [label, key] of [['one at a time', 'seq'], [`${opts.concurrency} at once`, 'conc']] as const) {
      for (const verb of ['add', 'del'] as const) {
        const m = summarize(fig.served[key][verb]);
        if (m.n > 0) served.push([label, verb.toUpperCase(), `agent, ${LABEL[side]}`, String(m.n), fmt(m.p50, 2), fmt(m.p99, 2), fmt(m.mean, 2), fmt(m.min, 2), fmt(m.max, 2)]);
      }
    }
  }
  if (served.length > 1) lines.push('Inside our agent, ms: "CNI request served" (request decoded to answer ready; excludes shim start and socket)', table(served, 3), '');

  if (opts.rssSamples > 0) {
    const rss: string[][] = [['verb', 'side', '', 'n', 'median KiB', 'max KiB']];
    for (const verb of ['add', 'del'] as const) {
      for (const side of r.keys) {
        const m = summarize(r.rss[side][verb]);
        rss.push([verb.toUpperCase(), side, '', String(m.n), fmt(m.p50, 0), fmt(m.max, 0)]);
      }
    }
    const f = summarize(r.rssFloor);
    rss.push(['floor', '/bin/true', '', String(f.n), fmt(f.p50, 0), fmt(f.max, 0)]);
    lines.push(`Peak RSS of the CNI process (${GNU_TIME} -f %M; for the reference the larger of bridge and host-local)`, table(rss, 3));
  }
  for (const side of r.keys) {
    const b = r.agents[side]?.memory.before;
    const a = r.agents[side]?.memory.after;
    if (b && a) lines.push(`Our agent${opts.policy ? `, ${LABEL[side]}` : ''} (for information): VmRSS ${b.vmRssKiB} KiB before, ${a.vmRssKiB} KiB after; VmHWM ${a.vmHwmKiB} KiB`
      + `${b.childrenRssKiB || a.childrenRssKiB ? `; its child processes (the NetworkPolicy worker) ${b.childrenRssKiB} KiB before, ${a.childrenRssKiB} KiB after` : ''}`);
  }
  lines.push('');

  const tt: string[][] = [['target', 'result', 'value']];
  for (const t of tg) tt.push([t.what, t.pass ? 'PASS' : 'MISS', t.value]);
  lines.push('Targets', table(tt, 3));
  return lines.join('\n');
}

// ---------------------------------------------------------------------------------------------------------------
// Main

function preflight(opts: Options): void {
  const problems: string[] = [];
  if (!isRoot()) problems.push('needs root: it builds network namespaces, a bridge per side and runs a private agent');
  if (opts.policy) {
    if (spawnSync('nft', ['--version'], { stdio: 'ignore' }).status !== 0) problems.push('nft is missing: apt-get install nftables');
    if (!existsSync('/proc/sys/net/bridge/bridge-nf-call-iptables')) problems.push('br_netfilter is not loaded (the agent with NetworkPolicy sets bridge-nf-call-iptables): modprobe br_netfilter');
  } else {
    if (!existsSync(GNU_TIME)) problems.push(`${GNU_TIME} is missing: apt-get install time`);
    for (const p of ['bridge', 'host-local']) if (!existsSync(join(REF_DIR, p))) problems.push(`${REF_DIR}/${p} is missing: apt-get install containernetworking-plugins`);
  }
  if (problems.length > 0) throw new Error(problems.join('\n'));
}

const log = (msg: string) => process.stderr.write(`bench: ${msg}\n`);

async function setUp(fx: Fixture, opts: Options): Promise<{ sides: Sides; enforcement?: EnforcementCheck }> {
  if (!opts.policy) return { sides: { first: await setUpOurs(fx, opts), second: setUpReference(fx) } };
  log(`policy: agent A (NetworkPolicy off), then agent B (on: compiles and applies seed ${SEED}'s cluster before it serves)`);
  const first = await setUpOurs(fx, opts, 'policy-off');
  const view = nodePolicyView(synthesize(SEED), OUR_AGENT_NAME['policy-on'], addedPodNames(opts));
  const second = await setUpOurs(fx, opts, 'policy-on', view);
  const sides = { first, second };
  log('policy: checking that a pod ADDed on B is isolated (its status and its kernel) and A enforces nothing');
  return { sides, enforcement: await checkEnforced(fx, sides, view.policies.length) };
}

async function run(fx: Fixture, opts: Options): Promise<Results> {
  const { sides, enforcement } = await setUp(fx, opts);
  const ours = [sides.first, sides.second].filter((s) => s.agent !== undefined);
  const before = new Map(ours.map((s) => [s.key, agentMemory(s.agent?.pid)]));
  log(`one at a time: ${opts.warmup} warm-up + ${opts.iterations} ADD+DEL cycles per side`);
  const { samples: sequential, floor } = await oneAtATime(fx, sides, opts);
  log(`${opts.concurrency} at once: ${opts.rounds} round(s) per side`);
  const concurrent = await atOnce(fx, sides, opts);
  log(`peak RSS: ${opts.rssSamples} ADD+DEL cycles per side under ${GNU_TIME}`);
  const { samples: rss, floor: rssFloor } = await peakRss(fx, sides, opts);
  const agents: Partial<Record<SideKey, AgentFigures>> = {};
  for (const s of ours) {
    const logPath = s.agent?.logPath ?? '';
    if (opts.agentLog && existsSync(logPath)) copyFileSync(logPath, opts.policy ? `${opts.agentLog}.${s.key}` : opts.agentLog);
    agents[s.key] = { served: agentServed(logPath), memory: { before: before.get(s.key), after: agentMemory(s.agent?.pid) } };
  }
  return { keys: keysOf(opts), sequential, floor, concurrent, rss, rssFloor, agents, ...(enforcement ? { enforcement } : {}) };
}

async function main(): Promise<number> {
  const opts = parseOptions(process.argv.slice(2));
  preflight(opts);
  const started = Date.now();
  const load0 = loadavg();
  const fx = new Fixture();
  const watchdog = cleanUpOnExit(fx, opts.timeoutS);
  let results: Results;
  try {
    results = await run(fx, opts);
  } finally {
    clearTimeout(watchdog);
    await fx.cleanup();
  }
  const left = leftoverNetns();
  if (left.length > 0) throw new Error(`namespaces left behind: ${left.join(', ')}`);

  const tg = targets(results, opts);
  const seconds = (Date.now() - started) / 1000;
  const env = { kernel: release(), node: process.version, cpus: cpus().length, loadavgStart: load0, loadavgEnd: loadavg(), driverRssKiB: Math.round(process.memoryUsage().rss / 1024) };
  process.stdout.write(report(results, opts, tg) + '\n');
  process.stdout.write(`\n${opts.smoke ? 'smoke run' : 'run'} took ${seconds.toFixed(1)} s; load average ${load0.map((x) => x.toFixed(2)).join(' ')} at start, `
    + `${env.loadavgEnd.map((x) => x.toFixed(2)).join(' ')} at end; ${env.cpus} CPUs, kernel ${env.kernel}\n`);
  if (opts.json) {
    const [first, second] = results.keys;
    const both = <T>(f: (k: SideKey) => T) => ({ [first]: f(first), [second]: f(second) });
    const summaries = (s: Record<SideKey, Samples>) => both((k) => ({ add: summarize(s[k].add), del: summarize(s[k].del) }));
    const samples = (s: Record<SideKey, Samples>) => both((k) => s[k]);
    const agents = Object.fromEntries(Object.entries(results.agents).map(([k, a]) => [k, {
      served: { seq: { add: summarize(a.served.seq.add), del: summarize(a.served.seq.del) }, conc: { add: summarize(a.served.conc.add), del: summarize(a.served.conc.del) } },
      memoryKiB: a.memory,
    }]));
    writeFileSync(opts.json, JSON.stringify({
      options: opts, env, seconds,
      summary: {
        sequential: summaries(results.sequential),
        concurrent: summaries(results.concurrent),
        floor: summarize(results.floor),
        ...(opts.policy ? {} : { rssKiB: { ...summaries(results.rss), floor: summarize(results.rssFloor) } }),
        agents,
        ...(opts.policy ? { policyAddDifference: policyInterval(results), enforcement: results.enforcement } : {}),
      },
      targets: tg,
      samples: {
        sequential: samples(results.sequential), floor: results.floor, concurrent: samples(results.concurrent),
        ...(opts.policy ? {} : { rss: samples(results.rss), rssFloor: results.rssFloor }),
        agentServed: Object.fromEntries(Object.entries(results.agents).map(([k, a]) => [k, a.served])),
      },
    }, null, 2) + '\n');
  }
  return exitStatus(tg.filter((t) => !t.pass).length, opts.enforce);
}

runBench(main);
