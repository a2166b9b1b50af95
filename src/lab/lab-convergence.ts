/**
 * Waiting for the lab's agents to converge, and reading what they use: every agent holds a block and knows every
 * node of its view (their state files), every node routes its site's and its tunnel peers' blocks (protocol 44 routes in its
 * namespace), every tunnel pair runs over its expected path (`atoll peers`, through the agents' status sockets).
 * Every wait is bounded and fails with LAB_STEP_FAILED naming what is missing.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { atollError } from '../core/errors.ts';
import { type LabNode, type LabPlan, udpBlockedAt } from './plan/plan.ts';
import { expectationOf, expectedPath, type LabPath } from './plan/paths.ts';
import { labUsesUdp } from './plan/spec.ts';
import { IpRoute2 } from '../adapters/kernel/iproute2.ts';
import { readTunnelStatus, statusSocketOf } from '../adapters/ops/status-socket.ts';
import type { PeerPath } from '../core/tunnel/status.ts';
import { inView, type ViewPlace, viewScope } from '../core/cluster/view.ts';
import { ROLE_ANNOTATION } from '../core/tunnel/plan.ts';
import { mapLimit, nsPath } from './running-lab.ts';

const BLOCKS_TIMEOUT_MS = 60_000;
const ROUTES_TIMEOUT_MS = 30_000;
const TUNNEL_PATHS_TIMEOUT_MS = 40_000;

const ip = new IpRoute2();

interface NodeState {
  readonly blocks: readonly string[];
  readonly peers: readonly { name: string; blocks: readonly string[]; vtepMac: string }[];
}

function nodeState(dataDir: string): NodeState {
  try {
    return JSON.parse(readFileSync(join(dataDir, 'cluster-state.json'), 'utf8')) as NodeState;
  } catch {
    return { blocks: [], peers: [] };
  }
}

/** Where node `n` stands in the controller's views (src/core/cluster/view.ts): its site, community and tunnel role. */
function placeOf(n: LabNode): ViewPlace {
  const role = (n.agentConfig.tunnel as { role?: string } | undefined)?.role;
  return { name: n.name, site: n.site, community: n.community, annotations: role ? { [ROLE_ANNOTATION]: role } : {} };
}

/** Waits until every agent holds a block and knows every node of its view with its blocks and VTEP MAC. */
export async function waitForBlocksAndPeers(plan: LabPlan, agentLog: (node: string) => Promise<string>): Promise<void> {
  const deadline = Date.now() + BLOCKS_TIMEOUT_MS;
  const missing = () => plan.nodes.flatMap((n) => {
    const s = nodeState(n.dataDir);
    const known = new Set(s.peers.filter((p) => p.blocks.length > 0 && p.vtepMac).map((p) => p.name));
    const scope = viewScope(placeOf(n));
    const lacks = plan.nodes.filter((m) => inView(scope, placeOf(m)) && !known.has(m.name)).map((m) => m.name);
    if (s.blocks.length === 0) return [`${n.name} has no block`];
    return lacks.length > 0 ? [`${n.name} does not know ${lacks.join(', ')}`] : [];
  });
  for (;;) {
    const m = missing();
    if (m.length === 0) return;
    if (Date.now() > deadline) {
      const tails = await Promise.all(plan.nodes.filter((n) => m.some((x) => x.startsWith(`${n.name} `))).slice(0, 3).map(async (n) => `--- agent ${n.name} (log tail)\n${await agentLog(n.name)}`));
      throw atollError('LAB_STEP_FAILED', `agents did not get blocks and peers within ${BLOCKS_TIMEOUT_MS / 1000} s: ${m.join('; ')}\n${tails.join('\n')}`,
        'read the agents\' logs above; is the controller reachable from the edge sites through their NAT?');
    }
    await sleep(200);
  }
}

