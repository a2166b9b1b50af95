/**
 * The cross-site tunnel, as data: which peers this node keeps a tunnel stream with, who dials whom, and the routes
 * that send the peers' pod blocks into the TUN device. Pure: src/agent/tunnel.ts applies it.
 *
 * Design notes (why):
 * - Only cloud <-> edge pairs for now: a cloud node has a public underlay address, so the edge node dials it through
 *   its NAT and the cloud node answers over the same stream. Edge <-> edge pairs need hole punching or a relay and get
 *   no routes (cloud <-> cloud pairs in different sites neither: not built).
 * - A peer takes part only once it has published its tunnel key (the pin both ends check), its role and its blocks.
 * - Routes carry ROUTE_PROTO like the overlay's, but have no gateway: `<block> dev <tun> proto 44`. The overlay's diff
 *   only handles routes with a gateway, so the two never touch each other's routes.
 */
import type { NodeRecord } from '../cluster/model.ts';
import { type Cidr, formatCidr, parseCidr } from '../net/ipv4.ts';
import { ROUTE_PROTO } from '../overlay/plan.ts';

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
}

export interface TunnelPeerPlan {
  readonly name: string;
  /** The peer's tunnel key pin (`sha256:<hex>`). */
  readonly pin: string;
  readonly role: TunnelRole;
  readonly blocks: readonly Cidr[];
  /** Where to dial the peer; undefined when the peer dials us. */
  readonly dial: { readonly host: string; readonly port: number } | undefined;
}

export interface TunnelPlan {
  readonly peers: readonly TunnelPeerPlan[];
  /** Remote peers left out, with why (edge <-> edge, no key yet...). */
  readonly skipped: readonly { readonly name: string; readonly reason: string }[];
}

/** The role a node published, or undefined when it runs no tunnel. */
export function roleOf(p: Pick<NodeRecord, 'annotations'>): TunnelRole | undefined {
  const r = p.annotations[ROLE_ANNOTATION];
  return r === 'cloud' || r === 'edge' ? r : undefined;
}

/**
 * The tunnel peers of `self` among `peers`, limited to the names in `remote` (peers outside this node's site, as the
 * overlay decides). Deterministic: sorted by name.
 */
export function planTunnel(self: TunnelSelf, peers: readonly NodeRecord[], remote: ReadonlySet<string>): TunnelPlan {
  const out: TunnelPeerPlan[] = [];
  const skipped: { name: string; reason: string }[] = [];
  for (const p of [...peers].sort((a, b) => a.name.localeCompare(b.name))) {
    if (p.name === self.name || !remote.has(p.name)) continue;
    const role = roleOf(p);
    const blocks = p.blocks.map((b) => parseCidr(b)).filter((b): b is Cidr => b !== undefined);
    if (!role || !p.tunnelKey) skipped.push({ name: p.name, reason: 'runs no tunnel (no role or key published)' });
    else if (blocks.length === 0) skipped.push({ name: p.name, reason: 'has no block yet' });
    else if (role === self.role) skipped.push({ name: p.name, reason: `${role} <-> ${role} across sites is not built (hole punching/relay)` });
    else if (role === 'cloud' && !p.addresses[0]) skipped.push({ name: p.name, reason: 'cloud peer publishes no address to dial' });
    else {
      const port = Number(p.annotations[TUNNEL_PORT_ANNOTATION] ?? self.port);
      const dial = role === 'cloud' ? { host: p.addresses[0] as string, port: Number.isInteger(port) && port > 0 && port < 65536 ? port : self.port } : undefined;
      out.push({ name: p.name, pin: p.tunnelKey, role, blocks, dial });
    }
  }
  return { peers: out, skipped };
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
