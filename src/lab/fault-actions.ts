/**
 * What the faults do to the live lab (src/lab/faults.ts runs and judges them, src/lab/plan/faults.ts plans what hits
 * whom), and how long each is held: kills and restarts the controller, the relay and agents by PID, cuts an edge
 * router's uplink (or its path to the cloud) with an nftables table of its own, flushes a router's connection
 * tracking (a NAT reboot) or gives it another public address, wipes what a reboot takes from a node, and re-creates
 * pods (through containerd's CRI, StopPodSandbox, RemovePodSandbox and RunPodSandbox under the same name, or by CNI DEL
 * and ADD), the sample pings from a re-created pod following it.
 *
 * Safety: everything happens inside the run's namespaces; processes are stopped by PID (the ones the lab started).
 */
import { keeperSocketOf, stopKeeper } from '../adapters/tunnel/keeper.ts';
import { setTimeout as sleep } from 'node:timers/promises';
import { atollError } from '../core/errors.ts';
import { type LabFaultKind, peerCutRuleset, uplinkCutRuleset, uplinkRestoreRuleset } from './plan/faults.ts';
import { NODE_DEVICES } from './plan/plan.ts';
import { NFT_TABLE } from '../core/overlay/nft.ts';
import { IpRoute2 } from '../adapters/kernel/iproute2.ts';
import { readTunnelStatus, statusSocketOf } from '../adapters/ops/status-socket.ts';
import { renderPeers } from '../core/tunnel/status.ts';
import { Nft } from '../adapters/kernel/nft.ts';
import { Child } from './io/child-process.ts';
import type { Pinger } from './samplers.ts';
import { ServiceProcess } from './service-process.ts';
import { agentLauncher, type LabPodInfo, nsPath, recordProcess, type RunningLab } from './running-lab.ts';

const ip = new IpRoute2();
const nft = new Nft();

/** How long a fault is held before it is healed. */
export const HOLD_MS: Record<LabFaultKind, number> = {
  'controller-kill': 2000, 'relay-kill': 2000, 'direct-path-cut': 8000, 'agent-restart': 500, 'offline-restart': 500, 'pod-recreate': 0, 'uplink-cut': 3000, 'uplink-flap': 0, 'node-reboot': 2000,
  'statefulset-recreate': 0, 'crash-offline': 2000, 'agent-roll': 0, 'node-delete': 0,
  // after the rebooted node's pods and paths are back, still cut off
  'node-reboot-offline': 2000,
  // after the deletion: past the bound within which the pairs elsewhere must open (POLICY_CHANGE_OPEN_MS)
  'policy-offline': 6000,
  // between a site's cut and the first restart, and between restarts; after a NAT reboot (its paths must be back within
  // 5 s); the jumped clocks (beyond every liveness deadline, 3 s, so a false "dead" would show)
  'offline-restart-all': 2000, 'nat-reboot-offline': 6000, 'clock-jump': 8000, 'readdress-offline': 8000,
};

/** The line of `node`'s `atoll peers` saying the path to `peer` is being rebuilt without the relay, if it says so. */
export async function rebuildingLine(lab: RunningLab, node: string, peer: string): Promise<string | undefined> {
  const n = lab.plan.nodes.find((x) => x.name === node);
  if (!n) return undefined;
  const st = await readTunnelStatus(statusSocketOf(n.socketPath), 2000).catch(() => undefined);
  return st ? renderPeers(st, Date.now()).find((l) => l.startsWith(`${peer}: rebuilding`)) : undefined;
}

/**
 * Gives `site`'s router the public address `to` (CIDR) instead of `from`, as a carrier handing out a new one: the old
 * address removed (its NAT mappings and connected route with it), the new one added, the default route put back, the
 * rest of its connection tracking flushed.
 */
export async function moveRouter(lab: RunningLab, site: string, from: string, to: string): Promise<void> {
  const netns = routerOf(lab, site);
  const gateway = lab.plan.routes.find((r) => r.netns === netns && r.dst === 'default')?.via;
  await ip.batch([`addr del ${from} dev up0`, `addr add ${to} dev up0`, ...(gateway ? [`route replace default via ${gateway} dev up0`] : [])], { netns: nsPath(netns) });
  await flushConntrack(netns);
}

/** Flushes the connection tracking of `netns` (a router rebooting: its NAT forgets every mapping). */
export async function flushConntrack(netns: string): Promise<void> {
  const proc = new Child(['ip', 'netns', 'exec', netns, 'conntrack', '-F'], { output: 'pipe' });
  await proc.closed();
  if (proc.exitCode !== 0) throw atollError('LAB_STEP_FAILED', `conntrack -F in ${netns} failed (status ${proc.exitCode})`, 'install conntrack (apt install conntrack)');
}

export function routerOf(lab: RunningLab, site: string): string {
  const ns = lab.plan.namespaces.find((n) => n.role === 'router' && n.site === site);
  // cannot happen: faults name only the plan's own sites, nodes and pods (planFault)
  if (!ns) throw new Error(`edge site ${site} has no router`);
  return ns.name;
}

