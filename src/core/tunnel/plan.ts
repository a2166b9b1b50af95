/**
 * The cross-site tunnel, as data: which peers this node keeps a tunnel stream with, who dials whom, and the routes
 * that send the peers' pod blocks into the TUN device. Pure: src/agent/tunnel.ts applies it.
 *
 * Design notes (why):
 * - Cloud <-> edge: a cloud node has a public underlay address, so the edge node dials it through its NAT and the
 *   cloud node answers over the same stream.
 * - Edge <-> edge only inside one community (a node label; FabEdge's semantics): both ends hole-punch a direct stream,
 *   coordinated through the relay, and use the relay's stream until (and whenever) they have none. The name that
 *   sorts first initiates. Edge nodes without a community, or of different communities, get no path and no routes
 *   (their packets leave by the default route, where nothing routes pod addresses); the relay refuses such pairs too.
 * - Cloud <-> cloud pairs in different sites: not built (one cloud site).
 * - A peer takes part only once it has published its tunnel key (the pin both ends check), its role and its blocks.
 * - Routes carry ROUTE_PROTO like the overlay's, but have no gateway: `<block> dev <tun> proto 44`. The overlay's diff
 *   only handles routes with a gateway, so the two never touch each other's routes.
 */
import type { NodeRecord } from '../cluster/model.ts';
import { type Cidr, formatCidr, formatIpv4, parseCidr } from '../net/ipv4.ts';
import { ROUTE_PROTO } from '../overlay/plan.ts';
import { compareText } from '../order.ts';

export type TunnelRole = 'cloud' | 'edge';

/** Annotation a node publishes its tunnel role under. */
export const ROLE_ANNOTATION = 'atoll.dev/role';
/** Annotation a node publishes its tunnel listening port under (cloud nodes). */
export const TUNNEL_PORT_ANNOTATION = 'atoll.dev/tunnel-port';

export interface TunnelSelf {
  readonly name: string;
  readonly role: TunnelRole;
  /** The port this node listens on (cloud) and assumes for peers that publish none. */
  readonly port: number;
  /** This node's community ('' for none). */
  readonly community: string;
  /** Whether a relay is configured (edge <-> edge paths need one to coordinate punching). */
  readonly relay: boolean;
}

/** How the stream to a peer comes up: we dial it, it dials us, or both punch through NAT (edge <-> edge). */
export type TunnelPeerMode = 'dial' | 'accept' | 'punch';

export interface TunnelPeerPlan {
  readonly name: string;
  /** The peer's tunnel key pin (`sha256:<hex>`). */
  readonly pin: string;
  readonly role: TunnelRole;
  readonly blocks: readonly Cidr[];
  readonly mode: TunnelPeerMode;
  /** Where to dial the peer (mode 'dial'). */
  readonly dial: { readonly host: string; readonly port: number } | undefined;
  /** For mode 'punch': whether this node starts the punching (and is the TLS client). */
  readonly initiator: boolean;
}

export interface TunnelPlan {
  readonly peers: readonly TunnelPeerPlan[];
  /** Remote peers left out, with why (another community, no key yet...). */
  readonly skipped: readonly { readonly name: string; readonly reason: string }[];
}

/** The role a node published, or undefined when it runs no tunnel. */
export function roleOf(p: Pick<NodeRecord, 'annotations'>): TunnelRole | undefined {
  const r = p.annotations[ROLE_ANNOTATION];
  return r === 'cloud' || r === 'edge' ? r : undefined;
}

/**
 * This node as the cluster sees it, and which of its peers are remote: decided once, here, for the agent's status, its
 * overlay and its tunnel.
 */
export interface PeerSelection {
  /** This node's record, once the cluster has one. */
  readonly self: NodeRecord | undefined;
  /** Its site and community: the cluster's record wins over the configuration (on Kubernetes it carries the Node's labels). */
  readonly site: string;
  readonly community: string;
  /**
   * Peers outside this node's site: by site labels when both ends have one, else as the overlay's probes decided
   * (without labels or probes a peer counts as same-site: no tunnel).
   */
  readonly remote: ReadonlySet<string>;
}

/** {@link PeerSelection} of the node `own` (as configured) among `peers`; `probedRemote`: peers the overlay's probes found remote. */
export function selectPeers(own: { readonly name: string; readonly site: string; readonly community: string }, peers: readonly NodeRecord[], probedRemote: readonly string[]): PeerSelection {
  const self = peers.find((p) => p.name === own.name);
  const site = self?.site ?? own.site;
  const probed = new Set(probedRemote);
  const remote = new Set(peers.filter((p) => p.name !== own.name && (site !== '' && p.site !== '' ? p.site !== site : probed.has(p.name))).map((p) => p.name));
  return { self, site, community: self?.community ?? own.community, remote };
}

/**
 * The tunnel peers of `self` among `peers`, limited to the names in `remote` (peers outside this node's site, as the
 * overlay decides). Deterministic: sorted by name.
 */
