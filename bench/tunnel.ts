/**
 * The cross-site tunnel's throughput, side by side in one run on one machine, on the lab (`atoll lab up --pods direct`:
 * namespaces, NAT routers, the real controller, relay and an agent per node, pods created through `atoll-cni`):
 *   unshaped  one lab: cloud 1 node; edge a (2 nodes) and b (1 node) behind endpoint-independent NAT, c (1 node)
 *             behind symmetric NAT; all in community "x"; 1 pod per node. iperf3, one TCP stream, runs alternating:
 *             VXLAN (the reference) a-1-p1 -> a-2-p1, same site, kernel VXLAN; tunnel direct a-1-p1 -> b-1-p1,
 *             hole-punched through both NATs; tunnel relayed a-2-p1 -> c-1-p1, through the relay.
 *   shaped    a second lab (a: 1 node, b: 1 node) with both edge uplinks shaped (`--rate`, tbf; `--delay`, netem, or
 *             the lab's delay line where the kernel has no netem): the tunnel a-1-p1 -> b-1-p1 against a kernel VXLAN
 *             built by hand between the two
 *             edge routers over the same shaped uplinks.
 *   datagram  the unshaped lab with the tunnel's datagram path on (`--udp`): a-1-p1 -> b-1-p1 over UDP datagrams against
 *             the same pair over its TLS stream (UDP dropped at a's router), and a-2-p1 -> c-1-p1 through the relay.
 *   lossy     the shaped lab with the datagram path on and random loss on each edge uplink (an nftables `numgen random
 *             mod 1000 < N drop` rule on each edge router, on what arrives from the uplink; offloads off on the ports): per loss rate, plain TCP
 *             from node a-1 through its NAT to b's router (the issue's reference) and from a's router to b's, over the
 *             same uplinks, against the tunnel over UDP datagrams and over its TLS stream (UDP dropped at a's router),
 *             1 and 8 streams each.
 *   flood     the shaped lab with the datagram path on, no loss: a-1-p1 -> b-1-p1 over UDP datagrams, 8 streams, with
 *             no flood against each kind of bad input (bench/udp-flood.c, from b's router: garbage, an unknown key,
 *             forged datagrams under the live key that each cost a full AES-GCM open, hellos from an unknown key)
 *             at b-1's UDP port, and a control (the same garbage at a port of b-1 its input hook drops: what carrying
 *             the flood costs the machine without the agent), runs alternating; b-1's drop counters show where each
 *             flood went.
 * During every run the CPU time and memory of the agents at both ends (and of the relay on the relayed path) are
 * read from /proc.
 *
 * Traffic only flows between namespaces of the labs this run creates. Every lab is removed with `atoll lab down` in a
 * `finally`, on SIGINT/SIGTERM and when `--timeout` fires; processes are killed by PID. bench/README.md explains what is
 * measured and why.
 *
 * Usage: node bench/tunnel.ts [--smoke] [--only unshaped|shaped|datagram|lossy] [--reps R] [--time S] [--rate MBIT]
 *        [--delay MS] [--loss PCT,...] [--json FILE] [--timeout SECONDS] [--enforce]
 */
import { type ChildProcess, execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, release, tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { LAB_STATE_DIR } from '../src/lab/io/lab-state.ts';
import { statusSocketOf } from '../src/adapters/ops/status-socket.ts';
import type { TunnelStatus } from '../src/core/tunnel/status.ts';
import { isRoot } from '../harness/netns.ts';
import { until } from '../harness/wait.ts';
import { exitStatus, fmt, intOption, median, parseBenchArgs, runBench, type Spawned, type SpawnOptions, spawnBounded, table } from './common.ts';

const ROOT = dirname(dirname(import.meta.filename));
const ATOLL = join(ROOT, 'bin', 'atoll');
const DIRECT_VS_VXLAN_TARGET = 0.2;
const RELAYED_VS_DIRECT_TARGET = 0.5;
const SHAPED_TARGET = 0.9;
/** Lossy part: the tunnel over datagrams against plain TCP over the same lossy uplinks. */
const LOSSY_TARGET = 0.9;
/** Datagram part: UDP datagrams against the TLS stream, unshaped. */
const DATAGRAM_VS_STREAM_TARGET = 1.0;
/** The issue's "relayed >= 0.6x direct", against the direct path as it is now: UDP datagrams. */
const RELAYED_VS_UDP_TARGET = 0.6;
/** Agents' idle resident memory with the datagram path, MiB: when the lab is up, and (idle part) over time. */
const IDLE_RSS_TARGET_MIB = 80;
/** Idle part: how often the agents' VmRSS is read. */
const IDLE_SAMPLE_MS = 30_000;
/**
 * Idle part: an agent "does not grow" when the median of its last 5 samples is within this of the median of its
 * samples from minute 2 to minute 4 (after the lab converged).
 */
const IDLE_GROWTH_TARGET_MIB = 1;
/** Idle part's reference: a bare Node with `node:tls` loaded, run with `bin/atoll`'s flags beside the lab. */
const IDLE_REFERENCE = 'reference: bare Node + node:tls';
/** Flood part: the flow under a flood against without one. */
const FLOOD_TARGET = 0.95;
/** Flood part: the kinds of bad input (bench/udp-flood.c), datagrams per second of each, and the flow's streams. */
const FLOOD_KINDS = ['garbage', 'unknown-key', 'forged', 'hello'] as const;
const FLOOD_STREAMS = 8;
/** Flood part, the control: the same garbage flood at a port of b-1 whose datagrams b-1's input hook drops (no socket reads them). */
const FLOOD_CONTROL_PORT = 47_999;
/** Lossy part: streams per iperf3 run. */
const LOSSY_STREAMS = [1, 8] as const;
const IPERF_PORT = 5201;
/** The hand-built reference VXLAN between the edge routers (shaped part): its own device, VNI, port and /30. */
const REF_VXLAN = Object.freeze({ dev: 'atb.vx0', vni: 4242, port: 4789, a: '10.250.0.1', b: '10.250.0.2', bits: 30 });
const LAB_UP_TIMEOUT_MS = 120_000;
/** Shaped part: TCP buffer autotuning bounds (min default max) at both ends of either path, room for 1 Gbit/s x 40 ms. */
const TCP_BUFFERS = '4096 131072 33554432';
const LAB_DOWN_TIMEOUT_MS = 60_000;
const PATH_WAIT_MS = 40_000;
const RSS_SAMPLE_MS = 250;
const KIB_PER_MIB = 1024;

// ---------------------------------------------------------------------------------------------------------------
// Options

type Part = 'unshaped' | 'shaped' | 'datagram' | 'lossy' | 'flood' | 'idle';
const PARTS: readonly Part[] = ['unshaped', 'shaped', 'datagram', 'lossy', 'flood', 'idle'];

interface Options {
  readonly smoke: boolean;
  readonly parts: readonly Part[];
  readonly reps: number;
  readonly seconds: number;
  /** Shaped part: tbf rate of each edge uplink (a and b), Mbit/s. */
  readonly rateMbit: number;
  /** Shaped part: one-way delay of each edge uplink (a and b), ms; 0 for none. */
  readonly delayMs: number;
  /** Lossy part: loss rates, per mille, each direction. */
  readonly lossPerMille: readonly number[];
  /** Flood part: bad datagrams per second. */
  readonly floodRate: number;
  /** Idle part: minutes the lab stays up idle while its agents' VmRSS is read. */
  readonly idleMinutes: number;
  readonly timeoutS: number;
  readonly enforce: boolean;
  readonly json: string | undefined;
  /** Unshaped part: the lab with its metrics listeners (on), without (`atoll lab up --no-metrics`: off), or both labs, runs alternating. */
  readonly metrics: MetricsSetting;
}

type MetricsSetting = 'on' | 'off' | 'both';
const METRICS_SETTINGS: readonly MetricsSetting[] = ['on', 'off', 'both'];
/** Suffix of the unshaped part's path keys measured in the lab without metrics listeners, with --metrics both. */
const NO_METRICS = '-nometrics';

const USAGE = `usage: node bench/tunnel.ts [options]
  --smoke              short run for CI: 1 repetition, iperf3 -t 2, the unshaped part only
  --only PART          unshaped, shaped, datagram, lossy, flood or idle (default: all; unshaped with --smoke)
  --reps R             iperf3 runs per path, alternating between the paths (default 3; 1 with --smoke)
  --time S             seconds per iperf3 run (iperf3 -t; default 10; 2 with --smoke)
  --rate MBIT          shaped part: tbf rate on the uplinks of sites a and b, both directions (default 1000)
  --delay MS           shaped part: one-way delay on each of those uplinks, both directions (default 10: 20 ms one
                       way from a to b, 40 ms round trip); 0 for none. By netem, or by the lab's delay line where
                       the kernel has no netem; the report says which
  --metrics on|off|both
                       unshaped part: the lab's agents, controller and relay with their metrics listeners (on,
                       the default), without them (off: atoll lab up --no-metrics), or both: two labs, each path
                       measured in one and then the other, alternating, and the two side by side
  --loss PCT,...       lossy part: random loss per edge uplink and direction, percent (default 1,3)
  --flood-rate N       flood part: bad datagrams per second of each kind (default 50000; at most 1000000)
  --idle-minutes M     idle part: how long the lab stays up idle while the agents' VmRSS is read every 30 s
                       (default 15; growth is judged in runs of 6 minutes or more)
  --json FILE          write every sample and summary to FILE
  --timeout SECONDS    abort (and clean up) after this long (default 900 for 3 runs of 10 s per path, scaled up
                       for more or longer runs, plus the idle part's minutes; 300 with --smoke)
  --enforce            exit 1 when a target is missed (default: report only)`;

function parseOptions(argv: readonly string[]): Options {
  const values = parseBenchArgs(argv, USAGE, {
    only: { type: 'string' },
    reps: { type: 'string' },
    time: { type: 'string' },
    rate: { type: 'string' },
    delay: { type: 'string' },
    loss: { type: 'string' },
    metrics: { type: 'string' },
    'flood-rate': { type: 'string' },
    'idle-minutes': { type: 'string' },
    enforce: { type: 'boolean', default: false },
  });
  const smoke = values.smoke;
  const int = intOption(USAGE);
  if (values.only !== undefined && !PARTS.includes(values.only as Part)) {
    throw new Error(`--only must be one of ${PARTS.join(', ')}, got "${values.only}"\n${USAGE}`);
  }
  const metrics = (values.metrics ?? 'on') as MetricsSetting;
  if (!METRICS_SETTINGS.includes(metrics)) throw new Error(`--metrics must be on, off or both, got "${values.metrics}"\n${USAGE}`);
  const loss = (values.loss ?? '1,3').split(',').map((x) => Math.round(Number(x) * 10));
  if (loss.some((x) => !Number.isInteger(x) || x < 0 || x > 500)) throw new Error(`--loss must be percentages 0 to 50, got "${values.loss}"\n${USAGE}`);
  const parts = values.only ? [values.only as Part] : smoke ? ['unshaped' as const] : PARTS;
  const idleMinutes = int('idle-minutes', values['idle-minutes'], 15, 1, 240);
  const reps = int('reps', values.reps, smoke ? 1 : 3, 1, 100);
  const seconds = int('time', values.time, smoke ? 2 : 10, 1, 600);
  // 900 s for 3 runs of 10 s per path, longer for more or longer runs (a lossy part of 5 runs was cut at 900 s)
  const defaultTimeoutS = smoke ? 300 : Math.round(900 * Math.max(1, (reps * seconds) / 30)) + (parts.includes('idle') ? idleMinutes * 60 : 0);
  return {
    smoke,
    parts,
    reps,
    seconds,
    rateMbit: int('rate', values.rate, 1000, 1, 100_000),
    delayMs: int('delay', values.delay, 10, 0, 10_000),
    lossPerMille: loss,
    floodRate: int('flood-rate', values['flood-rate'], 50_000, 1, 1_000_000),
    idleMinutes,
    timeoutS: int('timeout', values.timeout, defaultTimeoutS, 1, 86_400),
    enforce: values.enforce,
    json: values.json,
    metrics,
  };
}

// ---------------------------------------------------------------------------------------------------------------
// Resources: the labs, devices and processes this run creates, and their removal

interface Live {
  readonly done: Promise<Spawned>;
  /** Stopped with SIGTERM first (`atoll lab up` removes what it built on SIGTERM), else SIGKILL. */
  readonly gentle: boolean;
}

class Fixture {
  readonly dir: string = mkdtempSync(join(tmpdir(), 'atoll-tunnel-bench-'));
  /** Lab run ids of this run not removed yet. */
  readonly labs = new Set<string>();
  /** VXLAN devices made by hand (namespace, device), removed at cleanup. */
  readonly devices: { netns: string; dev: string }[] = [];
  readonly live = new Map<ChildProcess, Live>();
  #stopping = false;
  #cleaned: Promise<string[]> | undefined;

  get stopping(): boolean {
    return this.#stopping;
  }

  /** Idempotent: kills this run's processes by PID, removes its devices and labs; returns what it could not remove. */
  cleanup(): Promise<string[]> {
    this.#cleaned ??= this.#cleanup();
    return this.#cleaned;
  }

  async #cleanup(): Promise<string[]> {
    this.#stopping = true;
    const running = [...this.live];
    for (const [c, l] of running) c.kill(l.gentle ? 'SIGTERM' : 'SIGKILL');
    await Promise.race([Promise.allSettled(running.map(([, l]) => l.done)), sleep(20_000)]);
    for (const [c] of this.live) c.kill('SIGKILL');
    for (const d of this.devices.splice(0)) deleteDevice(d.netns, d.dev);
    const problems: string[] = [];
    for (const runId of [...this.labs]) {
      const res = await runQuiet([ATOLL, 'lab', 'down', runId], LAB_DOWN_TIMEOUT_MS);
      const left = labNamespaces(runId);
      if (left.length > 0) problems.push(`lab ${runId}: namespaces left behind: ${left.join(' ')} (atoll lab down ${runId}: exit ${res.code} ${res.stderr.trim()})`);
      else this.labs.delete(runId);
    }
    rmSync(this.dir, { recursive: true, force: true });
    return problems;
  }
}

