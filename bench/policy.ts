/**
 * NetworkPolicy enforcement, both of the issue's targets in one run on one machine:
 *   rebuild     a synthetic cluster, the same every run (seeded): 1,000 NetworkPolicies over 100 namespaces,
 *               10,000 remote pods and 110 pods on the node. Per repetition, in this process: compilePolicies
 *               (src/core/policy/compile.ts), the rendering (src/core/policy/nft.ts) and the real Nft adapter's
 *               apply into a fresh throwaway namespace, each timed on its own; first from empty (both tables whole),
 *               then with one more remote pod as the agent does on a change (the delta from the tables applied).
 *               Target: the change's three steps in 200 ms.
 *   throughput  iperf3, one TCP stream between two pods on one node's bridge (veths named `atl...` as the agent
 *               names them, br_netfilter on), alternating A B A B: (A) no policy tables, (B) that cluster's ruleset,
 *               where the server pod is isolated for ingress by several policies with the rule that lets the client
 *               in last in its chain, and the client is isolated for egress. Target: B / A >= 0.95 (medians), with a
 *               bootstrap interval (bench/ratio-interval.ts) saying whether the run can tell.
 *
 * Both parts read one cluster: the throughput node's two pods are two of the 110 local pods, at the addresses and on
 * the veth names the ruleset expects. Every namespace is a throwaway one with this run's prefix; the node has no link
 * out, so traffic stays between the namespaces made here. Before timing, the compiled plan is checked with `decide`
 * (the client gets in only by the last policy of the server's chain) and the kernel with a probe (the same pair on a
 * port no policy opens is refused under B, answered under A). bench/README.md explains what is measured and why.
 *
 * Usage: node bench/policy.ts [--smoke] [--only rebuild|throughput] [--reps R] [--time S] [--json FILE]
 *        [--timeout SECONDS] [--enforce]
 */
import type { ChildProcess } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { cpus, loadavg, release } from 'node:os';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { Nft } from '../src/adapters/kernel/nft.ts';
import { type Cidr, parseCidr, parseIpv4 } from '../src/core/net/ipv4.ts';
import { compilePolicies, decide, type PolicyInput, type PolicyPlan } from '../src/core/policy/compile.ts';
import { keyOf } from '../src/core/policy/model.ts';
import { buildPolicyTables, POLICY_TABLE, type PolicyTables, renderPolicyDelta, renderPolicyRuleset, renderPolicyTables } from '../src/core/policy/nft.ts';
import { renderNftRuleset } from '../src/core/overlay/nft.ts';
import { PROJECT_NODE } from '../src/lab/agent-process.ts';
import { isRoot, leftoverNetns, sh } from '../harness/netns.ts';
import { until } from '../harness/wait.ts';
import { CLIENT_ALLOW, CLIENT_NS, type Cluster, IPERF_PORT, type LocalPod, NODE_BLOCK, NODE_GATEWAY, SEED, SERVER_ALLOW, SERVER_NS, synthesize } from './policy-cluster.ts';
import { cleanUpOnExit, exitStatus, fmt, intOption, median, NetnsFixture, parseBenchArgs, runBench, type Spawned, table } from './common.ts';
import { bootstrapRatio, type RatioInterval } from './ratio-interval.ts';
import { seeded } from './seeded.ts';

const PROBE = fileURLToPath(new URL('../test/support/l4-probe.ts', import.meta.url));
const REBUILD_TARGET_MS = 200;
const THROUGHPUT_RATIO_TARGET = 0.95;
const BRIDGE = 'atb0';
/** A port on which the server listens and no policy lets the client in: refused under B, answered under A. */
const CLOSED_PORT = 5202;
const BOOTSTRAP_DRAWS = 2000;
/** nft -f of the whole ruleset, bounded; a 2-core machine under load takes seconds. */
const APPLY_TIMEOUT_MS = 60_000;

// ---------------------------------------------------------------------------------------------------------------
// Options

type Part = 'rebuild' | 'throughput';

interface Options {
  readonly smoke: boolean;
  readonly parts: readonly Part[];
  readonly reps: number;
  readonly seconds: number;
  readonly timeoutS: number;
  readonly enforce: boolean;
  readonly json: string | undefined;
}

