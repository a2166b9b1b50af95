/**
 * The lab as a picture (`atoll lab run|up --svg FILE`): sites, nodes, pods and the paths between nodes, readable at a
 * glance. Pure and deterministic: the same input gives the same bytes (no clock, no randomness, fixed number formats).
 *
 * Layout, top to bottom: a title line with the verdict counts; the cloud site (controller, relay, cloud nodes); the
 * wan; each edge site's NAT router above its site box; edge nodes; a legend with a line per path kind and its counts;
 * the failed node pairs. Pods are dots inside their node (green: every cell to and from it is as expected, red: one
 * failed, grey: not checked), with name and IP while a node has few pods.
 *
 * Paths are drawn between nodes, one line per node pair (both directions and all pod pairs aggregated): same-site
 * pairs as arcs below the nodes, cloud <-> edge through the edge's router, relayed pairs (a symmetric NAT on the way)
 * from the relay in the cloud site down through both edge routers, hole-punched pairs (a direct stream between the
 * edges) as arcs below the edge sites. A pair with a failed cell is solid red, drawn over the others; a pair that is
 * not allowed is a faint grey dotted arc. Bigger labs (more than {@link NODE_LINK_LIMITS}) degrade: edge sites wrap
 * into rows, each row on its own wan line; cloud <-> edge is the line from the wan to each edge router (per site pair,
 * red when a cell failed); the rest is summed up as text in each site, with a red line between the routers of edge
 * site pairs that failed. Nodes with many pods show them as dots, names in tooltips.
 */
import { type CellVerdict, formatMs, type LabCell, median, PATH_ORDER } from './report.ts';
import { describeLabSpec, type NatType } from './spec.ts';
import { expectationOf, type LabPath, type LabPlan } from './plan.ts';

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
  readonly nodes: readonly LabSvgNode[];
}

/** The part of a {@link LabCell} the picture uses. */
export type LabSvgCell = Pick<LabCell, 'from' | 'to' | 'fromNode' | 'toNode' | 'path' | 'verdict'> & { readonly ping?: { readonly rttMs?: number } };