/** The lab namespaces of one run (`atl-lab-<runid>-...`) that exist now. */
function labNamespaces(runId: string): string[] {
  const out = execFileSync('ip', ['netns', 'list'], { encoding: 'utf8' });
  return out.split('\n').map((l) => l.split(' ')[0] ?? '').filter((n) => n.startsWith(`atl-lab-${runId}-`));
}

function deleteDevice(netns: string, dev: string): void {
  try {
    execFileSync('ip', ['-n', netns, 'link', 'del', 'dev', dev], { stdio: 'ignore' });
  } catch {
    // gone already, or its namespace is
  }
}

/** Starts argv bounded in time (see spawnBounded), tracked by the fixture for cleanup until it exits. */
function start(fx: Fixture, argv: readonly string[], timeoutMs: number, o: SpawnOptions = {}): { child: ChildProcess; done: Promise<Spawned> } {
  if (fx.stopping) throw new Error('the benchmark is stopping');
  const started = spawnBounded(argv, timeoutMs, o);
  fx.live.set(started.child, { done: started.done, gentle: o.gentle ?? false });
  started.done.finally(() => fx.live.delete(started.child)).catch(() => undefined);
  return started;
}

async function run(fx: Fixture, argv: readonly string[], timeoutMs: number): Promise<Spawned> {
  return start(fx, argv, timeoutMs).done;
}

/** For cleanup, when the fixture refuses new processes: runs argv bounded in time, never throws. */
function runQuiet(argv: readonly string[], timeoutMs: number): Promise<Spawned> {
  return spawnBounded(argv, timeoutMs).done.catch((e: unknown) => ({ code: 127, stdout: '', stderr: String(e) }));
}

const inNs = (netns: string, argv: readonly string[]) => ['ip', 'netns', 'exec', netns, ...argv];
const log = (msg: string) => process.stderr.write(`bench: ${msg}\n`);

// ---------------------------------------------------------------------------------------------------------------
// The labs

interface LabPod {
  readonly name: string;
  readonly node: string;
  readonly netns: string;
  readonly ip: string;
}

interface Lab {
  readonly runId: string;
  readonly prefix: string;
  /** The run's directory (/run/atoll-lab/<runid>), the nodes' files under it. */
  readonly dir: string;
  readonly pods: ReadonlyMap<string, LabPod>;
  readonly nodes: ReadonlyMap<string, { readonly netns: string; readonly underlay: string }>;
  /** PIDs by the lab state's role: `controller`, `relay`, `agent a-1`, ... */
  readonly pids: ReadonlyMap<string, number>;
  /** The `atoll lab up` flags it was built with (besides --spec). */
  readonly flags: readonly string[];
  /** How its uplink delays (if any) are made. */
  readonly delayBy: 'netem' | 'delay-line';
}

interface EdgeSpec {
  readonly name: string;
  readonly nodes: number;
  readonly nat: 'endpoint-independent' | 'symmetric';
}

function labSpec(edges: readonly EdgeSpec[]): unknown {
  return { cloudNodes: 1, edges: edges.map((e) => ({ ...e, community: 'x', uplink: {} })), podsPerNode: 1, sameSite: 'vxlan' };
}

const UNSHAPED_SPEC = labSpec([
  { name: 'a', nodes: 2, nat: 'endpoint-independent' }, { name: 'b', nodes: 1, nat: 'endpoint-independent' }, { name: 'c', nodes: 1, nat: 'symmetric' },
]);
const SHAPED_SPEC = labSpec([{ name: 'a', nodes: 1, nat: 'endpoint-independent' }, { name: 'b', nodes: 1, nat: 'endpoint-independent' }]);

/**
 * `atoll lab up --detach` for `spec` with `flags`; the run id is taken from its first line, so a lab being built is
 * removed even when this run stops half-way. @throws Error with the lab's output when it failed or refused.
 */
async function labUp(fx: Fixture, name: string, spec: unknown, flags: readonly string[]): Promise<Lab> {
  const specPath = join(fx.dir, `${name}-spec.json`);
  const jsonPath = join(fx.dir, `${name}-lab.json`);
  writeFileSync(specPath, JSON.stringify(spec));
  const t0 = Date.now();
  let runId: string | undefined;
  // --pods direct: pods in named namespaces (`ip netns exec`), plumbed by the same atoll-cni and agent as through CRI;
  // the parts that measure the TLS stream tunnel (all but those given --udp) run their agents on streams only
  const udp = flags.includes('--udp') ? [] : ['--no-udp'];
  const res = await start(fx, [ATOLL, 'lab', 'up', '--detach', '--pods', 'direct', '--json', jsonPath, '--spec', specPath, ...udp, ...flags], LAB_UP_TIMEOUT_MS, {
    gentle: true,
    onStdout: (text) => {
      const m = /atoll lab ([0-9a-f]{4}):/.exec(text);
      if (m?.[1] && runId === undefined) {
        runId = m[1];
        fx.labs.add(runId);
      }
    },
  }).done;
  if (res.code !== 0) {
    const why = `${res.stdout.trim()}\n${res.stderr.trim()}`;
    if (res.stderr.includes('LAB_PREREQUISITE_MISSING')) {
      // refused before creating anything: there is nothing of this run id to remove
      if (runId !== undefined && labNamespaces(runId).length === 0) fx.labs.delete(runId);
    }
    throw new Error(`atoll lab up ${flags.join(' ')} failed (exit ${res.code}):\n${why}`);
  }
  const up = JSON.parse(readFileSync(jsonPath, 'utf8')) as { runId: string; prefix: string; pods: LabPod[]; nodes: { name: string; netns: string; underlay: string }[]; uplinkDelayBy: 'netem' | 'delay-line' };
  fx.labs.add(up.runId);
  const state = JSON.parse(readFileSync(join(LAB_STATE_DIR, `${up.runId}.json`), 'utf8')) as { dir: string; processes: { role: string; pid: number }[] };
  log(`${name}: lab ${up.runId} up in ${((Date.now() - t0) / 1000).toFixed(1)} s (${flags.join(' ') || 'no uplink conditions'})`);
  return {
    runId: up.runId, prefix: up.prefix, dir: state.dir, flags, delayBy: up.uplinkDelayBy,
    pods: new Map(up.pods.map((p) => [p.name, { name: p.name, node: p.node, netns: p.netns, ip: p.ip }])),
    nodes: new Map(up.nodes.map((n) => [n.name, { netns: n.netns, underlay: n.underlay }])),
    pids: new Map(state.processes.map((p) => [p.role, p.pid])),
  };
}