const USAGE = `usage: node bench/policy.ts [options]   (as root)
  --smoke              short run that checks the bench works: 1 repetition, iperf3 -t 1 (the cluster keeps its size)
  --only PART          rebuild or throughput (default: both)
  --reps R             repetitions: rebuilds, and iperf3 runs per side, alternating (default 3; 1 with --smoke)
  --time S             seconds per iperf3 run (iperf3 -t; default 5; 1 with --smoke)
  --json FILE          write every sample and summary to FILE
  --timeout SECONDS    abort (and clean up) after this long (default 900; 120 with --smoke)
  --enforce            exit 1 when a target is missed (default: report only)`;

function parseOptions(argv: readonly string[]): Options {
  const values = parseBenchArgs(argv, USAGE, {
    only: { type: 'string' },
    reps: { type: 'string' },
    time: { type: 'string' },
    enforce: { type: 'boolean', default: false },
  });
  const smoke = values.smoke;
  const int = intOption(USAGE);
  if (values.only !== undefined && values.only !== 'rebuild' && values.only !== 'throughput') {
    throw new Error(`--only must be rebuild or throughput, got "${values.only}"\n${USAGE}`);
  }
  return {
    smoke,
    parts: values.only ? [values.only as Part] : ['rebuild', 'throughput'],
    reps: int('reps', values.reps, smoke ? 1 : 3, 1, 100),
    seconds: int('time', values.time, smoke ? 1 : 5, 1, 600),
    timeoutS: int('timeout', values.timeout, smoke ? 120 : 900, 1, 86_400),
    enforce: values.enforce,
    json: values.json,
  };
}

// ---------------------------------------------------------------------------------------------------------------
// Resources: every namespace and process this run creates, and their removal


async function run(fx: NetnsFixture, argv: readonly string[], timeoutMs: number): Promise<Spawned> {
  return fx.start(argv, timeoutMs).done;
}

/** Kills a process this run started (by PID) unless it has ended within `graceMs`, and waits for it. */
async function stop(p: { child: ChildProcess; done: Promise<Spawned> }, graceMs: number): Promise<void> {
  const exited = await Promise.race([p.done.then(() => true, () => true), sleep(graceMs).then(() => false)]);
  if (!exited) {
    p.child.kill('SIGKILL');
    await p.done.catch(() => undefined);
  }
}

const inNs = (ns: string, argv: readonly string[]): string[] => ['ip', 'netns', 'exec', ns, ...argv];
const nsPath = (ns: string): string => `/run/netns/${ns}`;
const log = (msg: string) => process.stderr.write(`bench: ${msg}\n`);
const now = () => performance.now();

/** Where the client's connection to the server is decided: which rule of which chain lets it through, and how late. */
interface PairPath {
  readonly serverPolicies: number;
  readonly serverRules: number;
  /** 1-based position of the compiled rule that lets the client in, among the server's ingress rules. */
  readonly serverAllowAt: number;
  readonly clientRules: number;
  readonly clientAllowAt: number;
}

/**
 * Checks the plan holds what the throughput part needs: the client gets to the server on the iperf3 port only by the
 * two zz-policies, the last in each chain, and not on CLOSED_PORT.
 * @throws Error naming what does not hold (a change to the generator or the compiler).
 */
function checkPair(plan: PolicyPlan, c: Cluster): PairPath {
  const ip = (p: LocalPod) => parseIpv4(p.pod.ip) as number;
  const srv = plan.pods.find((p) => p.ip === ip(c.server));
  const cli = plan.pods.find((p) => p.ip === ip(c.client));
  if (!srv?.ingress || !cli?.egress) throw new Error(`the plan does not isolate the server for ingress (${Boolean(srv?.ingress)}) and the client for egress (${Boolean(cli?.egress)})`);
  const d = decide(plan, { src: ip(c.client), dst: ip(c.server), protocol: 'tcp', port: IPERF_PORT });
  const want = { ingress: `${SERVER_NS}/${SERVER_ALLOW.name}`, egress: `${CLIENT_NS}/${CLIENT_ALLOW.name}` };
  if (!d.allowed || d.ingressBy?.policy !== want.ingress || d.egressBy?.policy !== want.egress) {
    throw new Error(`the client should reach the server on tcp/${IPERF_PORT} by ${want.egress} and ${want.ingress} only; decide says ${JSON.stringify(d)}`);
  }
  const closed = decide(plan, { src: ip(c.client), dst: ip(c.server), protocol: 'tcp', port: CLOSED_PORT });
  if (closed.allowed) throw new Error(`the plan lets the client reach the server on tcp/${CLOSED_PORT}: ${JSON.stringify(closed)}`);
  const at = (rules: readonly { policy: string; rule: number }[], by: { policy: string; rule: number }) => rules.findIndex((r) => r.policy === by.policy && r.rule === by.rule) + 1;
  return {
    serverPolicies: srv.policies.length,
    serverRules: srv.ingress.length,
    serverAllowAt: at(srv.ingress, d.ingressBy),
    clientRules: cli.egress.length,
    clientAllowAt: at(cli.egress, d.egressBy),
  };
}

