/**
 * A cloud node with many edge peers (issue #34, item 4): a real `atoll agent` (bin/atoll, as harness/agent.ts starts
 * it) as a cloud node, in a throwaway namespace of this run, given N edge peers, measured from its start until its
 * tunnel routes for all of them are in the kernel, then its memory and its idle CPU.
 *
 * How the peers reach it: from its saved cluster state. Before the agent starts, this file writes
 * `<dataDir>/cluster-state.json` (src/adapters/node/cluster-state-file.ts) holding the node's own record, 19 other
 * cloud nodes of its site and N edge nodes (sites of 2 nodes, communities of 50 sites: the issue's topology), each
 * with a tunnel key, the edge role, flannel's annotations and one /26 block. The agent's controller URL is a port on
 * its own namespace's loopback that nobody serves, so it works from that state as it does while the controller is
 * away (src/agent/controller-link.ts). Registering 100,000 nodes through the real controller would take minutes at
 * today's join rate (issue #34's table: 152 registrations/s) and would measure the controller, not the agent.
 *
 * The agent runs with the lab's cloud configuration (src/lab/plan/plan.ts): overlay (VXLAN), tunnel role cloud with
 * the datagram path and its keeper, a controller, the default resync period (60 s). Its underlay is one end of a veth
 * pair inside its own namespace (198.18.0.1/15); every peer's underlay address is in 198.18.0.0/15 and every pod block
 * in 10.128.0.0/9, which exist only in that namespace. Nothing is sent outside loopback and this run's namespaces.
 *
 * Per N and repetition (sizes in alternating order):
 *   ours       spawn -> every peer's block routed on the TUN device (`ip route show dev atoll.tun proto 44`, polled);
 *              spawn -> the CNI socket answers (the agent serves once its first peer sync is done); the agent's own
 *              log times (plan logged, routes logged); then after --settle s, VmRSS of the agent and its children (the
 *              keeper), and its CPU time (utime+stime, its reaped children's too) over --idle s with nothing to do.
 *   reference  the same N routes by one `ip -batch` into a fresh namespace (spawn -> exit), then counted.
 *
 * Usage: node bench/cloud-peers.ts [--peers N[,N...]] [--runs R] [--idle S] [--settle S] [--resync S]
 *        [--node-flags FLAGS] [--cpu-prof DIR] [--agent-log DIR] [--smoke] [--json FILE] [--timeout S] [--enforce]
 */
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { copyFileSync, existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, release, tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { TestAgent } from '../harness/agent.ts';
import { leftoverNetns, RUN_PREFIX, sh } from '../harness/netns.ts';
import { ROUTE_PROTO } from '../src/core/overlay/plan.ts';
import { ROLE_ANNOTATION, TUNNEL_PORT_ANNOTATION } from '../src/core/tunnel/plan.ts';
import { flannelAnnotations } from '../src/core/overlay/flannel.ts';
import { formatIpv4 } from '../src/core/net/ipv4.ts';
import type { NodeRecord } from '../src/core/cluster/model.ts';
import { cleanUpOnExit, exitStatus, fmt, intOption, median, NetnsFixture, parseBenchArgs, runBench, spawnBounded, table } from './common.ts';

const USAGE = `usage: node bench/cloud-peers.ts [options]   (as root)
  --peers N[,N...]   edge peers of the cloud agent, one case per size (default 1000,10000,100000; 100 with --smoke)
  --runs R           repetitions per size, alternating the order of sizes (default 3; 1 with --smoke)
  --idle S           seconds of idle CPU measured after settling (default 60, one resync period; 3 with --smoke)
  --settle S         seconds waited after the routes are in before measuring (default 5; 1 with --smoke)
  --resync S         the agent's resyncPeriod (default 60, the product's default)
  --node-flags F     the agent's Node flags (ATOLL_AGENT_NODE_FLAGS; bin/atoll's default is --jitless)
  --cpu-prof DIR     write a CPU profile of each agent into DIR (adds --cpu-prof to its Node flags)
  --agent-log DIR    copy each agent's log into DIR
  --smoke            a short run that checks the bench works, not the targets
  --json FILE        write every sample and the summary to FILE
  --timeout S        abort (and clean up) after this long (default 3600)
  --enforce          exit 1 when a target is missed (default: report only)
Targets (issue #34, for 100,000 peers; every size is held to them): routes in <= 10 s from the agent's start,
idle CPU <= 5% of a core, RSS (agent and its children) <= 512 MiB.`;

/** Issue #34's targets. */
const TARGET = { routesMs: 10_000, idleCpuPct: 5, rssMiB: 512 } as const;
/** Cloud nodes of the agent's site besides itself (the issue's 20 cloud nodes). */
const CLOUD_PEERS = 19;
const EDGE_SITE_NODES = 2;
const COMMUNITY_SITES = 50;
/** Pod blocks: /26 each from 10.128.0.0/9 (131,072 of them); underlay addresses from 198.18.0.0/15. */
const BLOCK_BASE = 0x0a800000;
const BLOCK_SIZE = 64;
const UNDERLAY_BASE = 0xc6120000;
const MAX_PEERS = 131_072 - CLOUD_PEERS - 2;
const CLK_TCK = 100;
const TUN_DEVICE = 'atoll.tun';

interface Options {
  readonly peers: readonly number[];
  readonly runs: number;
  readonly idleS: number;
  readonly settleS: number;
  readonly resyncS: number;
  readonly nodeFlags: string | undefined;
  readonly cpuProf: string | undefined;
  readonly agentLog: string | undefined;
  readonly smoke: boolean;
  readonly json: string | undefined;
  readonly timeoutS: number;
  readonly enforce: boolean;
}

function parseOptions(argv: readonly string[]): Options {
  const v = parseBenchArgs(argv, USAGE, {
    peers: { type: 'string' }, runs: { type: 'string' }, idle: { type: 'string' }, settle: { type: 'string' }, resync: { type: 'string' },
    'node-flags': { type: 'string' }, 'cpu-prof': { type: 'string' }, 'agent-log': { type: 'string' }, enforce: { type: 'boolean', default: false },
  });
  const int = intOption(USAGE);
  const smoke = v.smoke === true;
  const peers = (v.peers ?? (smoke ? '100' : '1000,10000,100000')).split(',').map((p) => int('peers', p.trim(), 0, 1, MAX_PEERS));
  return {
    peers, smoke,
    runs: int('runs', v.runs, smoke ? 1 : 3, 1, 20),
    idleS: int('idle', v.idle, smoke ? 3 : 60, 1, 600),
    settleS: int('settle', v.settle, smoke ? 1 : 5, 0, 600),
    resyncS: int('resync', v.resync, 60, 1, 3600),
    nodeFlags: v['node-flags'], cpuProf: v['cpu-prof'], agentLog: v['agent-log'],
    json: v.json, timeoutS: int('timeout', v.timeout, 3600, 10), enforce: v.enforce === true,
  };
}

// ---------------------------------------------------------------------------------------------------------------
// The cluster the agent is given

const hex = (s: string) => createHash('sha256').update(s).digest('hex');
const blockOf = (i: number) => `${formatIpv4(BLOCK_BASE + i * BLOCK_SIZE)}/26`;
const underlayOf = (i: number) => formatIpv4(UNDERLAY_BASE + i + 1);

/** A registered node as the controller would send it; `i` numbers its block and underlay address. */
function nodeRecord(name: string, i: number, site: string, community: string, role: 'cloud' | 'edge'): NodeRecord {
  const digest = hex(name);
  const vtepMac = `0a:${digest.slice(0, 10).match(/../g)?.join(':')}`;
  const address = underlayOf(i);
  return {
    name, identity: Buffer.from(`302a300506032b6570032100${digest}`, 'hex').toString('base64'), site, community,
    addresses: [address], observedAddress: address, vtepMac, tunnelKey: `sha256:${hex(`key ${name}`)}`, agentVersion: '0.1.0',
    annotations: { ...flannelAnnotations(1, vtepMac, address), [ROLE_ANNOTATION]: role, [TUNNEL_PORT_ANNOTATION]: '8475' },
    blocks: [blockOf(i)], registeredAt: 1_760_000_000_000, updatedAt: 1_760_000_000_000,
  };
}

/** The cluster state file's text: the node `self`, CLOUD_PEERS cloud peers and `edges` edge nodes. */
function clusterStateText(self: string, edges: number): string {
  const peers: NodeRecord[] = [nodeRecord(self, 0, 'cloud', '', 'cloud')];
  for (let c = 1; c <= CLOUD_PEERS; c++) peers.push(nodeRecord(`cloud-peer-${c}`, c, 'cloud', '', 'cloud'));
  for (let e = 0; e < edges; e++) {
    const site = Math.floor(e / EDGE_SITE_NODES);
    const name = `edge-${String(site).padStart(6, '0')}-${(e % EDGE_SITE_NODES) + 1}`;
    peers.push(nodeRecord(name, CLOUD_PEERS + 1 + e, `edge-${site}`, `community-${Math.floor(site / COMMUNITY_SITES)}`, 'edge'));
  }
  return JSON.stringify({ blocks: [blockOf(0)], revision: 1, peers });
}

// ---------------------------------------------------------------------------------------------------------------
// The process and the kernel, read from outside

/** utime+stime (and, with `reaped`, its waited-for children's) of a process, in ticks; 0 when it is gone. */
function cpuTicks(pid: number, reaped: boolean): number {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    // after the command: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14)
    return Number(f[11]) + Number(f[12]) + (reaped ? Number(f[13]) + Number(f[14]) : 0);
  } catch {
    return 0;
  }
}

