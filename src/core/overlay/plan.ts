/**
 * The same-site overlay, as data: which peers share this node's site, and the routes, neighbours and forwarding
 * entries the kernel must hold for them. Pure; src/agent/overlay.ts reads what the kernel holds, diffs with
 * {@link diffOverlay} and applies the difference in batches.
 *
 * Design notes (why, after flannel's vxlan backend and its failure modes):
 * - One VXLAN device per node, learning off, no multicast: every peer gets a static fdb entry (its VTEP MAC -> its
 *   underlay address), a permanent neighbour (its VTEP address -> its VTEP MAC) and one route per pod block via its
 *   VTEP address, onlink. Peers cut off from the cloud keep working because nothing here is learned at run time.
 * - A node's VTEP address is the network address of its first block (a /32 on the VXLAN device), as flannel does.
 * - The VTEP MAC is chosen once and kept in local state (flannel re-created it on restart: peers that could not
 *   hear about the change sent to a MAC that no longer existed).
 * - Peers on the node's own L2 segment can skip encapsulation: a plain route via their underlay address.
 * - Site: nodes with the same site label are one site; unlabelled nodes that answered a direct probe join the site;
 *   a differing label wins over a probe. Peers outside the site are left to the cross-site tunnel.
 */
import { type Cidr, cidrContains, formatCidr, formatIpv4, parseIpv4 } from '../net/ipv4.ts';
import { compareText } from '../order.ts';

/** Routes Atoll installs carry this protocol number, so a diff only ever touches Atoll's routes. */
export const ROUTE_PROTO = 44;

export type DirectRouting = 'never' | 'auto';

export interface OverlayNode {
  readonly name: string;
  readonly site: string;
  readonly underlay: string;
  readonly vtepMac: string;
  readonly blocks: readonly Cidr[];
}

export interface OverlayPeer extends OverlayNode {
  /** The peer answered a direct probe on its underlay address. */
  readonly reachable: boolean;
}

export interface OverlaySettings {
  readonly device: string;
  /** The underlay network of this node (its address's prefix), for direct-routing decisions. */
  readonly underlayNet: Cidr;
  readonly underlayDevice: string;
  readonly directRouting: DirectRouting;
}

export interface RouteEntry {
  readonly dst: string;
  readonly via: string;
  readonly dev: string;
  readonly onlink: boolean;
}

export interface NeighEntry {
  readonly ip: string;
  readonly mac: string;
  readonly dev: string;
}

export interface FdbEntry {
  readonly mac: string;
  readonly dst: string;
  readonly dev: string;
}

export interface OverlayPlan {
  /** This node's VTEP address with /32, or undefined while it has no block. */
  readonly vtepAddress: string | undefined;
  readonly routes: readonly RouteEntry[];
  readonly neighbours: readonly NeighEntry[];
  readonly fdb: readonly FdbEntry[];
  /** Peers in this site, and how each is reached. */
  readonly sitePeers: readonly { readonly name: string; readonly path: 'vxlan' | 'direct' }[];
  /** Peers outside this site: the tunnel's business. */
  readonly remotePeers: readonly string[];
}

/** The VTEP address of a node: the network address of its first block. */
export function vtepAddressOf(node: Pick<OverlayNode, 'blocks'>): string | undefined {
  const first = node.blocks[0];
  return first ? formatIpv4(first.base) : undefined;
}

export function sameSite(self: OverlayNode, peer: OverlayPeer): boolean {
  if (self.site !== '' && peer.site !== '') return self.site === peer.site;
  return peer.reachable;
}