async function labDown(fx: Fixture, lab: Lab): Promise<void> {
  const res = await run(fx, [ATOLL, 'lab', 'down', lab.runId], LAB_DOWN_TIMEOUT_MS);
  const left = labNamespaces(lab.runId);
  if (res.code !== 0 || left.length > 0) throw new Error(`atoll lab down ${lab.runId} failed (exit ${res.code}; namespaces left: ${left.join(' ') || 'none'}): ${res.stderr}`);
  fx.labs.delete(lab.runId);
  log(`lab ${lab.runId} removed`);
}

function need<T>(m: ReadonlyMap<string, T>, key: string, what: string): T {
  const v = m.get(key);
  if (v === undefined) throw new Error(`the lab has no ${what} "${key}" (has: ${[...m.keys()].join(', ')})`);
  return v;
}

/** What `atoll peers --json` says on `node`, through its status socket (`<dir of the agent's socketPath>/atoll-status.sock`). */
async function peersOf(fx: Fixture, lab: Lab, node: string): Promise<TunnelStatus> {
  const config = JSON.parse(readFileSync(join(lab.dir, node, 'agent.json'), 'utf8')) as { socketPath: string };
  const res = await run(fx, [ATOLL, 'peers', '--json', '--socket', statusSocketOf(config.socketPath)], 15_000);
  const status = res.code === 0 ? (JSON.parse(res.stdout) as TunnelStatus | null) : null;
  if (!status) throw new Error(`atoll peers on ${node} answered nothing usable (exit ${res.code}): ${res.stdout.slice(0, 300)}${res.stderr}`);
  return status;
}

async function pathOf(fx: Fixture, lab: Lab, node: string, peer: string): Promise<{ path: string; txBytes: number }> {
  const p = (await peersOf(fx, lab, node)).peers.find((x) => x.name === peer);
  return { path: p?.path ?? 'unknown', txBytes: p?.txBytes ?? 0 };
}

async function waitForPath(fx: Fixture, lab: Lab, node: string, peer: string, want: string): Promise<void> {
  let last = '';
  try {
    await until(`${node}'s tunnel path to ${peer} to be ${want}`, async () => (last = (await pathOf(fx, lab, node, peer)).path) === want, PATH_WAIT_MS, 1000);
  } catch (e) {
    throw new Error(`${node} -> ${peer}: atoll peers shows the path "${last}", expected "${want}" within ${PATH_WAIT_MS / 1000} s`, { cause: e });
  }
  log(`atoll peers on ${node}: the path to ${peer} is ${want}`);
}

/** Bytes a link in `netns` transmitted so far (`ip -s -json link`). */
function txBytesOf(netns: string, dev: string): number {
  const [l] = JSON.parse(execFileSync('ip', ['-n', netns, '-s', '-json', 'link', 'show', 'dev', dev], { encoding: 'utf8' })) as { stats64?: { tx?: { bytes?: number } } }[];
  return l?.stats64?.tx?.bytes ?? NaN;
}

/** The qdiscs on a link, one line each (`tc -s qdisc` minus the statistics). */
function qdiscsOf(netns: string, dev: string): string[] {
  const out = execFileSync('tc', ['-n', netns, 'qdisc', 'show', 'dev', dev], { encoding: 'utf8' });
  return out.split('\n').map((l) => l.trim()).filter((l) => l !== '');
}

// ---------------------------------------------------------------------------------------------------------------
// CPU and memory of the agents and the relay, from /proc

const CLK_TCK = Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100;

/** utime + stime of a process (all its threads), in clock ticks. */
function cpuTicks(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' '); // fields[0] is field 3 (state)
  return Number(fields[11]) + Number(fields[12]);
}

function memKiB(pid: number): { rss: number; hwm: number; anon: number } {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kib = (key: string) => Number(new RegExp(`^${key}:\\s+(\\d+) kB`, 'm').exec(status)?.[1] ?? NaN);
  return { rss: kib('VmRSS'), hwm: kib('VmHWM'), anon: kib('RssAnon') };
}

interface Watched {
  /** `agent a-1`, `relay`. */
  readonly role: string;
  /** Its part in the run: sender, receiver, relay. */
  readonly as: string;
  readonly pid: number;
}

interface ProcUsage extends Watched {
  /** CPU time over the run's wall time, % of one core. */
  readonly cpuPct: number;
  /** VmRSS right before the run. */
  readonly rssBeforeKiB: number;
  readonly rssMaxKiB: number;
  readonly rssMedianKiB: number;
  /** VmHWM (the process's peak since it started) at the end of the run. */
  readonly hwmEndKiB: number;
  readonly rssSamples: number;
}

/** Samples `procs` from `begin()` to `end()`: CPU ticks at both ends, VmRSS every RSS_SAMPLE_MS. */
function sampler(procs: readonly Watched[]): { begin: () => void; end: () => ProcUsage[] } {
  let t0 = 0;
  let ticks0: number[] = [];
  let before: number[] = [];
  const rss: number[][] = procs.map(() => []);
  let timer: NodeJS.Timeout | undefined;
  const read = () => procs.forEach((p, i) => rss[i]?.push(memKiB(p.pid).rss));
  return {
    begin() {
      before = procs.map((p) => memKiB(p.pid).rss);
      ticks0 = procs.map((p) => cpuTicks(p.pid));
      t0 = performance.now();
      timer = setInterval(() => {
        try {
          read();
        } catch {
          // a process that died is reported by end()
        }
      }, RSS_SAMPLE_MS);
    },
    end() {
      clearInterval(timer);
      const wallS = (performance.now() - t0) / 1000;
      return procs.map((p, i) => {
        const ticks = cpuTicks(p.pid) - (ticks0[i] ?? NaN);
        const m = memKiB(p.pid);
        const xs = [...(rss[i] ?? []), m.rss];
        return {
          ...p, cpuPct: (ticks / CLK_TCK / wallS) * 100, rssBeforeKiB: before[i] ?? NaN, rssMaxKiB: Math.max(...xs), rssMedianKiB: median(xs),
          hwmEndKiB: m.hwm, rssSamples: xs.length,
        };
      });
    },
  };
}

// ---------------------------------------------------------------------------------------------------------------
// One iperf3 run

/** 'vxlan', 'direct', 'relayed', 'shaped-vxlan', 'shaped-direct', 'datagram-udp', 'datagram-stream', 'datagram-relayed', 'lossy-<pct>-<path>-<streams>'. */
type PathKey = string;

interface PathDef {
  readonly key: PathKey;
  readonly part: Part;
  readonly label: string;
  readonly from: { readonly name: string; readonly netns: string };
  readonly to: { readonly name: string; readonly netns: string; readonly ip: string };
  readonly watch: readonly Watched[];
  /** Bytes the path's carrier (a VXLAN device, the tunnel peer's stream) sent so far: shows the traffic took it. */
  readonly carried: () => Promise<number>;
  readonly carrier: string;
  /** For tunnel paths: the source agent's path to the peer, read after each run. */
  readonly tunnel?: { readonly lab: Lab; readonly node: string; readonly peer: string; readonly want: string };
  /** Parallel TCP streams (iperf3 -P); 1 when absent. */
  readonly streams?: number;
  /** Run before each of its runs (block or allow UDP, and wait for the path). */
  readonly before?: () => Promise<void>;
  /** Run after each of its runs, whatever happened (stop a flood). */
  readonly after?: () => Promise<void>;
}

interface Sample {
  readonly part: Part;
  readonly path: PathKey;
  readonly run: number;
  readonly gbps: number;
  readonly bytesReceived: number;
  readonly retransmits: number;
  /** iperf3's own CPU figures (client host, server host), % */
  readonly senderCpu: number;
  readonly receiverCpu: number;
  /** Bytes the path's carrier sent during the run over the bytes iperf3 received (about 1, a little more for headers). */
  readonly carriedShare: number;
  /** The source agent's path to the peer after the run (tunnel paths). */
  readonly pathAfter?: string;
  readonly procs: readonly ProcUsage[];
  /** The machine's 1-minute load average at the end of the run. */
  readonly load: number;
}

async function iperf(fx: Fixture, p: PathDef, seconds: number, runIndex: number): Promise<Sample> {
  const srv = start(fx, inNs(p.to.netns, ['iperf3', '-s', '-1', '-B', p.to.ip, '-p', String(IPERF_PORT)]), (seconds + 40) * 1000);
  try {
    await until(`the iperf3 server in ${p.to.netns} to listen`, async () => (await run(fx, inNs(p.to.netns, ['ss', '-Hltn', `sport = :${IPERF_PORT}`]), 5000)).stdout.trim() !== '', 10_000);
    const s = sampler(p.watch);
    const carried0 = await p.carried();
    s.begin();
    const parallel = (p.streams ?? 1) > 1 ? ['-P', String(p.streams)] : [];
    const res = await run(fx, inNs(p.from.netns, ['iperf3', '-c', p.to.ip, '-p', String(IPERF_PORT), '-t', String(seconds), '-J', '--connect-timeout', '3000', ...parallel]), (seconds + 30) * 1000);
    const procs = s.end();
    const carried = (await p.carried()) - carried0;
    let report: { error?: string; end?: { sum_received?: { bits_per_second?: number; bytes?: number }; sum_sent?: { retransmits?: number }; cpu_utilization_percent?: { host_total?: number; remote_total?: number } } };
    try {
      report = JSON.parse(res.stdout) as typeof report;
    } catch {
      throw new Error(`iperf3 ${p.from.name} -> ${p.to.name} (${p.to.ip}) printed no JSON (exit ${res.code}): ${res.stdout.slice(0, 500)}${res.stderr}`);
    }
    const bps = report.end?.sum_received?.bits_per_second;
    const bytes = report.end?.sum_received?.bytes ?? NaN;
    if (res.code !== 0 || typeof bps !== 'number' || bps <= 0) throw new Error(`iperf3 ${p.from.name} -> ${p.to.name} (${p.to.ip}) failed (exit ${res.code}): ${report.error ?? res.stderr}`);
    const pathAfter = p.tunnel ? (await pathOf(fx, p.tunnel.lab, p.tunnel.node, p.tunnel.peer)).path : undefined;
    if (p.tunnel && pathAfter !== p.tunnel.want) log(`WARNING: after this run ${p.tunnel.node}'s path to ${p.tunnel.peer} is ${pathAfter}, not ${p.tunnel.want}`);
    return {
      part: p.part, path: p.key, run: runIndex, gbps: bps / 1e9, bytesReceived: bytes, retransmits: report.end?.sum_sent?.retransmits ?? 0,
      senderCpu: report.end?.cpu_utilization_percent?.host_total ?? NaN, receiverCpu: report.end?.cpu_utilization_percent?.remote_total ?? NaN,
      carriedShare: carried / bytes, ...(pathAfter !== undefined ? { pathAfter } : {}), procs, load: loadavg()[0] as number,
    };
  } finally {
    srv.child.kill('SIGKILL');
    await srv.done.catch(() => undefined);
  }
}