/** Live descendants of `pid` (the keeper, an `ip` in flight), by their parent links in /proc. */
function descendants(pid: number): number[] {
  const parent = new Map<number, number>();
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const s = readFileSync(`/proc/${d}/stat`, 'utf8');
      parent.set(Number(d), Number(s.slice(s.lastIndexOf(')') + 2).split(' ')[1]));
    } catch {
      // gone meanwhile
    }
  }
  const out: number[] = [];
  let frontier = [pid];
  while (frontier.length > 0) {
    const next = [...parent].filter(([, pp]) => frontier.includes(pp)).map(([p]) => p);
    out.push(...next);
    frontier = next;
  }
  return out;
}

/** A /proc/PID/status field in KiB (VmRSS, VmHWM); 0 when the process is gone. */
function statusKiB(pid: number, field: string): number {
  try {
    const m = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) : 0;
  } catch {
    return 0;
  }
}

/** RSS of the agent and of its live descendants, KiB. */
function treeRssKiB(pid: number): { agent: number; children: number } {
  return { agent: statusKiB(pid, 'VmRSS'), children: descendants(pid).reduce((s, p) => s + statusKiB(p, 'VmRSS'), 0) };
}

/** CPU ticks of the agent (with the children it reaped) and of its live descendants. */
function treeCpuTicks(pid: number): number {
  return cpuTicks(pid, true) + descendants(pid).reduce((s, p) => s + cpuTicks(p, false), 0);
}