export function planTunnel(self: TunnelSelf, peers: readonly NodeRecord[], remote: ReadonlySet<string>): TunnelPlan {
  const out: TunnelPeerPlan[] = [];
  const skipped: { name: string; reason: string }[] = [];
  for (const p of [...peers].sort((a, b) => compareText(a.name, b.name))) {
    if (p.name === self.name || !remote.has(p.name)) continue;
    const role = roleOf(p);
    const blocks = p.blocks.map((b) => parseCidr(b)).filter((b): b is Cidr => b !== undefined);
    if (!role || !p.tunnelKey) skipped.push({ name: p.name, reason: 'runs no tunnel (no role or key published)' });
    else if (blocks.length === 0) skipped.push({ name: p.name, reason: 'has no block yet' });
    else if (role === 'cloud' && self.role === 'cloud') skipped.push({ name: p.name, reason: 'cloud <-> cloud across sites is not built' });
    else if (role === 'edge' && self.role === 'edge') {
      const why = edgePairRefusal(self, p.community);
      if (why) skipped.push({ name: p.name, reason: why });
      else out.push({ name: p.name, pin: p.tunnelKey, role, blocks, mode: 'punch', dial: undefined, initiator: self.name < p.name });
    } else if (role === 'cloud' && !p.addresses[0]) skipped.push({ name: p.name, reason: 'cloud peer publishes no address to dial' });
    else if (role === 'cloud') {
      const port = Number(p.annotations[TUNNEL_PORT_ANNOTATION] ?? self.port);
      const dial = { host: p.addresses[0] as string, port: Number.isInteger(port) && port > 0 && port < 65536 ? port : self.port };
      out.push({ name: p.name, pin: p.tunnelKey, role, blocks, mode: 'dial', dial, initiator: true });
    } else out.push({ name: p.name, pin: p.tunnelKey, role, blocks, mode: 'accept', dial: undefined, initiator: false });
  }
  return { peers: out, skipped };
}

/** Why an edge node may not have a path to an edge peer of `community`, or undefined when it may. */
function edgePairRefusal(self: TunnelSelf, community: string): string | undefined {
  if (self.community === '') return 'edge <-> edge needs a community, and this node has none (not allowed)';
  if (community !== self.community) return `edge in ${community === '' ? 'no community' : `community ${community}`}, not ours (${self.community}): not allowed`;
  if (!self.relay) return 'edge <-> edge needs a relay to coordinate hole punching, and none is configured';
  return undefined;
}

/** What a relay knows of a node: enough to decide which pairs it may carry. */
export interface RelayMember {
  readonly name: string;
  readonly pin: string;
  readonly role: TunnelRole;
  readonly community: string;
}

/** The relay's members among the registered nodes: those that run a tunnel (a role and a key published). */
export function relayMembers(nodes: readonly NodeRecord[]): RelayMember[] {
  return nodes.flatMap((n) => {
    const role = roleOf(n);
    return role && n.tunnelKey ? [{ name: n.name, pin: n.tunnelKey, role, community: n.community }] : [];
  });
}

/** Whether the relay may carry traffic between `a` and `b`: an edge pair of one community, or any pair with a cloud node. */
export function relayAllows(a: RelayMember, b: RelayMember): boolean {
  if (a.name === b.name) return false;
  if (a.role === 'cloud' || b.role === 'cloud') return true;
  return a.community !== '' && a.community === b.community;
}

/**
 * The address the node's own traffic into the tunnel leaves with: its VTEP address (the network address of its first
 * block, as on the VXLAN device), as a /32 for the TUN device. Without it the kernel would pick the underlay address,
 * which the far end's source check drops and could not route back. Undefined while the node has no block.
 */
export function tunnelSourceAddress(self: Pick<NodeRecord, 'blocks'> | undefined): string | undefined {
  const first = self?.blocks[0];
  const cidr = first === undefined ? undefined : parseCidr(first);
  return cidr && `${formatIpv4(cidr.base)}/32`;
}

/** The routes the plan needs, as prefixes (each `<prefix> dev <device> proto ROUTE_PROTO`). */
export function tunnelRoutes(plan: TunnelPlan): string[] {
  return plan.peers.flatMap((p) => p.blocks.map(formatCidr));
}

/** `ip -batch` lines turning the tunnel routes `have` (ours on `device`) into `want`; deletions first. */
export function renderTunnelRouteDiff(want: readonly string[], have: readonly string[], device: string): string[] {
  const w = new Set(want);
  const h = new Set(have);
  return [
    ...[...h].filter((d) => !w.has(d)).map((d) => `route del ${d} dev ${device} proto ${ROUTE_PROTO}`),
    // `add`, not `replace`: a foreign route for the same prefix is refused (and reported), never taken over
    ...[...w].filter((d) => !h.has(d)).map((d) => `route add ${d} dev ${device} proto ${ROUTE_PROTO}`),
  ];
}
