/**
 * The same-site overlay, side by side in one run on one machine:
 *   programming  1,000 simulated same-site peers (3,000 kernel entries: an fdb entry, a neighbour and a route each)
 *                programmed by the real `Overlay.sync` (src/agent/overlay.ts) into a throwaway namespace, against
 *                one `ip`/`bridge` process per entry for the same entries in a second fresh namespace; also the
 *                steady-state resync (nothing to change) and a repair (10 routes deleted).
 *   throughput   iperf3, one TCP stream pod to pod across two nodes: ours (2 real agents + a controller, VXLAN,
 *                pods created through `atoll-cni`) against a hand-built flannel-style VXLAN in the same node
 *                namespaces, alternating A B A B; and the largest unfragmented datagram on ours (the MTU).
 *
 * The programming side runs in a child process of this file (`--worker`) started inside the throwaway namespace with
 * `ip netns exec`: the Overlay, its adapters and every process they start live there, so nothing can reach the
 * synthetic underlay addresses, and the namespace has no link out (its only underlay is a veth whose peer is in the
 * same namespace). bench/README.md explains what is measured and why.
 *
 * Usage: node bench/overlay.ts [--smoke] [--only programming|throughput] [--peers N] [--reps R] [--time S]
 *        [--json FILE] [--timeout SECONDS] [--enforce]
 */
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, release, tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { BridgeFdb } from '../src/adapters/kernel/bridge-fdb.ts';
import { type Exec, exec as realExec } from '../src/adapters/exec.ts';
import { IpRoute2 } from '../src/adapters/kernel/iproute2.ts';
import { Nft } from '../src/adapters/kernel/nft.ts';
import { Overlay, type OverlayInit } from '../src/agent/overlay.ts';
import type { NodeRecord } from '../src/core/cluster/model.ts';
import { type Cidr, formatCidr, formatIpv4, parseCidr, parseIpv4 } from '../src/core/net/ipv4.ts';
import { diffOverlay, planOverlay, renderOverlayDiff, ROUTE_PROTO } from '../src/core/overlay/plan.ts';
import type { Logger } from '../src/core/ports.ts';
import { PROJECT_NODE } from '../src/lab/agent-process.ts';
import { TestAgent } from '../harness/agent.ts';
import { type ControllerProc, TestCloud } from '../harness/cloud.ts';
import { isRoot, leftoverNetns, RUN_PREFIX, sh } from '../harness/netns.ts';
import { until } from '../harness/wait.ts';
import { cleanUpOnExit, exitStatus, fmt, intOption, median, NetnsFixture, parseBenchArgs, runBench, type Spawned, table } from './common.ts';

const SELF = import.meta.filename;
const PEERS_TARGET_MS = 1000;
const THROUGHPUT_RATIO_TARGET = 0.95;
const ROUTES_DELETED = 10;
/** Peer updates in a row for the burst measurement (one sync call each, as the agent makes them). */
const BURST = 20;
/** Per-process floor samples (spawning /bin/true from the same launcher) per reference worker. */
const FLOOR_SPAWNS = 300;
/** A worker is killed after this long: the reference spawns 3 processes per peer (about 4 ms each here). */
const WORKER_TIMEOUT_BASE_MS = 60_000;
const WORKER_TIMEOUT_PER_PEER_MS = 150;
const CONTROLLER_PORT = 17_481;
const IPERF_PORT = 5201;

// ---------------------------------------------------------------------------------------------------------------
// Options

type Part = 'programming' | 'throughput';

interface Options {
  readonly smoke: boolean;
  readonly parts: readonly Part[];
  readonly peers: number;
  readonly reps: number;
  readonly seconds: number;
  readonly timeoutS: number;
  readonly enforce: boolean;
  readonly json: string | undefined;
}

const USAGE = `usage: node bench/overlay.ts [options]
  --smoke              short run for CI: 1 repetition, iperf3 -t 2
  --only PART          programming or throughput (default: both)
  --peers N            simulated same-site peers to program (default 1000)
  --reps R             repetitions: programming per side, and iperf3 runs per side, alternating (default 3; 1 with --smoke)
  --time S             seconds per iperf3 run (iperf3 -t; default 10; 2 with --smoke)
  --json FILE          write every sample and summary to FILE
  --timeout SECONDS    abort (and clean up) after this long (default 900; 240 with --smoke)
  --enforce            exit 1 when a target is missed (default: report only)`;

function parseOptions(argv: readonly string[]): Options {
  const values = parseBenchArgs(argv, USAGE, {
    only: { type: 'string' },
    peers: { type: 'string' },
    reps: { type: 'string' },
    time: { type: 'string' },
    enforce: { type: 'boolean', default: false },
  });
  const smoke = values.smoke;
  const int = intOption(USAGE);
  if (values.only !== undefined && values.only !== 'programming' && values.only !== 'throughput') {
    throw new Error(`--only must be programming or throughput, got "${values.only}"\n${USAGE}`);
  }
  return {
    smoke,
    parts: values.only ? [values.only as Part] : ['programming', 'throughput'],
    peers: int('peers', values.peers, 1000, 1, 60_000),
    reps: int('reps', values.reps, smoke ? 1 : 3, 1, 100),
    seconds: int('time', values.time, smoke ? 2 : 10, 1, 600),
    timeoutS: int('timeout', values.timeout, smoke ? 240 : 900, 1, 86_400),
    enforce: values.enforce,
    json: values.json,
  };
}

// ---------------------------------------------------------------------------------------------------------------
// Resources: every namespace, directory and process this run creates, and their removal

class Fixture extends NetnsFixture {
  readonly dir: string = mkdtempSync(join(tmpdir(), `${RUN_PREFIX}overlay-bench-`));
  cloud: TestCloud | undefined;
  readonly agents: TestAgent[] = [];