/** Routes with our protocol on `dev` in namespace `ns` (0 while the device does not exist). */
async function countRoutes(ns: string, dev: string): Promise<number> {
  const { done } = spawnBounded(['ip', '-n', ns, '-4', 'route', 'show', 'table', 'main', 'proto', String(ROUTE_PROTO), 'dev', dev], 30_000);
  const r = await done;
  if (r.code !== 0) return 0;
  let n = 0;
  for (let i = r.stdout.indexOf('\n'); i !== -1; i = r.stdout.indexOf('\n', i + 1)) n++;
  return n;
}

/** Times (ms after the first line) of the agent's log lines that mark its start-up steps. */
function logMarks(path: string): Record<string, number> {
  if (!existsSync(path)) return {};
  const marks: Record<string, number> = {};
  let t0: number | undefined;
  for (const line of readFileSync(path, 'utf8').split('\n')) {
    const head = line.slice(0, 200);
    const time = /"time":"([^"]+)"/.exec(head)?.[1];
    const msg = /"msg":"([^"]+)"/.exec(head)?.[1];
    if (!time || !msg) continue;
    const t = Date.parse(time);
    t0 ??= t;
    if (marks[msg] === undefined) marks[msg] = t - t0;
  }
  return marks;
}

// ---------------------------------------------------------------------------------------------------------------
// One case

interface Sample {
  readonly peers: number;
  readonly rep: number;
  /** spawn -> all N tunnel routes in the kernel (polled: resolution one poll, 100 ms + its own time). */
  readonly routesMs: number;
  /** spawn -> the CNI socket answers. */
  readonly readyMs: number;
  /** From the agent's log, ms after its first line: plan logged ('tunnel peers'), routes logged, ready. */
  readonly log: { readonly planMs?: number; readonly routesMs?: number; readonly readyMs?: number };
  readonly rssKiB: { readonly agent: number; readonly children: number; readonly agentPeak: number };
  /** Share of one core over the idle window, %. */
  readonly idleCpuPct: number;
  /** One `ip -batch` of N routes into a fresh namespace: spawn -> exit. */
  readonly referenceMs: number;
  readonly stateFileMiB: number;
}

