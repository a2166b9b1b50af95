/**
 * What the lab picture draws, as data: its input (sites, nodes, pods, cells) and the node pairs (links) the cells
 * aggregate into. Pure.
 */
import { type CellVerdict, type LabCell, median } from '../report.ts';
import type { NatType } from '../spec.ts';
import type { LabPath } from '../paths.ts';

export interface LabSvgPod {
  readonly name: string;
  /** Its address; absent before it has one. */
  readonly ip?: string;
}

export interface LabSvgNode {
  readonly name: string;
  /** Underlay address. */
  readonly address?: string;
  readonly pods: readonly LabSvgPod[];
}

export interface LabSvgSite {
  readonly name: string;
  /** The cloud site (public addresses, the controller); every other site is an edge behind a NAT router. */
  readonly cloud: boolean;
  readonly community?: string;
  readonly nat?: NatType;
  /** The edge router's public address. */
  readonly routerAddress?: string;
  /** The edge router drops UDP (`--block-udp`): the site's tunnels keep to their TLS streams. */
  readonly udpBlocked?: boolean;
  readonly nodes: readonly LabSvgNode[];
}

/** The part of a {@link LabCell} the picture uses. */
export type LabSvgCell = Pick<LabCell, 'from' | 'to' | 'fromNode' | 'toNode' | 'path' | 'verdict'> & { readonly ping?: { readonly rttMs?: number } };

export interface LabSvgInput {
  readonly runId: string;
  /** Second title line, e.g. the spec in words. */
  readonly description?: string;
  /** The controller's address or URL (or its replicas' addresses). */
  readonly controller?: string;
  /** The relay in the cloud site (beside the controller); `address` as host:port, maybe with the node it runs on. */
  readonly relay?: { readonly address?: string };
  /** Cloud site first, then the edge sites. */
  readonly sites: readonly LabSvgSite[];
  /** The connectivity matrix; without it the picture is the topology only. */
  readonly cells?: readonly LabSvgCell[];
  /**
   * Whether the agents' tunnels use the datagram path (`tunnel.udp`): direct and hole-punched pairs are then carried in
   * UDP datagrams (but those of sites that block UDP), else in TLS streams. Absent: not known, the legend does not say.
   */
  readonly tunnelUdp?: boolean;
}

/** Up to these sizes every node pair gets its own line; beyond them lines are drawn per site pair. */
export const NODE_LINK_LIMITS = Object.freeze({ nodes: 16, cloudNodes: 6, nodesPerEdgeSite: 4, edgeSites: 5 });
/** Up to this many pods a node lists them with names and IPs; beyond, as dots. */
export const POD_LIST_LIMIT = 6;

/** How a node pair's cells came out. */
export type LinkStatus = 'ok' | 'failed' | 'blocked';

/** The cells of one unordered node pair (or site pair), both directions. */
export interface LabSvgLink {
  /** First in the input's node order. */
  readonly a: string;
  readonly b: string;
  readonly path: LabPath;
  readonly cells: number;
  readonly ok: number;
  readonly failed: number;
  readonly medianRttMs?: number;
  readonly status: LinkStatus;
}

/** Failed when one cell failed; blocked when every cell is blocked as expected (pairs that are not allowed); else ok. */
function statusOf(cells: readonly LabSvgCell[]): LinkStatus {
  if (cells.some((c) => c.verdict === 'FAIL')) return 'failed';
  return cells.every((c) => c.verdict === 'blocked as expected') ? 'blocked' : 'ok';
}

/**
 * Aggregates cells per unordered pair of groups (nodes by default, or whatever `groupOf` maps a node to), in the
 * order of `order`; pairs within one group (e.g. same node) are left out. Deterministic.
 */
export function aggregateLinks(cells: readonly LabSvgCell[], order: readonly string[], groupOf: (node: string) => string = (n) => n): LabSvgLink[] {
  const rank = new Map(order.map((n, i) => [n, i]));
  const byPair = new Map<string, { a: string; b: string; cells: LabSvgCell[] }>();
  for (const c of cells) {
    const [x, y] = [groupOf(c.fromNode), groupOf(c.toNode)];
    if (x === y) continue;
    const [a, b] = (rank.get(x) ?? Infinity) <= (rank.get(y) ?? Infinity) ? [x, y] : [y, x];
    const key = `${a}\n${b}`;
    const entry = byPair.get(key) ?? { a, b, cells: [] };
    entry.cells.push(c);
    byPair.set(key, entry);
  }
  const links = [...byPair.values()].map(({ a, b, cells: of }) => {
    const rtts = of.flatMap((c) => (c.verdict === 'ok' && c.ping?.rttMs !== undefined ? [c.ping.rttMs] : []));
    const m = median(rtts);
    return {
      a, b, path: (of[0] as LabSvgCell).path, cells: of.length, ok: of.filter((c) => c.verdict === 'ok').length,
      failed: of.filter((c) => c.verdict === 'FAIL').length, ...(m !== undefined ? { medianRttMs: m } : {}), status: statusOf(of),
    };
  });
  const pos = (l: LabSvgLink) => [rank.get(l.a) ?? Infinity, rank.get(l.b) ?? Infinity] as const;
  return links.sort((l, r) => pos(l)[0] - pos(r)[0] || pos(l)[1] - pos(r)[1] || (l.a < r.a ? -1 : l.a > r.a ? 1 : l.b < r.b ? -1 : l.b > r.b ? 1 : 0));
}

/** The site of every node, by node name. */
export function sitesByNode(input: LabSvgInput): Map<string, LabSvgSite> {
  return new Map(input.sites.flatMap((s) => s.nodes.map((x) => [x.name, s] as const)));
}

/** The second line of an edge router's box. */
export function routerLabel(s: LabSvgSite): string {
  return s.nat === 'symmetric' ? 'symmetric NAT' : s.nat ? 'endpoint-independent NAT' : 'NAT';
}

/** A pod's label: its name and IP. */
export const podLabel = (p: LabSvgPod): string => (p.ip ? `${p.name}  ${p.ip}` : p.name);

/** The non-zero counts of `of` by outcome, e.g. `['62 ok', '2 FAIL']`. */
export function verdictCounts(of: readonly LabSvgCell[]): string[] {
  const verdicts: readonly CellVerdict[] = ['ok', 'FAIL', 'blocked as expected'];
  return verdicts.map((v) => [of.filter((c) => c.verdict === v).length, v] as const).filter(([k]) => k > 0).map(([k, v]) => `${k} ${v}`);
}

/** The cells between pods of one node, by node. */
export function cellsWithinNodes(cells: readonly LabSvgCell[]): Map<string, LabSvgCell[]> {
  const sameNode = new Map<string, LabSvgCell[]>();
  for (const c of cells) if (c.fromNode === c.toNode) sameNode.set(c.fromNode, [...(sameNode.get(c.fromNode) ?? []), c]);
  return sameNode;
}