// ---------------------------------------------------------------------------------------------------------------
// What a ruleset holds

interface RulesetSize {
  readonly policies: number;
  readonly namespaces: number;
  readonly pods: number;
  readonly localPods: number;
  readonly isolatedIngress: number;
  readonly isolatedEgress: number;
  readonly compiledRules: number;
  /** nft rules in the per-pod chains (allowing rules and the final drops). */
  readonly nftRules: number;
  readonly sets: number;
  readonly setElements: number;
  readonly bytes: number;
  readonly problems: number;
}

function sizeOf(input: PolicyInput, plan: PolicyPlan, text: string): RulesetSize {
  const setLines = text.split('\n').filter((l) => /^ {2}set (peers|pods)_[0-9a-f]+ /.test(l));
  return {
    policies: input.policies.length,
    namespaces: input.namespaces.length,
    pods: input.pods.length,
    localPods: input.local.size,
    isolatedIngress: plan.pods.filter((p) => p.ingress).length,
    isolatedEgress: plan.pods.filter((p) => p.egress).length,
    compiledRules: plan.pods.reduce((s, p) => s + (p.ingress?.length ?? 0) + (p.egress?.length ?? 0), 0),
    nftRules: text.split('\n').filter((l) => /^ {4}.*\b(accept|return|drop) comment "/.test(l)).length,
    sets: setLines.length,
    setElements: setLines.reduce((s, l) => s + (/elements = \{ (.*) \};/.exec(l)?.[1]?.split(', ').length ?? 0), 0),
    bytes: Buffer.byteLength(text),
    problems: plan.problems.length,
  };
}

/** The tables of ours a namespace holds now, e.g. `['inet', 'bridge']`. */
function ourTables(ns: string): string[] {
  return sh('ip', ['netns', 'exec', ns, 'nft', 'list', 'tables']).split('\n').map((l) => l.trim().split(' ')).filter((w) => w[0] === 'table' && w[2] === POLICY_TABLE).map((w) => w[1] as string);
}

/** Checks the kernel holds the plan's chains (forward plus one per isolated direction of a pod); ours is the namespace's only inet table. */
function checkChains(ns: string, plan: PolicyPlan, what: string): void {
  const chains = sh('ip', ['netns', 'exec', ns, 'nft', 'list', 'chains', 'inet']).split('\n').filter((l) => /^\s*chain /.test(l)).length;
  const want = 1 + plan.pods.reduce((s, p) => s + (p.ingress ? 1 : 0) + (p.egress ? 1 : 0), 0);
  if (chains !== want) throw new Error(`${what}: ${ns} holds ${chains} chains in inet ${POLICY_TABLE}, expected ${want}`);
}

// ---------------------------------------------------------------------------------------------------------------
// Part 1: rebuild

interface Steps {
  readonly compileMs: number;
  readonly renderMs: number;
  readonly applyMs: number;
  readonly totalMs: number;
}

interface RebuildSample {
  readonly rep: number;
  /** Compiled, rendered and applied into the fresh namespace from empty. */
  readonly first: Steps;
  /** Again with one more pod, replacing the tables the first apply made. */
  readonly change: Steps;
  readonly load: number;
}

interface RebuildResults {
  readonly size: RulesetSize;
  readonly changedBytes: number;
  readonly samples: RebuildSample[];
}

/** Apply with a bound: a hung nft fails the run instead of the watchdog. */
async function applyBounded(nft: Nft, text: string, ns: string): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  const limit = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`nft -f in ${ns} took more than ${APPLY_TIMEOUT_MS} ms`)), APPLY_TIMEOUT_MS)));
  try {
    await Promise.race([nft.apply(text, { netns: nsPath(ns) }), limit]);
  } finally {
    clearTimeout(timer);
  }
}