class Fixture extends NetnsFixture {
  readonly agents = new Set<TestAgent>();

  protected override async cleanupMore(): Promise<void> {
    for (const a of this.agents) await a.cleanup();
    this.agents.clear();
  }
}

let caseNo = 0;

async function ours(fx: Fixture, o: Options, peers: number, rep: number): Promise<Omit<Sample, 'referenceMs'>> {
  const k = ++caseNo;
  const name = `cloud-${k}`;
  const agent = new TestAgent({
    name, podCidrs: [],
    config: {
      resyncPeriod: o.resyncS, site: 'cloud', underlayAddresses: [underlayOf(0)], clusterCidrs: ['10.128.0.0/9'],
      overlay: {}, tunnel: { role: 'cloud' },
      // nobody listens there: the agent works from its saved state, as with the controller away
      controller: { urls: ['https://127.0.0.1:9'], token: 'atoll-bench-not-served-0123', caCertHash: `sha256:${'0'.repeat(64)}` },
    },
  });
  fx.agents.add(agent);
  fx.namespaces.add(agent.netns);
  // the underlay: one end of a veth pair inside the agent's namespace, so peers' addresses lead nowhere else
  sh('ip', ['-n', agent.netns, 'link', 'add', 'ul0', 'type', 'veth', 'peer', 'name', 'ul1']);
  sh('ip', ['-n', agent.netns, 'addr', 'add', `${underlayOf(0)}/15`, 'dev', 'ul0']);
  sh('ip', ['-n', agent.netns, 'link', 'set', 'ul0', 'up']);
  sh('ip', ['-n', agent.netns, 'link', 'set', 'ul1', 'up']);
  mkdirSync(agent.dataDir, { recursive: true, mode: 0o700 });
  const text = clusterStateText(name, peers);
  writeFileSync(join(agent.dataDir, 'cluster-state.json'), text);
  const flags = [o.nodeFlags ?? process.env.ATOLL_AGENT_NODE_FLAGS ?? '--jitless', ...(o.cpuProf ? [`--cpu-prof --cpu-prof-dir=${o.cpuProf} --cpu-prof-name=agent-${peers}-${rep}.cpuprofile`] : [])].join(' ');
  process.env.ATOLL_AGENT_NODE_FLAGS = flags;
  const limitMs = Math.max(60_000, peers * 2);
  const t0 = performance.now();
  let readyMs = NaN;
  const started = agent.start(limitMs).then(() => { readyMs = performance.now() - t0; });
  let failed: unknown;
  started.catch((e: unknown) => { failed = e; });
  let routesMs = NaN;
  while (performance.now() - t0 < limitMs && failed === undefined && !fx.stopping) {
    const n = await countRoutes(agent.netns, TUN_DEVICE);
    if (n >= peers) {
      routesMs = performance.now() - t0;
      break;
    }
    await sleep(100);
  }
  await started.catch(() => undefined);
  if (failed !== undefined || !Number.isFinite(routesMs)) {
    throw new Error(`the agent with ${peers} peers did not program its routes within ${limitMs} ms (${failed instanceof Error ? failed.message : 'routes missing'})\n${agent.dump().slice(-4000)}`);
  }
  const pid = agent.pid as number;
  await sleep(o.settleS * 1000);
  const cpu0 = treeCpuTicks(pid);
  const w0 = performance.now();
  await sleep(o.idleS * 1000);
  const idleCpuPct = (100 * ((treeCpuTicks(pid) - cpu0) / CLK_TCK)) / ((performance.now() - w0) / 1000);
  const rss = treeRssKiB(pid);
  const agentPeak = statusKiB(pid, 'VmHWM');
  if (await countRoutes(agent.netns, TUN_DEVICE) < peers) throw new Error(`routes lost after settling (${peers} peers)\n${agent.dump().slice(-4000)}`);
  await agent.stop('SIGTERM'); // gracefully: a CPU profile is written at exit
  const marks = logMarks(agent.logPath);
  if (o.agentLog) copyFileSync(agent.logPath, join(o.agentLog, `agent-${peers}-${rep}.log`));
  await agent.cleanup();
  fx.agents.delete(agent);
  fx.namespaces.delete(agent.netns);
  return {
    peers, rep, routesMs, readyMs, stateFileMiB: text.length / 2 ** 20,
    log: { planMs: marks['tunnel peers'], routesMs: marks['tunnel routes updated'], readyMs: marks['atoll agent ready'] },
    rssKiB: { ...rss, agentPeak }, idleCpuPct,
  };
}