export const cutFromCloud = (lab: RunningLab, site: string, cloud: readonly string[]) => nft.apply(peerCutRuleset(cloud, 'cut off from the cloud'), { netns: nsPath(routerOf(lab, site)) });
export const cutUplink = (lab: RunningLab, site: string) => nft.apply(uplinkCutRuleset('up0'), { netns: nsPath(routerOf(lab, site)) });
export const restoreUplink = (lab: RunningLab, site: string) => nft.apply(uplinkRestoreRuleset(), { netns: nsPath(routerOf(lab, site)) });

/**
 * SIGKILLs the lab's controller or relay, holds the fault, runs `whileDown`, and starts it again from the same
 * configuration (and so the same key): a pin that changed is noted, since agents pinned the old one.
 */
export async function restartService(lab: RunningLab, kind: 'controller' | 'relay', notes: string[], whileDown?: () => Promise<void>): Promise<void> {
  const service = kind === 'controller' ? lab.plan.controller : lab.plan.relay;
  const running = lab[kind];
  if (!running) throw atollError('LAB_STEP_FAILED', `the lab runs no ${kind} process of its own (the chart installed Atoll)`, 'run this fault without --kubernetes, or its --kubernetes form');
  await running.stop('SIGKILL');
  await sleep(HOLD_MS[kind === 'controller' ? 'controller-kill' : 'relay-kill']);
  await whileDown?.();
  const next = new ServiceProcess({ kind, configPath: service.configPath, logPath: service.logPath });
  const started = next.start(['ip', 'netns', 'exec', service.netns]);
  recordProcess(lab, `${kind} (restarted)`, next.pid);
  lab[kind] = next;
  const pin = await started;
  const was = kind === 'controller' ? lab.caCertHash : lab.relayPin;
  if (pin !== was) notes.push(`the restarted ${kind} has another key (${pin.slice(0, 23)}...): agents pinned the old one`);
}

export async function restartAgent(lab: RunningLab, node: string, beforeStart?: () => Promise<void>): Promise<void> {
  const agent = lab.agents.get(node);
  const n = lab.plan.nodes.find((x) => x.name === node);
  // cannot happen: faults name only the plan's own sites, nodes and pods (planFault)
  if (!agent || !n) throw new Error(`no agent for node ${node}`);
  await agent.stop('SIGKILL');
  await beforeStart?.();
  const starting = agent.start(agentLauncher(lab, n), 30_000);
  recordProcess(lab, `agent ${node} (restarted)`, agent.pid);
  await starting;
}

/**
 * What a reboot takes from a node: its processes (the tunnel's keeper, which held the TUN device, the UDP socket and the
 * kept keys), its pods' veths, the pod bridge, the VXLAN and TUN devices, and the agent's nft table.
 */
export async function wipeNode(lab: RunningLab, node: string): Promise<void> {
  const n = lab.plan.nodes.find((x) => x.name === node);
  // cannot happen: faults name only the plan's own sites, nodes and pods (planFault)
  if (!n) throw new Error(`unknown node ${node}`);
  await stopKeeper(keeperSocketOf(n.dataDir));
  const netns = nsPath(n.netns);
  const ports = await ip.json<{ ifname: string }>(['link', 'show', 'master', NODE_DEVICES.bridge], { netns }).catch(() => []);
  const present = new Set((await ip.json<{ ifname: string }>(['link', 'show'], { netns })).map((l) => l.ifname));
  const lines = [...ports.map((p) => `link del ${p.ifname}`), ...[NODE_DEVICES.bridge, NODE_DEVICES.overlay, NODE_DEVICES.tunnel].filter((d) => present.has(d)).map((d) => `link del ${d}`)];
  if (lines.length > 0) await ip.batch(lines, { netns });
  await nft.apply(`table ip ${NFT_TABLE}\ndelete table ip ${NFT_TABLE}\n`, { netns });
}

/**
 * Re-creates `pod` under its name and puts the new one in `lab.pods`; sample pings from it move to its new namespace.
 * Returns it with the one it replaced.
 */
export async function recreatePod(lab: RunningLab, podName: string, pingers: readonly Pinger[]): Promise<{ was: LabPodInfo; now: LabPodInfo }> {
  const pod = lab.plan.pods.find((p) => p.name === podName);
  // cannot happen: faults name only the plan's own sites, nodes and pods (planFault)
  if (!pod) throw new Error(`unknown pod ${podName}`);
  return replacePod(lab, podName, pingers, (was) => lab.podRuntime.recreate(pod, was));
}

/** Replaces `podName` in `lab.pods` by what `make` returns for it; sample pings from it move to its new namespace. */
export async function replacePod(lab: RunningLab, podName: string, pingers: readonly Pinger[], make: (was: LabPodInfo) => Promise<LabPodInfo>): Promise<{ was: LabPodInfo; now: LabPodInfo }> {
  const i = lab.pods.findIndex((p) => p.name === podName);
  const was = lab.pods[i];
  // cannot happen: faults name only the plan's own sites, nodes and pods (planFault)
  if (!was) throw new Error(`unknown pod ${podName}`);
  const now = await make(was);
  lab.pods[i] = now;
  if (now.netns !== was.netns) {
    for (const p of pingers.filter((x) => x.pair.from === podName)) await p.moveTo(now);
  }
  return { was, now };
}
