/**
 * `atoll trace FROM TO`: explains, hop by hop, how a packet from a pod on this node reaches another pod's address,
 * from the source agent's status (src/core/ops/agent-status.ts): which node holds the destination's block, whether
 * that node is this one, in this site (VXLAN to its VTEP, or a direct route) or beyond it (the tunnel: a direct
 * stream, hole-punched, or relayed through the relay), and, when there is no path, why and where it breaks. Pure.
 *
 * The path names are the lab's (src/lab/plan/paths.ts `LabPath`), so the lab can check an explanation against what
 * its matrix measured; `broken` is a path that should exist and does not now.
 */
import { cidrContains, parseCidr, parseIpv4 } from '../net/ipv4.ts';
import { viewScope } from '../cluster/view.ts';
import { ROLE_ANNOTATION } from '../tunnel/plan.ts';
import { pathKindOf } from '../tunnel/status.ts';
import type { AgentStatus, StatusNode } from './agent-status.ts';

export type TracePath = 'same node' | 'vxlan' | 'direct route' | 'tunnel direct' | 'tunnel hole-punched' | 'tunnel relayed' | 'not allowed' | 'broken';

export interface TraceResult {
  readonly from: { readonly ip: string; readonly node: string };
  readonly to: { readonly ip: string; readonly node: string | undefined };
  readonly path: TracePath;
  /** What happens to the packet, in order. */
  readonly hops: readonly string[];
  /** When there is no path: why, and where it breaks. */
  readonly reason?: string;
  /** What the controller's view adds, when it was asked: agreement, or where this agent's view differs. */
  readonly controller?: string;
}

/** The controller's view of the blocks (`atoll ipam show`): each node and the blocks it leases. */
export type ControllerView = readonly { readonly name: string; readonly blocks: readonly string[] }[];

/** The node of `nodes` whose blocks hold `ip`, if any. */
export function blockOwner(nodes: readonly StatusNode[], ip: number): StatusNode | undefined {
  return nodes.find((n) => n.blocks.some((b) => {
    const c = parseCidr(b);
    return c !== undefined && cidrContains(c, ip);
  }));
}

/**
 * A pod reference as the user gives it: an IPv4 address, or `namespace/name` of a pod on the node `st` describes.
 * Returns the address, or undefined when neither.
 */
export function resolvePodRef(ref: string, st: AgentStatus): string | undefined {
  if (parseIpv4(ref) !== undefined) return ref;
  const slash = ref.indexOf('/');
  const [namespace, name] = slash < 0 ? ['', ref] : [ref.slice(0, slash), ref.slice(slash + 1)];
  return st.ipam.pods.find((p) => p.releasedAt === undefined && p.namespace === namespace && p.name === name)?.ip;
}

function since(st: AgentStatus, t: number): string {
  if (t <= 0) return '';
  return ` since ${new Date(t).toISOString()} (${Math.max(0, Math.round((st.now - t) / 1000))} s ago)`;
}

/**
 * Explains the path from `fromIp` (a pod address in this node's blocks) to `toIp`, from this node's status `st`, and,
 * when `controller` is given, whether the controller's view of the blocks agrees with the agent's.
 * @returns a result whose `path` is 'broken' or 'not allowed', with `reason`, when there is no path now.
 */
export function tracePath(st: AgentStatus, fromIp: string, toIp: string, controller?: ControllerView): TraceResult {
  const t = traceFromAgent(st, fromIp, toIp);
  if (!controller) return t;
  const ip = parseIpv4(toIp);
  const owner = ip === undefined ? undefined : blockOwner(controller.map((n) => ({ ...n, site: '', community: '', role: '', addresses: [], agentVersion: '' })), ip);
  const link = st.controller ? `this agent's controller link is ${st.controller.state}` : 'this agent has no controller configured';
  let note: string;
  if (!owner) note = t.to.node ? `the controller leases ${toIp} to no node, yet this agent has node ${t.to.node} holding it (${link})` : `the controller agrees: no node holds ${toIp}`;
  else if (owner.name === t.to.node) note = `the controller agrees: node ${owner.name} holds ${toIp}`;
  else if (!t.to.node && t.path === 'not allowed') note = `the controller says node ${owner.name} holds ${toIp}, which this agent does not know: a node outside this node's view (another site and community), or one it has not heard of yet (${link})`;
  else note = `the controller says node ${owner.name} holds ${toIp}, but this agent ${t.to.node ? `has node ${t.to.node}` : 'does not know it'}: its view is behind (${link})`;
  return { ...t, controller: note };
}