/** The reference: the same N routes by one `ip -batch` into a fresh namespace. */
async function reference(fx: Fixture, peers: number): Promise<number> {
  const ns = fx.addNetns(`ref-${++caseNo}`);
  sh('ip', ['-n', ns, 'link', 'add', 'rt0', 'type', 'veth', 'peer', 'name', 'rt1']);
  sh('ip', ['-n', ns, 'link', 'set', 'rt0', 'up']);
  sh('ip', ['-n', ns, 'link', 'set', 'rt1', 'up']);
  const file = join(tmpdir(), `${RUN_PREFIX}ref-${peers}.batch`);
  const lines: string[] = [];
  for (let e = 0; e < peers; e++) lines.push(`route add ${blockOf(CLOUD_PEERS + 1 + e)} dev rt0 proto ${ROUTE_PROTO}`);
  writeFileSync(file, lines.join('\n') + '\n');
  const t0 = performance.now();
  const r = await fx.start(['ip', '-n', ns, '-batch', file], 600_000).done;
  const ms = performance.now() - t0;
  if (r.code !== 0) throw new Error(`reference ip -batch failed: ${r.stderr.slice(0, 500)}`);
  const n = await countRoutes(ns, 'rt0');
  if (n !== peers) throw new Error(`reference: ${n} routes in the kernel, ${peers} expected`);
  fx.delNetns(ns);
  return ms;
}

// ---------------------------------------------------------------------------------------------------------------
// Report

interface Summary {
  readonly peers: number;
  readonly runs: number;
  readonly med: Record<'routesMs' | 'readyMs' | 'planMs' | 'rssMiB' | 'childrenMiB' | 'peakMiB' | 'idleCpuPct' | 'referenceMs', number>;
  readonly range: Record<'routesMs' | 'rssMiB' | 'idleCpuPct', readonly [number, number]>;
}

function summarize(samples: readonly Sample[], peers: number): Summary {
  const s = samples.filter((x) => x.peers === peers);
  const col = (f: (x: Sample) => number) => s.map(f).filter(Number.isFinite);
  const rng = (xs: number[]): [number, number] => [Math.min(...xs), Math.max(...xs)];
  const rss = col((x) => (x.rssKiB.agent + x.rssKiB.children) / 1024);
  return {
    peers, runs: s.length,
    med: {
      routesMs: median(col((x) => x.routesMs)), readyMs: median(col((x) => x.readyMs)), planMs: median(col((x) => x.log.planMs ?? NaN)),
      rssMiB: median(rss), childrenMiB: median(col((x) => x.rssKiB.children / 1024)), peakMiB: median(col((x) => x.rssKiB.agentPeak / 1024)),
      idleCpuPct: median(col((x) => x.idleCpuPct)), referenceMs: median(col((x) => x.referenceMs)),
    },
    range: { routesMs: rng(col((x) => x.routesMs)), rssMiB: rng(rss), idleCpuPct: rng(col((x) => x.idleCpuPct)) },
  };
}

function targets(sums: readonly Summary[]): { name: string; pass: boolean; detail: string }[] {
  return sums.flatMap((s) => [
    { name: `${s.peers} peers: routes <= ${TARGET.routesMs / 1000} s`, pass: s.med.routesMs <= TARGET.routesMs, detail: `${fmt(s.med.routesMs / 1000, 2)} s` },
    { name: `${s.peers} peers: idle CPU <= ${TARGET.idleCpuPct}% of a core`, pass: s.med.idleCpuPct <= TARGET.idleCpuPct, detail: `${fmt(s.med.idleCpuPct, 2)}%` },
    { name: `${s.peers} peers: RSS <= ${TARGET.rssMiB} MiB`, pass: s.med.rssMiB <= TARGET.rssMiB, detail: `${fmt(s.med.rssMiB, 0)} MiB` },
  ]);
}