export function planOverlay(self: OverlayNode, peers: readonly OverlayPeer[], s: OverlaySettings): OverlayPlan {
  const routes: RouteEntry[] = [];
  const neighbours: NeighEntry[] = [];
  const fdb: FdbEntry[] = [];
  const sitePeers: { name: string; path: 'vxlan' | 'direct' }[] = [];
  const remotePeers: string[] = [];
  for (const p of [...peers].sort((a, b) => compareText(a.name, b.name))) {
    if (p.name === self.name || p.blocks.length === 0) continue;
    const underlay = parseIpv4(p.underlay);
    if (!sameSite(self, p) || underlay === undefined) {
      remotePeers.push(p.name);
      continue;
    }
    const direct = s.directRouting === 'auto' && cidrContains(s.underlayNet, underlay);
    if (direct) {
      for (const b of p.blocks) routes.push({ dst: formatCidr(b), via: p.underlay, dev: s.underlayDevice, onlink: false });
      sitePeers.push({ name: p.name, path: 'direct' });
      continue;
    }
    const vtep = vtepAddressOf(p) as string;
    if (!p.vtepMac) {
      remotePeers.push(p.name); // not announced a VTEP yet
      continue;
    }
    for (const b of p.blocks) routes.push({ dst: formatCidr(b), via: vtep, dev: s.device, onlink: true });
    neighbours.push({ ip: vtep, mac: p.vtepMac, dev: s.device });
    fdb.push({ mac: p.vtepMac, dst: p.underlay, dev: s.device });
    sitePeers.push({ name: p.name, path: 'vxlan' });
  }
  const vtep = vtepAddressOf(self);
  return { vtepAddress: vtep && `${vtep}/32`, routes, neighbours, fdb, sitePeers, remotePeers };
}

export interface OverlayState {
  readonly routes: readonly RouteEntry[];
  readonly neighbours: readonly NeighEntry[];
  readonly fdb: readonly FdbEntry[];
}

export interface OverlayDiff {
  readonly addRoutes: readonly RouteEntry[];
  readonly delRoutes: readonly RouteEntry[];
  readonly addNeighbours: readonly NeighEntry[];
  readonly delNeighbours: readonly NeighEntry[];
  readonly addFdb: readonly FdbEntry[];
  readonly delFdb: readonly FdbEntry[];
}

const routeKey = (r: RouteEntry) => `${r.dst}|${r.via}|${r.dev}|${r.onlink}`;
const neighKey = (n: NeighEntry) => `${n.ip}|${n.mac}|${n.dev}`;
const fdbKey = (f: FdbEntry) => `${f.mac}|${f.dst}|${f.dev}`;

function diffBy<T>(want: readonly T[], have: readonly T[], key: (t: T) => string): { add: T[]; del: T[] } {
  const w = new Map(want.map((t) => [key(t), t]));
  const h = new Map(have.map((t) => [key(t), t]));
  return { add: [...w].filter(([k]) => !h.has(k)).map(([, t]) => t), del: [...h].filter(([k]) => !w.has(k)).map(([, t]) => t) };
}

/** What to add and delete so that `have` (Atoll's entries only) becomes `want`. */
export function diffOverlay(want: OverlayState, have: OverlayState): OverlayDiff {
  const r = diffBy(want.routes, have.routes, routeKey);
  const n = diffBy(want.neighbours, have.neighbours, neighKey);
  const f = diffBy(want.fdb, have.fdb, fdbKey);
  return { addRoutes: r.add, delRoutes: r.del, addNeighbours: n.add, delNeighbours: n.del, addFdb: f.add, delFdb: f.del };
}

/** The diff as `ip -batch` lines (routes, neighbours) and `bridge -batch` lines (fdb); deletions first. */
export function renderOverlayDiff(d: OverlayDiff): { ip: string[]; bridge: string[] } {
  const ip: string[] = [];
  const bridge: string[] = [];
  for (const r of d.delRoutes) ip.push(`route del ${r.dst} via ${r.via} dev ${r.dev} proto ${ROUTE_PROTO}`);
  for (const n of d.delNeighbours) ip.push(`neigh del ${n.ip} dev ${n.dev}`);
  for (const f of d.delFdb) bridge.push(`fdb del ${f.mac} dev ${f.dev} dst ${f.dst} self`);
  for (const f of d.addFdb) bridge.push(`fdb replace ${f.mac} dev ${f.dev} dst ${f.dst} self permanent`);
  for (const n of d.addNeighbours) ip.push(`neigh replace ${n.ip} lladdr ${n.mac} dev ${n.dev} nud permanent`);
  // `add`, not `replace`: a foreign route for the same prefix is refused (and reported), never taken over
  for (const r of d.addRoutes) ip.push(`route add ${r.dst} via ${r.via} dev ${r.dev}${r.onlink ? ' onlink' : ''} proto ${ROUTE_PROTO}`);
  return { ip, bridge };
}

/** The pod MTU over VXLAN on IPv4: the underlay's minus 50 bytes (outer IPv4 20, UDP 8, VXLAN 8, inner Ethernet 14). */
export function vxlanMtu(underlayMtu: number): number {
  return underlayMtu - 50;
}