/** Compiles, renders (both tables whole, or with `before` the delta from it, as the agent does) and applies, timed. */
async function timedBuild(nft: Nft, input: PolicyInput, node: Cluster['node'], ns: string, before?: PolicyTables): Promise<{ steps: Steps; plan: PolicyPlan; tables: PolicyTables; text: string }> {
  const t0 = now();
  const plan = compilePolicies(input);
  const t1 = now();
  const tables = buildPolicyTables(plan, node);
  const text = before ? renderPolicyDelta(before, tables) : renderPolicyTables(tables);
  const t2 = now();
  await applyBounded(nft, text, ns);
  const t3 = now();
  return { steps: { compileMs: t1 - t0, renderMs: t2 - t1, applyMs: t3 - t2, totalMs: t3 - t0 }, plan, tables, text };
}

async function rebuild(fx: NetnsFixture, opts: Options, cluster: Cluster): Promise<RebuildResults> {
  const nft = new Nft();
  const samples: RebuildSample[] = [];
  let size: RulesetSize | undefined;
  let changedBytes = 0;
  for (let r = 0; r < opts.reps; r++) {
    log(`rebuild: repetition ${r + 1}/${opts.reps}: ${cluster.input.policies.length} policies, ${cluster.input.pods.length} pods, into a fresh namespace`);
    const ns = fx.addNetns(`pol-rebuild${r}`);
    try {
      const first = await timedBuild(nft, cluster.input, cluster.node, ns);
      checkChains(ns, first.plan, 'after the first apply');
      const change = await timedBuild(nft, cluster.changed, cluster.node, ns, first.tables);
      checkChains(ns, change.plan, 'after the change');
      if (change.text === '') throw new Error(`one more pod (${keyOf(cluster.extra)}, ${cluster.extra.ip}) left the ruleset as it was: no change to measure`);
      // the new pod's address reached the kernel: a set of the changed ruleset holds it alone
      const set = [...change.tables.sets].find(([, s]) => s.items.includes(cluster.extra.ip))?.[0];
      if (!set) throw new Error(`no set of the changed ruleset holds ${cluster.extra.ip} as an element`);
      sh('ip', ['netns', 'exec', ns, 'nft', 'get', 'element', 'inet', POLICY_TABLE, set, `{ ${cluster.extra.ip} }`]);
      size ??= sizeOf(cluster.input, first.plan, first.text);
      changedBytes = Buffer.byteLength(change.text);
      samples.push({ rep: r, first: first.steps, change: change.steps, load: loadavg()[0] as number });
    } finally {
      fx.delNetns(ns);
    }
  }
  return { size: size as RulesetSize, changedBytes, samples };
}

// ---------------------------------------------------------------------------------------------------------------
// Part 2: throughput

type Side = 'no-policy' | 'policy';
const SIDES: readonly Side[] = ['no-policy', 'policy'];

interface Pod {
  /** Full namespace name. */
  readonly ns: string;
  readonly ip: string;
}

interface IperfSample {
  readonly side: Side;
  readonly run: number;
  readonly gbps: number;
  readonly retransmits: number;
  readonly senderCpu: number;
  readonly receiverCpu: number;
  /** The machine's 1-minute load average at the end of the run (other work competing for the CPUs). */
  readonly load: number;
}

/** The kernel's answer to the client on the iperf3 port and on CLOSED_PORT, on each side. */
interface ProbeCheck {
  readonly noPolicy: readonly boolean[];
  readonly policy: readonly boolean[];
}

interface ThroughputResults {
  readonly path: PairPath;
  readonly probe: ProbeCheck;
  readonly samples: IperfSample[];
}

/**
 * The node as the agent leaves it with networkPolicy on (test/kernel/policy.test.ts builds the same): forwarding and
 * br_netfilter's bridge-nf-call-iptables on, Atoll's own `ip atoll` table (its pod masquerade, so conntrack is on in
 * both sides, as on every Atoll node), a bridge holding the node's gateway, and the client and server pods on veths
 * named by {@link hostVethName}, at the addresses the ruleset knows them by. No link leads out.
 */
