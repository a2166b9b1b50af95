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
 * Usage: node bench/cni-latency.ts [--smoke] [--iterations N] [--rounds R] [--concurrency C] [--rss-samples K]
 *        [--warmup W] [--json FILE] [--agent-log FILE] [--timeout SECONDS] [--enforce]
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { closeSync, copyFileSync, existsSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, release, tmpdir } from 'node:os';
import { join } from 'node:path';
import { setImmediate as nextTurn, setTimeout as sleep } from 'node:timers/promises';
import { inNetns } from '../src/adapters/kernel/netns.ts';
import { TestAgent } from '../harness/agent.ts';
import { addNetns, delNetns, isRoot, leftoverNetns, RUN_PREFIX } from '../harness/netns.ts';
import { cleanUpOnExit, exitStatus, fmt, intOption, nearestRank, parseBenchArgs, removeRunTempDirs, runBench, table } from './common.ts';

const GNU_TIME = '/usr/bin/time';
const REF_DIR = '/usr/lib/cni';
const CALL_TIMEOUT_MS = 30_000;

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
}

const USAGE = `usage: node bench/cni-latency.ts [options]
  --smoke              tiny run for CI: 10 one at a time, 1 round at once, 5 RSS samples
  --iterations N       one-at-a-time ADD+DEL cycles per side (default 100)
  --rounds R           rounds of C concurrent ADDs then C concurrent DELs per side (default 5)
  --concurrency C      calls at once in a round (default 30)
  --rss-samples K      ADD+DEL cycles per side under ${GNU_TIME} -f %M (default 20)
  --warmup W           unrecorded cycles per side before the one-at-a-time mode (default 3)
  --json FILE          write every sample and summary to FILE
  --agent-log FILE     keep a copy of the agent's debug log
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
  });
  const smoke = values.smoke;
  const int = intOption(USAGE);
  return {
    smoke,
    iterations: int('iterations', values.iterations, smoke ? 10 : 100, 1),
    rounds: int('rounds', values.rounds, smoke ? 1 : 5, 0),
    concurrency: int('concurrency', values.concurrency, 30, 1),
    rssSamples: int('rss-samples', values['rss-samples'], smoke ? 5 : 20, 0),
    warmup: int('warmup', values.warmup, smoke ? 1 : 3, 0),
    timeoutS: int('timeout', values.timeout, smoke ? 120 : 900, 1),
    enforce: values.enforce,
    json: values.json,
    agentLog: values['agent-log'],
    metrics: values.metrics,
  };
}

// ---------------------------------------------------------------------------------------------------------------
// Resources: every namespace, directory and process this run creates, and their removal

/** Everything the run creates; `cleanup()` removes it all, once, whichever way the run ends. */
class Fixture {
  readonly dir: string = mkdtempSync(join(tmpdir(), `${RUN_PREFIX}bench-`));
  agent: TestAgent | undefined;
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
    try {
      await this.agent?.cleanup();
    } catch (e) {
      process.stderr.write(`bench: agent cleanup failed: ${String(e)}\n`);
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

type SideKey = 'ours' | 'reference';
const SIDES: readonly SideKey[] = ['ours', 'reference'];

interface Side {
  readonly key: SideKey;
  /** One letter for namespace names. */
  readonly tag: string;
  /** The node namespace the plugin runs in. */
  readonly nsPath: string;
  readonly plugin: string;
  readonly cniPath: string;
  /** File holding the network configuration passed on stdin. */
  readonly config: string;
}

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
    CNI_ARGS: `IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=${pod.podName};K8S_POD_INFRA_CONTAINER_ID=${pod.containerId}`,
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
    const extra = side.key === 'ours' && fx.agent ? `\n${fx.agent.dump()}` : '';
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

async function setUpOurs(fx: Fixture, opts: Options): Promise<Side> {
  // The production reconcile period (60 s) rather than the test harness's 2 s: we measure what a node would see.
  const agent = new TestAgent({ name: 'bench', podCidrs: [oursPodCidr(opts)], config: { resyncPeriod: 60, ...(opts.metrics ? { metrics: {} } : {}) } });
  fx.agent = agent;
  await agent.start();
  const plugin = join(agent.binDir, 'atoll-cni'); // installed by the agent at start, as on a node
  for (let waited = 0; !existsSync(plugin); waited += 50) {
    if (waited >= 5000) throw new Error(`the agent did not install ${plugin} within 5 s:\n${agent.dump()}`);
    await sleep(50);
  }
  const config = join(fx.dir, 'ours.json');
  writeFileSync(config, agent.netconf('1.0.0'));
  return { key: 'ours', tag: 'o', nsPath: `/var/run/netns/${agent.netns}`, plugin, cniPath: `${agent.binDir}:${REF_DIR}`, config };
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
  return { key: 'reference', tag: 'r', nsPath: `/var/run/netns/${fx.refNs}`, plugin: join(REF_DIR, 'bridge'), cniPath: REF_DIR, config };
}

// ---------------------------------------------------------------------------------------------------------------
// Modes

interface Samples {
  readonly add: number[];
  readonly del: number[];
}

const emptySamples = (): Samples => ({ add: [], del: [] });
const perSide = (): Record<SideKey, Samples> => ({ ours: emptySamples(), reference: emptySamples() });

/** Ours first on even steps, the reference first on odd ones. */
function order(sides: Record<SideKey, Side>, step: number): Side[] {
  return step % 2 === 0 ? [sides.ours, sides.reference] : [sides.reference, sides.ours];
}

function podRef(fx: Fixture, side: Side, mode: string, id: string): PodRef {
  const netns = fx.addPodNetns(`${side.tag}-${mode}-${id}`);
  return { containerId: `${mode}-${side.key}-${id}`, podName: `${mode}-${id}`, netns };
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
async function oneAtATime(fx: Fixture, sides: Record<SideKey, Side>, opts: Options): Promise<{ samples: Record<SideKey, Samples>; floor: number[] }> {
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
    const t = await launch(fx, sides.ours.nsPath, ['/bin/true'], {});
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
async function atOnce(fx: Fixture, sides: Record<SideKey, Side>, opts: Options): Promise<Record<SideKey, Samples>> {
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
async function peakRss(fx: Fixture, sides: Record<SideKey, Side>, opts: Options): Promise<{ samples: Record<SideKey, Samples>; floor: number[] }> {
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
    const t = await launch(fx, sides.ours.nsPath, [...wrap, '/bin/true'], {});
    if (t.code !== 0) throw new Error(`${wrap.join(' ')} /bin/true failed (exit ${t.code}): ${t.stderr}`);
    floor.push(read());
  }
  return { samples, floor };
}

// ---------------------------------------------------------------------------------------------------------------
// Agent-side figures

interface AgentMemory {
  readonly vmRssKiB: number;
  readonly vmHwmKiB: number;
}

function agentMemory(pid: number | undefined): AgentMemory | undefined {
  if (pid === undefined) return undefined;
  try {
    const status = readFileSync(`/proc/${pid}/status`, 'utf8');
    const field = (name: string) => Number(new RegExp(`^${name}:\\s+(\\d+) kB$`, 'm').exec(status)?.[1] ?? NaN);
    return { vmRssKiB: field('VmRSS'), vmHwmKiB: field('VmHWM') };
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
  readonly ours: number;
  readonly reference: number;
  readonly unit: string;
  readonly pass: boolean;
}

interface Results {
  readonly sequential: Record<SideKey, Samples>;
  readonly floor: number[];
  readonly concurrent: Record<SideKey, Samples>;
  readonly rss: Record<SideKey, Samples>;
  readonly rssFloor: number[];
  readonly agentServed: Record<'seq' | 'conc', Samples>;
  readonly agentMemory: { readonly before: AgentMemory | undefined; readonly after: AgentMemory | undefined };
}

function targets(r: Results, opts: Options): Target[] {
  const t: Target[] = [];
  const modes: [string, Record<SideKey, Samples>][] = [['one at a time', r.sequential]];
  if (opts.rounds > 0) modes.push([`${opts.concurrency} at once`, r.concurrent]);
  for (const [label, s] of modes) {
    for (const verb of ['add', 'del'] as const) {
      const ours = summarize(s.ours[verb]).p50;
      const reference = summarize(s.reference[verb]).p50;
      t.push({ what: `ours ${verb.toUpperCase()} p50 <= reference ${verb.toUpperCase()} p50 (${label})`, ours, reference, unit: 'ms', pass: ours <= reference });
    }
  }
  if (opts.rssSamples > 0) {
    const ours = summarize([...r.rss.ours.add, ...r.rss.ours.del]).p50;
    const reference = summarize([...r.rss.reference.add, ...r.rss.reference.del]).p50;
    t.push({ what: 'ours peak RSS <= reference peak RSS (median of ADD+DEL)', ours, reference, unit: 'KiB', pass: ours <= reference });
  }
  return t;
}

function report(r: Results, opts: Options, tg: readonly Target[]): string {
  const lines: string[] = [];
  const floor = summarize(r.floor).p50;
  const head = ['mode', 'verb', 'side', 'n', 'p50', 'p99', 'mean', 'min', 'max', 'ours/ref p50', 'same, floor subtracted'];
  const rows: string[][] = [head];
  const modes: [string, Record<SideKey, Samples>][] = [['one at a time', r.sequential]];
  if (opts.rounds > 0) modes.push([`${opts.concurrency} at once`, r.concurrent]);
  for (const [label, s] of modes) {
    for (const verb of ['add', 'del'] as const) {
      const o = summarize(s.ours[verb]).p50;
      const ref = summarize(s.reference[verb]).p50;
      for (const side of SIDES) {
        const m = summarize(s[side][verb]);
        const ratios = side === 'ours' ? [fmt(o / ref, 2), fmt((o - floor) / (ref - floor), 2)] : ['', ''];
        rows.push([label, verb.toUpperCase(), side, String(m.n), fmt(m.p50, 2), fmt(m.p99, 2), fmt(m.mean, 2), fmt(m.min, 2), fmt(m.max, 2), ...ratios]);
      }
    }
  }
  const fl = summarize(r.floor);
  rows.push(['one at a time', 'floor', '/bin/true', String(fl.n), fmt(fl.p50, 2), fmt(fl.p99, 2), fmt(fl.mean, 2), fmt(fl.min, 2), fmt(fl.max, 2), '', '']);
  lines.push('CNI latency, ms: wall time from spawn to exit of the plugin process (same launcher for both sides)', table(rows, 3), '');

  const served: string[][] = [['mode', 'verb', 'side', 'n', 'p50', 'p99', 'mean', 'min', 'max']];
  for (const [label, key] of [['one at a time', 'seq'], [`${opts.concurrency} at once`, 'conc']] as const) {
    for (const verb of ['add', 'del'] as const) {
      const m = summarize(r.agentServed[key][verb]);
      if (m.n > 0) served.push([label, verb.toUpperCase(), 'agent', String(m.n), fmt(m.p50, 2), fmt(m.p99, 2), fmt(m.mean, 2), fmt(m.min, 2), fmt(m.max, 2)]);
    }
  }
  if (served.length > 1) lines.push('Inside our agent, ms: "CNI request served" (request decoded to answer ready; excludes shim start and socket)', table(served, 3), '');

  if (opts.rssSamples > 0) {
    const rss: string[][] = [['verb', 'side', '', 'n', 'median KiB', 'max KiB']];
    for (const verb of ['add', 'del'] as const) {
      for (const side of SIDES) {
        const m = summarize(r.rss[side][verb]);
        rss.push([verb.toUpperCase(), side, '', String(m.n), fmt(m.p50, 0), fmt(m.max, 0)]);
      }
    }
    const f = summarize(r.rssFloor);
    rss.push(['floor', '/bin/true', '', String(f.n), fmt(f.p50, 0), fmt(f.max, 0)]);
    lines.push(`Peak RSS of the CNI process (${GNU_TIME} -f %M; for the reference the larger of bridge and host-local)`, table(rss, 3));
  }
  const b = r.agentMemory.before;
  const a = r.agentMemory.after;
  if (b && a) lines.push(`Our agent (for information): VmRSS ${b.vmRssKiB} KiB before, ${a.vmRssKiB} KiB after; VmHWM ${a.vmHwmKiB} KiB`);
  lines.push('');

  const tt: string[][] = [['target', 'result', '', 'ours', 'reference']];
  for (const t of tg) tt.push([t.what, t.pass ? 'PASS' : 'MISS', '', `${fmt(t.ours, t.unit === 'KiB' ? 0 : 2)} ${t.unit}`, `${fmt(t.reference, t.unit === 'KiB' ? 0 : 2)} ${t.unit}`]);
  lines.push('Targets', table(tt, 3));
  return lines.join('\n');
}

// ---------------------------------------------------------------------------------------------------------------
// Main

function preflight(): void {
  const problems: string[] = [];
  if (!isRoot()) problems.push('needs root: it builds network namespaces, a bridge per side and runs a private agent');
  if (!existsSync(GNU_TIME)) problems.push(`${GNU_TIME} is missing: apt-get install time`);
  for (const p of ['bridge', 'host-local']) if (!existsSync(join(REF_DIR, p))) problems.push(`${REF_DIR}/${p} is missing: apt-get install containernetworking-plugins`);
  if (problems.length > 0) throw new Error(problems.join('\n'));
}

async function run(fx: Fixture, opts: Options): Promise<Results> {
  const ours = await setUpOurs(fx, opts);
  const reference = setUpReference(fx);
  const sides = { ours, reference };
  const before = agentMemory(fx.agent?.pid);
  const log = (msg: string) => process.stderr.write(`bench: ${msg}\n`);
  log(`one at a time: ${opts.warmup} warm-up + ${opts.iterations} ADD+DEL cycles per side`);
  const { samples: sequential, floor } = await oneAtATime(fx, sides, opts);
  log(`${opts.concurrency} at once: ${opts.rounds} round(s) per side`);
  const concurrent = await atOnce(fx, sides, opts);
  log(`peak RSS: ${opts.rssSamples} ADD+DEL cycles per side under ${GNU_TIME}`);
  const { samples: rss, floor: rssFloor } = await peakRss(fx, sides, opts);
  const after = agentMemory(fx.agent?.pid);
  const logPath = fx.agent?.logPath ?? '';
  if (opts.agentLog && existsSync(logPath)) copyFileSync(logPath, opts.agentLog);
  return { sequential, floor, concurrent, rss, rssFloor, agentServed: agentServed(logPath), agentMemory: { before, after } };
}

async function main(): Promise<number> {
  const opts = parseOptions(process.argv.slice(2));
  preflight();
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
    const summaries = (s: Record<SideKey, Samples>) => Object.fromEntries(SIDES.map((k) => [k, { add: summarize(s[k].add), del: summarize(s[k].del) }]));
    writeFileSync(opts.json, JSON.stringify({
      options: opts, env, seconds,
      summary: {
        sequential: summaries(results.sequential),
        concurrent: summaries(results.concurrent),
        floor: summarize(results.floor),
        rssKiB: { ...summaries(results.rss), floor: summarize(results.rssFloor) },
        agentServed: { seq: { add: summarize(results.agentServed.seq.add), del: summarize(results.agentServed.seq.del) },
          conc: { add: summarize(results.agentServed.conc.add), del: summarize(results.agentServed.conc.del) } },
        agentMemoryKiB: results.agentMemory,
      },
      targets: tg,
      samples: results,
    }, null, 2) + '\n');
  }
  return exitStatus(tg.filter((t) => !t.pass).length, opts.enforce);
}

runBench(main);