/** Every path `reps` times, alternating: A B C A B C ... */
async function measure(fx: Fixture, paths: readonly PathDef[], opts: Options): Promise<Sample[]> {
  const samples: Sample[] = [];
  for (let r = 0; r < opts.reps; r++) {
    for (const p of paths) {
      await p.before?.();
      log(`${p.part}: ${p.label}, run ${r + 1}/${opts.reps}, ${opts.seconds} s`);
      let s: Sample;
      try {
        s = await iperf(fx, p, opts.seconds, r);
      } finally {
        await p.after?.();
      }
      log(`  ${s.gbps.toFixed(2)} Gbit/s`);
      samples.push(s);
    }
  }
  return samples;
}

function tunnelCarried(fx: Fixture, lab: Lab, node: string, peer: string): () => Promise<number> {
  return async () => (await pathOf(fx, lab, node, peer)).txBytes;
}

function watched(lab: Lab, ...procs: [role: string, as: string][]): Watched[] {
  return procs.map(([role, as]) => ({ role, as, pid: need(lab.pids, role, 'process') }));
}

/** Resident memory of the agents and the relay before any load. */
function idleMemory(lab: Lab): Record<string, { rssKiB: number; hwmKiB: number }> {
  const out: Record<string, { rssKiB: number; hwmKiB: number }> = {};
  for (const [role, pid] of lab.pids) if (role === 'relay' || role.startsWith('agent ')) out[role] = (({ rss, hwm }) => ({ rssKiB: rss, hwmKiB: hwm }))(memKiB(pid));
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// Part 1: unshaped

interface PartResult {
  readonly runId: string;
  /** The `atoll lab up` flags the lab was built with. */
  readonly flags: readonly string[];
  readonly paths: Record<string, string>;
  readonly idle: Record<string, { rssKiB: number; hwmKiB: number }>;
  readonly samples: Sample[];
  /** Unshaped part with --metrics both: the second lab, without metrics listeners (its paths' keys end in {@link NO_METRICS}). */
  readonly noMetrics?: { readonly runId: string; readonly flags: readonly string[]; readonly idle: Record<string, { rssKiB: number; hwmKiB: number }> };
  /** Flood part: per kind, what the flooder said it sent and what b-1 counted as dropped (by reason) over its runs. */
  readonly floods?: Record<string, { readonly lines: readonly string[]; readonly drops: Record<string, number> }>;
  /**
   * Idle part: each agent's (and the reference's) VmRSS and RssAnon (KiB) read every {@link IDLE_SAMPLE_MS}, from
   * when the lab converged, at `atS` seconds.
   */
  readonly idleSeries?: { readonly atS: readonly number[]; readonly rssKiB: Record<string, number[]>; readonly anonKiB: Record<string, number[]> };
  /** Shaped part: the uplink conditions applied, and how the delay was made. */
  readonly applied?: { readonly rateMbit: number; readonly delayMs: number; readonly delayBy: 'netem' | 'delay-line'; readonly qdiscs: Record<string, string[]> };
}

/** The unshaped part's three paths in `lab`; `suffix` and `note` mark the lab without metrics listeners. */
async function unshapedPaths(fx: Fixture, lab: Lab, suffix: string, note: string): Promise<PathDef[]> {
  await waitForPath(fx, lab, 'a-1', 'b-1', 'direct');
  await waitForPath(fx, lab, 'a-2', 'c-1', 'relayed');
  const pod = (n: string) => need(lab.pods, n, 'pod');
  const a1 = need(lab.nodes, 'a-1', 'node');
  return [
    {
      key: `vxlan${suffix}`, part: 'unshaped', label: `VXLAN a-1-p1 -> a-2-p1 (same site, kernel VXLAN)${note}`, from: pod('a-1-p1'), to: pod('a-2-p1'),
      watch: watched(lab, ['agent a-1', 'sender'], ['agent a-2', 'receiver']), carried: async () => txBytesOf(a1.netns, 'atoll.1'), carrier: 'atoll.1 on a-1',
    },
    {
      key: `direct${suffix}`, part: 'unshaped', label: `tunnel direct a-1-p1 -> b-1-p1 (hole-punched)${note}`, from: pod('a-1-p1'), to: pod('b-1-p1'),
      watch: watched(lab, ['agent a-1', 'sender'], ['agent b-1', 'receiver']), carried: tunnelCarried(fx, lab, 'a-1', 'b-1'), carrier: 'a-1 tunnel peer b-1 (txBytes)',
      tunnel: { lab, node: 'a-1', peer: 'b-1', want: 'direct' },
    },
    {
      key: `relayed${suffix}`, part: 'unshaped', label: `tunnel relayed a-2-p1 -> c-1-p1 (through the relay)${note}`, from: pod('a-2-p1'), to: pod('c-1-p1'),
      watch: watched(lab, ['agent a-2', 'sender'], ['agent c-1', 'receiver'], ['relay', 'relay']), carried: tunnelCarried(fx, lab, 'a-2', 'c-1'), carrier: 'a-2 tunnel peer c-1 (txBytes)',
      tunnel: { lab, node: 'a-2', peer: 'c-1', want: 'relayed' },
    },
  ];
}

async function unshaped(fx: Fixture, opts: Options): Promise<PartResult> {
  if (opts.metrics !== 'both') {
    const flags = opts.metrics === 'off' ? ['--no-metrics'] : [];
    const lab = await labUp(fx, 'unshaped', UNSHAPED_SPEC, flags);
    try {
      const paths = await unshapedPaths(fx, lab, '', opts.metrics === 'off' ? ' (metrics off)' : '');
      const idle = idleMemory(lab);
      const samples = await measure(fx, paths, opts);
      return { runId: lab.runId, flags: lab.flags, paths: Object.fromEntries(paths.map((p) => [p.key, p.label])), idle, samples };
    } finally {
      await labDown(fx, lab);
    }
  }
  // both: two labs up at once; each path in the lab with metrics, then in the one without, rep after rep
  const [on, off] = await Promise.allSettled([labUp(fx, 'unshaped', UNSHAPED_SPEC, []), labUp(fx, 'unshaped-nometrics', UNSHAPED_SPEC, ['--no-metrics'])]);
  try {
    if (on.status === 'rejected') throw on.reason;
    if (off.status === 'rejected') throw off.reason;
    const onPaths = await unshapedPaths(fx, on.value, '', '');
    const offPaths = await unshapedPaths(fx, off.value, NO_METRICS, ' (metrics off)');
    const paths = onPaths.flatMap((p, i) => [p, offPaths[i] as PathDef]);
    const idle = idleMemory(on.value);
    const idleOff = idleMemory(off.value);
    const samples = await measure(fx, paths, opts);
    return {
      runId: on.value.runId, flags: on.value.flags, paths: Object.fromEntries(paths.map((p) => [p.key, p.label])), idle, samples,
      noMetrics: { runId: off.value.runId, flags: off.value.flags, idle: idleOff },
    };
  } finally {
    for (const r of [on, off]) if (r.status === 'fulfilled') await labDown(fx, r.value);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Part 2: shaped uplinks; the reference is a kernel VXLAN between the two edge routers, over the same uplinks

function publicAddressOf(netns: string): string {
  const [l] = JSON.parse(execFileSync('ip', ['-n', netns, '-json', '-4', 'addr', 'show', 'dev', 'up0'], { encoding: 'utf8' })) as { addr_info?: { local?: string }[] }[];
  const a = l?.addr_info?.[0]?.local;
  if (!a) throw new Error(`${netns} has no IPv4 address on up0`);
  return a;
}

/**
 * A VXLAN device in each router, `local`/`remote` their public addresses, a fixed UDP source port equal to the
 * destination port: the routers' firewall (the lab's `atoll-lab` table) drops unsolicited packets arriving on `up0`,
 * and with one 5-tuple both ways each router's own outgoing packets make the other's arrive as `established`, as
 * hole punching does for the tunnel. Checked with pings both ways.
 */
async function buildReferenceVxlan(fx: Fixture, ra: string, rb: string): Promise<void> {
  const ends = [{ ns: ra, local: publicAddressOf(ra), remote: publicAddressOf(rb), addr: REF_VXLAN.a }, { ns: rb, local: publicAddressOf(rb), remote: publicAddressOf(ra), addr: REF_VXLAN.b }];
  for (const e of ends) {
    fx.devices.push({ netns: e.ns, dev: REF_VXLAN.dev });
    execFileSync('ip', ['-n', e.ns, 'link', 'add', REF_VXLAN.dev, 'type', 'vxlan', 'id', String(REF_VXLAN.vni), 'dstport', String(REF_VXLAN.port),
      'srcport', String(REF_VXLAN.port), String(REF_VXLAN.port + 1), 'local', e.local, 'remote', e.remote, 'dev', 'up0']);
    execFileSync('ip', ['-n', e.ns, 'addr', 'add', `${e.addr}/${REF_VXLAN.bits}`, 'dev', REF_VXLAN.dev]);
    execFileSync('ip', ['-n', e.ns, 'link', 'set', REF_VXLAN.dev, 'up']);
  }
  const ping = async (ns: string, to: string) => (await run(fx, inNs(ns, ['ping', '-c', '1', '-W', '1', to]), 5000)).code === 0;
  await until('the reference VXLAN between the routers to answer both ways', async () => (await ping(rb, REF_VXLAN.a)) && (await ping(ra, REF_VXLAN.b)), 15_000, 200);
  log(`reference VXLAN ${REF_VXLAN.dev} (VNI ${REF_VXLAN.vni}, port ${REF_VXLAN.port}) up between ${ends[0]?.local} and ${ends[1]?.local}`);
}

async function shaped(fx: Fixture, opts: Options): Promise<PartResult> {
  const rate = ['--rate', `a=${opts.rateMbit}`, '--rate', `b=${opts.rateMbit}`];
  const lab = await labUp(fx, 'shaped', SHAPED_SPEC, opts.delayMs > 0 ? [...rate, '--delay', `a=${opts.delayMs}`, '--delay', `b=${opts.delayMs}`] : rate);
  try {
    const ra = `${lab.prefix}a-router`;
    const rb = `${lab.prefix}b-router`;
    const wan = `${lab.prefix}wan`;
    const qdiscs = { 'a-router up0': qdiscsOf(ra, 'up0'), 'wan p-a': qdiscsOf(wan, 'p-a'), 'b-router up0': qdiscsOf(rb, 'up0'), 'wan p-b': qdiscsOf(wan, 'p-b') };
    await buildReferenceVxlan(fx, ra, rb);
    await waitForPath(fx, lab, 'a-1', 'b-1', 'direct');
    const pod = (n: string) => need(lab.pods, n, 'pod');
    // Linux's default TCP buffers (tcp_rmem max 6 MiB) cap one stream near 0.5 Gbit/s at 40 ms; raise them on both
    // paths' ends (the routers for the reference; the nodes, whose agents' streams carry the tunnel, and the pods)
    const tcpEnds = [ra, rb, need(lab.nodes, 'a-1', 'node').netns, need(lab.nodes, 'b-1', 'node').netns, pod('a-1-p1').netns, pod('b-1-p1').netns];
    for (const ns of tcpEnds) execFileSync('ip', ['netns', 'exec', ns, 'sysctl', '-q', '-w', `net.ipv4.tcp_rmem=${TCP_BUFFERS}`, `net.ipv4.tcp_wmem=${TCP_BUFFERS}`]);
    const conditions = `${opts.rateMbit} Mbit/s${opts.delayMs > 0 ? `, ${opts.delayMs} ms per uplink` : ''}`;
    const paths: PathDef[] = [
      {
        key: 'shaped-vxlan', part: 'shaped', label: `VXLAN a-router -> b-router over the shaped uplinks (${conditions})`,
        from: { name: 'a-router', netns: ra }, to: { name: 'b-router', netns: rb, ip: REF_VXLAN.b },
        watch: [], carried: async () => txBytesOf(ra, REF_VXLAN.dev), carrier: `${REF_VXLAN.dev} on a-router`,
      },
      {
        key: 'shaped-direct', part: 'shaped', label: `tunnel direct a-1-p1 -> b-1-p1 over the shaped uplinks (${conditions})`, from: pod('a-1-p1'), to: pod('b-1-p1'),
        watch: watched(lab, ['agent a-1', 'sender'], ['agent b-1', 'receiver']), carried: tunnelCarried(fx, lab, 'a-1', 'b-1'), carrier: 'a-1 tunnel peer b-1 (txBytes)',
        tunnel: { lab, node: 'a-1', peer: 'b-1', want: 'direct' },
      },
    ];
    const idle = idleMemory(lab);
    const samples = await measure(fx, paths, opts);
    return {
      runId: lab.runId, flags: lab.flags, paths: Object.fromEntries(paths.map((p) => [p.key, p.label])), idle, samples,
      applied: { rateMbit: opts.rateMbit, delayMs: opts.delayMs, delayBy: lab.delayBy, qdiscs },
    };
  } finally {
    for (const d of fx.devices.splice(0)) deleteDevice(d.netns, d.dev);
    await labDown(fx, lab);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Parts 3 and 4: the datagram path, unshaped and on lossy uplinks

/**
 * Drops all UDP forwarded at `router` with `block` (as the lab's `--block-udp` does: edge nodes receive datagrams on
 * an ephemeral port, so the tunnel's UDP has no fixed port to match), or stops dropping it, and waits until `node`'s
 * path to `peer` shows it (the stream within about 3 s; datagrams again within a keepalive or two).
 */
async function tunnelUdp(fx: Fixture, lab: Lab, router: string, block: boolean, node: string, peer: string): Promise<void> {
  const table = 'atoll-bench-noudp';
  await run(fx, inNs(router, ['nft', 'delete', 'table', 'ip', table]), 10_000); // absent the first time
  if (block) {
    const rules = `table ip ${table} {\n  chain forward {\n    type filter hook forward priority -20; policy accept;\n    meta l4proto udp drop\n  }\n}\n`;
    writeFileSync(join(fx.dir, `${table}.nft`), rules);
    const res = await run(fx, inNs(router, ['nft', '-f', join(fx.dir, `${table}.nft`)]), 10_000);
    if (res.code !== 0) throw new Error(`blocking UDP at ${router} failed: ${res.stderr}`);
  }
  await waitForPath(fx, lab, node, peer, block ? 'direct' : 'udp');
}

/**
 * Sets random loss of `perMille` on what arrives at each router from its uplink (for it, or to forward); 0 removes it.
 * On arrival, not on departure: a packet the sending host's own OUTPUT hook drops is an error its TCP sees at once
 * (local congestion, sent again without a loss signal), so a departure rule would spare the routers' plain TCP (the
 * reference) the loss the tunnel's forwarded packets get. Before conntrack (priority -300), as a lost packet would be.
 */
async function setLoss(fx: Fixture, routers: readonly string[], perMille: number): Promise<void> {
  const table = 'atoll-bench-loss';
  for (const r of routers) {
    await run(fx, inNs(r, ['nft', 'delete', 'table', 'ip', table]), 10_000);
    if (perMille === 0) continue;
    const rules = `table ip ${table} {\n  chain prerouting {\n    type filter hook prerouting priority -300; policy accept;\n    iifname "up0" numgen random mod 1000 < ${perMille} counter drop\n  }\n}\n`;
    writeFileSync(join(fx.dir, `${table}.nft`), rules);
    const res = await run(fx, inNs(r, ['nft', '-f', join(fx.dir, `${table}.nft`)]), 10_000);
    if (res.code !== 0) throw new Error(`the loss rule in ${r} failed: ${res.stderr}`);
  }
}

/** Turns GRO, GSO and TSO off on a link (one feature at a time: a veth may refuse one), so a loss takes one packet, not a superpacket. */
async function offloadsOff(fx: Fixture, netns: string, dev: string): Promise<void> {
  for (const f of ['gro', 'gso', 'tso']) await run(fx, inNs(netns, ['ethtool', '-K', dev, f, 'off']), 10_000);
}

async function datagram(fx: Fixture, opts: Options): Promise<PartResult> {
  const lab = await labUp(fx, 'datagram', UNSHAPED_SPEC, ['--udp']);
  try {
    const ra = `${lab.prefix}a-router`;
    await waitForPath(fx, lab, 'a-1', 'b-1', 'udp');
    await waitForPath(fx, lab, 'a-2', 'c-1', 'relayed');
    const pod = (n: string) => need(lab.pods, n, 'pod');
    const common = {
      part: 'datagram' as const, from: pod('a-1-p1'), to: pod('b-1-p1'), watch: watched(lab, ['agent a-1', 'sender'], ['agent b-1', 'receiver']),
      carried: tunnelCarried(fx, lab, 'a-1', 'b-1'), carrier: 'a-1 tunnel peer b-1 (txBytes)',
    };
    const paths: PathDef[] = [
      { ...common, key: 'datagram-udp', label: 'tunnel a-1-p1 -> b-1-p1 over UDP datagrams (unshaped)', tunnel: { lab, node: 'a-1', peer: 'b-1', want: 'udp' },
        before: () => tunnelUdp(fx, lab, ra, false, 'a-1', 'b-1') },
      { ...common, key: 'datagram-stream', label: 'tunnel a-1-p1 -> b-1-p1 over its TLS stream, UDP dropped at a-router (unshaped)', tunnel: { lab, node: 'a-1', peer: 'b-1', want: 'direct' },
        before: () => tunnelUdp(fx, lab, ra, true, 'a-1', 'b-1') },
      {
        key: 'datagram-relayed', part: 'datagram', label: 'tunnel a-2-p1 -> c-1-p1 through the relay (c behind a symmetric NAT; unshaped)', from: pod('a-2-p1'), to: pod('c-1-p1'),
        watch: watched(lab, ['agent a-2', 'sender'], ['agent c-1', 'receiver'], ['relay', 'relay']), carried: tunnelCarried(fx, lab, 'a-2', 'c-1'), carrier: 'a-2 tunnel peer c-1 (txBytes)',
        tunnel: { lab, node: 'a-2', peer: 'c-1', want: 'relayed' }, before: () => tunnelUdp(fx, lab, ra, false, 'a-1', 'b-1'),
      },
    ];
    const idle = idleMemory(lab);
    const samples = await measure(fx, paths, opts);
    return { runId: lab.runId, flags: lab.flags, paths: Object.fromEntries(paths.map((p) => [p.key, p.label])), idle, samples };
  } finally {
    await labDown(fx, lab);
  }
}

async function lossy(fx: Fixture, opts: Options): Promise<PartResult> {
  const rate = ['--rate', `a=${opts.rateMbit}`, '--rate', `b=${opts.rateMbit}`];
  const delay = opts.delayMs > 0 ? ['--delay', `a=${opts.delayMs}`, '--delay', `b=${opts.delayMs}`] : [];
  const lab = await labUp(fx, 'lossy', SHAPED_SPEC, [...rate, ...delay, '--udp']);
  try {
    const ra = `${lab.prefix}a-router`;
    const rb = `${lab.prefix}b-router`;
    const wan = `${lab.prefix}wan`;
    for (const [ns, dev] of [[ra, 'up0'], [rb, 'up0'], [wan, 'p-a'], [wan, 'p-b']] as const) await offloadsOff(fx, ns, dev);
    const pod = (n: string) => need(lab.pods, n, 'pod');
    const tcpEnds = [ra, rb, need(lab.nodes, 'a-1', 'node').netns, need(lab.nodes, 'b-1', 'node').netns, pod('a-1-p1').netns, pod('b-1-p1').netns];
    for (const ns of tcpEnds) execFileSync('ip', ['netns', 'exec', ns, 'sysctl', '-q', '-w', `net.ipv4.tcp_rmem=${TCP_BUFFERS}`, `net.ipv4.tcp_wmem=${TCP_BUFFERS}`]);
    // the routers drop unsolicited packets from their uplink: let iperf3 in to b-router for the plain TCP reference
    execFileSync('ip', ['netns', 'exec', rb, 'nft', 'insert', 'rule', 'ip', 'atoll-lab', 'input', 'tcp', 'dport', String(IPERF_PORT), 'accept']);
    await waitForPath(fx, lab, 'a-1', 'b-1', 'udp');
    const conditions = `${opts.rateMbit} Mbit/s${opts.delayMs > 0 ? `, ${opts.delayMs} ms per uplink` : ''}`;
    const idle = idleMemory(lab);
    const samples: Sample[] = [];
    const labels: Record<string, string> = {};
    for (const perMille of opts.lossPerMille) {
      await setLoss(fx, [ra, rb], perMille);
      const pct = perMille / 10;
      const paths: PathDef[] = LOSSY_STREAMS.flatMap((n) => {
        const tunnel = {
          part: 'lossy' as const, from: pod('a-1-p1'), to: pod('b-1-p1'), watch: watched(lab, ['agent a-1', 'sender'], ['agent b-1', 'receiver']),
          carried: tunnelCarried(fx, lab, 'a-1', 'b-1'), carrier: 'a-1 tunnel peer b-1 (txBytes)', streams: n,
        };
        return [
          {
            key: `lossy-${pct}-plain-${n}`, part: 'lossy' as const, label: `${pct}% loss, ${n} stream(s): plain TCP a-router -> b-router (${conditions})`, streams: n,
            from: { name: 'a-router', netns: ra }, to: { name: 'b-router', netns: rb, ip: publicAddressOf(rb) }, watch: [],
            carried: async () => txBytesOf(ra, 'up0'), carrier: 'up0 on a-router',
          },
          {
            key: `lossy-${pct}-node-${n}`, part: 'lossy' as const, label: `${pct}% loss, ${n} stream(s): plain TCP node a-1 -> b-router, through a's NAT (${conditions})`, streams: n,
            from: { name: 'a-1', netns: need(lab.nodes, 'a-1', 'node').netns }, to: { name: 'b-router', netns: rb, ip: publicAddressOf(rb) }, watch: [],
            carried: async () => txBytesOf(ra, 'up0'), carrier: 'up0 on a-router',
          },
          { ...tunnel, key: `lossy-${pct}-udp-${n}`, label: `${pct}% loss, ${n} stream(s): tunnel a-1-p1 -> b-1-p1 over UDP datagrams (${conditions})`,
            tunnel: { lab, node: 'a-1', peer: 'b-1', want: 'udp' }, before: () => tunnelUdp(fx, lab, ra, false, 'a-1', 'b-1') },
          { ...tunnel, key: `lossy-${pct}-stream-${n}`, label: `${pct}% loss, ${n} stream(s): tunnel a-1-p1 -> b-1-p1 over its TLS stream, UDP dropped (${conditions})`,
            tunnel: { lab, node: 'a-1', peer: 'b-1', want: 'direct' }, before: () => tunnelUdp(fx, lab, ra, true, 'a-1', 'b-1') },
        ];
      });
      for (const p of paths) labels[p.key] = p.label;
      samples.push(...await measure(fx, paths, opts));
    }
    await setLoss(fx, [ra, rb], 0);
    return { runId: lab.runId, flags: lab.flags, paths: labels, idle, samples, applied: { rateMbit: opts.rateMbit, delayMs: opts.delayMs, delayBy: lab.delayBy, qdiscs: {} } };
  } finally {
    await labDown(fx, lab);
  }
}

/**
 * The agent's datagram port in `netns`: the UDP socket of process `pid` bound to every address (its underlay probe's
 * socket, also UDP, is bound to the node's own address).
 */
function udpPortOf(netns: string, pid: number): number {
  const out = execFileSync('ip', ['netns', 'exec', netns, 'ss', '-Hulnp'], { encoding: 'utf8' });
  const line = out.split('\n').find((l) => l.includes(`pid=${pid},`) && /\s0\.0\.0\.0:\d+\s/.test(l));
  const port = Number(/:(\d+)\s/.exec(line ?? '')?.[1]);
  if (!Number.isInteger(port) || port <= 0) throw new Error(`no UDP port of pid ${pid} in ${netns}:\n${out}`);
  return port;
}

/** bench/udp-flood.c, built into the run's directory. */
function buildFlooder(fx: Fixture): string {
  const tool = join(fx.dir, 'udp-flood');
  execFileSync('cc', ['-O2', '-Wall', '-Wextra', '-Werror', '-o', tool, join(ROOT, 'bench', 'udp-flood.c')]);
  return tool;
}

async function flood(fx: Fixture, opts: Options): Promise<PartResult> {
  const rate = ['--rate', `a=${opts.rateMbit}`, '--rate', `b=${opts.rateMbit}`];
  const delay = opts.delayMs > 0 ? ['--delay', `a=${opts.delayMs}`, '--delay', `b=${opts.delayMs}`] : [];
  const tool = buildFlooder(fx);
  const lab = await labUp(fx, 'flood', SHAPED_SPEC, [...rate, ...delay, '--udp']);
  try {
    const rb = `${lab.prefix}b-router`;
    const b1 = need(lab.nodes, 'b-1', 'node');
    const pod = (n: string) => need(lab.pods, n, 'pod');
    for (const ns of [pod('a-1-p1').netns, pod('b-1-p1').netns]) execFileSync('ip', ['netns', 'exec', ns, 'sysctl', '-q', '-w', `net.ipv4.tcp_rmem=${TCP_BUFFERS}`, `net.ipv4.tcp_wmem=${TCP_BUFFERS}`]);
    await waitForPath(fx, lab, 'a-1', 'b-1', 'udp');
    const port = udpPortOf(b1.netns, need(lab.pids, 'agent b-1', 'process'));
    // the header of a datagram a-1 sent b-1 (a keepalive comes every second): its key id is live
    const sniffed = await run(fx, inNs(b1.netns, [tool, 'sniff', String(port), '10']), 15_000);
    const header = sniffed.stdout.trim();
    if (sniffed.code !== 0 || !/^[0-9a-f]{32}$/.test(header)) throw new Error(`sniffing a datagram for b-1's port ${port} failed: ${sniffed.stderr}`);
    const conditions = `${opts.rateMbit} Mbit/s${opts.delayMs > 0 ? `, ${opts.delayMs} ms per uplink` : ''}`;
    const common = {
      part: 'flood' as const, from: pod('a-1-p1'), to: pod('b-1-p1'), watch: watched(lab, ['agent a-1', 'sender'], ['agent b-1', 'receiver']),
      carried: tunnelCarried(fx, lab, 'a-1', 'b-1'), carrier: 'a-1 tunnel peer b-1 (txBytes)', streams: FLOOD_STREAMS, tunnel: { lab, node: 'a-1', peer: 'b-1', want: 'udp' },
    };
    const floods: Record<string, { lines: string[]; drops: Record<string, number> }> = {};
    // the control: what carrying the flood costs the machine (the flooder, the routers, the kernel) without the agent
    let control: ReturnType<typeof start> | undefined;
    const controlTable = 'atoll-bench-flood-control';
    const paths: PathDef[] = [
      { ...common, key: 'flood-none', label: `tunnel a-1-p1 -> b-1-p1 over UDP datagrams, ${FLOOD_STREAMS} streams, no flood (${conditions})` },
      {
        ...common, key: 'flood-control', label: `the same under a flood of garbage datagrams, ${opts.floodRate}/s from b-router at b-1:${FLOOD_CONTROL_PORT}, dropped by b-1's input hook (the control)`,
        before: async () => {
          const rules = `table ip ${controlTable} {\n  chain input {\n    type filter hook input priority -20; policy accept;\n    udp dport ${FLOOD_CONTROL_PORT} counter drop\n  }\n}\n`;
          writeFileSync(join(fx.dir, `${controlTable}.nft`), rules);
          const res = await run(fx, inNs(b1.netns, ['nft', '-f', join(fx.dir, `${controlTable}.nft`)]), 10_000);
          if (res.code !== 0) throw new Error(`the control's drop rule in b-1 failed: ${res.stderr}`);
          control = start(fx, inNs(rb, [tool, 'send', 'garbage', b1.underlay, String(FLOOD_CONTROL_PORT), String(opts.floodRate), String(Math.min(60, opts.seconds + 10))]), (opts.seconds + 20) * 1000);
        },
        after: async () => {
          control?.child.kill('SIGINT');
          await control?.done.catch(() => undefined);
          await run(fx, inNs(b1.netns, ['nft', 'delete', 'table', 'ip', controlTable]), 10_000);
        },
      },
      ...FLOOD_KINDS.map((kind): PathDef => {
        let flooder: ReturnType<typeof start> | undefined;
        let drops0: Readonly<Record<string, number>> = {};
        return {
          ...common, key: `flood-${kind}`, label: `the same under a flood of ${kind} datagrams, ${opts.floodRate}/s from b-router at b-1:${port}`,
          before: async () => {
            drops0 = (await peersOf(fx, lab, 'b-1')).dropped;
            // bounded: the run, its start and a margin; stopped by PID after the run
            flooder = start(fx, inNs(rb, [tool, 'send', kind, b1.underlay, String(port), String(opts.floodRate), String(Math.min(60, opts.seconds + 10)), header]), (opts.seconds + 20) * 1000);
          },
          after: async () => {
            flooder?.child.kill('SIGINT');
            const res = await flooder?.done.catch(() => undefined);
            const drops = (await peersOf(fx, lab, 'b-1')).dropped;
            const f = (floods[kind] ??= { lines: [], drops: {} });
            f.lines.push(res?.stdout.trim() ?? '');
            for (const [reason, n] of Object.entries(drops)) if (n !== (drops0[reason] ?? 0)) f.drops[reason] = (f.drops[reason] ?? 0) + n - (drops0[reason] ?? 0);
          },
        };
      }),
    ];
    const idle = idleMemory(lab);
    const samples = await measure(fx, paths, opts);
    for (const [kind, f] of Object.entries(floods)) log(`flood ${kind}: b-1 dropped ${JSON.stringify(f.drops)}; ${f.lines.join('; ')}`);
    return { runId: lab.runId, flags: lab.flags, paths: Object.fromEntries(paths.map((p) => [p.key, p.label])), idle, samples, floods };
  } finally {
    await labDown(fx, lab);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Statistics and the report

const mib = (kib: number) => fmt(kib / KIB_PER_MIB);

interface Target {
  readonly what: string;
  readonly value: string;
  readonly pass: boolean;
  readonly note?: string;
}

interface Summary {
  readonly part: Part;
  readonly path: PathKey;
  readonly label: string;
  readonly runs: number;
  readonly medianGbps: number;
  readonly minGbps: number;
  readonly maxGbps: number;
}

type Results = Partial<Record<Part, PartResult>>;

const partsOf = (r: Results): PartResult[] => PARTS.flatMap((p) => (r[p] ? [r[p]] : []));

function summaries(r: Results): Summary[] {
  const out: Summary[] = [];
  for (const part of partsOf(r)) {
    for (const [key, label] of Object.entries(part.paths)) {
      const xs = part.samples.filter((s) => s.path === key).map((s) => s.gbps);
      const p = part.samples.find((s) => s.path === key)?.part ?? 'unshaped';
      out.push({ part: p, path: key as PathKey, label, runs: xs.length, medianGbps: median(xs), minGbps: Math.min(...xs), maxGbps: Math.max(...xs) });
    }
  }
  return out;
}

/** --metrics both: each unshaped path with and without the metrics listeners, medians side by side. */
function metricsSideBySide(part: PartResult): string[] {
  const rows: string[][] = [['path', 'runs', 'Gbit/s on', 'off', 'off/on', 'sender agent CPU % on', 'off', 'receiver agent CPU % on', 'off', 'relay CPU % on', 'off']];
  const gbps = (key: string) => median(part.samples.filter((s) => s.path === key).map((s) => s.gbps));
  const cpu = (key: string, as: string) => {
    const xs = part.samples.filter((s) => s.path === key).flatMap((s) => s.procs.filter((p) => p.as === as).map((p) => p.cpuPct));
    return xs.length > 0 ? fmt(median(xs)) : '-';
  };
  for (const key of Object.keys(part.paths).filter((k) => !k.endsWith(NO_METRICS))) {
    const off = `${key}${NO_METRICS}`;
    const runs = part.samples.filter((s) => s.path === key).length;
    rows.push([key, String(runs), fmt(gbps(key), 2), fmt(gbps(off), 2), fmt(gbps(off) / gbps(key), 3),
      cpu(key, 'sender'), cpu(off, 'sender'), cpu(key, 'receiver'), cpu(off, 'receiver'), cpu(key, 'relay'), cpu(off, 'relay')]);
  }
  return [`Metrics on and off (medians; lab ${part.runId} with the metrics listeners, lab ${part.noMetrics?.runId} with atoll lab up --no-metrics; runs alternating between them)`, table(rows, 2), ''];
}

function report(r: Results, opts: Options): { text: string; targets: Target[]; summary: Summary[] } {
  const lines: string[] = [];
  const samples = partsOf(r).flatMap((p) => p.samples);
  const runs: string[][] = [['part', 'path', 'run', 'Gbit/s', 'retransmits', 'sender CPU %', 'receiver CPU %', 'carried/received', 'path after', 'load 1 min']];
  for (const s of samples) {
    runs.push([s.part, s.path, String(s.run + 1), fmt(s.gbps, 2), String(s.retransmits), fmt(s.senderCpu), fmt(s.receiverCpu), fmt(s.carriedShare, 3), s.pathAfter ?? '', fmt(s.load, 2)]);
  }
  const summary = summaries(r);
  if (samples.length > 0) { // the idle part alone runs no iperf3
    lines.push(`Runs: iperf3, 1 TCP stream, ${opts.seconds} s per run, receiver bits/s, runs alternating between the paths (iperf3's CPU figures; carried/received: bytes the path's VXLAN device or tunnel stream sent over the bytes received)`, table(runs, 2), '');
    const rows: string[][] = [['part', 'path', 'runs', 'median Gbit/s', 'min', 'max']];
    for (const s of summary) rows.push([s.part, s.label, String(s.runs), fmt(s.medianGbps, 2), fmt(s.minGbps, 2), fmt(s.maxGbps, 2)]);
    lines.push('Throughput', table(rows), '');
  }
  const applied = r.shaped?.applied;
  if (applied) {
    const by = applied.delayBy === 'netem' ? 'netem' : 'the lab\'s delay line (this kernel has no netem: TAP devices and a process in a namespace spliced into each uplink)';
    lines.push(`Shaped uplinks (sites a and b, both directions): tbf ${applied.rateMbit} Mbit/s; `
      + (applied.delayMs > 0 ? `${applied.delayMs} ms one way per uplink by ${by} (${2 * applied.delayMs} ms one way a -> b, ${4 * applied.delayMs} ms round trip)` : 'no delay (--delay 0)')
      + `; TCP buffers (net.ipv4.tcp_rmem and tcp_wmem) ${TCP_BUFFERS} at both ends of both paths`);
    for (const [link, q] of Object.entries(applied.qdiscs)) lines.push(`  ${link}: ${q.join(' | ')}`);
    lines.push('');
  }

  const med = (key: PathKey) => summary.find((s) => s.path === key)?.medianGbps ?? NaN;
  const targets: Target[] = [];
  const ratio = (what: string, num: PathKey, den: PathKey, target: number, note?: string) => {
    const v = med(num) / med(den);
    targets.push({ what: `${what} >= ${target}`, value: `${fmt(med(num), 2)} / ${fmt(med(den), 2)} Gbit/s = ${fmt(v, 3)}`, pass: v >= target, ...(note ? { note } : {}) });
  };
  if (r.unshaped) {
    ratio('unshaped: tunnel direct / VXLAN', 'direct', 'vxlan', DIRECT_VS_VXLAN_TARGET);
    ratio('unshaped: tunnel relayed / tunnel direct', 'relayed', 'direct', RELAYED_VS_DIRECT_TARGET);
  }
  if (r.shaped) {
    const cond = (applied?.delayMs ?? 0) === 0 ? `${applied?.rateMbit} Mbit/s, no delay` : `${applied?.rateMbit} Mbit/s, ${applied?.delayMs} ms per uplink`;
    ratio(`shaped (${cond}): tunnel direct / VXLAN`, 'shaped-direct', 'shaped-vxlan', SHAPED_TARGET);
  }
  if (r.datagram) {
    ratio('unshaped: tunnel over UDP datagrams / over its TLS stream', 'datagram-udp', 'datagram-stream', DATAGRAM_VS_STREAM_TARGET);
    ratio('unshaped: tunnel relayed / tunnel over UDP datagrams (direct)', 'datagram-relayed', 'datagram-udp', RELAYED_VS_UDP_TARGET);
  }
  if (r.lossy) {
    for (const perMille of opts.lossPerMille.filter((x) => x > 0)) {
      for (const n of LOSSY_STREAMS) {
        const pct = perMille / 10;
        ratio(`${pct}% loss, ${n} stream(s): tunnel over datagrams / plain TCP from node a-1 (the issue's reference)`, `lossy-${pct}-udp-${n}`, `lossy-${pct}-node-${n}`, LOSSY_TARGET);
        ratio(`${pct}% loss, ${n} stream(s): tunnel over datagrams / plain TCP from a-router`, `lossy-${pct}-udp-${n}`, `lossy-${pct}-plain-${n}`, 0,
          'no target: the router sends from beside its uplink, without the node, veth and NAT hops, for comparison');
        ratio(`${pct}% loss, ${n} stream(s): tunnel over its TLS stream / plain TCP from node a-1 (today's tunnel, for comparison)`, `lossy-${pct}-stream-${n}`, `lossy-${pct}-node-${n}`, 0,
          'no target: the fallback');
      }
    }
  }
  if (r.flood) {
    for (const kind of FLOOD_KINDS) ratio(`flood of ${kind} datagrams (${opts.floodRate}/s): the flow under it / without`, `flood-${kind}`, 'flood-none', FLOOD_TARGET);
    ratio(`flood of garbage (${opts.floodRate}/s) that no socket reads: the flow under it / without`, 'flood-control', 'flood-none', 0,
      'no target: the control, what carrying the flood costs this machine without the agent');
    for (const [kind, f] of Object.entries(r.flood.floods ?? {})) lines.push(`Flood of ${kind}: b-1 counted ${Object.entries(f.drops).map(([k, v]) => `${k} ${v}`).join(', ') || 'nothing'}; the flooder: ${f.lines.join('; ')}`);
    lines.push('');
  }
  for (const part of [r.datagram, r.lossy, r.flood]) {
    for (const [role, m] of Object.entries(part?.idle ?? {})) {
      if (!role.startsWith('agent ')) continue;
      targets.push({ what: `idle VmRSS of ${role} with the datagram path <= ${IDLE_RSS_TARGET_MIB} MiB (lab ${part?.runId})`, value: `${mib(m.rssKiB)} MiB`, pass: m.rssKiB / KIB_PER_MIB <= IDLE_RSS_TARGET_MIB });
    }
  }
  const series = r.idle?.idleSeries;
  if (series) {
    // a column every 5 minutes (and the last sample), so a long run stays readable
    const cols = series.atS.flatMap((t, i) => (i === series.atS.length - 1 || t % 300 < IDLE_SAMPLE_MS / 1000 ? [i] : []));
    const settled = series.atS.flatMap((t, i) => (t >= 120 && t <= 240 ? [i] : []));
    const growth = (kib: readonly number[]) => median(kib.slice(-5)) - median(settled.map((i) => kib[i] ?? NaN));
    for (const [what, bySeries] of [['VmRSS', series.rssKiB], ['RssAnon', series.anonKiB]] as const) {
      const rows: string[][] = [['process', ...cols.map((i) => `${fmt((series.atS[i] ?? 0) / 60)} min`), 'max', 'growth (last 5 - min 2 to 4)']];
      for (const [role, kib] of Object.entries(bySeries)) {
        rows.push([role, ...cols.map((i) => mib(kib[i] ?? NaN)), mib(Math.max(...kib)), mib(growth(kib))]);
        if (what !== 'VmRSS' || role === IDLE_REFERENCE) continue;
        targets.push({
          what: `idle VmRSS of ${role} stays <= ${IDLE_RSS_TARGET_MIB} MiB over ${opts.idleMinutes} min at the lab's periods (lab ${r.idle?.runId})`,
          value: `max ${mib(Math.max(...kib))} MiB`, pass: Math.max(...kib) / KIB_PER_MIB <= IDLE_RSS_TARGET_MIB,
          note: `the reference: max ${mib(Math.max(...(series.rssKiB[IDLE_REFERENCE] ?? [])))} MiB`,
        });
        if (settled.length === 0 || (series.atS.at(-1) ?? 0) < 360) continue; // too short a run to judge growth
        targets.push({
          what: `idle VmRSS of ${role} does not grow: last 5 samples against minutes 2 to 4, <= ${IDLE_GROWTH_TARGET_MIB} MiB (lab ${r.idle?.runId})`,
          value: `${mib(growth(kib))} MiB`, pass: growth(kib) / KIB_PER_MIB <= IDLE_GROWTH_TARGET_MIB,
        });
      }
      lines.push(`Idle agents' ${what} in MiB over time, and a bare Node beside them (lab ${r.idle?.runId}: unshaped topology, --udp, resync and usage report every 5 s; read every ${IDLE_SAMPLE_MS / 1000} s)`, table(rows, 1), '');
    }
  }
  const tt: string[][] = [['target', 'result', 'value']];
  for (const t of targets) tt.push([t.what, t.pass ? 'PASS' : 'MISS', `${t.value}${t.note ? ` (${t.note})` : ''}`]);
  lines.push('Targets (medians)', table(tt, 3), '');

  const procRows: string[][] = [['part', 'path', 'process', 'as', 'runs', 'CPU % of 1 core (median)', 'min', 'max', 'VmRSS MiB: idle', 'before run (median)', 'max under load', 'VmHWM at end']];
  for (const part of partsOf(r)) {
    for (const key of Object.keys(part.paths)) {
      const mine = part.samples.filter((s) => s.path === key);
      const roles = [...new Set(mine.flatMap((s) => s.procs.map((p) => p.role)))];
      for (const role of roles) {
        const us = mine.flatMap((s) => s.procs.filter((p) => p.role === role));
        const cpu = us.map((u) => u.cpuPct);
        procRows.push([mine[0]?.part ?? '', key, role, us[0]?.as ?? '', String(us.length), fmt(median(cpu)), fmt(Math.min(...cpu)), fmt(Math.max(...cpu)),
          mib((key.endsWith(NO_METRICS) && part.noMetrics ? part.noMetrics.idle : part.idle)[role]?.rssKiB ?? NaN), mib(median(us.map((u) => u.rssBeforeKiB))), mib(Math.max(...us.map((u) => u.rssMaxKiB))), mib(Math.max(...us.map((u) => u.hwmEndKiB)))]);
      }
    }
  }
  if (r.unshaped?.noMetrics) lines.push('', ...metricsSideBySide(r.unshaped));
  if (samples.length > 0) lines.push('Agents and relay under load (/proc/<pid>/stat utime+stime over the run; VmRSS: at lab start, right before each run, its maximum sampled every 250 ms '
    + 'during the runs; VmHWM: the peak since the process started, so it includes earlier runs of other paths)', table(procRows, 4));
  return { text: lines.join('\n'), targets, summary };
}

// ---------------------------------------------------------------------------------------------------------------
// Part 6: idle

/**
 * The unshaped part's lab with the datagram path on, left idle at the lab's periods (resync and usage report every
 * 5 s): every agent's VmRSS every 30 s for `--idle-minutes`. What grows here grows on a node, only slower at the
 * default periods (60 s, 10 s).
 */
async function idle(fx: Fixture, opts: Options): Promise<PartResult> {
  const lab = await labUp(fx, 'idle', UNSHAPED_SPEC, ['--udp']);
  // the reference: what this machine and its Node make of a process that does nothing (file pages mapped, a heap)
  const reference = start(fx, [process.execPath, '--max-semi-space-size=1', '--expose-gc', '-e', "require('node:tls'); setInterval(() => {}, 5000)"],
    opts.idleMinutes * 60_000 + 120_000);
  try {
    await waitForPath(fx, lab, 'a-1', 'b-1', 'udp');
    const watched: [string, number][] = [...[...lab.pids].filter(([role]) => role.startsWith('agent ')), [IDLE_REFERENCE, reference.child.pid ?? NaN]];
    const t0 = performance.now();
    const atS: number[] = [];
    const rssKiB: Record<string, number[]> = Object.fromEntries(watched.map(([role]) => [role, []]));
    const anonKiB: Record<string, number[]> = Object.fromEntries(watched.map(([role]) => [role, []]));
    for (let k = 0; k * IDLE_SAMPLE_MS <= opts.idleMinutes * 60_000; k++) {
      await sleep(Math.max(0, t0 + k * IDLE_SAMPLE_MS - performance.now()));
      atS.push(Math.round((performance.now() - t0) / 1000));
      for (const [role, pid] of watched) {
        const m = memKiB(pid);
        rssKiB[role]?.push(m.rss);
        anonKiB[role]?.push(m.anon);
      }
      if (k % 10 === 0) process.stderr.write(`bench: idle lab, ${atS.at(-1)} s of ${opts.idleMinutes * 60}\n`);
    }
    return { runId: lab.runId, flags: lab.flags, paths: {}, idle: idleMemory(lab), samples: [], idleSeries: { atS, rssKiB, anonKiB } };
  } finally {
    reference.child.kill();
    await labDown(fx, lab);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Main

function preflight(opts: Options): void {
  const problems: string[] = [];
  if (!isRoot()) problems.push('needs root: it builds labs of network namespaces (atoll lab up)');
  const has = (cmd: string) => execFileSync('sh', ['-c', `command -v ${cmd} || true`], { encoding: 'utf8' }).trim() !== '';
  if (opts.parts.includes('flood') && !has('cc')) problems.push('cc is missing (apt-get install gcc): the flood part builds bench/udp-flood.c');
  if (opts.parts.includes('lossy') && !has('ethtool')) problems.push('ethtool is missing (apt-get install ethtool): the lossy part turns offloads off with it');
  for (const t of ['ip', 'tc', 'nft', 'iperf3', 'ping', 'ss']) if (!has(t)) problems.push(`${t} is missing (apt-get install iproute2 nftables iperf3 iputils-ping)`);
  if (!existsSync(join(ROOT, 'bin', 'atoll-cni'))) problems.push('bin/atoll-cni is not built (make setup)');
  if (problems.length > 0) throw new Error(problems.join('\n'));
}

async function main(): Promise<number> {
  const opts = parseOptions(process.argv.slice(2));
  preflight(opts);
  const started = Date.now();
  const load0 = loadavg();
  const fx = new Fixture();
  let aborting = false;
  const abort = (why: string, code: number) => {
    // `on`, not `once`: a second signal (Ctrl-C twice; `timeout` signals the process and then its group) must not
    // kill this process half-way through removing its labs
    if (aborting) return void process.stderr.write(`bench: ${why} again; still cleaning up\n`);
    aborting = true;
    process.stderr.write(`bench: ${why}; cleaning up\n`);
    void fx.cleanup().then((problems) => {
      for (const p of problems) process.stderr.write(`bench: ${p}\n`);
    }).finally(() => process.exit(code));
  };
  process.on('SIGINT', () => abort('interrupted', 130));
  process.on('SIGTERM', () => abort('terminated', 143));
  const watchdog = setTimeout(() => abort(`still running after ${opts.timeoutS} s (--timeout)`, 2), opts.timeoutS * 1000);
  const results: Results = {};
  const seconds: Record<string, number> = {};
  let problems: string[] = [];
  try {
    for (const part of opts.parts) {
      const t0 = Date.now();
      const parts: Record<Part, (fx: Fixture, opts: Options) => Promise<PartResult>> = { unshaped, shaped, datagram, lossy, flood, idle };
      results[part] = await parts[part](fx, opts);
      seconds[part] = (Date.now() - t0) / 1000;
    }
  } finally {
    clearTimeout(watchdog);
    problems = await fx.cleanup();
  }
  if (problems.length > 0) throw new Error(problems.join('\n'));

  const { text, targets, summary } = report(results, opts);
  const total = (Date.now() - started) / 1000;
  const env = { kernel: release(), node: process.version, cpus: cpus().length, clkTck: CLK_TCK, loadavgStart: load0, loadavgEnd: loadavg(), date: new Date().toISOString() };
  process.stdout.write(text + '\n');
  process.stdout.write(`\n${opts.smoke ? 'smoke run' : 'run'} took ${total.toFixed(1)} s (${Object.entries(seconds).map(([k, v]) => `${k} ${v.toFixed(1)} s`).join(', ')}); `
    + `load average ${load0.map((x) => x.toFixed(2)).join(' ')} at start, ${env.loadavgEnd.map((x) => x.toFixed(2)).join(' ')} at end; `
    + `${env.cpus} CPUs, kernel ${env.kernel}; every lab of this run removed\n`);
  if (opts.json) writeFileSync(opts.json, JSON.stringify({ options: opts, env, seconds: { total, ...seconds }, targets, summary, results }, null, 2) + '\n');
  return exitStatus(targets.filter((t) => !t.pass).length, opts.enforce);
}

runBench(main);