function buildNode(fx: NetnsFixture, c: Cluster): { node: string; client: Pod; server: Pod } {
  const node = fx.addNetns('pol-node');
  sh('ip', ['netns', 'exec', node, 'sysctl', '-qw', 'net.ipv4.ip_forward=1', 'net.bridge.bridge-nf-call-iptables=1']);
  sh('ip', ['netns', 'exec', node, 'nft', '-f', '-'], renderNftRuleset({ localBlocks: [parseCidr(NODE_BLOCK) as Cidr], clusterCidrs: [parseCidr('10.200.0.0/16') as Cidr] }));
  const bits = (parseCidr(NODE_BLOCK) as Cidr).bits;
  sh('ip', ['-n', node, 'link', 'add', BRIDGE, 'type', 'bridge']);
  sh('ip', ['-n', node, 'addr', 'add', `${NODE_GATEWAY}/${bits}`, 'dev', BRIDGE]);
  sh('ip', ['-n', node, 'link', 'set', BRIDGE, 'up']);
  const pod = (l: LocalPod, short: string): Pod => {
    const ns = fx.addNetns(`pol-${short}`);
    sh('ip', ['-n', node, 'link', 'add', l.veth, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns]);
    sh('ip', ['-n', node, 'link', 'set', l.veth, 'master', BRIDGE, 'up']);
    sh('ip', ['-n', ns, 'addr', 'add', `${l.pod.ip}/${bits}`, 'dev', 'eth0']);
    sh('ip', ['-n', ns, 'link', 'set', 'eth0', 'up']);
    sh('ip', ['-n', ns, 'route', 'add', 'default', 'via', NODE_GATEWAY]);
    return { ns, ip: l.pod.ip };
  };
  return { node, client: pod(c.client, 'client'), server: pod(c.server, 'server') };
}

/** Both tables of ours declared and deleted in one transaction: gone whether they were there or not. */
const REMOVE_TABLES = [`table inet ${POLICY_TABLE}`, `delete table inet ${POLICY_TABLE}`, `table bridge ${POLICY_TABLE}`, `delete table bridge ${POLICY_TABLE}`, ''].join('\n');

/** Puts the node in side `side`'s state and checks the kernel holds it. */
async function setSide(nft: Nft, node: string, side: Side, ruleset: string): Promise<void> {
  await applyBounded(nft, side === 'policy' ? ruleset : REMOVE_TABLES, node);
  const tables = ourTables(node).sort().join(',');
  const want = side === 'policy' ? 'bridge,inet' : '';
  if (tables !== want) throw new Error(`${node} holds tables of ours [${tables}] for side ${side}, expected [${want}]`);
}

/** The client tries the server's iperf3 port and CLOSED_PORT (test/support/l4-probe.ts; answered within 800 ms). */
async function probePorts(fx: NetnsFixture, client: Pod, server: Pod): Promise<boolean[]> {
  const list = [IPERF_PORT, CLOSED_PORT].map((port) => ({ ip: server.ip, proto: 'tcp', port }));
  const res = await run(fx, inNs(client.ns, [PROJECT_NODE, PROBE, 'try', JSON.stringify(list)]), 30_000);
  if (res.code !== 0) throw new Error(`the prober in ${client.ns} failed (exit ${res.code}): ${res.stderr}`);
  return JSON.parse(res.stdout) as boolean[];
}

/**
 * The bed works and the ruleset bites: with a prober serving both ports in the server, the client reaches both with
 * no tables, and only the iperf3 port with the ruleset.
 */
async function checkEnforced(fx: NetnsFixture, nft: Nft, node: string, client: Pod, server: Pod, ruleset: string): Promise<ProbeCheck> {
  const srv = fx.start(inNs(server.ns, [PROJECT_NODE, PROBE, 'serve', String(IPERF_PORT), String(CLOSED_PORT)]), 120_000);
  srv.done.catch(() => undefined);
  try {
    await until('the prober serving in the server pod', () => sh('ss', ['-N', server.ns, '-Hltn', 'sport', '=', `:${CLOSED_PORT}`]).trim() !== '', 20_000, 50);
    await setSide(nft, node, 'no-policy', ruleset);
    const noPolicy = await probePorts(fx, client, server);
    await setSide(nft, node, 'policy', ruleset);
    const policy = await probePorts(fx, client, server);
    if (noPolicy.join() !== 'true,true' || policy.join() !== 'true,false') {
      throw new Error(`the client to the server on tcp/${IPERF_PORT} and tcp/${CLOSED_PORT}: without tables ${noPolicy.join(', ')} (expected true, true), `
        + `with the ruleset ${policy.join(', ')} (expected true, false)\n${sh('ip', ['netns', 'exec', node, 'nft', 'list', 'chains'])}`);
    }
    return { noPolicy, policy };
  } finally {
    await stop(srv, 0);
  }
}

