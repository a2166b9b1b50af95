/**
 * The lab's checks: the connectivity matrix (every pod to every other, ping and TCP through a probe process in each
 * pod, the route the source node's kernel takes, a verdict per cell), the same matrix between the workloads' pods
 * (`--kubernetes`), and `atoll trace` run on every judged cell against the path the matrix measured.
 */
import type { LabPlan } from './plan/plan.ts';
import { classifyRoute, expectationOf, expectedPath, type LabPath, type ObservedRoute } from './plan/paths.ts';
import { cellExpectation, judgeCell, type LabCell, type PingResult, type TcpResult } from './plan/report.ts';
import { exec } from '../adapters/exec.ts';
import { IpRoute2 } from '../adapters/kernel/iproute2.ts';
import { readAgentStatus, statusSocketOf } from '../adapters/ops/status-socket.ts';
import { type TracePath, tracePath } from '../core/ops/trace.ts';
import type { AgentStatus } from '../core/ops/agent-status.ts';
import type { PeerPath } from '../core/tunnel/status.ts';
import { KubePods, type LabWorkloads, startWorkloads } from './lab-kube-pods.ts';
import { ProbeClient } from './probe.ts';
import { pathIn, tunnelPaths } from './lab-convergence.ts';
import { type LabOptions, mapLimit, nsPath, type RunningLab } from './running-lab.ts';

const PING_ARGS = ['-n', '-q', '-c', '3', '-i', '0.2', '-W', '1', '-w', '2'];
const TCP_TIMEOUT_MS = 2000;
const CHECK_CONCURRENCY = 48;

const ip = new IpRoute2();

function parsePing(out: string, code: number): PingResult {
  const m = /(\d+) packets transmitted, (\d+) (?:packets )?received/.exec(out);
  const sent = Number(m?.[1] ?? 0);
  const received = Number(m?.[2] ?? 0);
  const rtt = /= [\d.]+\/([\d.]+)\//.exec(out);
  const ok = received > 0;
  const error = ok ? undefined : m ? `${received}/${sent} replies` : `ping failed (status ${code}): ${out.trim().split('\n').pop() ?? ''}`;
  return { ok, sent, received, ...(rtt ? { rttMs: Number(rtt[1]) } : {}), ...(error ? { error } : {}) };
}

/** Pings `target` from the pod namespace `enter` leads into. */
async function pingFrom(enter: readonly string[], target: string): Promise<PingResult> {
  const res = await exec(enter[0] as string, [...enter.slice(1), 'ping', ...PING_ARGS, target]);
  return parsePing(res.stdout + res.stderr, res.code);
}

async function observedRoute(plan: LabPlan, paths: Map<string, Map<string, PeerPath>>, node: string, target: string, targetNode: string): Promise<ObservedRoute> {
  const n = plan.nodes.find((x) => x.name === node);
  if (!n) return 'no route';
  let route: ObservedRoute;
  try {
    const [r] = await ip.json<{ dev?: string; gateway?: string; type?: string }>(['route', 'get', target], { netns: nsPath(n.netns) });
    route = classifyRoute(n, r);
  } catch {
    return 'no route';
  }
  if (route !== 'tunnel') return route;
  const path = pathIn(paths, node, targetNode);
  return path === 'direct' || path === 'udp' ? 'tunnel' : path === 'relayed' ? 'tunnel relayed' : 'tunnel down';
}

/**
 * The connectivity matrix: every pod to every other, ping and TCP (through a probe process in each pod), the route
 * the source node's kernel takes, and a verdict per cell. Prints a line per source pod as its row completes.
 */