/** Waits until every node routes (protocol 44) every block of the peers in its site and of its tunnel peers. */
export async function waitForSiteRoutes(plan: LabPlan): Promise<void> {
  const deadline = Date.now() + ROUTES_TIMEOUT_MS;
  for (;;) {
    const lacking: string[] = [];
    for (const n of plan.nodes) {
      const sitePeers = new Set(plan.nodes.filter((p) => p.name !== n.name && expectationOf(expectedPath(plan, n.name, p.name)) === 'reachable').map((p) => p.name));
      const want = nodeState(n.dataDir).peers.filter((p) => sitePeers.has(p.name)).flatMap((p) => p.blocks);
      const have = new Set((await ip.json<{ dst: string }>(['route', 'show', 'proto', '44'], { netns: nsPath(n.netns) })).map((r) => r.dst));
      const absent = want.filter((b) => !have.has(b));
      if (absent.length > 0) lacking.push(`${n.name} lacks ${absent.join(', ')}`);
    }
    if (lacking.length === 0) return;
    if (Date.now() > deadline) throw atollError('LAB_STEP_FAILED', `same-site or tunnel routes missing after ${ROUTES_TIMEOUT_MS / 1000} s: ${lacking.join('; ')}`, 'read the agents\' logs (overlay updated / tunnel routes updated / ... sync failed)');
    await sleep(200);
  }
}

/**
 * The tunnel path every agent uses to each of its peers now (`atoll peers`), by node then peer: one status read per
 * node. A node whose agent does not answer has no entry (its peers count as 'down').
 */
export async function tunnelPaths(plan: LabPlan): Promise<Map<string, Map<string, PeerPath>>> {
  const read = await mapLimit(plan.nodes, 8, async (n) => {
    try {
      const st = await readTunnelStatus(statusSocketOf(n.socketPath), 2000);
      return [n.name, new Map((st?.peers ?? []).map((p) => [p.name, p.path]))] as const;
    } catch {
      return [n.name, new Map<string, PeerPath>()] as const;
    }
  });
  return new Map(read);
}

export const pathIn = (paths: Map<string, Map<string, PeerPath>>, from: string, to: string): PeerPath => paths.get(from)?.get(to) ?? 'down';

/**
 * The agent path a tunnel pair should have: hole-punched and cloud pairs a direct stream, the rest the relay; with
 * the datagram path on, UDP datagrams for those direct pairs unless a site on the way blocks UDP.
 */
function wantedTunnelPath(plan: LabPlan, a: string, b: string, path: LabPath): PeerPath | undefined {
  const direct = path === 'tunnel direct' || path === 'tunnel hole-punched';
  if (direct && labUsesUdp(plan.spec)) {
    return udpBlockedAt(plan, a) || udpBlockedAt(plan, b) ? 'direct' : 'udp';
  }
  return direct ? 'direct' : path === 'tunnel relayed' ? 'relayed' : undefined;
}

/**
 * Waits until every tunnel pair runs over its expected path: a direct stream (cloud <-> edge, and edge pairs that
 * hole-punched through endpoint-independent NATs) or the relay (a symmetric NAT on the way).
 * @returns how many node pairs of each path came up.
 */
export async function waitForTunnelPaths(plan: LabPlan, timeoutMs = TUNNEL_PATHS_TIMEOUT_MS): Promise<Record<string, number>> {
  const pairs = plan.nodes.flatMap((a) => plan.nodes.filter((b) => b !== a).map((b) => ({ a: a.name, b: b.name, path: expectedPath(plan, a.name, b.name) })))
    .filter((p) => wantedTunnelPath(plan, p.a, p.b, p.path) !== undefined);
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const paths = await tunnelPaths(plan);
    const seen = pairs.map((p) => ({ ...p, now: pathIn(paths, p.a, p.b) }));
    const wrong = seen.filter((p) => p.now !== wantedTunnelPath(plan, p.a, p.b, p.path));
    if (wrong.length === 0) {
      const counts: Record<string, number> = {};
      for (const p of seen) counts[p.path] = (counts[p.path] ?? 0) + 1;
      return counts;
    }
    if (Date.now() > deadline) {
      throw atollError('LAB_STEP_FAILED', `tunnel paths not as expected after ${timeoutMs / 1000} s: ${wrong.slice(0, 6).map((p) => `${p.a} -> ${p.b} is ${p.now}, expected ${wantedTunnelPath(plan, p.a, p.b, p.path)} (${p.path})`).join('; ')}`,
        'read the agents\' logs (hole punching failed / relay stream / tunnel stream) and `atoll peers` on those nodes');
    }
    await sleep(250);
  }
}