  /** The agents and the controller, then the run's directory (namespaces go after, in {@link NetnsFixture}). */
  protected override async cleanupMore(): Promise<void> {
    for (const a of this.agents) {
      try {
        await a.cleanup();
      } catch (e) {
        process.stderr.write(`bench: agent cleanup failed: ${String(e)}\n`);
      }
    }
    try {
      await this.cloud?.cleanup();
    } catch (e) {
      process.stderr.write(`bench: cloud cleanup failed: ${String(e)}\n`);
    }
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/** Runs argv to its end, bounded as `start` does. */
async function run(fx: Fixture, argv: readonly string[], timeoutMs: number): Promise<Spawned> {
  return fx.start(argv, timeoutMs).done;
}

const log = (msg: string) => process.stderr.write(`bench: ${msg}\n`);

// ---------------------------------------------------------------------------------------------------------------
// Part 1: peer programming. The synthetic cluster, identical for both sides.

const SITE = 'bench-site';
const DEVICE = 'atoll.1';
const UNDERLAY_DEVICE = 'ul0';
const SELF_UNDERLAY = '192.168.0.1';
const UNDERLAY_NET = '192.168.0.0/16';
/** Pod blocks: /27s from 10.64.0.0 on, ours first. */
const BLOCK_BASE = parseIpv4('10.64.0.0') as number;

const silent: Logger = { info: () => {}, warn: () => {}, error: () => {}, debug: () => {}, child: () => silent };

function selfInit(): OverlayInit {
  return {
    nodeName: 'bench-self', site: SITE, device: DEVICE, vni: 1, port: 8472, vtepMac: '0a:aa:00:00:00:01',
    underlay: SELF_UNDERLAY, underlayDevice: UNDERLAY_DEVICE, underlayNet: parseCidr(UNDERLAY_NET) as Cidr, mtu: 1450,
    directRouting: 'never', probePort: 8474, clusterCidrs: [],
  };
}

const selfBlocks = (): Cidr[] => [{ base: BLOCK_BASE, bits: 27 }];

/**
 * `n` peers of our site: distinct /27 blocks, VTEP MACs and underlay addresses in 192.168.0.0/16. Equal site labels
 * on both sides, so Overlay never probes them (sameSite decides on labels alone).
 */
function syntheticPeers(n: number): NodeRecord[] {
  return Array.from({ length: n }, (_, i) => {
    const k = i + 1;
    const mac = `0a:bb:00:${((k >> 16) & 0xff).toString(16).padStart(2, '0')}:${((k >> 8) & 0xff).toString(16).padStart(2, '0')}:${(k & 0xff).toString(16).padStart(2, '0')}`;
    return {
      name: `peer-${String(k).padStart(5, '0')}`, identity: '', site: SITE, community: '',
      addresses: [formatIpv4((parseIpv4(SELF_UNDERLAY) as number) + k)], observedAddress: '', vtepMac: mac, tunnelKey: '',
      agentVersion: 'bench', annotations: {}, blocks: [formatCidr({ base: BLOCK_BASE + k * 32, bits: 27 })], registeredAt: 0, updatedAt: 0,
    };
  });
}

/** The same link the Overlay creates (ensureDevice), for the reference namespace. */
function deviceLines(init: OverlayInit): string[] {
  return [
    `link add ${init.device} address ${init.vtepMac} mtu ${init.mtu} type vxlan id ${init.vni} dstport ${init.port} local ${init.underlay} dev ${init.underlayDevice} nolearning`,
    `link set dev ${init.device} mtu ${init.mtu} up`,
    `addr replace ${formatIpv4(BLOCK_BASE)}/32 dev ${init.device}`,
  ];
}

interface Counts {
  readonly routes: number;
  readonly neighbours: number;
  readonly fdb: number;
}

interface ProcTiming {
  readonly what: string;
  /** performance.now() at spawn. */
  readonly start: number;
  readonly ms: number;
}

interface WorkerResult {
  readonly side: 'ours' | 'reference';
  /** ours: Overlay.sync from empty; reference: the processes one per entry. */
  readonly firstMs: number;
  readonly firstCounts: Counts;
  readonly processes: number;
  /** ours: every process the first sync started, in order. */
  readonly firstBreakdown: readonly ProcTiming[];
  readonly steadyMs?: number;
  readonly steadyBreakdown?: readonly ProcTiming[];
  readonly repairMs?: number;
  readonly repairCounts?: Counts;
  /** ours: BURST sync calls issued back to back, until the last one settled. */
  readonly burstMs?: number;
  readonly burstCalls?: number;
  /** reference: median ms per entry process, and per /bin/true from the same launcher. */
  readonly perProcessMs?: number;
  readonly floorMs?: number;
}

// ---------------------------------------------------------------------------------------------------------------
// Part 1, the worker: runs inside the throwaway namespace (started with `ip netns exec`), prints one JSON line.

/** The fdb entries with a remote destination on `dev`, as `bridge` lists them (the all-zero default entry left out). */
async function fdbHere(dev: string): Promise<{ mac: string; dst: string }[]> {
  const res = await realExec('bridge', ['-json', 'fdb', 'show', 'dev', dev]);
  if (res.code !== 0) throw new Error(`bridge fdb show dev ${dev} failed: ${res.stderr.trim()}`);
  const rows = res.stdout.trim() === '' ? [] : (JSON.parse(res.stdout) as { mac: string; dst?: string }[]);
  return rows.filter((r) => r.dst && r.mac !== '00:00:00:00:00:00').map((r) => ({ mac: r.mac, dst: r.dst as string }));
}

/** What the kernel holds of ours, read with iproute2 (not with the netlink code under test). */
async function countsHere(dev: string): Promise<Counts> {
  const ip = new IpRoute2();
  const [routes, neigh, fdb] = await Promise.all([
    ip.json(['route', 'show', 'proto', String(ROUTE_PROTO)]),
    ip.json(['neigh', 'show', 'dev', dev, 'nud', 'permanent']),
    fdbHere(dev),
  ]);
  return { routes: routes.length, neighbours: neigh.length, fdb: fdb.length };
}

function expectCounts(what: string, got: Counts, want: Counts): void {
  if (got.routes !== want.routes || got.neighbours !== want.neighbours || got.fdb !== want.fdb) {
    throw new Error(`${what}: the kernel holds ${JSON.stringify(got)}, expected ${JSON.stringify(want)}`);
  }
}

const now = () => performance.now();

async function workerOurs(n: number): Promise<WorkerResult> {
  const procs: ProcTiming[] = [];
  const timedExec: Exec = async (cmd, args, o) => {
    const t0 = now();
    const res = await realExec(cmd, args, o);
    const lines = o?.input ? o.input.split('\n').filter((l) => l !== '').length : 0;
    procs.push({ what: `${cmd} ${args.join(' ')}${lines > 0 ? ` (${lines} lines)` : ''}`, start: t0, ms: now() - t0 });
    return res;
  };
  const overlay = new Overlay({ ip: new IpRoute2(timedExec), fdb: new BridgeFdb(timedExec), nft: new Nft(timedExec), log: silent }, selfInit());
  const peers = syntheticPeers(n);
  const blocks = selfBlocks();
  await overlay.ensureDevice(); // what the agent does at start, before its first sync; not timed
  const want = { routes: n, neighbours: n, fdb: n };

  procs.length = 0;
  let t0 = now();
  await overlay.sync(blocks, peers);
  const firstMs = now() - t0;
  const firstBreakdown = [...procs];
  const firstCounts = await countsHere(DEVICE);
  expectCounts('after the first sync', firstCounts, want);
  if (overlay.plan?.sitePeers.length !== n) throw new Error(`the plan has ${overlay.plan?.sitePeers.length} site peers, expected ${n}: a peer was not same-site`);

  procs.length = 0;
  t0 = now();
  await overlay.sync(blocks, peers);
  const steadyMs = now() - t0;
  const steadyBreakdown = [...procs];

  const victims = peers.filter((_, i) => i % Math.max(1, Math.floor(n / ROUTES_DELETED)) === 0).slice(0, ROUTES_DELETED);
  await new IpRoute2().batch(victims.map((p) => `route del ${p.blocks[0]} proto ${ROUTE_PROTO}`));
  expectCounts(`after deleting ${victims.length} routes`, await countsHere(DEVICE), { ...want, routes: n - victims.length });
  t0 = now();
  await overlay.sync(blocks, peers);
  const repairMs = now() - t0;
  const repairCounts = await countsHere(DEVICE);
  expectCounts('after the repair', repairCounts, want);

  // A burst of peer updates, as BURST watch `put` lines in a row make it: the agent calls sync once per line, each
  // with the peer set as it stands after that line (here: one more peer with a new VTEP MAC each time).
  let changed = peers;
  const calls: Promise<void>[] = [];
  t0 = now();
  for (let k = 0; k < Math.min(BURST, n); k++) {
    changed = changed.map((p, i) => (i === k ? { ...p, vtepMac: p.vtepMac.replace(/^0a:bb/, '0a:cc') } : p));
    calls.push(overlay.sync(blocks, changed));
  }
  await Promise.all(calls);
  const burstMs = now() - t0;
  expectCounts('after the burst', await countsHere(DEVICE), want);
  const moved = (await fdbHere(DEVICE)).filter((f) => f.mac.startsWith('0a:cc')).length;
  if (moved !== Math.min(BURST, n)) throw new Error(`after the burst ${moved} fdb entries carry the new MACs, expected ${Math.min(BURST, n)}`);
  return { side: 'ours', firstMs, firstCounts, processes: firstBreakdown.length, firstBreakdown, steadyMs, steadyBreakdown, repairMs, repairCounts, burstMs, burstCalls: calls.length };
}

async function workerReference(n: number): Promise<WorkerResult> {
  const init = selfInit();
  const settings = { device: init.device, underlayNet: init.underlayNet, underlayDevice: init.underlayDevice, directRouting: init.directRouting };
  const self = { name: init.nodeName, site: init.site, underlay: init.underlay, vtepMac: init.vtepMac, blocks: selfBlocks() };
  const peers = syntheticPeers(n).map((p) => ({ name: p.name, site: p.site, underlay: p.addresses[0] as string, vtepMac: p.vtepMac, blocks: p.blocks.map((b) => parseCidr(b) as Cidr), reachable: false }));
  // The very lines Overlay would batch, from the same plan: identical entries on both sides.
  const lines = renderOverlayDiff(diffOverlay(planOverlay(self, peers, settings), { routes: [], neighbours: [], fdb: [] }));
  const commands = [...lines.bridge.map((l) => ['bridge', ...l.split(' ')]), ...lines.ip.map((l) => ['ip', ...l.split(' ')])];
  const per: number[] = [];
  const t0 = now();
  for (const [cmd, ...args] of commands) {
    const t = now();
    const res = await realExec(cmd as string, args);
    per.push(now() - t);
    if (res.code !== 0) throw new Error(`${cmd} ${args.join(' ')} failed: ${res.stderr.trim()}`);
  }
  const firstMs = now() - t0;
  const firstCounts = await countsHere(DEVICE);
  expectCounts('after one process per entry', firstCounts, { routes: n, neighbours: n, fdb: n });
  const floor: number[] = [];
  for (let i = 0; i < FLOOR_SPAWNS; i++) {
    const t = now();
    await realExec('/bin/true', []);
    floor.push(now() - t);
  }
  return { side: 'reference', firstMs, firstCounts, processes: commands.length, firstBreakdown: [], perProcessMs: median(per), floorMs: median(floor) };
}

async function worker(argv: readonly string[]): Promise<void> {
  const [side, count] = argv;
  const n = Number(count);
  if ((side !== 'ours' && side !== 'reference') || !Number.isInteger(n) || n < 1) throw new Error(`usage: overlay.ts --worker ours|reference N`);
  const res = side === 'ours' ? await workerOurs(n) : await workerReference(n);
  process.stdout.write(JSON.stringify(res) + '\n');
}

// ---------------------------------------------------------------------------------------------------------------
// Part 1, the driver

/** A fresh namespace with an underlay that leads nowhere: a veth pair with both ends inside, the far end down. */
function programmingNamespace(fx: Fixture, name: string): string {
  const ns = fx.addNetns(name);
  sh('ip', ['-n', ns, 'link', 'add', UNDERLAY_DEVICE, 'type', 'veth', 'peer', 'name', 'ul1']);
  sh('ip', ['-n', ns, 'addr', 'add', `${SELF_UNDERLAY}/16`, 'dev', UNDERLAY_DEVICE]);
  sh('ip', ['-n', ns, 'link', 'set', UNDERLAY_DEVICE, 'up']);
  return ns;
}

/** Independent check from outside the worker: what the namespace's kernel tables hold now. */
function countsIn(ns: string): Counts {
  const j = (args: string[]) => JSON.parse(sh(args[0] as string, args.slice(1)) || '[]') as { dst?: string; mac?: string }[];
  return {
    routes: j(['ip', '-n', ns, '-json', 'route', 'show', 'proto', String(ROUTE_PROTO)]).length,
    neighbours: j(['ip', '-n', ns, '-json', 'neigh', 'show', 'dev', DEVICE, 'nud', 'permanent']).length,
    fdb: j(['bridge', '-n', ns, '-json', 'fdb', 'show', 'dev', DEVICE]).filter((e) => e.dst && e.mac !== '00:00:00:00:00:00').length,
  };
}

async function programmingSide(fx: Fixture, side: 'ours' | 'reference', n: number, rep: number): Promise<WorkerResult> {
  const ns = programmingNamespace(fx, `prog-${side === 'ours' ? 'o' : 'r'}${rep}`);
  try {
    if (side === 'reference') for (const l of deviceLines(selfInit())) sh('ip', ['-n', ns, ...l.split(' ')]);
    const res = await run(fx, ['ip', 'netns', 'exec', ns, PROJECT_NODE, SELF, '--worker', side, String(n)], WORKER_TIMEOUT_BASE_MS + n * WORKER_TIMEOUT_PER_PEER_MS);
    if (res.code !== 0) throw new Error(`the ${side} programming worker failed (exit ${res.code}):\n${res.stderr}`);
    const result = JSON.parse(res.stdout.trim().split('\n').pop() as string) as WorkerResult;
    expectCounts(`${side}, seen from outside the worker`, countsIn(ns), { routes: n, neighbours: n, fdb: n });
    return result;
  } finally {
    fx.delNetns(ns);
  }
}

async function programming(fx: Fixture, opts: Options): Promise<{ ours: WorkerResult[]; reference: WorkerResult[] }> {
  const out = { ours: [] as WorkerResult[], reference: [] as WorkerResult[] };
  for (let r = 0; r < opts.reps; r++) {
    const order = r % 2 === 0 ? (['ours', 'reference'] as const) : (['reference', 'ours'] as const);
    for (const side of order) {
      log(`programming ${opts.peers} peers, ${side}, repetition ${r + 1}/${opts.reps}`);
      out[side].push(await programmingSide(fx, side, opts.peers, r));
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// Part 2: throughput

interface Node {
  readonly agent: TestAgent;
  /** Full name of the node namespace. */
  readonly ns: string;
  readonly underlay: string;
}

interface Pod {
  /** Full namespace name. */
  readonly ns: string;
  readonly ip: string;
}

interface IperfSample {
  readonly side: 'ours' | 'reference';
  readonly run: number;
  readonly gbps: number;
  readonly retransmits: number;
  readonly senderCpu: number;
  readonly receiverCpu: number;
  /** Bytes the sending node's VXLAN device transmitted during the run, over the bytes iperf3 received. */
  readonly vxlanShare: number;
  /** The machine's 1-minute load average at the end of the run (other work competing for the CPUs). */
  readonly load: number;
}

interface MtuCheck {
  readonly podMtu: number;
  readonly largestPayload: number;
  readonly passes: boolean;
  readonly oneMoreRefused: boolean;
  readonly underlayFragments: number;
}


function peersKnown(agent: TestAgent): number {
  const path = join(agent.dataDir, 'cluster-state.json');
  if (!existsSync(path)) return 0;
  const peers = (JSON.parse(readFileSync(path, 'utf8')) as { peers?: { blocks: string[]; vtepMac: string }[] }).peers ?? [];
  return peers.filter((p) => p.blocks.length > 0 && p.vtepMac).length;
}

function inNs(ns: string, argv: readonly string[]): string[] {
  return ['ip', 'netns', 'exec', ns, ...argv];
}

async function ping(fx: Fixture, from: Pod, to: string, extra: readonly string[] = []): Promise<boolean> {
  return (await run(fx, inNs(from.ns, ['ping', '-c1', '-W2', ...extra, to]), 10_000)).code === 0;
}

/** Sum of the IP fragmentation counters (FragCreates + ReasmReqds) in a namespace: nonzero deltas mean fragments. */
function fragCounters(ns: string): number {
  const snmp = sh('ip', ['netns', 'exec', ns, 'cat', '/proc/net/snmp']).split('\n').filter((l) => l.startsWith('Ip:'));
  const [head, vals] = [snmp[0]?.split(/\s+/) ?? [], snmp[1]?.split(/\s+/) ?? []];
  const get = (k: string) => Number(vals[head.indexOf(k)] ?? 0);
  return get('FragCreates') + get('ReasmReqds');
}

function txBytes(ns: string, dev: string): number {
  return (JSON.parse(sh('ip', ['-n', ns, '-s', '-json', 'link', 'show', 'dev', dev])) as { stats64: { tx: { bytes: number } } }[])[0]?.stats64.tx.bytes ?? 0;
}

async function setUpOurs(fx: Fixture): Promise<{ nodes: Node[]; pods: Pod[] }> {
  const cloud = new TestCloud();
  fx.cloud = cloud;
  const controller: ControllerProc = await cloud.startController('ctl', { port: CONTROLLER_PORT });
  const nodes: Node[] = [];
  for (const name of ['ov1', 'ov2']) {
    const agent = new TestAgent({ name, podCidrs: [] });
    fx.agents.push(agent);
    const underlay = cloud.connect(agent.netns);
    // The production reconcile and usage periods (the test harness uses 2 s and 1 s): as a node runs.
    agent.rewriteConfig({ controller: { ...cloud.controllerConfig([controller]), usagePeriod: 10 }, underlayAddresses: [underlay], overlay: {}, resyncPeriod: 60 });
    nodes.push({ agent, ns: agent.netns, underlay });
  }
  await Promise.all(nodes.map((n) => n.agent.start()));
  await until('both agents to know each other with blocks and VTEP MACs', () => nodes.every((n) => peersKnown(n.agent) === 2), 30_000);
  const pods: Pod[] = [];
  for (const n of nodes) {
    const path = n.agent.podNetns(`${n.ns.split('-').at(-2)}p`);
    const full = path.split('/').pop() as string;
    const res = n.agent.cni(n.agent.env('ADD', `c-${full}`, path, { namespace: 'bench', name: `iperf-${full}` }), n.agent.netconf());
    if (res.code !== 0) throw new Error(`atoll-cni ADD failed (exit ${res.code}): ${res.stdout}${res.stderr}\n${n.agent.dump()}`);
    const ip = ((res.json?.ips as { address: string }[] | undefined)?.[0]?.address ?? '').split('/')[0] as string;
    pods.push({ ns: full, ip });
  }
  await until('overlay routes on both nodes', () => nodes.every((n) => sh('ip', ['-n', n.ns, 'route', 'show', 'proto', String(ROUTE_PROTO)]).trim() !== ''), 30_000);
  const [a, b] = pods as [Pod, Pod];
  await until(`ours: ${a.ip} to reach ${b.ip}`, () => ping(fx, a, b.ip), 20_000);
  return { nodes, pods };
}

const FLAN_DEVICE = 'flan.2';
const FLAN_BRIDGE = 'flbr0';
const FLAN_VETH = 'flveth0';
const flanMac = (i: number) => `0e:f1:00:00:00:0${i + 1}`;
const flanSubnet = (i: number) => `10.200.${i + 1}`;

/**
 * The reference: what flannel's vxlan backend and the bridge plugin build, by hand, in the same node namespaces
 * (same underlay veth, same MTU): a VXLAN device (VNI 2, its own port, learning off, MTU underlay - 50) holding the
 * node's subnet address as /32, a bridge with the subnet's gateway, a pod on a veth (hairpin on), and per peer a
 * permanent neighbour, a static fdb entry and an onlink route, as flannel programs them.
 */
async function setUpReference(fx: Fixture, nodes: readonly Node[]): Promise<Pod[]> {
  const pods: Pod[] = [];
  for (const [i, n] of nodes.entries()) {
    const uplinkMtu = (JSON.parse(sh('ip', ['-n', n.ns, '-json', 'link', 'show', 'dev', 'uplink0'])) as { mtu: number }[])[0]?.mtu ?? 1500;
    const mtu = String(uplinkMtu - 50);
    const net = flanSubnet(i);
    const pod = fx.addNetns(`fl${i + 1}-pod`);
    const ip = (...args: string[]) => sh('ip', ['-n', n.ns, ...args]);
    ip('link', 'add', FLAN_DEVICE, 'address', flanMac(i), 'mtu', mtu, 'type', 'vxlan', 'id', '2', 'local', n.underlay, 'dev', 'uplink0', 'dstport', '8473', 'nolearning');
    ip('addr', 'add', `${net}.0/32`, 'dev', FLAN_DEVICE);
    ip('link', 'set', FLAN_DEVICE, 'up');
    ip('link', 'add', FLAN_BRIDGE, 'mtu', mtu, 'type', 'bridge');
    ip('addr', 'add', `${net}.1/24`, 'dev', FLAN_BRIDGE);
    ip('link', 'set', FLAN_BRIDGE, 'up');
    ip('link', 'add', FLAN_VETH, 'mtu', mtu, 'type', 'veth', 'peer', 'name', 'eth0', 'mtu', mtu, 'netns', pod);
    ip('link', 'set', FLAN_VETH, 'master', FLAN_BRIDGE);
    ip('link', 'set', FLAN_VETH, 'type', 'bridge_slave', 'hairpin', 'on');
    ip('link', 'set', FLAN_VETH, 'up');
    sh('ip', ['-n', pod, 'addr', 'add', `${net}.2/24`, 'dev', 'eth0']);
    sh('ip', ['-n', pod, 'link', 'set', 'eth0', 'up']);
    sh('ip', ['-n', pod, 'route', 'add', 'default', 'via', `${net}.1`]);
    pods.push({ ns: pod, ip: `${net}.2` });
  }
  for (const [i, n] of nodes.entries()) {
    for (const [j, peer] of nodes.entries()) {
      if (i === j) continue;
      sh('ip', ['-n', n.ns, 'neigh', 'replace', `${flanSubnet(j)}.0`, 'lladdr', flanMac(j), 'dev', FLAN_DEVICE, 'nud', 'permanent']);
      sh('bridge', ['-n', n.ns, 'fdb', 'append', flanMac(j), 'dev', FLAN_DEVICE, 'dst', peer.underlay, 'self', 'permanent']);
      sh('ip', ['-n', n.ns, 'route', 'replace', `${flanSubnet(j)}.0/24`, 'via', `${flanSubnet(j)}.0`, 'dev', FLAN_DEVICE, 'onlink']);
    }
  }
  const [a, b] = pods as [Pod, Pod];
  await until(`reference: ${a.ip} to reach ${b.ip}`, () => ping(fx, a, b.ip), 20_000);
  return pods;
}

/** One iperf3 run: a one-off server in `server`, a client in `client`; both bounded in time and killed by PID. */
async function iperf(fx: Fixture, client: Pod, server: Pod, seconds: number, sendingNode: string, vxlanDev: string): Promise<Omit<IperfSample, 'side' | 'run' | 'load'>> {
  const srv = fx.start(inNs(server.ns, ['iperf3', '-s', '-1', '-p', String(IPERF_PORT)]), (seconds + 40) * 1000);
  srv.done.catch(() => undefined); // a failure to start shows as the client's failure; never an unhandled rejection
  try {
    await until('the iperf3 server to listen', async () => (await run(fx, inNs(server.ns, ['ss', '-Hltn', `sport = :${IPERF_PORT}`]), 5000)).stdout.trim() !== '', 10_000);
    const tx0 = txBytes(sendingNode, vxlanDev);
    const res = await run(fx, inNs(client.ns, ['iperf3', '-c', server.ip, '-p', String(IPERF_PORT), '-t', String(seconds), '-J', '--connect-timeout', '3000']), (seconds + 30) * 1000);
    const tx = txBytes(sendingNode, vxlanDev) - tx0;
    let report: { end?: { sum_received?: { bits_per_second?: number; bytes?: number }; sum_sent?: { retransmits?: number }; cpu_utilization_percent?: { host_total?: number; remote_total?: number } }; error?: string };
    try {
      report = JSON.parse(res.stdout) as typeof report;
    } catch {
      throw new Error(`iperf3 client ${client.ip} -> ${server.ip} printed no JSON (exit ${res.code}): ${res.stdout.slice(0, 500)}${res.stderr}`);
    }
    const bps = report.end?.sum_received?.bits_per_second;
    if (res.code !== 0 || typeof bps !== 'number' || bps <= 0) throw new Error(`iperf3 client ${client.ip} -> ${server.ip} failed (exit ${res.code}): ${report.error ?? res.stderr}`);
    return {
      gbps: bps / 1e9,
      retransmits: report.end?.sum_sent?.retransmits ?? 0,
      senderCpu: report.end?.cpu_utilization_percent?.host_total ?? NaN,
      receiverCpu: report.end?.cpu_utilization_percent?.remote_total ?? NaN,
      vxlanShare: tx / (report.end?.sum_received?.bytes ?? NaN),
    };
  } finally {
    // The server exits after its one test (-1); if the client failed it would wait for another: kill it by PID.
    const exited = await Promise.race([srv.done.then(() => true, () => true), sleep(3000).then(() => false)]);
    if (!exited) {
      srv.child.kill('SIGKILL');
      await srv.done.catch(() => undefined);
    }
  }
}

/** The largest unfragmented datagram: `ping -M do -s (mtu - 28)` passes, `-s (mtu - 27)` is refused; no fragments. */
async function mtuCheck(fx: Fixture, from: Pod, to: Pod, nodeNamespaces: readonly string[]): Promise<MtuCheck> {
  const podMtu = (JSON.parse(sh('ip', ['-n', from.ns, '-json', 'link', 'show', 'dev', 'eth0'])) as { mtu: number }[])[0]?.mtu ?? 0;
  const largestPayload = podMtu - 28; // 20 bytes of IPv4 header, 8 of ICMP
  const frags0 = nodeNamespaces.reduce((s, ns) => s + fragCounters(ns), 0);
  const passes = await ping(fx, from, to.ip, ['-M', 'do', '-s', String(largestPayload)]);
  const oneMoreRefused = !(await ping(fx, from, to.ip, ['-M', 'do', '-s', String(largestPayload + 1)]));
  const underlayFragments = nodeNamespaces.reduce((s, ns) => s + fragCounters(ns), 0) - frags0;
  return { podMtu, largestPayload, passes, oneMoreRefused, underlayFragments };
}

/** Identity keys of `ip -d -json link` that differ between any two links and say nothing about the data path. */
const IDENTITY_KEYS = new Set(['ifindex', 'ifname', 'address', 'broadcast', 'link', 'link_index', 'link_netnsid', 'master', 'perm_address',
  'bridge_id', 'root_id', 'designated_root', 'designated_bridge', 'designated_port', 'designated_cost', 'root_port', 'root_path_cost',
  'hello_timer', 'tcn_timer', 'topology_change_timer', 'gc_timer', 'message_age_timer', 'forward_delay_timer', 'hold_timer', 'group_addr',
  'altnames', 'parentbus', 'parentdev', 'stats64']);

function flatten(prefix: string, v: unknown, out: Map<string, string>): void {
  if (v !== null && typeof v === 'object' && !Array.isArray(v)) {
    for (const [k, x] of Object.entries(v)) if (!IDENTITY_KEYS.has(k)) flatten(prefix ? `${prefix}.${k}` : k, x, out);
  } else {
    out.set(prefix, JSON.stringify(v));
  }
}

/**
 * What differs between a link of ours and its counterpart in the reference (`ip -d -json link`, identity keys left
 * out), as `key: ours / reference`: the evidence that both data paths are built alike.
 */
function linkDifferences(ours: { ns: string; dev: string }, ref: { ns: string; dev: string }): string[] {
  const details = (x: { ns: string; dev: string }) => {
    const out = new Map<string, string>();
    flatten('', (JSON.parse(sh('ip', ['-n', x.ns, '-d', '-json', 'link', 'show', 'dev', x.dev])) as unknown[])[0], out);
    return out;
  };
  const a = details(ours);
  const b = details(ref);
  return [...new Set([...a.keys(), ...b.keys()])].filter((k) => a.get(k) !== b.get(k)).map((k) => `${k}: ${a.get(k) ?? '-'} / ${b.get(k) ?? '-'}`);
}

/** The pod-side links of both sides, compared: pod eth0, the host end of its veth, the bridge, the VXLAN device. */
function pathDifferences(node: Node, pod: Pod, refPod: Pod): Record<string, string[]> {
  const hostEnd = (ns: string, podNs: string) => {
    const peer = (JSON.parse(sh('ip', ['-n', podNs, '-json', 'link', 'show', 'dev', 'eth0'])) as { link_index?: number }[])[0]?.link_index;
    return (JSON.parse(sh('ip', ['-n', ns, '-json', 'link', 'show'])) as { ifindex: number; ifname: string }[]).find((l) => l.ifindex === peer)?.ifname ?? '?';
  };
  return {
    'pod eth0': linkDifferences({ ns: pod.ns, dev: 'eth0' }, { ns: refPod.ns, dev: 'eth0' }),
    'host veth': linkDifferences({ ns: node.ns, dev: hostEnd(node.ns, pod.ns) }, { ns: node.ns, dev: FLAN_VETH }),
    bridge: linkDifferences({ ns: node.ns, dev: node.agent.bridge }, { ns: node.ns, dev: FLAN_BRIDGE }),
    'VXLAN device': linkDifferences({ ns: node.ns, dev: DEVICE }, { ns: node.ns, dev: FLAN_DEVICE }),
  };
}

interface ThroughputResults {
  /** Per link of the path (node 1), the details in which ours and the reference differ. */
  readonly pathDifferences: Record<string, string[]>;
  readonly samples: IperfSample[];
  readonly mtu: { ours: MtuCheck; reference: MtuCheck };
  readonly underlayFragmentsDuringRuns: number;
}

async function throughput(fx: Fixture, opts: Options): Promise<ThroughputResults> {
  log('throughput: starting a controller and 2 agents');
  const { nodes, pods } = await setUpOurs(fx);
  log('throughput: building the flannel-style reference in the same node namespaces');
  const refPods = await setUpReference(fx, nodes);
  const nodeNs = [...nodes.map((n) => n.ns), (fx.cloud as TestCloud).netns];
  const mtu = {
    ours: await mtuCheck(fx, pods[0] as Pod, pods[1] as Pod, nodeNs),
    reference: await mtuCheck(fx, refPods[0] as Pod, refPods[1] as Pod, nodeNs),
  };
  const sides = {
    ours: { client: pods[0] as Pod, server: pods[1] as Pod, dev: DEVICE },
    reference: { client: refPods[0] as Pod, server: refPods[1] as Pod, dev: FLAN_DEVICE },
  };
  const samples: IperfSample[] = [];
  const frags0 = nodeNs.reduce((s, ns) => s + fragCounters(ns), 0);
  for (let r = 0; r < opts.reps; r++) {
    for (const side of ['ours', 'reference'] as const) {
      log(`throughput: ${side}, run ${r + 1}/${opts.reps}, ${opts.seconds} s`);
      const s = sides[side];
      samples.push({ side, run: r, ...(await iperf(fx, s.client, s.server, opts.seconds, (nodes[0] as Node).ns, s.dev)), load: loadavg()[0] as number });
    }
  }
  return { pathDifferences: pathDifferences(nodes[0] as Node, pods[0] as Pod, refPods[0] as Pod), samples, mtu, underlayFragmentsDuringRuns: nodeNs.reduce((s, ns) => s + fragCounters(ns), 0) - frags0 };
}

// ---------------------------------------------------------------------------------------------------------------
// Statistics and the report

interface Target {
  readonly what: string;
  readonly value: string;
  readonly pass: boolean;
}

interface Results {
  readonly programming?: { ours: WorkerResult[]; reference: WorkerResult[] };
  readonly throughput?: ThroughputResults;
}

/** Wall time during which at least one of `procs` ran (counting overlaps once). */
function processWallMs(procs: readonly ProcTiming[]): number {
  let total = 0;
  let end = -Infinity;
  for (const p of [...procs].sort((a, b) => a.start - b.start)) {
    const e = p.start + p.ms;
    if (e <= end) continue;
    total += e - Math.max(p.start, end);
    end = e;
  }
  return total;
}

/** One sync's processes grouped by what they did, and the time outside them (netlink reads, planning, diffing). */
function breakdown(totalMs: number, procs: readonly ProcTiming[]): string {
  const group = (w: string): string => {
    if (w.startsWith('nft')) return 'nft -f';
    if (w.includes('-batch')) return w.endsWith('(1 lines)') ? 'device/address' : (w.split(' (')[0] as string).replace(' -batch -', ' -batch');
    return w;
  };
  const sums = new Map<string, { ms: number; n: number; lines: number }>();
  for (const p of procs) {
    const g = group(p.what);
    const e = sums.get(g) ?? { ms: 0, n: 0, lines: 0 };
    sums.set(g, { ms: e.ms + p.ms, n: e.n + 1, lines: e.lines + Number(/\((\d+) lines\)/.exec(p.what)?.[1] ?? 0) });
  }
  const wall = processWallMs(procs);
  const parts = [...sums].map(([g, e]) => `${g} ${fmt(e.ms)}${e.n > 1 ? ` (${e.n} processes)` : ''}${g.includes('-batch') && e.lines > 1 ? ` [${e.lines} lines]` : ''}`);
  return `${fmt(totalMs)} ms = ${fmt(wall)} in ${procs.length} processes (${parts.join('; ')}) + ${fmt(totalMs - wall)} in this process (netlink reads, plan, diff)`;
}

function report(r: Results, opts: Options): { text: string; targets: Target[] } {
  const lines: string[] = [];
  const targets: Target[] = [];
  if (r.programming) {
    const { ours, reference } = r.programming;
    const stat = (xs: number[]) => [String(xs.length), fmt(median(xs)), fmt(Math.min(...xs)), fmt(Math.max(...xs))];
    const first = ours.map((w) => w.firstMs);
    const ref = reference.map((w) => w.firstMs);
    const rows: string[][] = [['step', 'side', 'n', 'median ms', 'min', 'max', 'ours/ref'],
      [`program ${opts.peers} peers from empty (${opts.peers * 3} entries)`, `ours: Overlay.sync, ${ours[0]?.processes ?? '?'} processes`, ...stat(first), fmt(median(first) / median(ref), 3)],
      ['', `reference: ${reference[0]?.processes ?? '?'} processes, one per entry`, ...stat(ref), ''],
      ['steady-state resync (nothing to change)', 'ours', ...stat(ours.map((w) => w.steadyMs ?? NaN)), ''],
      [`repair (${ROUTES_DELETED} routes deleted)`, 'ours', ...stat(ours.map((w) => w.repairMs ?? NaN)), ''],
      [`burst: ${ours[0]?.burstCalls ?? BURST} peer updates, one sync call each, until the last settles`, 'ours', ...stat(ours.map((w) => w.burstMs ?? NaN)), ''],
      ['one entry process (median)', 'reference', ...stat(reference.map((w) => w.perProcessMs ?? NaN)), ''],
      ['/bin/true from the same launcher (median)', 'floor', ...stat(reference.map((w) => w.floorMs ?? NaN)), '']];
    lines.push(`Peer programming: ${opts.peers} same-site peers into a fresh namespace, wall time in ms (counts verified after each step)`, table(rows), '');
    const mid = [...ours].sort((a, b) => a.firstMs - b.firstMs)[(ours.length - 1) >> 1];
    if (mid) {
      lines.push(`ours, the median first sync: ${breakdown(mid.firstMs, mid.firstBreakdown)}`);
      lines.push(`ours, its steady-state resync: ${breakdown(mid.steadyMs ?? NaN, mid.steadyBreakdown ?? [])}`, '');
    }
    targets.push({ what: `ours: ${opts.peers} peers programmed in <= ${PEERS_TARGET_MS} ms (median)`, value: `${fmt(median(first))} ms`, pass: median(first) <= PEERS_TARGET_MS });
  }
  if (r.throughput) {
    const t = r.throughput;
    const runs: string[][] = [['run', 'side', 'Gbit/s', 'retransmits', 'sender CPU %', 'receiver CPU %', 'via VXLAN dev', 'load 1 min']];
    for (const s of t.samples) runs.push([String(s.run + 1), s.side, fmt(s.gbps, 2), String(s.retransmits), fmt(s.senderCpu), fmt(s.receiverCpu), `${fmt(s.vxlanShare * 100, 0)} %`, fmt(s.load, 2)]);
    lines.push(`Throughput: iperf3, 1 TCP stream pod to pod across two nodes, ${opts.seconds} s per run, receiver bits/s, runs alternating`, table(runs), '');
    const g = (side: string) => t.samples.filter((s) => s.side === side).map((s) => s.gbps);
    const o = g('ours');
    const ref = g('reference');
    const sum: string[][] = [['side', 'path', 'n', 'median Gbit/s', 'min', 'max', 'ours/ref'],
      ['ours', 'atoll agents, VXLAN (atoll.1, VNI 1, port 8472)', String(o.length), fmt(median(o), 2), fmt(Math.min(...o), 2), fmt(Math.max(...o), 2), fmt(median(o) / median(ref), 3)],
      ['reference', 'flannel-style VXLAN by hand (flan.2, VNI 2, port 8473)', String(ref.length), fmt(median(ref), 2), fmt(Math.min(...ref), 2), fmt(Math.max(...ref), 2), '']];
    lines.push(table(sum), 'The path on node 1, ip -d link of ours / the reference, where they differ:');
    for (const [link, diffs] of Object.entries(t.pathDifferences)) lines.push(`  ${link}: ${diffs.join('; ') || 'nothing'}`);
    lines.push('');
    const m = t.mtu;
    const mtuLine = (side: string, c: MtuCheck) => `${side}: pod MTU ${c.podMtu}; ping -M do -s ${c.largestPayload} ${c.passes ? 'passes' : 'FAILS'}, -s ${c.largestPayload + 1} ${c.oneMoreRefused ? 'is refused' : 'PASSES (fragmented or MTU too small)'}; underlay fragments ${c.underlayFragments}`;
    lines.push('MTU (largest unfragmented datagram = pod MTU):', `  ${mtuLine('ours', m.ours)}`, `  ${mtuLine('reference', m.reference)}`,
      `  IP fragments created or reassembled in the node and cloud namespaces during the iperf3 runs: ${t.underlayFragmentsDuringRuns}`, '');
    targets.push({ what: `throughput ours/reference >= ${THROUGHPUT_RATIO_TARGET} (medians)`, value: `${fmt(median(o), 2)} / ${fmt(median(ref), 2)} Gbit/s = ${fmt(median(o) / median(ref), 3)}`, pass: median(o) / median(ref) >= THROUGHPUT_RATIO_TARGET });
    targets.push({ what: `ours: a ${m.ours.largestPayload + 28}-byte datagram passes unfragmented, one byte more does not`, value: `MTU ${m.ours.podMtu}`, pass: m.ours.passes && m.ours.oneMoreRefused && m.ours.underlayFragments === 0 });
  }
  const tt: string[][] = [['target', 'result', 'value']];
  for (const t of targets) tt.push([t.what, t.pass ? 'PASS' : 'MISS', t.value]);
  lines.push('Targets', table(tt, 3));
  return { text: lines.join('\n'), targets };
}

// ---------------------------------------------------------------------------------------------------------------
// Main

function preflight(opts: Options): void {
  const problems: string[] = [];
  if (!isRoot()) problems.push('needs root: it builds network namespaces, VXLAN devices and runs a controller and agents');
  const has = (cmd: string) => sh('sh', ['-c', `command -v ${cmd} || true`]).trim() !== '';
  const tools = opts.parts.includes('throughput') ? ['ip', 'bridge', 'nft', 'iperf3', 'ping', 'ss'] : ['ip', 'bridge', 'nft'];
  for (const t of tools) if (!has(t)) problems.push(`${t} is missing (apt-get install iproute2 nftables iperf3 iputils-ping)`);
  if (problems.length > 0) throw new Error(problems.join('\n'));
}

async function main(): Promise<number> {
  const opts = parseOptions(process.argv.slice(2));
  preflight(opts);
  const started = Date.now();
  const load0 = loadavg();
  const fx = new Fixture();
  const watchdog = cleanUpOnExit(fx, opts.timeoutS);
  const results: { programming?: { ours: WorkerResult[]; reference: WorkerResult[] }; throughput?: ThroughputResults } = {};
  const seconds: Record<string, number> = {};
  try {
    for (const part of opts.parts) {
      const t0 = Date.now();
      if (part === 'programming') results.programming = await programming(fx, opts);
      else results.throughput = await throughput(fx, opts);
      seconds[part] = (Date.now() - t0) / 1000;
    }
  } finally {
    clearTimeout(watchdog);
    await fx.cleanup();
  }
  const left = leftoverNetns();
  if (left.length > 0) throw new Error(`namespaces left behind: ${left.join(', ')}`);

  const { text, targets } = report(results, opts);
  const total = (Date.now() - started) / 1000;
  const env = { kernel: release(), node: process.version, cpus: cpus().length, loadavgStart: load0, loadavgEnd: loadavg() };
  process.stdout.write(text + '\n');
  process.stdout.write(`\n${opts.smoke ? 'smoke run' : 'run'} took ${total.toFixed(1)} s (${Object.entries(seconds).map(([k, v]) => `${k} ${v.toFixed(1)} s`).join(', ')}); `
    + `load average ${load0.map((x) => x.toFixed(2)).join(' ')} at start, ${env.loadavgEnd.map((x) => x.toFixed(2)).join(' ')} at end; `
    + `${env.cpus} CPUs, kernel ${env.kernel}\n`);
  if (opts.json) writeFileSync(opts.json, JSON.stringify({ options: opts, env, seconds: { total, ...seconds }, targets, results }, null, 2) + '\n');
  return exitStatus(targets.filter((t) => !t.pass).length, opts.enforce);
}

if (process.argv[2] === '--worker') {
  worker(process.argv.slice(3)).then(() => process.exit(0), (err: unknown) => {
    process.stderr.write(`bench worker: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    process.exit(1);
  });
} else {
  runBench(main);
}