/** One iperf3 run: a one-off server in `server`, a client in `client`; both bounded in time and killed by PID. */
async function iperf(fx: NetnsFixture, client: Pod, server: Pod, seconds: number): Promise<Omit<IperfSample, 'side' | 'run' | 'load'>> {
  const srv = fx.start(inNs(server.ns, ['iperf3', '-s', '-1', '-p', String(IPERF_PORT)]), (seconds + 40) * 1000);
  srv.done.catch(() => undefined); // a failure to start shows as the client's failure; never an unhandled rejection
  try {
    await until('the iperf3 server to listen', () => sh('ss', ['-N', server.ns, '-Hltn', 'sport', '=', `:${IPERF_PORT}`]).trim() !== '', 10_000, 50);
    const res = await run(fx, inNs(client.ns, ['iperf3', '-c', server.ip, '-p', String(IPERF_PORT), '-t', String(seconds), '-J', '--connect-timeout', '3000']), (seconds + 30) * 1000);
    let report: { end?: { sum_received?: { bits_per_second?: number }; sum_sent?: { retransmits?: number }; cpu_utilization_percent?: { host_total?: number; remote_total?: number } }; error?: string };
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
    };
  } finally {
    // the server exits after its one test (-1); if the client failed it would wait for another: kill it by PID
    await stop(srv, 3000);
  }
}

async function throughput(fx: NetnsFixture, opts: Options, cluster: Cluster): Promise<ThroughputResults> {
  const plan = compilePolicies(cluster.input);
  const path = checkPair(plan, cluster);
  const ruleset = renderPolicyRuleset(plan, cluster.node);
  log('throughput: building the node, its bridge and the two pods');
  const { node, client, server } = buildNode(fx, cluster);
  const nft = new Nft();
  await until(`${client.ip} to reach ${server.ip}`, async () => (await run(fx, inNs(client.ns, ['ping', '-c1', '-W1', server.ip]), 5000)).code === 0, 10_000);
  log('throughput: checking the ruleset refuses what it should and lets iperf3 through');
  const probe = await checkEnforced(fx, nft, node, client, server, ruleset);
  const samples: IperfSample[] = [];
  for (let r = 0; r < opts.reps; r++) {
    for (const side of SIDES) {
      log(`throughput: ${side}, run ${r + 1}/${opts.reps}, ${opts.seconds} s`);
      await setSide(nft, node, side, ruleset);
      samples.push({ side, run: r, ...(await iperf(fx, client, server, opts.seconds)), load: loadavg()[0] as number });
    }
  }
  return { path, probe, samples };
}

// ---------------------------------------------------------------------------------------------------------------
// Statistics and the report

interface Target {
  readonly what: string;
  readonly value: string;
  readonly pass: boolean;
}

interface Results {
  rebuild?: RebuildResults;
  throughput?: ThroughputResults;
}

/** Where a ratio's interval lies against the target: above, below, or across it (the run cannot tell). */
function intervalVerdict(iv: RatioInterval, target: number, n: number): string {
  if (n < 2) return 'one run per side: no interval';
  if (iv.low >= target) return `above ${target}`;
  if (iv.high < target) return `below ${target}`;
  return `straddles ${target}: this run cannot tell (rerunning until it passes would not make it tell)`;
}