export interface LabSvgInput {
  readonly runId: string;
  /** Second title line, e.g. the spec in words. */
  readonly description?: string;
  /** The controller's address or URL. */
  readonly controller?: string;
  /** The relay in the cloud site (beside the controller); `address` as host:port. */
  readonly relay?: { readonly address?: string };
  /** Cloud site first, then the edge sites. */
  readonly sites: readonly LabSvgSite[];
  /** The connectivity matrix; without it the picture is the topology only. */
  readonly cells?: readonly LabSvgCell[];
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

/** The picture's input from a lab plan, the pods' addresses and (after `run`) the cells. */
export function labSvgInputOf(plan: LabPlan, pods: readonly { readonly name: string; readonly node: string; readonly ip?: string }[], cells?: readonly LabSvgCell[]): LabSvgInput {
  const siteNames = [...new Set(plan.nodes.map((n) => n.site))];
  const routerOf = (site: string) => {
    const ns = plan.namespaces.find((n) => n.role === 'router' && n.site === site)?.name;
    return plan.veths.find((v) => v.b.netns === ns && v.b.ifname === 'up0')?.b.address?.split('/')[0];
  };
  const sites = siteNames.map((site): LabSvgSite => {
    const edge = plan.spec.edges.find((e) => e.name === site);
    const routerAddress = routerOf(site);
    return {
      name: site, cloud: edge === undefined, ...(edge ? { community: edge.community, nat: edge.nat } : {}), ...(routerAddress ? { routerAddress } : {}),
      nodes: plan.nodes.filter((n) => n.site === site).map((n) => ({
        name: n.name, address: n.underlay,
        pods: plan.pods.filter((p) => p.node === n.name).map((p) => {
          const ip = pods.find((x) => x.name === p.name)?.ip;
          return { name: p.name, ...(ip ? { ip } : {}) };
        }),
      })),
    };
  });
  return {
    runId: plan.runId, description: describeLabSpec(plan.spec), controller: plan.controller.url.replace(/^https:\/\//, ''),
    relay: { address: `${plan.relay.address}:${plan.relay.port}` }, sites, ...(cells ? { cells } : {}),
  };
}

// ---------------------------------------------------------------------------------------------------------------
// Drawing

/** Escapes text for XML content and attribute values. */
export function escapeXml(text: string): string {
  return text.replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&apos;' })[c] as string);
}

/** Stroke of each path kind: colour and dash pattern ('' solid). */
export const PATH_STYLE: Readonly<Record<LabPath, { readonly color: string; readonly dash: string; readonly label: string }>> = Object.freeze({
  'same node': { color: '#2e7d32', dash: '', label: 'same node (pod bridge)' },
  vxlan: { color: '#1565c0', dash: '', label: 'VXLAN (same site)' },
  'direct route': { color: '#00897b', dash: '', label: 'direct route (same site)' },
  'tunnel direct': { color: '#6a1b9a', dash: '', label: 'tunnel direct (cloud <-> edge, through the NAT)' },
  'tunnel hole-punched': { color: '#ef6c00', dash: '', label: 'tunnel hole-punched (edge <-> edge, a direct stream through both NATs)' },
  'tunnel relayed': { color: '#ad1457', dash: '10 3 2 3', label: 'tunnel relayed (edge <-> edge through the relay: a symmetric NAT on the way)' },
  'not allowed': { color: '#9e9e9e', dash: '1 4', label: 'not allowed (no common community)' },
});
const FAIL_COLOR = '#d32f2f';
const OK_POD = '#43a047';
const IDLE_POD = '#9e9e9e';

const FONT = 'font-family="DejaVu Sans, Verdana, Arial, sans-serif"';
const MARGIN = 20;
const NODE_GAP = 22;
const SITE_PAD = 12;
const SITE_HEAD = 24;
const SITE_GAP = 28;
const NODE_HEAD = 22;
const POD_ROW = 15;
const DOT = 11;
const INFRA_W = 170;
const INFRA_H = 34;
const ROUTER_H = 34;

/** A generous estimate of a text's width (about 0.6 em per character), so labels never overlap. */
const textWidth = (text: string, size: number) => Math.ceil(text.length * size * 0.6);
/** Cuts text to fit `width` pixels, with an ellipsis. */
function fit(text: string, width: number, size: number): string {
  const max = Math.floor(width / (size * 0.6));
  return text.length <= max ? text : `${text.slice(0, Math.max(1, max - 1))}…`;
}
/** Numbers in the SVG: at most one decimal, so output is stable. */
const n = (v: number) => String(Math.round(v * 10) / 10);

interface Box { x: number; y: number; w: number; h: number }
interface Point { x: number; y: number }

/** A text element; `halo` outlines it in that colour so that lines crossing it do not hide it. */
function text(x: number, y: number, s: string, attrs: { size: number; weight?: 'bold'; fill?: string; anchor?: 'middle' | 'end'; halo?: string }): string {
  const halo = attrs.halo ? ` stroke="${attrs.halo}" stroke-width="4" stroke-linejoin="round" paint-order="stroke"` : '';
  const extra = `${attrs.weight ? ` font-weight="${attrs.weight}"` : ''}${attrs.anchor ? ` text-anchor="${attrs.anchor}"` : ''}${halo}`;
  return `<text x="${n(x)}" y="${n(y)}" font-size="${attrs.size}" fill="${attrs.fill ?? '#212121'}"${extra}>${escapeXml(s)}</text>`;
}

function rect(b: Box, attrs: { fill: string; stroke: string; width?: number; dash?: string; rx?: number; title?: string }): string {
  const dash = attrs.dash ? ` stroke-dasharray="${attrs.dash}"` : '';
  const open = `<rect x="${n(b.x)}" y="${n(b.y)}" width="${n(b.w)}" height="${n(b.h)}" rx="${attrs.rx ?? 6}" fill="${attrs.fill}" stroke="${attrs.stroke}" stroke-width="${attrs.width ?? 1}"${dash}`;
  return attrs.title ? `${open}><title>${escapeXml(attrs.title)}</title></rect>` : `${open}/>`;
}

function describeLink(l: LabSvgLink): string {
  const rtt = l.medianRttMs !== undefined ? `, median ping ${formatMs(l.medianRttMs)} ms` : '';
  const what = l.status === 'failed' ? `${l.failed} of ${l.cells} cells FAIL` : l.status === 'blocked' ? `${l.cells} cells blocked as expected` : `${l.ok}/${l.cells} cells ok`;
  return `${l.a} <-> ${l.b}: ${l.path}, ${what}${rtt}`;
}

function wire(d: string, l: LabSvgLink): string {
  const style = PATH_STYLE[l.path];
  const failed = l.status === 'failed';
  const color = failed ? FAIL_COLOR : style.color;
  const width = failed ? 3 : l.status === 'blocked' ? 1.2 : 2;
  const opacity = l.status === 'blocked' ? 0.6 : 0.9;
  const dash = style.dash && !failed ? ` stroke-dasharray="${style.dash}"` : '';
  return `<path class="link ${l.path.replace(/ /g, '-')}${failed ? ' failed' : ''}" d="${d}" fill="none" stroke="${color}" stroke-width="${width}" stroke-opacity="${opacity}"${dash}><title>${escapeXml(describeLink(l))}</title></path>`;
}

interface NodeBox extends Box { readonly node: LabSvgNode }
interface SiteBox extends Box { readonly site: LabSvgSite; readonly nodes: readonly NodeBox[]; readonly router?: Box; readonly arcBand: number; /** Its row's wan line. */ readonly wanY?: number }

/** Endpoints on a box's top or bottom edge, spread so that lines meeting one box do not start at one point. */
class Slots {
  readonly #wanted = new Map<string, { id: number; order: number }[]>();
  #next = 0;
  want(key: string, order: number): number {
    const id = this.#next++;
    this.#wanted.set(key, [...(this.#wanted.get(key) ?? []), { id, order }]);
    return id;
  }
  resolve(boxes: ReadonlyMap<string, Box>): Map<number, Point> {
    const out = new Map<number, Point>();
    for (const [key, list] of this.#wanted) {
      const [name, side] = key.split('\n') as [string, 'top' | 'bottom'];
      const b = boxes.get(name) as Box;
      const sorted = [...list].sort((p, q) => p.order - q.order || p.id - q.id);
      const inner = b.w * 0.8;
      sorted.forEach((s, i) => out.set(s.id, { x: b.x + b.w * 0.1 + (inner * (i + 1)) / (sorted.length + 1), y: side === 'top' ? b.y : b.y + b.h }));
    }
    return out;
  }
}

/**
 * The picture as an SVG document. Precondition: node and pod names are unique; the first site is the cloud (edge
 * sites alone are drawn too, without a cloud box). Deterministic.
 */
export function renderLabSvg(input: LabSvgInput): string {
  const cells = input.cells;
  const cloud = input.sites.find((s) => s.cloud);
  const edges = input.sites.filter((s) => !s.cloud);
  const allNodes = input.sites.flatMap((s) => s.nodes);
  const nodeOrder = allNodes.map((x) => x.name);
  const siteOfNode = new Map(input.sites.flatMap((s) => s.nodes.map((x) => [x.name, s] as const)));
  const perNode = cells !== undefined && allNodes.length <= NODE_LINK_LIMITS.nodes && (cloud?.nodes.length ?? 0) <= NODE_LINK_LIMITS.cloudNodes
    && edges.length <= NODE_LINK_LIMITS.edgeSites && edges.every((s) => s.nodes.length <= NODE_LINK_LIMITS.nodesPerEdgeSite);
  const maxPods = Math.max(1, ...allNodes.map((x) => x.pods.length));
  const listPods = maxPods <= POD_LIST_LIMIT;

  // pods' state: failed if one of its cells failed, ok if checked, idle if not
  const failedPods = new Set((cells ?? []).filter((c) => c.verdict === 'FAIL').flatMap((c) => [c.from, c.to]));
  const failedNodes = new Set((cells ?? []).filter((c) => c.verdict === 'FAIL').flatMap((c) => [c.fromNode, c.toNode]));
  const sameNode = new Map<string, LabSvgCell[]>();
  for (const c of cells ?? []) if (c.fromNode === c.toNode) sameNode.set(c.fromNode, [...(sameNode.get(c.fromNode) ?? []), c]);

  // node size: the same for every node, wide enough for its longest label
  const podLabel = (p: LabSvgPod) => (p.ip ? `${p.name}  ${p.ip}` : p.name);
  const headLabel = (x: LabSvgNode) => `${x.name}  ${x.address ?? ''}${listPods ? '' : `  ${x.pods.length} pods`}`;
  const nodeW = Math.min(260, Math.max(150, ...allNodes.map((x) => textWidth(headLabel(x), 11) + 16), ...(listPods ? allNodes.flatMap((x) => x.pods.map((p) => textWidth(podLabel(p), 10) + 34)) : [])));
  const dotsPerRow = Math.floor((nodeW - 16) / DOT);
  const nodeH = NODE_HEAD + (listPods ? maxPods * POD_ROW : Math.ceil(maxPods / dotsPerRow) * DOT) + 8;

  const cols = (site: LabSvgSite) => Math.min(site.nodes.length, site.cloud ? 8 : 4);
  const gridW = (site: LabSvgSite) => Math.max(1, cols(site)) * nodeW + Math.max(0, cols(site) - 1) * NODE_GAP;
  const gridH = (site: LabSvgSite) => Math.ceil(site.nodes.length / Math.max(1, cols(site))) * (nodeH + NODE_GAP) - NODE_GAP;
  // arcs of same-site pairs below a single row of nodes: depth grows with the distance in columns
  const arcDepth = (span: number) => 16 + 12 * (span - 1);
  const arcBand = (site: LabSvgSite) => (perNode && site.nodes.length > 1 ? Math.round(arcDepth(site.nodes.length - 1) * 0.75) + 8 : 0);
  const summaryLines = (site: LabSvgSite) => (cells && !perNode ? (site.cloud ? 1 : 3) : 0);

  const out: string[] = [];
  const layers = { sites: [] as string[], links: [] as string[], boxes: [] as string[] };

  // title
  let y = MARGIN;
  const title = `Atoll lab ${input.runId}: ${cells ? verdictLine(cells) : 'topology (no checks run)'}`;
  const head = [text(MARGIN, y + 16, title, { size: 17, weight: 'bold' })];
  y += 22;
  const descriptionY = y + 14;
  const description = wrap(input.description ?? '', 120);
  y += 16 * description.length + 2;
  y += 16;

  // cloud site
  const siteBoxes: SiteBox[] = [];
  const infra = new Map<string, Box>();
  let cloudBox: SiteBox | undefined;
  if (cloud) {
    const contentH = Math.max(2 * INFRA_H + 10, gridH(cloud));
    const w = SITE_PAD * 2 + INFRA_W + NODE_GAP + gridW(cloud);
    const h = SITE_HEAD + contentH + arcBand(cloud) + summaryLines(cloud) * 15 + SITE_PAD;
    const box: Box = { x: MARGIN, y, w, h };
    const top = y + SITE_HEAD;
    infra.set('controller', { x: box.x + SITE_PAD, y: top, w: INFRA_W, h: INFRA_H });
    infra.set('relay', { x: box.x + SITE_PAD, y: top + INFRA_H + 10, w: INFRA_W, h: INFRA_H });
    cloudBox = { ...box, site: cloud, nodes: placeNodes(cloud, box.x + SITE_PAD + INFRA_W + NODE_GAP, top), arcBand: arcBand(cloud) };
    siteBoxes.push(cloudBox);
    y += h;
  }

  // the wan and the edge sites, in rows no wider than the cloud (or 1400 px)
  const wanY = y + 26;
  const edgeW = (s: LabSvgSite) => Math.max(gridW(s) + 2 * SITE_PAD, textWidth(routerLabel(s), 10) + 24, 170);
  const maxRow = Math.max(cloudBox ? cloudBox.w : 0, 1400);
  const rows: LabSvgSite[][] = [];
  for (const s of edges) {
    const row = rows.at(-1);
    const rowW = (r: LabSvgSite[]) => r.reduce((sum, x) => sum + edgeW(x) + SITE_GAP, 0);
    if (row && (perNode || rowW(row) + edgeW(s) <= maxRow)) row.push(s);
    else rows.push([s]);
  }
  let rowTop = wanY + 16;
  let rowsBottom = wanY;
  const wanLines: { y: number; right: number }[] = [];
  for (const row of rows) {
    const rowWan = rowTop - 16;
    let x = MARGIN;
    let rowH = 0;
    for (const s of row) {
      const w = edgeW(s);
      const router: Box = { x: x + w / 2 - Math.min(w, 200) / 2, y: rowTop, w: Math.min(w, 200), h: ROUTER_H };
      const siteTop = rowTop + ROUTER_H + 14;
      const h = SITE_HEAD + gridH(s) + arcBand(s) + summaryLines(s) * 15 + SITE_PAD;
      const gx = x + (w - gridW(s)) / 2;
      siteBoxes.push({ x, y: siteTop, w, h, site: s, router, nodes: placeNodes(s, gx, siteTop + SITE_HEAD), arcBand: arcBand(s), wanY: rowWan });
      rowH = Math.max(rowH, ROUTER_H + 14 + h);
      x += w + SITE_GAP;
    }
    wanLines.push({ y: rowWan, right: x - SITE_GAP });
    rowsBottom = rowTop + rowH;
    rowTop = rowsBottom + 40;
  }

  function placeNodes(site: LabSvgSite, x0: number, y0: number): NodeBox[] {
    const c = Math.max(1, cols(site));
    return site.nodes.map((node, i) => ({ node, x: x0 + (i % c) * (nodeW + NODE_GAP), y: y0 + Math.floor(i / c) * (nodeH + NODE_GAP), w: nodeW, h: nodeH }));
  }

  // links
  const nodeBoxes = new Map<string, Box>(siteBoxes.flatMap((s) => s.nodes.map((b) => [b.node.name, b] as const)));
  const slotBoxes = new Map<string, Box>([...nodeBoxes, ...[...infra].map(([k, b]) => [`@${k}`, b] as const), ...siteBoxes.flatMap((s) => (s.router ? [[`@router ${s.site.name}`, s.router] as const] : []))]);
  const slots = new Slots();
  const want = (name: string, side: 'top' | 'bottom', towardX: number) => slots.want(`${name}\n${side}`, towardX);
  const center = (name: string) => {
    const b = slotBoxes.get(name) as Box;
    return b.x + b.w / 2;
  };
  type Draw = (p: Map<number, Point>) => string;
  const draws: Draw[] = [];
  let bottomArcs = 0;
  const belowEdges = rowsBottom + 12;
  const stubbed = new Set<string>();
  if (cells && perNode) {
    for (const l of aggregateLinks(cells, nodeOrder)) {
      const sa = siteOfNode.get(l.a) as LabSvgSite;
      const sb = siteOfNode.get(l.b) as LabSvgSite;
      if (sa === sb) {
        const ia = want(l.a, 'bottom', center(l.b));
        const ib = want(l.b, 'bottom', center(l.a));
        const span = Math.abs(sa.nodes.findIndex((x) => x.name === l.a) - sa.nodes.findIndex((x) => x.name === l.b));
        draws.push((p) => {
          const [a, b] = [p.get(ia) as Point, p.get(ib) as Point];
          const d = arcDepth(span);
          return wire(`M${n(a.x)} ${n(a.y)} C${n(a.x)} ${n(a.y + d)} ${n(b.x)} ${n(b.y + d)} ${n(b.x)} ${n(b.y)}`, l);
        });
      } else if (sa.cloud || sb.cloud) {
        const [cn, en, es] = sa.cloud ? [l.a, l.b, sb] : [l.b, l.a, sa];
        draws.push(throughRouter(want(cn, 'bottom', center(en)), es, en, l));
      } else if (l.path === 'tunnel relayed') {
        draws.push(throughRouter(want('@relay', 'bottom', center(l.a)), sa, l.a, l, want('@relay', 'bottom', center(l.b)), sb, l.b));
      } else {
        // edge <-> edge: an arc below the edge sites
        const ia = want(l.a, 'bottom', center(l.b));
        const ib = want(l.b, 'bottom', center(l.a));
        const depth = 18 + 7 * bottomArcs++;
        draws.push((p) => {
          const [a, b] = [p.get(ia) as Point, p.get(ib) as Point];
          const low = belowEdges + depth;
          return wire(`M${n(a.x)} ${n(a.y)} C${n(a.x)} ${n(low + 10)} ${n(b.x)} ${n(low + 10)} ${n(b.x)} ${n(b.y)}`, l);
        });
      }
    }
  } else if (cells && cloud) {
    // per site pair: cloud <-> each edge through its router; other site pairs only when they failed
    const siteNames = input.sites.map((s) => s.name);
    for (const l of aggregateLinks(cells, siteNames, (x) => (siteOfNode.get(x) as LabSvgSite).name)) {
      const link = { ...l, a: `site ${l.a}`, b: `site ${l.b}` };
      if (l.a === cloud.name || l.b === cloud.name) {
        const es = input.sites.find((s) => s.name === (l.a === cloud.name ? l.b : l.a)) as LabSvgSite;
        // the router's stub from its row's wan line: lines from the cloud would cross the rows above
        const sb = siteBoxes.find((s) => s.site === es) as SiteBox;
        const r = sb.router as Box;
        stubbed.add(es.name);
        draws.push(() => wire(`M${n(r.x + r.w / 2)} ${n(sb.wanY ?? wanY)} L${n(r.x + r.w / 2)} ${n(r.y)}`, link));
      } else if (l.status === 'failed') {
        const ra = siteBoxes.find((s) => s.site.name === l.a)?.router as Box;
        const rb = siteBoxes.find((s) => s.site.name === l.b)?.router as Box;
        draws.push(() => wire(`M${n(ra.x + ra.w / 2)} ${n(ra.y + ra.h / 2)} L${n(rb.x + rb.w / 2)} ${n(rb.y + rb.h / 2)}`, link));
      }
    }
  }

  /** From a point above (a cloud node or the relay) down through an edge router into an edge node; twice for relayed pairs. */
  function throughRouter(from: number, site: LabSvgSite, node: string, l: LabSvgLink, from2?: number, site2?: LabSvgSite, node2?: string): Draw {
    const leg = (start: number, s: LabSvgSite, nodeName: string) => {
      const rkey = `@router ${s.name}`;
      const rt = want(rkey, 'top', center(nodeName));
      const rb = want(rkey, 'bottom', center(nodeName));
      const end = want(nodeName, 'top', center(rkey));
      return (p: Map<number, Point>) => {
        const [a, t, b, e] = [p.get(start), p.get(rt), p.get(rb), p.get(end)] as Point[] as [Point, Point, Point, Point];
        const k1 = (t.y - a.y) / 2;
        const k2 = (e.y - b.y) / 2;
        return `M${n(a.x)} ${n(a.y)} C${n(a.x)} ${n(a.y + k1)} ${n(t.x)} ${n(t.y - k1)} ${n(t.x)} ${n(t.y)} L${n(b.x)} ${n(b.y)} C${n(b.x)} ${n(b.y + k2)} ${n(e.x)} ${n(e.y - k2)} ${n(e.x)} ${n(e.y)}`;
      };
    };
    const first = leg(from, site, node);
    const second = from2 !== undefined && site2 && node2 ? leg(from2, site2, node2) : undefined;
    return (p) => wire(second ? `${first(p)} ${second(p)}` : first(p), l);
  }

  const points = slots.resolve(slotBoxes);
  // failed pairs last, so that no other line hides them
  const wires = draws.map((d) => d(points));
  layers.links.push(...wires.filter((w) => !w.includes(' failed"')), ...wires.filter((w) => w.includes(' failed"')));
  const arcsBottom = bottomArcs > 0 ? belowEdges + 18 + 7 * (bottomArcs - 1) + 10 : rowsBottom;

  // boxes: sites, routers, infra, nodes, pods
  if (edges.length > 0) {
    const wanRight = Math.max(MARGIN + 300, cloudBox ? cloudBox.x + cloudBox.w : 0, ...siteBoxes.map((s) => s.x + s.w));
    const trunk = MARGIN / 2;
    for (const [i, w] of wanLines.entries()) layers.sites.push(`<line x1="${i === 0 ? MARGIN : trunk}" y1="${n(w.y)}" x2="${n(i === 0 ? wanRight : w.right)}" y2="${n(w.y)}" stroke="#90a4ae" stroke-width="3"/>`);
    if (wanLines.length > 1) layers.sites.push(`<path d="M${MARGIN} ${n(wanY)} H${trunk} V${n((wanLines.at(-1) as { y: number }).y)}" fill="none" stroke="#90a4ae" stroke-width="3"/>`);
    layers.boxes.push(text(MARGIN, wanY - 6, 'wan (the internet, 198.51.100.0/24)', { size: 10, fill: '#607d8b', halo: '#ffffff' }));
  }
  for (const s of siteBoxes) {
    const bg = s.site.cloud ? '#e3f2fd' : '#fff8e1';
    layers.sites.push(rect(s, { fill: bg, stroke: s.site.cloud ? '#64b5f6' : '#ffb74d', width: 1.5, rx: 10 }));
    const label = s.site.cloud ? `${s.site.name}: public addresses` : `edge ${s.site.name}: ${s.site.community ? `community ${s.site.community}` : 'no community'}`;
    layers.boxes.push(text(s.x + SITE_PAD, s.y + 17, fit(label, s.w - 2 * SITE_PAD, 12), { size: 12, weight: 'bold', fill: s.site.cloud ? '#0d47a1' : '#e65100', halo: bg }));
    if (s.router) {
      const r = s.router;
      if (!stubbed.has(s.site.name)) layers.sites.push(`<line x1="${n(r.x + r.w / 2)}" y1="${n(s.wanY ?? wanY)}" x2="${n(r.x + r.w / 2)}" y2="${n(r.y)}" stroke="#90a4ae" stroke-width="2"/>`);
      layers.sites.push(`<line x1="${n(r.x + r.w / 2)}" y1="${n(r.y + r.h)}" x2="${n(r.x + r.w / 2)}" y2="${n(s.y)}" stroke="#90a4ae" stroke-width="2"/>`);
      layers.boxes.push(rect(r, { fill: '#eceff1', stroke: '#546e7a', rx: 4, title: `${s.site.name}-router ${s.site.routerAddress ?? ''}: NAT ${s.site.nat ?? ''}` }));
      layers.boxes.push(text(r.x + r.w / 2, r.y + 14, fit(`${s.site.name}-router ${s.site.routerAddress ?? ''}`.trim(), r.w - 8, 11), { size: 11, weight: 'bold', anchor: 'middle' }));
      layers.boxes.push(text(r.x + r.w / 2, r.y + 27, fit(routerLabel(s.site), r.w - 8, 10), { size: 10, fill: '#455a64', anchor: 'middle' }));
    }
    if (cells && !perNode) layers.boxes.push(...siteSummary(s));
    for (const b of s.nodes) layers.boxes.push(...drawNode(b));
  }
  for (const [k, b] of infra) {
    const isRelay = k === 'relay';
    if (isRelay && !input.relay) continue;
    const addr = isRelay ? (input.relay?.address ?? '') : (input.controller ?? '');
    const tip = isRelay ? `relay ${addr}: carries edge <-> edge tunnels that cannot punch through (a symmetric NAT on the way)` : `controller ${addr}`;
    layers.boxes.push(rect(b, { fill: '#ffffff', stroke: isRelay ? PATH_STYLE['tunnel relayed'].color : '#1565c0', width: 1.5, rx: 4, title: tip }));
    layers.boxes.push(text(b.x + 8, b.y + 14, fit(isRelay ? 'relay' : 'controller', b.w - 16, 11), { size: 11, weight: 'bold' }));
    layers.boxes.push(text(b.x + 8, b.y + 27, fit(addr, b.w - 16, 10), { size: 10, fill: '#616161' }));
  }

  function drawNode(b: NodeBox): string[] {
    const x = b.node;
    const bad = failedNodes.has(x.name);
    const same = sameNode.get(x.name);
    const sameNote = same ? `; same node: ${same.filter((c) => c.verdict === 'ok').length}/${same.length} cells ok` : '';
    const parts = [rect(b, { fill: '#ffffff', stroke: bad ? FAIL_COLOR : '#78909c', width: bad ? 2.5 : 1, rx: 5, title: `node ${x.name}${x.address ? ` (${x.address})` : ''}, ${x.pods.length} pods${sameNote}` })];
    parts.push(text(b.x + 8, b.y + 15, fit(x.name, b.w - 16, 12), { size: 12, weight: 'bold' }));
    const right = `${x.address ?? ''}${listPods ? '' : `  ${x.pods.length} pods`}`;
    if (right.trim()) parts.push(text(b.x + b.w - 8, b.y + 15, right.trim(), { size: 10, fill: '#616161', anchor: 'end' }));
    x.pods.forEach((p, i) => {
      const fill = !cells ? IDLE_POD : failedPods.has(p.name) ? FAIL_COLOR : OK_POD;
      const tip = `<title>pod ${escapeXml(podLabel(p).replace('  ', ' '))}</title>`;
      if (listPods) {
        const cy = b.y + NODE_HEAD + i * POD_ROW + 8;
        parts.push(`<circle class="pod" cx="${n(b.x + 14)}" cy="${n(cy)}" r="4.5" fill="${fill}">${tip}</circle>`);
        parts.push(text(b.x + 24, cy + 3.5, fit(podLabel(p), b.w - 32, 10), { size: 10, fill: '#37474f' }));
      } else {
        const cx = b.x + 8 + (i % dotsPerRow) * DOT + DOT / 2;
        const cy = b.y + NODE_HEAD + Math.floor(i / dotsPerRow) * DOT + DOT / 2;
        parts.push(`<circle class="pod" cx="${n(cx)}" cy="${n(cy)}" r="4" fill="${fill}">${tip}</circle>`);
      }
    });
    return parts;
  }

  /** Bigger labs: what the lines no longer show, as text at the bottom of each site box. */
  function siteSummary(s: SiteBox): string[] {
    const names = new Set(s.site.nodes.map((x) => x.name));
    const inside = (cells ?? []).filter((c) => names.has(c.fromNode) && names.has(c.toNode) && c.fromNode !== c.toNode);
    const others = (cells ?? []).filter((c) => names.has(c.fromNode) && !names.has(c.toNode) && !(siteOfNode.get(c.toNode) as LabSvgSite).cloud);
    const toCloud = (cells ?? []).filter((c) => names.has(c.fromNode) && (siteOfNode.get(c.toNode) as LabSvgSite).cloud);
    const line = (label: string, of: readonly LabSvgCell[]) => {
      if (of.length === 0) return `${label}: none`;
      const byPath = PATH_ORDER.filter((p) => of.some((c) => c.path === p)).map((p) => `${p} ${verdictCounts(of.filter((x) => x.path === p)).join(', ')}`);
      return `${label}: ${byPath.join('; ')}`;
    };
    const groups: [string, readonly LabSvgCell[]][] = s.site.cloud ? [['in the site', inside]] : [['to the cloud', toCloud], ['in the site', inside], ['to other edges', others]];
    const y0 = s.y + s.h - SITE_PAD - groups.length * 15 + 11;
    return groups.map(([label, of], i) => text(s.x + SITE_PAD, y0 + 15 * i, fit(line(label, of), s.w - 2 * SITE_PAD, 10), { size: 10, fill: of.some((c) => c.verdict === 'FAIL') ? FAIL_COLOR : '#37474f' }));
  }

  // legend and failures
  let ly = arcsBottom + (bottomArcs > 0 ? 20 : 36);
  const legend: string[] = [text(MARGIN, ly, cells ? (perNode ? 'Paths (one line per node pair, all pod pairs in both directions)' : 'Paths (cloud <-> edge: the line from the wan to each edge router; the rest summed up in each site)') : 'Paths (not checked)', { size: 12, weight: 'bold' })];
  ly += 8;
  const present = new Set((cells ?? []).map((c) => c.path));
  for (const p of PATH_ORDER) {
    ly += 18;
    const st = PATH_STYLE[p];
    const of = (cells ?? []).filter((c) => c.path === p);
    const stats = !cells ? '' : of.length === 0 ? ': none in this lab' : `: ${legendStats(of)}`;
    if (p === 'same node') {
      legend.push(`<circle cx="${MARGIN + 10}" cy="${ly - 4}" r="4.5" fill="${OK_POD}"/><circle cx="${MARGIN + 30}" cy="${ly - 4}" r="4.5" fill="${OK_POD}"/>`);
    } else {
      legend.push(`<line class="legend ${p.replace(/ /g, '-')}" x1="${MARGIN}" y1="${ly - 4}" x2="${MARGIN + 40}" y2="${ly - 4}" stroke="${st.color}" stroke-width="2"${st.dash ? ` stroke-dasharray="${st.dash}"` : ''}/>`);
    }
    legend.push(text(MARGIN + 50, ly, `${st.label}${stats}`, { size: 11, fill: present.has(p) || !cells ? '#212121' : '#9e9e9e' }));
  }
  ly += 22;
  legend.push(`<line x1="${MARGIN}" y1="${ly - 4}" x2="${MARGIN + 40}" y2="${ly - 4}" stroke="${FAIL_COLOR}" stroke-width="3"/>`,
    text(MARGIN + 50, ly, 'red: a pair (node, pod) with a failed cell;  pods: green checked, grey not checked', { size: 11 }));
  const failed = cells ? aggregateLinks(cells.filter((c) => c.verdict === 'FAIL'), nodeOrder) : [];
  const failedSame = [...sameNode].filter(([, c]) => c.some((x) => x.verdict === 'FAIL'));
  if (failed.length + failedSame.length > 0) {
    ly += 26;
    legend.push(text(MARGIN, ly, 'Failed', { size: 12, weight: 'bold', fill: FAIL_COLOR }));
    const lines = [...failedSame.map(([node, c]) => `${node} (same node): ${c.filter((x) => x.verdict === 'FAIL').length} cells FAIL`), ...failed.map((l) => `${l.a} <-> ${l.b} (${l.path}): ${l.failed} cells FAIL`)];
    const shown = lines.length > 12 ? [...lines.slice(0, 11), `... and ${lines.length - 11} more node pairs (see the terminal or --json)`] : lines;
    for (const l of shown) {
      ly += 16;
      legend.push(text(MARGIN + 10, ly, l, { size: 11, fill: FAIL_COLOR }));
    }
  }
  const height = ly + MARGIN;
  const width = Math.max(MARGIN * 2 + 820, textWidth(title, 17) + 2 * MARGIN, ...siteBoxes.map((s) => s.x + s.w + MARGIN));
  description.forEach((line, i) => head.push(text(MARGIN, descriptionY + 16 * i, fit(line, width - 2 * MARGIN, 11), { size: 11, fill: '#616161' })));

  out.push('<?xml version="1.0" encoding="UTF-8"?>');
  out.push(`<svg xmlns="http://www.w3.org/2000/svg" width="${n(width)}" height="${n(height)}" viewBox="0 0 ${n(width)} ${n(height)}" ${FONT}>`);
  out.push(`<title>${escapeXml(title)}</title>`);
  out.push(`<rect x="0" y="0" width="${n(width)}" height="${n(height)}" fill="#ffffff"/>`);
  out.push(...head, '<g class="sites">', ...layers.sites, '</g>', '<g class="links">', ...layers.links, '</g>', '<g class="boxes">', ...layers.boxes, '</g>', '<g class="legend">', ...legend, '</g>', '</svg>', '');
  return out.join('\n');
}

/** Text cut into lines of at most `max` characters at `; ` (a part longer than that stays whole), at most 3 lines. */
function wrap(s: string, max: number): string[] {
  const lines: string[] = [];
  for (const part of s ? s.split('; ') : []) {
    const last = lines.at(-1);
    if (last !== undefined && last.length + 2 + part.length <= max) lines[lines.length - 1] = `${last}; ${part}`;
    else lines.push(part);
  }
  return lines.length > 3 ? [...lines.slice(0, 2), `${lines.slice(2).join('; ').slice(0, max - 1)}…`] : lines;
}

function routerLabel(s: LabSvgSite): string {
  return s.nat === 'symmetric' ? 'symmetric NAT' : s.nat ? 'endpoint-independent NAT' : 'NAT';
}

/**
 * E.g. `116/116 cells ok, 0 FAIL, 16 blocked as expected`, as the terminal counts: ok of the cells that should work,
 * every failed cell, and the forbidden cells that are blocked (that part only when the lab has forbidden pairs).
 */
function verdictLine(cells: readonly LabSvgCell[]): string {
  const count = (v: CellVerdict) => cells.filter((c) => c.verdict === v).length;
  const allowed = cells.filter((c) => expectationOf(c.path) === 'reachable').length;
  const parts = [`${count('ok')}/${allowed} cells ok`, `${count('FAIL')} FAIL`];
  if (allowed < cells.length) parts.push(`${count('blocked as expected')} blocked as expected`);
  return parts.join(', ');
}

/** The non-zero counts of `of` by outcome, e.g. `['62 ok', '2 FAIL']`. */
function verdictCounts(of: readonly LabSvgCell[]): string[] {
  const verdicts: readonly CellVerdict[] = ['ok', 'FAIL', 'blocked as expected'];
  return verdicts.map((v) => [of.filter((c) => c.verdict === v).length, v] as const).filter(([k]) => k > 0).map(([k, v]) => `${k} ${v}`);
}

function legendStats(of: readonly LabSvgCell[]): string {
  const m = median(of.flatMap((c) => (c.verdict === 'ok' && c.ping?.rttMs !== undefined ? [c.ping.rttMs] : [])));
  return `${[`${of.length} cells`, ...verdictCounts(of)].join(', ')}${m !== undefined ? `; median ping ${formatMs(m)} ms` : ''}`;
}