function traceFromAgent(st: AgentStatus, fromIp: string, toIp: string): TraceResult {
  const self = st.node.name;
  const hops: string[] = [];
  const to = parseIpv4(toIp);
  const nodes = [st.node, ...st.nodes.filter((n) => n.name !== self)];
  const dst = to === undefined ? undefined : blockOwner(nodes, to);
  const result = (path: TracePath, reason?: string): TraceResult =>
    ({ from: { ip: fromIp, node: self }, to: { ip: toIp, node: dst?.name }, path, hops, ...(reason ? { reason } : {}) });
  hops.push(`${fromIp} leaves its pod on node ${self} through the bridge (its default gateway)`);
  if (to === undefined) return result('broken', `${toIp} is not an IPv4 address`);
  if (!dst) {
    const { name, site, community, role } = st.node;
    if (!viewScope({ name, site, community, annotations: role ? { [ROLE_ANNOTATION]: role } : {} }).all) {
      // the controller sends an edge node its own view (src/core/cluster/view.ts): a node outside it is no peer
      return result('not allowed', `no node of this node's view holds a block containing ${toIp}: an edge node is sent only its site, its community and the cloud nodes, so if ${toIp} is a pod's, its node is an edge node of another site and community (not allowed)`);
    }
    return result('broken', `no node holds a block containing ${toIp} (no block owner): it is no pod address this node knows of`);
  }

  if (dst.name === self) {
    const pod = st.ipam.pods.find((p) => p.ip === toIp);
    if (!pod || pod.releasedAt !== undefined) return result('broken', `${toIp} is in this node's block ${dst.blocks.join(', ')}, but no pod has it now`);
    hops.push(`same node: the bridge delivers it to ${pod.namespace ? `${pod.namespace}/` : ''}${pod.name} (${toIp})`);
    return result('same node');
  }

  const site = st.overlay?.sitePeers.find((p) => p.name === dst.name);
  if (site) {
    const address = dst.addresses[0] ?? '?';
    if (site.path === 'vxlan') hops.push(`same site: VXLAN to node ${dst.name} at its VTEP (underlay ${address}), decapsulated there`);
    else hops.push(`same site: a direct route via node ${dst.name}'s underlay address ${address}`);
    hops.push(`node ${dst.name} delivers it to ${toIp} through its bridge`);
    return result(site.path === 'vxlan' ? 'vxlan' : 'direct route');
  }

  const tunnel = st.tunnel;
  if (!tunnel) {
    return result('broken', st.overlay
      ? `node ${dst.name} is outside this node's site and this node runs no tunnel`
      : `node ${dst.name} holds ${toIp}, but this node runs neither overlay nor tunnel: no route to other nodes`);
  }
  const skipped = tunnel.skipped.find((s) => s.name === dst.name);
  if (skipped) {
    const notAllowed = /not allowed/.test(skipped.reason);
    return result(notAllowed ? 'not allowed' : 'broken', `no tunnel path to node ${dst.name}: ${skipped.reason}` + (notAllowed && st.node.community !== dst.community
      ? ` (communities differ: ${st.node.community || 'none'} here, ${dst.community || 'none'} there)` : ''));
  }
  const peer = tunnel.peers.find((p) => p.name === dst.name);
  if (!peer) return result('broken', `node ${dst.name} is outside this site but not in this node's tunnel plan yet (the agent plans it at its next sync)`);
  const kind = pathKindOf(peer);
  const rtt = peer.rttMs === undefined ? '' : `, rtt ${peer.rttMs.toFixed(1)} ms`;
  const relay = tunnel.relay;
  switch (kind) {
    case 'udp':
      hops.push(`tunnel: the TUN device, then encrypted UDP datagrams${peer.mode === 'punch' ? ' hole-punched through both NATs' : ''} to node ${dst.name}`
        + `${peer.udp?.endpoint ? ` at ${peer.udp.endpoint}` : ''}${rtt} (its TLS stream stands by)`);
      break;
    case 'direct':
      hops.push(`tunnel: the TUN device, then a direct TLS stream to node ${dst.name} (${peer.mode === 'dial' ? 'this node dialled it' : 'it dialled this node'}${rtt})`);
      break;
    case 'hole-punched':
      hops.push(`tunnel: the TUN device, then a hole-punched TLS stream through both NATs to node ${dst.name}${rtt}`);
      break;
    case 'relayed':
      hops.push(`tunnel: the TUN device, then a circuit through relay ${relay?.address ?? '?'} to node ${dst.name}, TLS end to end${rtt}`
        + (peer.punch?.lastError ? ` (hole punching failed: ${peer.punch.lastError})` : ''));
      break;
    case 'down': {
      const why = [
        `the tunnel peer ${dst.name} is down${since(st, peer.since)}`,
        ...(peer.punch?.lastError ? [`hole punching failed (${peer.punch.lastError}${/symmetric|timed out|timeout/i.test(peer.punch.lastError) ? ', as behind a symmetric NAT' : ''})`] : []),
        ...(relay && !relay.connected ? [`the relay ${relay.address} is not connected`] : []),
      ];
      return result('broken', `${why.join('; ')}: it breaks at this node's tunnel, before ${dst.name}`);
    }
  }
  hops.push(`node ${dst.name} takes it off its TUN device and delivers it to ${toIp} through its bridge`);
  const punched = kind === 'hole-punched' || (kind === 'udp' && peer.mode === 'punch');
  return result(punched ? 'tunnel hole-punched' : kind === 'relayed' ? 'tunnel relayed' : 'tunnel direct');
}

/** The explanation as lines of text. */
export function renderTrace(t: TraceResult): string[] {
  const out = [`trace ${t.from.ip} (node ${t.from.node}) -> ${t.to.ip}${t.to.node ? ` (node ${t.to.node})` : ''}: ${t.path}`];
  t.hops.forEach((h, i) => out.push(`  ${i + 1}. ${h}`));
  if (t.reason) out.push(`  ${t.path === 'not allowed' ? 'NOT ALLOWED' : 'BREAKS'}: ${t.reason}`);
  if (t.controller) out.push(`  controller: ${t.controller}`);
  return out;
}