export async function runChecks(lab: RunningLab, opts: LabOptions): Promise<LabCell[]> {
  const say = opts.say;
  const { plan, pods } = lab;
  const pairs = pods.flatMap((a) => pods.filter((b) => b !== a).map((b) => ({ a, b })));
  say(`  checks: ${pairs.length} pod pairs, ping (3 packets, at most 2 s) and TCP (connect and echo, at most ${TCP_TIMEOUT_MS / 1000} s), ${CHECK_CONCURRENCY} at a time`);
  const probes = new Map(pods.map((p) => [p.name, new ProbeClient(p.enter, p.name, lab.state.dir)]));
  try {
    await Promise.all([...probes.values()].map((p) => p.ready()));
    const routeKeys = [...new Set(pairs.map(({ a, b }) => `${a.node}>${b.ip}>${b.node}`))];
    const paths = await tunnelPaths(plan);
    const routes = new Map(await mapLimit(routeKeys, 8, async (k) => {
      const [node, target, targetNode] = k.split('>') as [string, string, string];
      return [`${node}>${target}`, await observedRoute(plan, paths, node, target, targetNode)] as const;
    }));
    const remaining = new Map(pods.map((p) => [p.name, pods.length - 1]));
    const rows = new Map<string, LabCell[]>();
    const cells = await mapLimit(pairs, CHECK_CONCURRENCY, async ({ a, b }) => {
      const path = expectedPath(plan, a.node, b.node);
      const route = routes.get(`${a.node}>${b.ip}`) ?? 'no route';
      const [ping, tcp] = await Promise.all([pingFrom(a.enter, b.ip), (probes.get(a.name) as ProbeClient).tcp(b.ip, TCP_TIMEOUT_MS)]);
      // a pair the topology forbids stays judged by the topology; one it allows may be denied by the lab's policies
      const deniedBy = expectationOf(path) === 'reachable' ? lab.policy?.denies(a.name, b.name) : undefined;
      const cell: LabCell = {
        from: a.name, to: b.name, fromNode: a.node, toNode: b.node, fromIp: a.ip, toIp: b.ip, path, expect: cellExpectation(path, deniedBy), route,
        ping, tcp: roundTcp(tcp), ...judgeCell(path, route, ping, tcp, deniedBy), ...(deniedBy ? { deniedBy } : {}),
      };
      rows.set(a.name, [...(rows.get(a.name) ?? []), cell]);
      const left = (remaining.get(a.name) ?? 1) - 1;
      remaining.set(a.name, left);
      if (left === 0) say(`    ${a.name.padEnd(14)} ${a.ip.padEnd(15)} ${rowSummary(rows.get(a.name) ?? [])}`);
      return cell;
    });
    return cells;
  } finally {
    await Promise.all([...probes.values()].map((p) => p.close()));
  }
}

/**
 * `--kubernetes`: the workloads applied through the API (src/lab/lab-kube-pods.ts startWorkloads: a Deployment with
 * a pod on every node, a StatefulSet), then the whole matrix between their pods, with the IPs the API gives, judged as
 * the lab's own pods are. Their pods then join `lab.pods` (and `lab.workloadPods`), for the faults.
 */
export async function checkWorkloads(lab: RunningLab, opts: LabOptions): Promise<{ workloads: LabWorkloads; cells: LabCell[] }> {
  // cannot happen: its only caller (src/cli/lab.ts) asks only of a lab up with --kubernetes, whose pods are KubePods
  if (!lab.kubernetes || !(lab.podRuntime instanceof KubePods)) throw new Error('the workloads need --kubernetes');
  const workloads = await startWorkloads(lab.kubernetes, { plan: lab.plan, containerds: lab.podRuntime.containerds });
  const cells = await runChecks({ ...lab, pods: [...workloads.deployment, ...workloads.statefulSet] }, opts);
  // from here on the faults' matrices, samples and Service checks take them in too
  lab.pods.push(...workloads.deployment, ...workloads.statefulSet);
  lab.workloadPods.push(...workloads.deployment.map((p) => ({ name: p.name, node: p.node, workload: 'deployment' as const })),
    ...workloads.statefulSet.map((p) => ({ name: p.name, node: p.node, workload: 'statefulset' as const })));
  return { workloads, cells };
}

function roundTcp(t: TcpResult): TcpResult {
  const r = (x: number | undefined) => (x === undefined ? undefined : Math.round(x * 1000) / 1000);
  return { ...t, connectMs: r(t.connectMs), echoMs: r(t.echoMs) };
}

function rowSummary(cells: readonly LabCell[]): string {
  const counts = new Map<string, number>();
  for (const c of cells) counts.set(c.verdict, (counts.get(c.verdict) ?? 0) + 1);
  return [...counts].map(([v, n]) => `${n} ${v}`).join(', ');
}

/** `atoll trace` of one matrix cell, next to the path the matrix measured. */
export interface LabTraceCheck {
  readonly from: string;
  readonly to: string;
  readonly measured: LabPath;
  readonly traced: TracePath;
  readonly ok: boolean;
  readonly reason?: string;
}

/**
 * Runs the trace explanation (src/core/ops/trace.ts) on every cell the matrix judged (ok or blocked as expected),
 * from the source node's agent status, and compares its path with the one the matrix measured.
 */
export async function traceCells(lab: RunningLab, cells: readonly LabCell[]): Promise<LabTraceCheck[]> {
  const statuses = new Map(await Promise.all(lab.plan.nodes.map(async (n) => [n.name, await readAgentStatus(statusSocketOf(n.socketPath), 5000)] as const)));
  return cells.filter((c) => c.verdict !== 'FAIL').map((c) => {
    const t = tracePath(statuses.get(c.fromNode) as AgentStatus, c.fromIp, c.toIp);
    return { from: c.from, to: c.to, measured: c.path, traced: t.path, ok: t.path === c.path, ...(t.reason ? { reason: t.reason } : {}) };
  });
}