function report(r: Results, opts: Options): { text: string; targets: Target[]; interval?: RatioInterval } {
  const lines: string[] = [];
  const targets: Target[] = [];
  let interval: RatioInterval | undefined;
  if (r.rebuild) {
    const { size: s, samples } = r.rebuild;
    lines.push(`Rebuild: ${s.policies} policies over ${s.namespaces} namespaces, ${s.pods - s.localPods} remote pods, ${s.localPods} on the node (seed ${SEED})`,
      `  the ruleset: ${s.isolatedIngress} pods isolated for ingress, ${s.isolatedEgress} for egress; ${s.compiledRules} compiled rules, ${s.nftRules} nft rules in their chains; `
      + `${s.sets} peer sets holding ${s.setElements} elements; ${fmt(s.bytes / 1024)} KiB of nft text whole (the change's delta: ${fmt(r.rebuild.changedBytes / 1024, 2)} KiB); ${s.problems} problems`, '');
    const stat = (xs: number[]) => [String(xs.length), fmt(median(xs)), fmt(Math.min(...xs)), fmt(Math.max(...xs))];
    const rows: string[][] = [['when', 'step', 'n', 'median ms', 'min', 'max']];
    for (const [when, stepsOf] of [['from empty', (x: RebuildSample) => x.first], ['one more pod', (x: RebuildSample) => x.change]] as const) {
      rows.push([when, 'compilePolicies', ...stat(samples.map((x) => stepsOf(x).compileMs))]);
      rows.push(['', when === 'from empty' ? 'render both tables whole' : 'render the delta (what the agent applies)', ...stat(samples.map((x) => stepsOf(x).renderMs))]);
      rows.push(['', 'Nft.apply (nft -f, one transaction)', ...stat(samples.map((x) => stepsOf(x).applyMs))]);
      rows.push(['', when === 'from empty' ? 'total (no target)' : `total (target ${REBUILD_TARGET_MS} ms)`, ...stat(samples.map((x) => stepsOf(x).totalMs))]);
    }
    lines.push('Wall time per step, ms (repetition 1 runs the compiler cold: no JIT yet)', table(rows), '');
    const change = samples.map((x) => x.change.totalMs);
    targets.push({
      what: `one more pod: compiled, rendered and applied in <= ${REBUILD_TARGET_MS} ms (median)`,
      value: `${fmt(median(change))} ms (max ${fmt(Math.max(...change))}; from empty ${fmt(median(samples.map((x) => x.first.totalMs)))})`,
      pass: median(change) <= REBUILD_TARGET_MS,
    });
  }
  if (r.throughput) {
    const t = r.throughput;
    const p = t.path;
    lines.push(`Throughput: iperf3, 1 TCP stream client -> server across the node's bridge, ${opts.seconds} s per run, receiver bits/s, runs alternating`,
      `  under the ruleset the server's ingress chain holds ${p.serverRules} rules from ${p.serverPolicies} policies and lets the client in by rule ${p.serverAllowAt}; `
      + `the client's egress chain lets it out by rule ${p.clientAllowAt} of ${p.clientRules}`,
      `  probe (tcp/${IPERF_PORT}, tcp/${CLOSED_PORT}): no tables ${t.probe.noPolicy.join(', ')}; ruleset ${t.probe.policy.join(', ')}`, '');
    const runs: string[][] = [['run', 'side', 'Gbit/s', 'retransmits', 'sender CPU %', 'receiver CPU %', 'load 1 min']];
    for (const s of t.samples) runs.push([String(s.run + 1), s.side, fmt(s.gbps, 2), String(s.retransmits), fmt(s.senderCpu), fmt(s.receiverCpu), fmt(s.load, 2)]);
    lines.push(table(runs), '');
    const g = (side: Side) => t.samples.filter((s) => s.side === side).map((s) => s.gbps);
    const pol = g('policy');
    const none = g('no-policy');
    interval = bootstrapRatio(pol, none, median, BOOTSTRAP_DRAWS, seeded(SEED));
    const n = Math.min(pol.length, none.length);
    const sum: string[][] = [['side', 'tables', 'n', 'median Gbit/s', 'min', 'max', 'policy/none']];
    sum.push(['policy', `inet and bridge ${POLICY_TABLE}, the whole ruleset`, String(pol.length), fmt(median(pol), 2), fmt(Math.min(...pol), 2), fmt(Math.max(...pol), 2), fmt(interval.ratio, 3)]);
    sum.push(['no-policy', 'none (br_netfilter still on)', String(none.length), fmt(median(none), 2), fmt(Math.min(...none), 2), fmt(Math.max(...none), 2), '']);
    const verdict = intervalVerdict(interval, THROUGHPUT_RATIO_TARGET, n);
    lines.push(table(sum), n < 2 ? '  no interval: one run per side' : `  95 % bootstrap interval of the ratio of medians: ${fmt(interval.low, 3)} - ${fmt(interval.high, 3)}, ${verdict}`, '');
    targets.push({
      what: `throughput policy / no policy >= ${THROUGHPUT_RATIO_TARGET} (medians)`,
      value: `${fmt(median(pol), 2)} / ${fmt(median(none), 2)} Gbit/s = ${fmt(interval.ratio, 3)}; interval ${n < 2 ? 'none (1 run per side)' : `${fmt(interval.low, 3)} - ${fmt(interval.high, 3)}, ${verdict.split(':')[0]}`}`,
      pass: interval.ratio >= THROUGHPUT_RATIO_TARGET,
    });
  }
  const tt: string[][] = [['target', 'result', 'value']];
  for (const t of targets) tt.push([t.what, t.pass ? 'PASS' : 'MISS', t.value]);
  lines.push('Targets', table(tt, 3));
  return { text: lines.join('\n'), targets, ...(interval ? { interval } : {}) };
}