function report(sums: readonly Summary[], o: Options): string {
  const rows = [['peers', 'runs', 'routes s', '(range)', 'ready s', 'plan s (log)', 'ip -batch s', 'RSS MiB', '(range)', 'of it children', 'agent peak', 'idle CPU %', '(range)']];
  for (const s of sums) {
    rows.push([String(s.peers), String(s.runs), fmt(s.med.routesMs / 1000, 2), `${fmt(s.range.routesMs[0] / 1000, 2)}-${fmt(s.range.routesMs[1] / 1000, 2)}`,
      fmt(s.med.readyMs / 1000, 2), fmt(s.med.planMs / 1000, 2), fmt(s.med.referenceMs / 1000, 2),
      fmt(s.med.rssMiB, 0), `${fmt(s.range.rssMiB[0], 0)}-${fmt(s.range.rssMiB[1], 0)}`, fmt(s.med.childrenMiB, 0), fmt(s.med.peakMiB, 0),
      fmt(s.med.idleCpuPct, 2), `${fmt(s.range.idleCpuPct[0], 2)}-${fmt(s.range.idleCpuPct[1], 2)}`]);
  }
  const tg = targets(sums).map((t) => `${t.pass ? 'PASS' : 'MISS'}  ${t.name}: ${t.detail}`);
  return [`cloud agent with N edge peers (sites of ${EDGE_SITE_NODES}, communities of ${COMMUNITY_SITES} sites, ${CLOUD_PEERS} more cloud nodes); medians of ${o.runs}; `
    + `idle over ${o.idleS} s after ${o.settleS} s; resyncPeriod ${o.resyncS} s; agent Node flags: ${process.env.ATOLL_AGENT_NODE_FLAGS ?? '--jitless'}`,
  table(rows, 1), '', ...tg].join('\n');
}

// ---------------------------------------------------------------------------------------------------------------

async function main(): Promise<number> {
  const o = parseOptions(process.argv.slice(2));
  if (process.getuid?.() !== 0) throw new Error('needs root: it builds network namespaces and runs an agent');
  for (const d of [o.cpuProf, o.agentLog]) if (d) mkdirSync(d, { recursive: true });
  if (spawnSync('ip', ['-V']).status !== 0) throw new Error('needs iproute2 (ip)');
  const started = Date.now();
  const load0 = loadavg();
  const fx = new Fixture();
  const watchdog = cleanUpOnExit(fx, o.timeoutS);
  const samples: Sample[] = [];
  try {
    for (let rep = 0; rep < o.runs; rep++) {
      const order = rep % 2 === 0 ? o.peers : [...o.peers].reverse();
      for (const n of order) {
        process.stderr.write(`bench: run ${rep + 1}/${o.runs}, ${n} peers: agent\n`);
        const s = await ours(fx, o, n, rep);
        process.stderr.write(`bench: run ${rep + 1}/${o.runs}, ${n} peers: reference ip -batch\n`);
        const referenceMs = await reference(fx, n);
        samples.push({ ...s, referenceMs });
        process.stderr.write(`bench:   routes ${fmt(s.routesMs / 1000, 2)} s (ip -batch ${fmt(referenceMs / 1000, 2)} s), ready ${fmt(s.readyMs / 1000, 2)} s, `
          + `RSS ${fmt((s.rssKiB.agent + s.rssKiB.children) / 1024, 0)} MiB, idle CPU ${fmt(s.idleCpuPct, 2)}%\n`);
      }
    }
  } finally {
    clearTimeout(watchdog);
    await fx.cleanup();
  }
  const left = leftoverNetns();
  if (left.length > 0) throw new Error(`namespaces left behind: ${left.join(', ')}`);
  const sums = o.peers.map((n) => summarize(samples, n));
  const seconds = (Date.now() - started) / 1000;
  const env = { kernel: release(), node: process.version, cpus: cpus().length, loadavgStart: load0, loadavgEnd: loadavg() };
  process.stdout.write(report(sums, o) + '\n');
  process.stdout.write(`\n${o.smoke ? 'smoke run' : 'run'} took ${seconds.toFixed(1)} s; load average ${load0.map((x) => x.toFixed(2)).join(' ')} at start, `
    + `${env.loadavgEnd.map((x) => x.toFixed(2)).join(' ')} at end; ${env.cpus} CPUs, kernel ${env.kernel}\n`);
  if (o.json) writeFileSync(o.json, JSON.stringify({ options: o, env, seconds, summary: sums, targets: targets(sums), samples }, null, 2) + '\n');
  return exitStatus(o.smoke ? 0 : targets(sums).filter((t) => !t.pass).length, o.enforce);
}

runBench(main);
