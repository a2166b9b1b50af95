/**
 * What an agent tells about itself on its status socket (`GET /v1/status`), for `atoll status` and `atoll trace`:
 * its node, the controller link, its blocks and pods, the overlay's view of its site, the tunnel, and the cluster as
 * it knows it (from the controller's watch, or its saved state while offline). Pure: the shape and its rendering.
 */
import type { AllocationHow, IpamUsage } from '../ipam/sticky-pool.ts';
import { countPeerPaths, type TunnelStatus } from '../tunnel/status.ts';

export interface StatusNode {
  readonly name: string;
  readonly site: string;
  readonly community: string;
  /** 'cloud' or 'edge' when the node runs the tunnel (its `atoll.dev/role` annotation), else ''. */
  readonly role: string;
  readonly addresses: readonly string[];
  readonly blocks: readonly string[];
  readonly agentVersion: string;
}

export interface StatusPod {
  readonly ip: string;
  /** '' for a pod without a Kubernetes identity. */
  readonly namespace: string;
  readonly name: string;
  /** Set while the pod is gone and its address kept for it (ms since epoch). */
  readonly releasedAt?: number;
  /** Set on such a reservation once another pod may take it (NetworkPolicy on: no peer holds the gone pod any more). */
  readonly reusable?: true;
}

export interface AgentStatus {
  readonly version: string;
  /** ms since epoch. */
  readonly startedAt: number;
  readonly now: number;
  readonly ready: boolean;
  readonly node: StatusNode;
  /** Absent when the agent has no controller configured. */
  readonly controller?: { readonly state: string; readonly lastError: string; readonly offlineSince?: number | undefined };
  readonly ipam: { readonly blocks: readonly string[]; readonly usage: IpamUsage; readonly allocations: Readonly<Record<AllocationHow, number>>; readonly pods: readonly StatusPod[] };
  /** The same-site overlay's plan (absent without an overlay): how each peer of this site is reached. */
  readonly overlay?: { readonly vtepAddress: string | undefined; readonly sitePeers: readonly { readonly name: string; readonly path: 'vxlan' | 'direct' }[]; readonly remotePeers: readonly string[] };
  readonly tunnel: TunnelStatus | null;
  /** NetworkPolicy on this node (absent when `networkPolicy` is off). */
  readonly policy?: {
    readonly policies: number;
    /** The first policies' `namespace/name` (absent from older agents). */
    readonly names?: readonly string[];
    /** A content hash of the view's policies, equal wherever the same policies are held (absent from older agents). */
    readonly revision?: string;
    readonly isolatedPods: number;
    /** Whether the node holds a view (from the controller, or kept on disk). */
    readonly hasView: boolean;
    /** When the ruleset in force was applied this run (ms since epoch). */
    readonly appliedAt?: number;
  };
  /** Every node as this agent knows it, itself included. */
  readonly nodes: readonly StatusNode[];
}

function ago(ms: number): string {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 120) return `${s}s`;
  if (s < 7200) return `${Math.round(s / 60)}m`;
  return `${Math.round(s / 3600)}h`;
}

/** `atoll status` as lines of text. */
export function renderStatus(st: AgentStatus): string[] {
  const u = st.ipam.usage;
  const out = [
    `node      ${st.node.name}${st.node.site ? ` (site ${st.node.site}` : ' (no site'}${st.node.community ? `, community ${st.node.community})` : ')'}${st.node.role ? `, tunnel ${st.node.role}` : ''}`,
    `agent     ${st.ready ? 'ready' : 'NOT ready'}, version ${st.version}, up ${ago(st.now - st.startedAt)}`,
  ];
  if (!st.controller) out.push('controller none configured (pod blocks from podCidrs only)');
  else if (st.controller.state === 'connected') out.push('controller connected');
  else {
    const since = st.controller.offlineSince === undefined ? '' : ` for ${ago(st.now - st.controller.offlineSince)}`;
    out.push(`controller ${st.controller.state.toUpperCase()}${since}${st.controller.lastError ? `: ${st.controller.lastError}` : ''} (working from saved state)`);
  }
  out.push(`blocks    ${st.ipam.blocks.length > 0 ? st.ipam.blocks.join(' ') : '(none)'}`);
  out.push(`addresses ${u.allocated} in use, ${u.reserved} reserved, ${u.free} free of ${u.capacity}; sticky re-uses ${st.ipam.allocations.sticky}, fresh ${st.ipam.allocations.fresh}, reclaimed ${st.ipam.allocations.reclaimed}`);
  if (st.overlay) {
    const vx = st.overlay.sitePeers.filter((p) => p.path === 'vxlan').length;
    out.push(`site      ${st.overlay.sitePeers.length} peers (${vx} over VXLAN, ${st.overlay.sitePeers.length - vx} direct routes), ${st.overlay.remotePeers.length} outside the site`);
  }
  if (st.tunnel) {
    const n = countPeerPaths(st.tunnel.peers);
    out.push(`tunnel    ${st.tunnel.peers.length} peers: ${n.udp} udp, ${n.direct} direct, ${n['hole-punched']} hole-punched, ${n.relayed} relayed, ${n.down} down${st.tunnel.skipped.length ? `; ${st.tunnel.skipped.length} without a path` : ''}`);
    if (st.tunnel.relay) out.push(`relay     ${st.tunnel.relay.address} ${st.tunnel.relay.connected ? 'connected' : 'NOT connected'}`);
  } else out.push('tunnel    off');
  if (!st.policy) out.push('policy    off');
  else if (!st.policy.hasView) out.push('policy    on, no view yet (the ruleset in the kernel, if any, stays in force)');
  else {
    const p = st.policy;
    const names = p.names && p.names.length > 0 ? ` (${p.names.join(', ')}${p.names.length < p.policies ? `, and ${p.policies - p.names.length} more` : ''})` : '';
    out.push(`policy    ${p.policies} policies for this node's pods${names}${p.revision ? `, revision ${p.revision}` : ''}, ${p.isolatedPods} pods isolated${p.appliedAt === undefined ? '' : `, applied ${ago(st.now - p.appliedAt)} ago`}`);
  }
  const versions = new Map<string, number>();
  for (const node of st.nodes) versions.set(node.agentVersion || '?', (versions.get(node.agentVersion || '?') ?? 0) + 1);
  out.push(`cluster   ${st.nodes.length} nodes; agent versions ${[...versions].map(([v, c]) => `${v} x${c}`).join(', ')}`);
  return out;
}
