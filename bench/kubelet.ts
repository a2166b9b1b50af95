/**
 * Pods through a real kubelet, Atoll's CNI against the reference, side by side in one run on ONE node:
 *   one node namespace with a private containerd 1.6 (src/lab/io/containerd/containerd.ts), a real kubelet v1.34
 *   (src/lab/io/kube/kubelet.ts), a kube-apiserver, controller-manager and scheduler on its loopback
 *   (harness/kube.ts), and a real `atoll agent` for that node (harness/agent.ts) whose `atoll-cni` and
 *   conflist are in the node's CNI directories;
 *   ours       the node's CNI conf dir holds Atoll's conflist (as the agent wrote it);
 *   reference  it holds a bridge + host-local conflist (Debian's containernetworking-plugins).
 *
 * The CNI is switched between phases by rewriting one file of the conf dir in place (`00-bench.conflist`, sorting
 * before the agent's own `10-atoll.conflist`): containerd reloads on the write; nothing is restarted. Each pod's IP is
 * checked against the phase's range (ours 10.77.0.0/22, the reference 10.79.0.0/22), so a phase whose pods went
 * through the other plugin fails the run. Phases alternate (ours first in even rounds).
 *
 * Measured: (1) create-to-Running of single pods, one at a time (p50, p95), each created at a chosen phase of the
 * kubelet's PLEG relist (the same evenly spread phases for both sides of a round; bench/relist-phase.ts), (2) a
 * Deployment scaled from 0 to N replicas until all are Ready, (3) the agent's idle VmRSS afterwards, (4) from
 * containerd's log, RunPodSandbox (the CRI call the plugin's ADD is inside) per side. Each target's ratio comes with
 * a bootstrap interval (bench/ratio-interval.ts). An unrecorded round of both sides first lets the new node settle.
 * bench/README.md explains the method, and why the targets are decided on kubelet v1.37 (`--kubernetes 1.37
 * --containerd 1.6`), whose on-demand relist reports Running at the start instead of at the next 1 s relist.
 *
 * `--evented-pleg` runs the same method on a node whose containerd is 2.x (scripts/containerd2.sh, built on demand)
 * and whose kubelet has the `EventedPLEG` feature gate: it learns of container starts from containerd's CRI events
 * instead of its generic PLEG's relist every 1 s (which then relists every 300 s only, as a fallback). The single
 * pods are created at the same spread of phases, of a fixed 5 s grid then: v1.34's evented PLEG reports Running at its
 * pod cache's 5 s tick (bench/relist-phase.ts, EVENTED_CACHE_TICK_MS), which is not logged. The run fails if the
 * kubelet's log shows no container event or a fall-back to relisting.
 *
 * `--kubernetes 1.37` runs the same method on Kubernetes v1.37.2 (its kube-apiserver, controller-manager, scheduler,
 * kubectl and kubelet: `sh scripts/k8s.sh all v1.37`, built on demand; etcd stays the default set's v3.6) with a node
 * on containerd 2.x and the kubelet's default PLEG of that version: the generic one with on-demand relist (gate
 * `PLEGOnDemandRelist`, GA in v1.37), which relists a pod right after the pod worker's sync that started its
 * container, so Running no longer waits for the next 1 s relist. The single pods keep their stratified phases of the
 * (still 1 s) global relist. The run fails unless the kubelet's log shows that most single pods were first seen
 * running by their own on-demand relist (bench/pod-timeline.ts, from containerd's and the kubelet's logs).
 * `--containerd 1.6` runs that node on Debian's containerd 1.6 instead (kubelet v1.37 starts on it, falling back from
 * the RuntimeConfig RPC 1.6 lacks to its own cgroup driver setting): the v1.34 runs' containerd, so that the two
 * modes differ in the kubelet only.
 *
 * Usage: node bench/kubelet.ts [--smoke] [--rounds R] [--pods P] [--replicas N] [--json FILE] [--timeout S] [--enforce]
 *   [--evented-pleg | --kubernetes 1.37 [--containerd 1.6]] [--logs DIR]
 */
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { closeSync, copyFileSync, existsSync, fstatSync, mkdirSync, mkdtempSync, openSync, readFileSync, readSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, release, tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { startContainerd, type Containerd } from '../src/lab/io/containerd/containerd.ts';
import { PAUSE_IMAGE_REF } from '../src/lab/io/containerd/pause-image.ts';
import { startKubelet, type Kubelet } from '../src/lab/io/kube/kubelet.ts';
import { TestAgent } from '../harness/agent.ts';
import { kubeBinDir, startControlPlane, type ControlPlane } from '../harness/kube.ts';
import { isRoot, leftoverNetns, RUN_PREFIX } from '../harness/netns.ts';
import { cleanUpOnExit, exitStatus, fmt, intOption, median, nearestRank as pct, parseBenchArgs, removeRunTempDirs, runBench, spawnBounded, table } from './common.ts';
import { catchingRelist, type CatchingRelist, containerdPodSteps, type ContainerdPodSteps } from './pod-timeline.ts';
import { bootstrapRatio, type RatioInterval } from './ratio-interval.ts';
import {
  estimateRelist, lastAtOrBefore, nextTimeAtPhase, observedPhase, phaseDifference, podRelistLine, predictedRelistBefore, EVENTED_CACHE_TICK_MS,
  type RelistEstimate, relistLineTime, stratifiedOffsets,
} from './relist-phase.ts';

const REF_DIR = '/usr/lib/cni';
const NODE = 'kb-node';
const NODE_IP = '192.0.2.10';
const OURS_CIDR = '10.77.0.0/22';
const OURS_PREFIX = '10.77.';
const REF_CIDR = '10.79.0.0/22';
const REF_PREFIX = '10.79.';
const SWITCH_FILE = '00-bench.conflist';
const POD_TIMEOUT_MS = 120_000;
/** The Kubernetes versions `--kubernetes` takes: the pinned default set, and the one of k8s/v1.37. */
const KUBERNETES_VERSIONS = ['1.34', '1.37'] as const;
type KubernetesVersion = (typeof KUBERNETES_VERSIONS)[number];
/** `--kubernetes 1.37`: the binaries taken from that set (etcd comes from the default set). */
const K8S137_BINARIES = ['kube-apiserver', 'kube-controller-manager', 'kube-scheduler', 'kubectl', 'kubelet'] as const;
/** `--kubernetes 1.37` fails below this share of single pods first seen running by their own on-demand relist. */
const MIN_ON_DEMAND_SHARE = 0.5;

interface Options {
  readonly smoke: boolean;
  readonly rounds: number;
  readonly pods: number;
  readonly replicas: number;
  readonly rssSamples: number;
  readonly timeoutS: number;
  readonly enforce: boolean;
  readonly json: string | undefined;
  readonly eventedPleg: boolean;
  readonly kubernetes: KubernetesVersion;
  /** containerd 2.x (scripts/containerd2.sh) rather than Debian's 1.6: with `--evented-pleg`, and by default with 1.37. */
  readonly containerd2: boolean;
  readonly logs: string | undefined;
}

const USAGE = `usage: node bench/kubelet.ts [options]
  --smoke              a small run: 1 round, 3 single pods and 5 replicas per side
  --rounds R           rounds; each runs both sides, alternating which goes first (default 10)
  --pods P             single pods per side and round, created one at a time, each at its own phase of the
                       kubelet's relist (the same P phases for both sides of a round) (default 20)
  --replicas N         replicas of the Deployment scaled from 0 per side and round (default 30)
  --rss-samples K      VmRSS samples of the idle agent, 1 s apart (default 5; 3 with --smoke)
  --json FILE          write every sample and summary to FILE
  --timeout SECONDS    abort (and clean up) after this long (default 3600; 600 with --smoke)
  --enforce            exit 1 when a target is missed (default: report only)
  --evented-pleg       the node on containerd 2.x (sh scripts/containerd2.sh, built on demand; ATOLL_CONTAINERD2_BIN
                       names a folder built already) with the kubelet's EventedPLEG feature gate: Running from
                       containerd's container events, not at the generic PLEG's next relist
  --kubernetes V       1.34 (default: the pinned set, containerd 1.6) or 1.37: Kubernetes v1.37.2 (sh scripts/k8s.sh all
                       v1.37, built on demand; ATOLL_K8S137_BIN names a folder built already; etcd from the default
                       set) on containerd 2.x, whose kubelet relists a pod on demand after the sync that started it
  --containerd V       with --kubernetes 1.37: 2 (default, containerd v2.2.9) or 1.6 (Debian's, as with 1.34: to
                       tell the kubelet's change from containerd's)
  --logs DIR           copy the kubelet's, containerd's and the agent's logs into DIR before the cleanup removes them`;

function parseOptions(argv: readonly string[]): Options {
  const values = parseBenchArgs(argv, USAGE, {
    rounds: { type: 'string' },
    pods: { type: 'string' },
    replicas: { type: 'string' },
    'rss-samples': { type: 'string' },
    enforce: { type: 'boolean', default: false },
    'evented-pleg': { type: 'boolean', default: false },
    kubernetes: { type: 'string', default: '1.34' },
    containerd: { type: 'string' },
    logs: { type: 'string' },
  });
  const kubernetes = values.kubernetes as string;
  if (!(KUBERNETES_VERSIONS as readonly string[]).includes(kubernetes)) {
    throw new Error(`--kubernetes ${kubernetes}: not a version this bench has a binary set for (${KUBERNETES_VERSIONS.join(' or ')})\n${USAGE}`);
  }
  if (kubernetes !== '1.34' && values['evented-pleg']) {
    throw new Error(`--evented-pleg is for kubelet v1.34 only (v1.37's evented PLEG relists on demand too): leave one out\n${USAGE}`);
  }
  const containerd = values.containerd as string | undefined;
  if (containerd !== undefined && (kubernetes !== '1.37' || !['1.6', '2'].includes(containerd))) {
    throw new Error(`--containerd ${containerd}: only with --kubernetes 1.37, and only 1.6 or 2\n${USAGE}`);
  }
  const smoke = values.smoke;
  const int = intOption(USAGE);
  return {
    smoke,
    rounds: int('rounds', values.rounds, smoke ? 1 : 10, 1),
    pods: int('pods', values.pods, smoke ? 3 : 20, 0, 200),
    replicas: int('replicas', values.replicas, smoke ? 5 : 30, 0, 100),
    rssSamples: int('rss-samples', values['rss-samples'], smoke ? 3 : 5, 0),
    timeoutS: int('timeout', values.timeout, smoke ? 600 : 3600, 1),
    enforce: values.enforce,
    json: values.json,
    eventedPleg: values['evented-pleg'],
    kubernetes: kubernetes as KubernetesVersion,
    containerd2: values['evented-pleg'] || (kubernetes === '1.37' && containerd !== '1.6'),
    logs: values.logs,
  };
}

const log = (msg: string) => process.stderr.write(`bench: ${msg}\n`);

// ---------------------------------------------------------------------------------------------------------------
// The pods as a watch sees them

interface PodSeen {
  /** Arrival (ms, performance.now) of the first event naming the pod: its creation. */
  readonly added: number;
  running?: number;
  ready?: number;
  deleted?: number;
  ip?: string;
  uid?: string;
}

/**
 * `kubectl get pods --watch` inside the node namespace, one line per event (fields separated by `|`: kubectl's watch output turns tabs into spaces); every time is this process's arrival
 * time of the event, so creation and Running are stamped by the same clock and path for both sides.
 */
class PodWatch {
  readonly pods = new Map<string, PodSeen>();
  #child: ChildProcess | undefined;
  #stopped = false;
  #buf = '';

  readonly #argv: readonly string[];

  constructor(argv: readonly string[]) {
    this.#argv = argv;
  }

  start(): void {
    const [cmd, ...args] = this.#argv as [string, ...string[]];
    const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    this.#child = child;
    child.stdout.setEncoding('utf8');
    child.stdout.on('data', (d: string) => {
      const now = performance.now();
      this.#buf += d;
      let nl: number;
      while ((nl = this.#buf.indexOf('\n')) >= 0) {
        this.#line(this.#buf.slice(0, nl), now);
        this.#buf = this.#buf.slice(nl + 1);
      }
    });
    child.stderr.on('data', (d: Buffer) => log(`kubectl watch: ${d.toString('utf8').trim()}`));
    child.on('close', (code) => {
      if (this.#stopped) return;
      log(`the pod watch ended (exit ${code}); restarting it`);
      this.#buf = '';
      setTimeout(() => {
        if (!this.#stopped) this.start();
      }, 500);
    });
  }

  #line(line: string, now: number): void {
    const [type, name, phase, podIp, ready, deleting, uid] = line.split('|');
    if (!name) return;
    let p = this.pods.get(name);
    if (!p) {
      if (type === 'DELETED') return;
      p = { added: now };
      this.pods.set(name, p);
    }
    if (podIp) p.ip = podIp;
    if (uid) p.uid = uid;
    if (phase === 'Running' && p.running === undefined && !deleting) p.running = now;
    if (ready === 'True' && p.ready === undefined && !deleting) p.ready = now;
    if (type === 'DELETED') p.deleted = now;
  }

  stop(): void {
    this.#stopped = true;
    this.#child?.kill('SIGKILL');
  }
}

/** Polls `check` every 10 ms until it returns a value; throws `what` after `ms`. */
async function until<T>(what: string, ms: number, check: () => T | undefined, detail: () => string = () => ''): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = check();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}\n${detail()}`);
    await sleep(10);
  }
}

/**
 * The kubelet's PLEG relists as its log shows them (`--vmodule=generic=5`: `"GenericPLEG: Relisting"` at the start
 * of each global one; v1.36+ also `"GenericPLEG: Relisting Pod"` at the start of each on-demand relist of one pod), read
 * incrementally; times are converted from the log's wall clock to this process's performance.now().
 */
class RelistLog {
  /** Relist starts (performance.now() ms), ascending. */
  readonly starts: number[] = [];
  /** The same starts as the log's wall clock gave them (ms since the epoch). */
  readonly startsWall: number[] = [];
  /**
   * On-demand relists of one pod (v1.36+, `"GenericPLEG: Relisting Pod"`), their starts by pod UID, ascending, as the
   * log's wall clock gave them: they are compared with containerd's log, whose lines precede them by well under 1 ms,
   * less than a conversion through Date.now() (whole ms) can keep apart.
   */
  readonly podRelists = new Map<string, number[]>();
  /** The evented PLEG's lines counted so far (see {@link EventedCounts}). */
  readonly evented: EventedCounts = { started: 0, generated: 0, fallBack: 0, streamErrors: 0 };
  readonly #path: string;
  readonly #grid: number | undefined;
  #offset = 0;
  #partial = '';

  /**
   * `grid` (a performance.now() time): time the creations by a fixed grid of {@link EVENTED_CACHE_TICK_MS} from that
   * time instead of the relists logged (the evented PLEG's node, whose generic PLEG relists every 300 s only, and
   * which reports Running at its pod cache's 5 s tick: the grid keeps a constant phase to that tick).
   */
  constructor(path: string, grid?: number) {
    this.#path = path;
    this.#grid = grid;
  }

  /** Reads what the kubelet logged since the last call. */
  read(): void {
    let fd: number;
    try {
      fd = openSync(this.#path, 'r');
    } catch {
      return; // not written yet
    }
    try {
      const size = fstatSync(fd).size;
      if (size <= this.#offset) return;
      const buf = Buffer.alloc(size - this.#offset);
      const n = readSync(fd, buf, 0, buf.length, this.#offset);
      this.#offset += n;
      const lines = (this.#partial + buf.subarray(0, n).toString('utf8')).split('\n');
      this.#partial = lines.pop() ?? '';
      const wallMinusPerf = Date.now() - performance.now();
      const year = new Date().getFullYear();
      for (const line of lines) {
        const t = relistLineTime(line, year);
        if (t !== undefined) {
          this.starts.push(t - wallMinusPerf);
          this.startsWall.push(t);
        }
        const pr = podRelistLine(line, year);
        if (pr !== undefined) {
          const list = this.podRelists.get(pr.podUid) ?? [];
          list.push(pr.time);
          this.podRelists.set(pr.podUid, list);
        }
        countEvented(this.evented, line);
      }
    } finally {
      closeSync(fd);
    }
  }

  /** The estimate from the latest relists logged so far (reads the log first), or the fixed grid. */
  estimate(): RelistEstimate | undefined {
    this.read();
    if (this.#grid !== undefined) return { last: this.#grid, period: EVENTED_CACHE_TICK_MS };
    return estimateRelist(this.starts);
  }
}

/**
 * What the kubelet's evented PLEG logged (`--vmodule=evented=4`; pkg/kubelet/pleg/evented.go): the container-started
 * events it received from the runtime, the pod statuses it generated from events, its fall-backs to generic
 * relisting, and its failures to read the runtime's event stream.
 */
interface EventedCounts {
  started: number;
  generated: number;
  fallBack: number;
  streamErrors: number;
}

function countEvented(c: EventedCounts, line: string): void {
  if (line.includes('Received Container Started Event')) c.started++;
  else if (line.includes('Evented PLEG: Generated pod status from the received event')) c.generated++;
  else if (line.includes('Fall back to Generic PLEG relisting')) c.fallBack++;
  else if (line.includes('Evented PLEG: Failed to get container events')) c.streamErrors++;
}

/** The folder of containerd 2.x for `--evented-pleg` (builds it the first time: a minute or more). */
function containerd2BinDir(): string {
  return process.env.ATOLL_CONTAINERD2_BIN
    ?? (execFileSync('sh', ['scripts/containerd2.sh'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] }).trim().split('\n').pop() as string);
}

/**
 * The Kubernetes binaries of the run: the default set's folder (`sh scripts/k8s.sh control-plane`, built already for
 * `--kubernetes 1.34`), or for 1.37 a folder `dir/k8s-bin` of symlinks to the v1.37 set's binaries (`sh scripts/k8s.sh
 * all v1.37`, built the first time: tens of minutes; ATOLL_K8S137_BIN names a folder built already) and to the
 * default set's etcd v3.6 (kube-apiserver v1.37 runs on it; the set does not build an etcd of its own).
 */
function kubeBins(version: KubernetesVersion, dir: string): string {
  if (version === '1.34') return kubeBinDir();
  const set = process.env.ATOLL_K8S137_BIN
    ?? (execFileSync('sh', ['scripts/k8s.sh', 'all', 'v1.37'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] }).trim().split('\n').pop() as string);
  const out = join(dir, 'k8s-bin');
  mkdirSync(out);
  symlinkSync(join(kubeBinDir(), 'etcd'), join(out, 'etcd'));
  for (const b of K8S137_BINARIES) {
    if (!existsSync(join(set, b))) throw new Error(`--kubernetes 1.37: ${set} has no ${b} (sh scripts/k8s.sh all v1.37 builds it)`);
    symlinkSync(join(set, b), join(out, b));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// The node and everything the run starts

class Fixture {
  readonly dir: string = mkdtempSync(join(tmpdir(), `${RUN_PREFIX}kbench-`));
  /** The folder of kube-apiserver, kubectl, kubelet, ... (see {@link kubeBins}). */
  bins = '';
  agent: TestAgent | undefined;
  cp: ControlPlane | undefined;
  ctd: Containerd | undefined;
  kubelet: Kubelet | undefined;
  watch: PodWatch | undefined;
  relists: RelistLog | undefined;
  #cleaned: Promise<void> | undefined;

  cleanup(): Promise<void> {
    this.#cleaned ??= this.#cleanup();
    return this.#cleaned;
  }

  async #cleanup(): Promise<void> {
    const step = async (what: string, f: () => Promise<void> | void) => {
      try {
        await f();
      } catch (e) {
        process.stderr.write(`bench: ${what} failed: ${String(e)}\n`);
      }
    };
    await step('stopping the watch', () => this.watch?.stop());
    await step('stopping the kubelet', () => this.kubelet?.stop());
    await step('stopping containerd', () => this.ctd?.stop());
    await step('stopping the control plane', () => this.cp?.stop());
    await step('stopping the agent', () => this.agent?.cleanup());
    rmSync(this.dir, { recursive: true, force: true });
    removeRunTempDirs();
  }
}

type SideKey = 'ours' | 'reference';
const SIDES: readonly SideKey[] = ['ours', 'reference'];
const PREFIX: Record<SideKey, string> = { ours: OURS_PREFIX, reference: REF_PREFIX };

function referenceConflist(fx: Fixture): string {
  return `${JSON.stringify({
    cniVersion: '1.0.0', name: 'bench-ref',
    plugins: [{ type: 'bridge', bridge: 'kbref0', isGateway: true, ipMasq: false,
      ipam: { type: 'host-local', ranges: [[{ subnet: REF_CIDR }]], dataDir: join(fx.dir, 'host-local') } }],
  }, null, 2)}\n`;
}

/** Rewrites the switch file in place with the side's conflist and lets containerd's watcher reload it. */
async function switchCni(fx: Fixture, side: SideKey): Promise<void> {
  const agent = fx.agent as TestAgent;
  const content = side === 'ours' ? readFileSync(join(agent.confDir, '10-atoll.conflist'), 'utf8') : referenceConflist(fx);
  writeFileSync(join(agent.confDir, SWITCH_FILE), content);
  await sleep(1500);
}

async function setUp(fx: Fixture, opts: Options): Promise<void> {
  const agent = new TestAgent({ name: 'kb', podCidrs: [OURS_CIDR], config: { resyncPeriod: 60 } });
  fx.agent = agent;
  const ns = agent.netns;
  const ip = (...args: string[]) => execFileSync('ip', ['-n', ns, ...args], { encoding: 'utf8' });
  ip('link', 'set', 'lo', 'up');
  ip('link', 'add', 'kb0', 'type', 'veth', 'peer', 'name', 'kb1');
  ip('addr', 'add', `${NODE_IP}/24`, 'dev', 'kb0');
  ip('link', 'set', 'kb0', 'up');
  ip('link', 'set', 'kb1', 'up');
  mkdirSync(agent.binDir, { recursive: true });
  mkdirSync(agent.confDir, { recursive: true });
  for (const p of ['loopback', 'bridge', 'host-local']) symlinkSync(join(REF_DIR, p), join(agent.binDir, p));
  const v137 = opts.kubernetes === '1.37';
  fx.bins = kubeBins(opts.kubernetes, fx.dir);
  log(`control plane (etcd, kube-apiserver, controller-manager, scheduler${v137 ? ': v1.37, etcd v3.6' : ''}) in the node namespace`);
  fx.cp = await startControlPlane(fx.dir, { netns: ns, nodes: [NODE], controllers: true, bins: fx.bins, endpointReconciler: v137 ? 'none' : undefined });
  log(`containerd${opts.containerd2 ? ' 2.x' : ' 1.6'}`);
  fx.ctd = await startContainerd({
    workDir: join(fx.dir, 'ctd'), netns: ns, cniBinDir: agent.binDir, cniConfDir: agent.confDir, cgroupPrefix: 'atoll-kb',
    binDir: opts.containerd2 ? containerd2BinDir() : undefined,
  });
  log('atoll agent');
  await agent.start(15_000, ['nsenter', `--mount=/proc/${fx.ctd.pid}/ns/mnt`, `--net=/var/run/netns/${ns}`, '--']);
  await until('the agent\'s conflist', 15_000, () => (existsSync(join(agent.confDir, '10-atoll.conflist')) ? true : undefined));
  log('kubelet');
  const cp = fx.cp;
  fx.kubelet = startKubelet({
    binary: join(fx.bins, 'kubelet'), dir: join(fx.dir, 'kubelet'), runtime: fx.ctd, nodeName: NODE, nodeIp: NODE_IP,
    labels: {}, apiServer: { server: cp.server, ca: cp.ca, token: cp.nodeToken(NODE) },
    vmodule: opts.eventedPleg ? 'generic=5,evented=4' : 'generic=5',
    featureGates: opts.eventedPleg ? { EventedPLEG: true } : undefined,
    failCgroupV1: v137 ? false : undefined,
  });
  const relists = new RelistLog(fx.kubelet.logPath, opts.eventedPleg ? performance.now() : undefined);
  fx.relists = relists;
  const k = fx.kubelet;
  await until('the node to turn Ready', 120_000, () => {
    try {
      const n = JSON.parse(cp.kubectl(['get', 'node', NODE, '-o', 'json'])) as { status: { conditions: { type: string; status: string }[] } };
      return n.status.conditions.some((c) => c.type === 'Ready' && c.status === 'True') ? true : undefined;
    } catch {
      return undefined;
    }
  }, () => k.logTail(30));
  await until('the default service account', 60_000, () => {
    try {
      cp.kubectl(['get', 'serviceaccount', 'default']);
      return true;
    } catch {
      return undefined;
    }
  });
  const jsonpath = '{.type}|{.object.metadata.name}|{.object.status.phase}|{.object.status.podIP}|'
    + '{.object.status.conditions[?(@.type=="Ready")].status}|{.object.metadata.deletionTimestamp}|{.object.metadata.uid}{"\\n"}';
  fx.watch = new PodWatch(['ip', 'netns', 'exec', ns, join(fx.bins, 'kubectl'), '--kubeconfig', cp.kubeconfig(), 'get', 'pods',
    '--watch', '--output-watch-events', '-o', `jsonpath=${jsonpath}`]);
  fx.watch.start();
  await sleep(1000);
  await until('the kubelet to log its PLEG relists (--vmodule=generic=5)', 15_000, () => relists.estimate(), () => k.logTail(20));
}

function podTemplate(labels: Record<string, string>) {
  return {
    metadata: { labels },
    spec: {
      terminationGracePeriodSeconds: 0,
      automountServiceAccountToken: false,
      enableServiceLinks: false,
      containers: [{ name: 'c', image: PAUSE_IMAGE_REF, imagePullPolicy: 'Never' }],
    },
  };
}

/** Waits until no pod with a name starting with `prefix` is left (the kubelet has stopped their sandboxes: CNI DEL). */
async function waitGone(fx: Fixture, prefix: string): Promise<void> {
  const w = fx.watch as PodWatch;
  await until(`pods ${prefix}* to be gone`, POD_TIMEOUT_MS, () => ([...w.pods].every(([n, p]) => !n.startsWith(prefix) || p.deleted !== undefined) ? true : undefined));
  // and containerd holds no ready sandbox any more: the kubelet stopped them, so the plugin's DEL ran with this
  // phase's configuration
  const ctd = fx.ctd as Containerd;
  const deadline = Date.now() + POD_TIMEOUT_MS;
  while ((await ctd.cri.listPodSandbox()).some((s) => s.state === 'SANDBOX_READY')) {
    if (Date.now() > deadline) throw new Error('sandboxes still ready after their pods were deleted');
    await sleep(50);
  }
}

/** Checks that every pod IP is in the side's range; throws otherwise. */
function checkIps(side: SideKey, what: string, ips: readonly (string | undefined)[]): void {
  const bad = ips.filter((a) => !a?.startsWith(PREFIX[side]));
  if (bad.length > 0) throw new Error(`${what} (${side}): pod IPs ${bad.join(', ')} are not from ${side === 'ours' ? OURS_CIDR : REF_CIDR}: the CNI switch did not take`);
}

/** One single pod: its creation's target phase, and what the watch and the kubelet's log saw. */
interface SinglePod {
  readonly name: string;
  /** Its UID as the watch saw it (the kubelet's log names pods by UID). */
  readonly uid: string | undefined;
  readonly side: SideKey;
  readonly round: number;
  /** The target phase of its creation after the predicted relist (fraction of the period). */
  readonly offset: number;
  /** The relists as predicted when `kubectl create` was started. */
  readonly est: RelistEstimate;
  /** When `kubectl create` was started, and the watch's stamps (performance.now() ms). */
  readonly spawned: number;
  readonly added: number;
  readonly running: number;
}

interface PhaseResult {
  readonly single: SinglePod[];
  readonly deployment: number | undefined;
}

/**
 * How long `kubectl create` takes from its start to the watch's ADDED event: the median of the latest samples (a
 * guess before the first), so that the creation, not the start of kubectl, falls at the chosen phase.
 */
class CreateLag {
  readonly #samples: number[] = [];

  add(ms: number): void {
    this.#samples.push(ms);
  }

  get ms(): number {
    return this.#samples.length === 0 ? 150 : median(this.#samples.slice(-10));
  }
}

/**
 * Sleeps until `kubectl create` should start so that the pod's creation falls at phase `offset` after the kubelet's
 * predicted relist, at least 20 ms from now. The prediction is made again from the latest relist logged shortly
 * before the start (the period slides by each relist's duration), keeping the target nearest the first plan.
 * Returns the estimate the start was timed with.
 */
async function waitForPhase(relists: RelistLog, offset: number, lag: number): Promise<RelistEstimate> {
  const estimate = () => {
    const e = relists.estimate();
    if (e === undefined) throw new Error('the kubelet\'s log shows no relists any more (did it stop?)');
    return e;
  };
  let est = estimate();
  let target = nextTimeAtPhase(est, offset, performance.now() + lag + 20);
  if (target - lag - performance.now() > 150) {
    await sleep(target - lag - performance.now() - 100);
    est = estimate();
    target = nextTimeAtPhase(est, offset, target - est.period / 2);
  }
  const wait = target - lag - performance.now();
  if (wait > 0) await sleep(wait);
  return est;
}

/** Writes the single pod `name` (label bench=`tag`) to a file for `kubectl create -f`; returns its path. */
function podFile(fx: Fixture, name: string, tag: string): string {
  const file = join(fx.dir, `${name}.json`);
  writeFileSync(file, JSON.stringify({ apiVersion: 'v1', kind: 'Pod', metadata: { name, ...podTemplate({ bench: tag }).metadata }, spec: podTemplate({}).spec }));
  return file;
}

/**
 * Creates the pod in `file` with `kubectl create` (not cp.kubectl: its execFileSync would hold this process's event
 * loop, and with it the watch's stamps); returns when the watch has seen it, with kubectl's start and the watch's
 * stamp, and adds their difference to `lag`.
 */
async function createPod(fx: Fixture, name: string, file: string, lag: CreateLag): Promise<{ spawned: number; added: number }> {
  const cp = fx.cp as ControlPlane;
  const w = fx.watch as PodWatch;
  const spawned = performance.now();
  const create = spawnBounded(['ip', 'netns', 'exec', (fx.agent as TestAgent).netns, join(fx.bins, 'kubectl'), '--kubeconfig', cp.kubeconfig(), 'create', '-f', file], 60_000);
  const res = await create.done;
  if (res.code !== 0) throw new Error(`kubectl create ${name} failed (exit ${res.code}): ${res.stderr}`);
  const added = await until(`pod ${name} to be created`, 60_000, () => w.pods.get(name)?.added);
  lag.add(added - spawned);
  return { spawned, added };
}

/** Waits for the watch to report pod `name` Running. */
async function untilRunning(fx: Fixture, name: string): Promise<PodSeen> {
  const w = fx.watch as PodWatch;
  return until(`pod ${name} to run`, POD_TIMEOUT_MS, () => {
    const s = w.pods.get(name);
    return s?.running !== undefined ? s : undefined;
  }, () => `${fx.cp?.kubectl(['describe', 'pod', name]) ?? ''}\n${fx.kubelet?.logTail(20) ?? ''}`);
}

/**
 * Three pods created, run and deleted before the first phase, through the agent's conflist (the only one then):
 * the first pods on a fresh node pay for things no later pod does, and `lag` gets samples before the first timed one.
 */
async function warmUp(fx: Fixture, lag: CreateLag): Promise<void> {
  for (let i = 0; i < 3; i++) {
    const name = `w-${i}`;
    await createPod(fx, name, podFile(fx, name, 'warm'), lag);
    await untilRunning(fx, name);
  }
  fx.cp?.kubectl(['delete', 'pods', '-l', 'bench=warm', '--wait=false']);
  await waitGone(fx, 'w-');
}

/**
 * One side's phase of a round: single pods at `offsets`, then the Deployment. `round` is the recorded round's index,
 * or 'settle' for the unrecorded round before them (its pods' names carry `x`, so no report counts them).
 */
async function phase(fx: Fixture, side: SideKey, round: number | 'settle', offsets: readonly number[], lag: CreateLag, opts: Options): Promise<PhaseResult> {
  const cp = fx.cp as ControlPlane;
  const relists = fx.relists as RelistLog;
  await switchCni(fx, side);
  const tag = round === 'settle' ? `x${side === 'ours' ? 'o' : 'r'}` : `${side === 'ours' ? 'o' : 'r'}${round}`;
  const single: SinglePod[] = [];
  const ips: (string | undefined)[] = [];
  for (const [i, offset] of offsets.entries()) {
    const name = `s-${tag}-${i}`;
    const file = podFile(fx, name, tag);
    const est = await waitForPhase(relists, offset, lag.ms);
    const { spawned, added } = await createPod(fx, name, file, lag);
    const p = await untilRunning(fx, name);
    single.push({ name, uid: p.uid, side, round: round === 'settle' ? -1 : round, offset, est, spawned, added, running: p.running as number });
    ips.push(p.ip);
  }
  if (offsets.length > 0) {
    checkIps(side, 'single pods', ips);
    cp.kubectl(['delete', 'pods', '-l', `bench=${tag}`, '--wait=false']);
    await waitGone(fx, `s-${tag}-`);
  }
  return { single, deployment: await deploymentPhase(fx, side, tag, opts) };
}

async function deploymentPhase(fx: Fixture, side: SideKey, tag: string, opts: Options): Promise<number | undefined> {
  const cp = fx.cp as ControlPlane;
  const w = fx.watch as PodWatch;
  let deployment: number | undefined;
  if (opts.replicas > 0) {
    const name = `d-${tag}`;
    cp.kubectl(['apply', '-f', '-'], JSON.stringify({
      apiVersion: 'apps/v1', kind: 'Deployment', metadata: { name },
      spec: { replicas: 0, selector: { matchLabels: { app: name } }, template: podTemplate({ app: name }) },
    }));
    const t0 = performance.now();
    cp.kubectl(['scale', `deployment/${name}`, `--replicas=${opts.replicas}`]);
    const ready = await until(`${opts.replicas} replicas of ${name} to be Ready`, POD_TIMEOUT_MS * 2, () => {
      const mine = [...w.pods].filter(([n]) => n.startsWith(`${name}-`)).map(([, p]) => p);
      const r = mine.filter((p) => p.ready !== undefined && p.deleted === undefined);
      return r.length >= opts.replicas ? r : undefined;
    }, () => cp.kubectl(['get', 'pods', '-o', 'wide']));
    deployment = Math.max(...ready.map((p) => p.ready as number)) - t0;
    checkIps(side, 'deployment pods', ready.map((p) => p.ip));
    cp.kubectl(['delete', 'deployment', name, '--wait=false']);
    await waitGone(fx, `${name}-`);
  }
  return deployment;
}

// ---------------------------------------------------------------------------------------------------------------
// Statistics and the report

/** The mean of the defined values. */
function mean(xs: readonly (number | undefined)[]): number {
  const d = xs.filter((x): x is number => x !== undefined);
  return d.reduce((a, b) => a + b, 0) / d.length;
}

interface Target {
  readonly what: string;
  readonly ours: number;
  readonly reference: number;
  readonly ratio: number;
  readonly pass: boolean;
  /**
   * The ratio's 95 % bootstrap interval (bench/ratio-interval.ts): where it spans 1.0 the run cannot tell the sides
   * apart. None with fewer than MIN_BOOTSTRAP_SAMPLES on a side (a smoke run's one Deployment).
   */
  readonly interval: RatioInterval | undefined;
}

/** Single pods per side in the unrecorded settle round before the recorded ones (not with --smoke). */
const SETTLE_PODS = 10;

/** Resamplings behind each target's interval, and the samples per side it needs to mean anything. */
const BOOTSTRAP_DRAWS = 4000;
const MIN_BOOTSTRAP_SAMPLES = 5;

function agentRss(pid: number | undefined): { rssKiB: number; hwmKiB: number; name: string } | undefined {
  if (pid === undefined) return undefined;
  try {
    const status = readFileSync(`/proc/${pid}/status`, 'utf8');
    const field = (name: string) => Number(new RegExp(`^${name}:\\s+(\\d+) kB$`, 'm').exec(status)?.[1] ?? NaN);
    return { rssKiB: field('VmRSS'), hwmKiB: field('VmHWM'), name: /^Name:\s+(\S+)/m.exec(status)?.[1] ?? '?' };
  } catch {
    return undefined;
  }
}

function preflight(): void {
  const problems: string[] = [];
  if (!isRoot()) problems.push('needs root: a node namespace, containerd, a kubelet and an agent');
  for (const tool of ['/usr/bin/containerd', '/usr/sbin/runc', '/usr/bin/nsenter', '/bin/busybox', join(REF_DIR, 'bridge'), join(REF_DIR, 'host-local'), join(REF_DIR, 'loopback')]) {
    if (!existsSync(tool)) problems.push(`missing ${tool} (apt-get install containerd runc util-linux busybox-static containernetworking-plugins)`);
  }
  if (problems.length > 0) throw new Error(problems.join('\n'));
}

/** What the kubelet's log says about one single pod's phases (ms, or fractions of the period). */
interface PodPhase {
  readonly side: SideKey;
  readonly round: number;
  readonly offset: number;
  /** create-to-Running. */
  readonly ms: number;
  /** The first relist logged after kubectl's start, minus the nearest relist predicted then. */
  readonly predictionErrorMs: number | undefined;
  /** Where the creation fell between the logged relists (fraction of that interval). */
  readonly phase: number | undefined;
  /** That phase minus the target, in ms of the predicted period. */
  readonly phaseErrorMs: number | undefined;
  /** The watch's Running stamp minus the start of the last relist logged before it. */
  readonly runningAfterRelistMs: number | undefined;
  /** kubectl create's start to the watch's ADDED event. */
  readonly createLagMs: number;
}

/** Each single pod's phases, against the relist starts the kubelet logged over the whole run. */
function podPhases(pods: readonly SinglePod[], starts: readonly number[]): PodPhase[] {
  return pods.map((p) => {
    const next = starts[lastAtOrBefore(starts, p.spawned) + 1];
    const nearest = next === undefined ? undefined : predictedRelistBefore(p.est, next + p.est.period / 2);
    const phase = observedPhase(starts, p.added);
    const before = starts[lastAtOrBefore(starts, p.running)];
    return {
      side: p.side, round: p.round, offset: p.offset, ms: p.running - p.added,
      predictionErrorMs: next === undefined || nearest === undefined ? undefined : next - nearest,
      phase,
      phaseErrorMs: phase === undefined ? undefined : phaseDifference(phase, p.offset) * p.est.period,
      runningAfterRelistMs: before === undefined ? undefined : p.running - before,
      createLagMs: p.added - p.spawned,
    };
  });
}

/**
 * How closely the watch's `Running` stamps sit on one grid of period `period` (ms): each stamp's distance to the
 * stamps' circular mean phase on that grid. With v1.34's evented PLEG they sit within tens of ms of its 5 s cache tick
 * (bench/relist-phase.ts, EVENTED_CACHE_TICK_MS), wherever in the period the pods were created.
 */
function gridDeviations(pods: readonly SinglePod[], period: number): number[] {
  const phase = (p: SinglePod) => 2 * Math.PI * ((((p.running - p.est.last) % period) + period) % period) / period;
  const mid = Math.atan2(pods.reduce((a, p) => a + Math.sin(phase(p)), 0), pods.reduce((a, p) => a + Math.cos(phase(p)), 0));
  return pods.map((p) => {
    const d = Math.abs(phase(p) - mid) % (2 * Math.PI);
    return (Math.min(d, 2 * Math.PI - d) / (2 * Math.PI)) * period;
  });
}

/** `median / p95 / max` of the defined values (ms), and how many there were. */
function spread(xs: readonly (number | undefined)[]): string {
  const a = xs.filter((x): x is number => x !== undefined);
  return `median ${fmt(pct(a, 50), 1)}, p95 ${fmt(pct(a, 95), 1)}, max ${fmt(Math.max(...a), 1)} ms (${a.length} pods)`;
}

/** `median, mean, p90, max` of xs (ms): the mean and p90 too, for steps whose tail is what differs. */
function spreadMean(xs: readonly (number | undefined)[]): string {
  const a = xs.filter((x): x is number => x !== undefined);
  return `median ${fmt(pct(a, 50), 1)}, mean ${fmt(mean(a), 1)}, p90 ${fmt(pct(a, 90), 1)}, max ${fmt(Math.max(...a), 1)} ms (${a.length} pods)`;
}

/** RunPodSandbox's own duration, request to return (ms), when containerd logged both. */
function sandboxRun(st: ContainerdPodSteps | undefined): number | undefined {
  return st?.sandboxRequested === undefined || st.sandboxReady === undefined ? undefined : st.sandboxReady - st.sandboxRequested;
}

/** RunPodSandbox's durations for the pods whose names start with `prefix` (a side's Deployments: `d-o`, `d-r`). */
function sandboxRuns(steps: ReadonlyMap<string, ContainerdPodSteps>, prefix: string): (number | undefined)[] {
  return [...steps].filter(([name]) => name.startsWith(prefix)).map(([, st]) => sandboxRun(st));
}

/** `median / p95 / max` of |xs| (ms). */
function absSpread(xs: readonly (number | undefined)[]): string {
  return spread(xs.map((x) => (x === undefined ? undefined : Math.abs(x))));
}

/** One single pod's start as containerd's and the kubelet's logs show it (ms; the relists' fields with `--kubernetes 1.37`). */
interface PodTimeline {
  readonly name: string;
  readonly side: SideKey;
  /** containerd's `RunPodSandbox` from the request to its return (network namespace, CNI ADD, pause container). */
  readonly sandboxRunMs: number | undefined;
  /** Creation (the watch's ADDED) to containerd's `RunPodSandbox ... returns` (sandbox and CNI ADD done). */
  readonly sandboxReadyMs: number | undefined;
  /** Creation to containerd's `StartContainer ... returns successfully`. */
  readonly containerStartedMs: number | undefined;
  /** That start to the watch's Running. */
  readonly startToRunningMs: number | undefined;
  /** The first relist that began after the start (bench/pod-timeline.ts), and when, after the start. */
  readonly caughtBy: CatchingRelist;
  readonly catchAfterStartMs: number | undefined;
  /** The on-demand relists of this pod logged between its creation and its Running. */
  readonly onDemandRelists: number;
  /** The watch's Running after the start of the last global relist logged before it. */
  readonly runningAfterGlobalMs: number | undefined;
}

/**
 * The single pods' timelines from containerd's CRI log (`steps`) and the kubelet's relists (`startsWall` global,
 * `podRelists` by UID), all on the wall clock of the logs; the watch's stamps (performance.now()) are moved onto it by
 * `wallMinusPerf` (Date.now() - performance.now() at the end of the run: within 1 ms).
 */
function podTimelines(pods: readonly SinglePod[], steps: ReadonlyMap<string, ContainerdPodSteps>, wallMinusPerf: number,
  startsWall: readonly number[], podRelists: ReadonlyMap<string, readonly number[]>): PodTimeline[] {
  return pods.map((p) => {
    const st = steps.get(p.name);
    const added = p.added + wallMinusPerf;
    const running = p.running + wallMinusPerf;
    const started = st?.containerStarted;
    const own = (p.uid === undefined ? undefined : podRelists.get(p.uid)) ?? [];
    const c = started === undefined ? { kind: 'none' as const, afterStartMs: undefined } : catchingRelist(started, running, startsWall, own);
    const before = startsWall[lastAtOrBefore(startsWall, running)];
    return {
      name: p.name, side: p.side,
      sandboxRunMs: sandboxRun(st),
      sandboxReadyMs: st?.sandboxReady === undefined ? undefined : st.sandboxReady - added,
      containerStartedMs: started === undefined ? undefined : started - added,
      startToRunningMs: started === undefined ? undefined : running - started,
      caughtBy: c.kind, catchAfterStartMs: c.afterStartMs,
      onDemandRelists: own.filter((t) => t >= added && t <= running).length,
      runningAfterGlobalMs: before === undefined ? undefined : running - before,
    };
  });
}

async function main(): Promise<number> {
  const opts = parseOptions(process.argv.slice(2));
  preflight();
  const started = Date.now();
  const load0 = loadavg();
  const fx = new Fixture();
  const watchdog = cleanUpOnExit(fx, opts.timeoutS);
  const pods: SinglePod[] = [];
  const lag = new CreateLag();
  const offsetsUsed: number[][] = [];
  const gridShift = Math.random(); // where this run's grid of phases sits within one step (bench/relist-phase.ts)
  const deployment: Record<SideKey, number[]> = { ours: [], reference: [] };
  const rss: number[] = [];
  let rssInfo: ReturnType<typeof agentRss>;
  const v137 = opts.kubernetes === '1.37';
  let ctdSteps = new Map<string, ContainerdPodSteps>();
  let ctdWallMinusPerf = 0;
  try {
    await setUp(fx, opts);
    log('warm-up: 3 pods created, run and deleted');
    await warmUp(fx, lag);
    if (!opts.smoke) {
      // The node keeps settling for about a minute after its start (in one run both sides' first phases ran about 45 ms
      // slower at the median than the later ones), and the first recorded phase is always ours: a round of both
      // sides, not recorded, absorbs it.
      log(`settle round (not recorded): ${SETTLE_PODS} single pods and a Deployment 0 -> ${opts.replicas} per side`);
      for (const side of SIDES) await phase(fx, side, 'settle', stratifiedOffsets(SETTLE_PODS, 0, 1, Math.random, gridShift), lag, opts);
    }
    for (let r = 0; r < opts.rounds; r++) {
      const offsets = stratifiedOffsets(opts.pods, r, opts.rounds, Math.random, gridShift);
      offsetsUsed.push(offsets);
      for (const side of r % 2 === 0 ? SIDES : [...SIDES].reverse()) {
        log(`round ${r + 1}/${opts.rounds}, ${side}: ${opts.pods} single pods, then a Deployment 0 -> ${opts.replicas}`);
        const res = await phase(fx, side, r, offsets, lag, opts);
        pods.push(...res.single);
        if (res.deployment !== undefined) deployment[side].push(res.deployment);
        log(`  single p50 ${fmt(median(res.single.map((p) => p.running - p.added)), 0)} ms; deployment ${fmt(res.deployment ?? NaN, 0)} ms`);
      }
    }
    if (opts.rssSamples > 0) {
      log(`agent idle RSS: settling 5 s, then ${opts.rssSamples} samples 1 s apart`);
      await sleep(5000);
      for (let k = 0; k < opts.rssSamples; k++) {
        rssInfo = agentRss(fx.agent?.pid);
        if (rssInfo) rss.push(rssInfo.rssKiB);
        await sleep(1000);
      }
    }
  } finally {
    clearTimeout(watchdog);
    fx.relists?.read(); // the relists after the last pod's, before cleanup removes the log
    if (opts.logs !== undefined) {
      mkdirSync(opts.logs, { recursive: true });
      for (const [from, to] of [[fx.kubelet?.logPath, 'kubelet.log'], [fx.ctd?.logPath, 'containerd.log'], [fx.agent?.logPath, 'agent.log']] as const) {
        if (from !== undefined && existsSync(from)) copyFileSync(from, join(opts.logs, to));
      }
    }
    if (fx.ctd !== undefined && existsSync(fx.ctd.logPath)) {
      ctdWallMinusPerf = Date.now() - performance.now();
      ctdSteps = containerdPodSteps(readFileSync(fx.ctd.logPath, 'utf8'));
    }
    await fx.cleanup();
  }
  const starts = fx.relists?.starts ?? [];
  const phases = podPhases(pods, starts);
  const single: Record<SideKey, number[]> = { ours: [], reference: [] };
  for (const p of phases) single[p.side].push(p.ms);
  const left = leftoverNetns();
  if (left.length > 0) throw new Error(`namespaces left behind: ${left.join(', ')}`);
  const ev = fx.relists?.evented;
  if (opts.eventedPleg && ev && (ev.started === 0 || ev.fallBack > 0 || ev.streamErrors > 0)) {
    throw new Error(`the evented PLEG did not carry the run: ${ev.started} container-started events received, ${ev.fallBack} fall-back(s) to `
      + `generic relisting, ${ev.streamErrors} failure(s) to read containerd's event stream (the kubelet's log: pkg/kubelet/pleg/evented.go)`);
  }

  const tg: Target[] = [];
  const add = (what: string, samples: Record<SideKey, number[]>, stat: (xs: readonly number[]) => number) => {
    const ours = stat(samples.ours);
    const reference = stat(samples.reference);
    const enough = Math.min(samples.ours.length, samples.reference.length) >= MIN_BOOTSTRAP_SAMPLES;
    const interval = enough ? bootstrapRatio(samples.ours, samples.reference, stat, BOOTSTRAP_DRAWS, Math.random) : undefined;
    tg.push({ what, ours, reference, ratio: ours / reference, pass: ours <= reference, interval });
  };
  if (opts.pods > 0) {
    add('single pod create-to-Running p50', single, (xs) => pct(xs, 50));
    add('single pod create-to-Running p95', single, (xs) => pct(xs, 95));
  }
  if (opts.replicas > 0) add(`Deployment 0 -> ${opts.replicas} all Ready, median`, deployment, median);

  const rows: string[][] = [['measure', 'side', 'n', 'p50 ms', 'p95 ms', 'mean', 'min', 'max']];
  for (const side of SIDES) {
    const s = single[side];
    rows.push(['single pod create-to-Running', side, String(s.length), fmt(pct(s, 50), 0), fmt(pct(s, 95), 0), fmt(mean(s), 0), fmt(Math.min(...s), 0), fmt(Math.max(...s), 0)]);
  }
  for (const side of SIDES) {
    const d = deployment[side];
    rows.push([`Deployment 0 -> ${opts.replicas} all Ready`, side, String(d.length), fmt(median(d), 0), '', '', fmt(Math.min(...d), 0), fmt(Math.max(...d), 0)]);
  }
  const intervals = starts.slice(1).map((t, i) => t - (starts[i] as number)).filter((d) => d <= 1500);
  const eventedLines = !opts.eventedPleg || !ev ? [] : [
    `Evented PLEG (containerd 2.x's CRI container events): ${ev.started} container-started events and ${ev.generated} pod statuses from events `
      + `in the kubelet's log, ${ev.fallBack} fall-backs to generic relisting, ${ev.streamErrors} event-stream failures; `
      + `${starts.length} generic relists logged (every 300 s with the gate)`,
    `  single pods created at the same spread of phases of a fixed ${EVENTED_CACHE_TICK_MS} ms grid (the evented PLEG's cache tick; its phase is not logged); `
      + `kubectl create's start to the watch's ADDED: median ${fmt(median(phases.map((p) => p.createLagMs)), 1)} ms`,
    `  watch's Running stamps against one ${EVENTED_CACHE_TICK_MS} ms grid, distance to their mean phase: ${absSpread(gridDeviations(pods, EVENTED_CACHE_TICK_MS))}`,
    '',
  ];
  const timelines = podTimelines(pods, ctdSteps, ctdWallMinusPerf, fx.relists?.startsWall ?? [], fx.relists?.podRelists ?? new Map());
  const caught = (kind: CatchingRelist) => timelines.filter((t) => t.caughtBy === kind).length;
  const onDemandLines = !v137 || pods.length === 0 ? [] : [
    `On-demand relist (kubelet v1.37, gate PLEGOnDemandRelist): ${[...(fx.relists?.podRelists.values() ?? [])].reduce((a, l) => a + l.length, 0)} on-demand relists `
      + `logged in the run, ${timelines.filter((t) => t.onDemandRelists > 0).length} of ${timelines.length} single pods had one between creation and Running; `
      + `the first relist to begin after a single pod's container started was its own on-demand one for ${caught('on-demand')}, a global one for `
      + `${caught('global')}, none logged for ${caught('none')}`,
    `  container started (containerd's log) to the watch's Running: ${spread(timelines.map((t) => t.startToRunningMs))}`,
    `  container started to the start of that relist: ${spread(timelines.map((t) => t.catchAfterStartMs))}`,
    `  watch's Running after the last global relist logged before it: ${spread(timelines.map((t) => t.runningAfterGlobalMs))} `
      + '(about 8 ms with v1.34, where that relist reports Running)',
    '',
  ];
  const startLines = pods.length === 0 && opts.replicas === 0 ? [] : [
    'Where the start goes (containerd\'s log; the plugin\'s ADD is inside RunPodSandbox, the kubelet\'s PLEG is not in any of these)',
    ...SIDES.flatMap((side) => {
      const mine = timelines.filter((t) => t.side === side);
      return [
        ...(mine.length === 0 ? [] : [
          `  ${side}, single pods: RunPodSandbox (network namespace, loopback, the plugin's ADD, pause container) ${spreadMean(mine.map((t) => t.sandboxRunMs))}`,
          `  ${side}, single pods: creation to sandbox ready ${spread(mine.map((t) => t.sandboxReadyMs))}; to container started ${spread(mine.map((t) => t.containerStartedMs))}`,
        ]),
        ...(opts.replicas === 0 ? [] : [`  ${side}, Deployments' pods: RunPodSandbox ${spreadMean(sandboxRuns(ctdSteps, `d-${side === 'ours' ? 'o' : 'r'}`))}`]),
      ];
    }),
    '',
  ];
  const phaseLines = pods.length === 0 || opts.eventedPleg ? eventedLines : [
    `Stratified creation: each single pod created at its own phase of the kubelet's PLEG relist, ${opts.pods} phases per round spread over the period, the same for both sides of a round`,
    `  relist interval logged: median ${fmt(median(intervals), 1)} ms, p5 ${fmt(pct(intervals, 5), 1)}, p95 ${fmt(pct(intervals, 95), 1)} (${intervals.length} intervals)`,
    `  relist predicted at kubectl's start vs the first one logged after it: |error| ${absSpread(phases.map((p) => p.predictionErrorMs))}`,
    `  creation's phase vs its target, in ms of the period: |error| ${absSpread(phases.map((p) => p.phaseErrorMs))}`,
    `  mean phase of the creations: ${SIDES.map((side) => `${side} ${fmt(mean(phases.filter((p) => p.side === side).map((p) => p.phase)), 3)}`).join(', ')}`,
    `  watch's Running after the last relist logged before it: median ${fmt(median(phases.flatMap((p) => p.runningAfterRelistMs ?? [])), 1)} ms, `
      + `p95 ${fmt(pct(phases.flatMap((p) => p.runningAfterRelistMs ?? []), 95), 1)} ms`,
    `  kubectl create's start to the watch's ADDED: median ${fmt(median(phases.map((p) => p.createLagMs)), 1)} ms`,
    '',
    ...onDemandLines,
  ];
  const tt: string[][] = [['target (ours / reference <= 1.0)', 'result', 'ours ms', 'reference ms', 'ratio', '95 % interval', 'resampled <= 1.0']];
  for (const t of tg) {
    const i = t.interval;
    tt.push([t.what, t.pass ? 'PASS' : 'MISS', fmt(t.ours, 0), fmt(t.reference, 0), fmt(t.ratio, 2),
      i ? `${fmt(i.low, 3)} - ${fmt(i.high, 3)}` : `n < ${MIN_BOOTSTRAP_SAMPLES}`, i ? `${fmt(100 * i.atOrBelowOne, 0)} %` : '']);
  }
  const load1 = loadavg();
  const out = [
    `Pods through a real kubelet v${v137 ? '1.37' : '1.34'} on one node (private containerd ${opts.containerd2 ? '2.x' : '1.6'}, `
      + `${v137 ? 'generic PLEG with on-demand relist' : opts.eventedPleg ? 'evented PLEG' : 'generic PLEG'}), `
      + `Atoll's CNI against bridge + host-local; ${opts.rounds} round(s), alternating`,
    table(rows, 2), '',
    ...phaseLines,
    ...startLines,
    'Targets', table(tt, 2), '',
    rss.length > 0 ? `Atoll agent idle after the runs: VmRSS median ${fmt(median(rss) / 1024, 1)} MiB (${rss.length} samples), VmHWM ${fmt((rssInfo?.hwmKiB ?? NaN) / 1024, 1)} MiB` : '',
    `${opts.smoke ? 'smoke run' : 'run'} took ${((Date.now() - started) / 1000).toFixed(1)} s; load average ${load0.map((x) => x.toFixed(2)).join(' ')} at start, `
      + `${load1.map((x) => x.toFixed(2)).join(' ')} at end; ${cpus().length} CPUs, kernel ${release()}`,
  ];
  process.stdout.write(out.join('\n') + '\n');
  if (opts.json) {
    writeFileSync(opts.json, JSON.stringify({ options: opts, env: { kernel: release(), node: process.version, cpus: cpus().length, loadavgStart: load0, loadavgEnd: load1 },
      targets: tg, offsets: offsetsUsed, relistStarts: starts, evented: opts.eventedPleg ? ev : undefined,
      podRelists: v137 ? Object.fromEntries(fx.relists?.podRelists ?? []) : undefined, podTimelines: timelines,
      relistStartsWall: v137 ? fx.relists?.startsWall : undefined, wallMinusPerf: ctdWallMinusPerf,
      samples: { single, singlePods: phases, singlePodTimes: pods, deployment, agentRssKiB: rss, agentHwmKiB: rssInfo?.hwmKiB } }, null, 2) + '\n');
  }
  if (v137 && pods.length > 0 && caught('on-demand') < MIN_ON_DEMAND_SHARE * timelines.length) {
    throw new Error(`on-demand relist did not carry the run: the first relist after the container's start was the pod's own on-demand one for `
      + `${caught('on-demand')} of ${timelines.length} single pods (global ${caught('global')}, none logged ${caught('none')}; at least `
      + `${MIN_ON_DEMAND_SHARE * 100} % needed): see the kubelet's "GenericPLEG: Relisting Pod" lines (pkg/kubelet/pleg/generic.go, --vmodule=generic=5)`);
  }
  return exitStatus(tg.filter((t) => !t.pass).length, opts.enforce);
}

runBench(main);