// ---------------------------------------------------------------------------------------------------------------
// Main

/** Why this machine cannot run the bench, or undefined; tools missing are an error, not a skip. */
function preflight(opts: Options): string | undefined {
  if (!isRoot()) return 'needs root: it builds network namespaces, a bridge, veths and nftables tables in them';
  const problems: string[] = [];
  const has = (cmd: string) => sh('sh', ['-c', `command -v ${cmd} || true`]).trim() !== '';
  const tools = opts.parts.includes('throughput') ? ['ip', 'nft', 'iperf3', 'ping', 'ss', 'sysctl'] : ['ip', 'nft'];
  for (const t of tools) if (!has(t)) problems.push(`${t} is missing (apt-get install iproute2 nftables iperf3 iputils-ping procps)`);
  if (opts.parts.includes('throughput') && sh('sh', ['-c', 'test -e /proc/sys/net/bridge/bridge-nf-call-iptables && echo yes || true']).trim() !== 'yes') {
    problems.push('br_netfilter is not loaded (/proc/sys/net/bridge/bridge-nf-call-iptables is missing): modprobe br_netfilter');
  }
  if (problems.length > 0) throw new Error(problems.join('\n'));
  return undefined;
}

async function main(): Promise<number> {
  const opts = parseOptions(process.argv.slice(2));
  const skip = preflight(opts);
  if (skip) {
    process.stdout.write(`bench/policy.ts skipped: ${skip}\n`);
    return 0;
  }
  const started = Date.now();
  const load0 = loadavg();
  const t0 = now();
  const cluster = synthesize(SEED);
  const synthMs = now() - t0;
  const fx = new NetnsFixture();
  const watchdog = cleanUpOnExit(fx, opts.timeoutS);
  const results: Results = {};
  const seconds: Record<string, number> = {};
  try {
    for (const part of opts.parts) {
      const p0 = Date.now();
      if (part === 'rebuild') results.rebuild = await rebuild(fx, opts, cluster);
      else results.throughput = await throughput(fx, opts, cluster);
      seconds[part] = (Date.now() - p0) / 1000;
    }
  } finally {
    clearTimeout(watchdog);
    await fx.cleanup();
  }
  const left = leftoverNetns();
  if (left.length > 0) throw new Error(`namespaces left behind: ${left.join(', ')}`);

  const { text, targets, interval } = report(results, opts);
  const total = (Date.now() - started) / 1000;
  const env = { kernel: release(), node: process.version, cpus: cpus().length, loadavgStart: load0, loadavgEnd: loadavg() };
  process.stdout.write(text + '\n');
  process.stdout.write(`\n${opts.smoke ? 'smoke run' : 'run'} took ${total.toFixed(1)} s (cluster synthesized in ${fmt(synthMs)} ms; ${Object.entries(seconds).map(([k, v]) => `${k} ${v.toFixed(1)} s`).join(', ')}); `
    + `load average ${load0.map((x) => x.toFixed(2)).join(' ')} at start, ${env.loadavgEnd.map((x) => x.toFixed(2)).join(' ')} at end; `
    + `${env.cpus} CPUs, kernel ${env.kernel}\n`);
  if (opts.json) {
    writeFileSync(opts.json, JSON.stringify({ options: opts, seed: SEED, env, seconds: { total, ...seconds }, targets, ...(interval ? { throughputInterval: interval } : {}), results }, null, 2) + '\n');
  }
  return exitStatus(targets.filter((t) => !t.pass).length, opts.enforce);
}

runBench(main);
