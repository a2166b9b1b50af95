/**
 * Layout of the lab picture: where the title's lines, the cloud site (controller, relay, nodes), the wan and the rows of
 * edge sites (router above, nodes inside) go. Every node box has one size, wide enough for the longest label. Pure.
 */
import { type Box, textWidth } from './draw.ts';
import { type LabSvgInput, type LabSvgNode, type LabSvgSite, NODE_LINK_LIMITS, podLabel, POD_LIST_LIMIT, routerLabel } from './model.ts';

export const MARGIN = 20;
const NODE_GAP = 22;
export const SITE_PAD = 12;
const SITE_HEAD = 24;
const SITE_GAP = 28;
export const NODE_HEAD = 22;
export const POD_ROW = 15;
export const DOT = 11;
const INFRA_W = 170;
const INFRA_H = 34;
const ROUTER_H = 34;

export interface NodeBox extends Box { readonly node: LabSvgNode }
export interface SiteBox extends Box { readonly site: LabSvgSite; readonly nodes: readonly NodeBox[]; readonly router?: Box; readonly arcBand: number; /** Its row's wan line. */ readonly wanY?: number }

export interface LabSvgLayout {
  /** One line per node pair (a small lab with cells); else lines per site pair and a summary in each site. */
  readonly perNode: boolean;
  /** Nodes list their pods with name and IP; else pods are dots, `dotsPerRow` to a row. */
  readonly listPods: boolean;
  readonly dotsPerRow: number;
  /** The description under the title, in lines, and the baseline of the first. */
  readonly description: readonly string[];
  readonly descriptionY: number;
  /** The cloud site first (when there is one), then the edge sites row by row. */
  readonly sites: readonly SiteBox[];
  readonly cloud?: SiteBox;
  /** The controller's and the relay's boxes in the cloud site, by name. */
  readonly infra: ReadonlyMap<string, Box>;
  /** The first row's wan line, and every row's line with its right end. */
  readonly wanY: number;
  readonly wanLines: readonly { readonly y: number; readonly right: number }[];
  /** The bottom of the last row of edge sites (the wan line's height without edge sites). */
  readonly rowsBottom: number;
}

/** How deep the arc between two nodes of one row goes, by their distance in columns. */
export const arcDepth = (span: number): number => 16 + 12 * (span - 1);

/** Places everything but the links and the legend. */
export function layoutLab(input: LabSvgInput): LabSvgLayout {
  const cells = input.cells;
  const cloud = input.sites.find((s) => s.cloud);
  const edges = input.sites.filter((s) => !s.cloud);
  const allNodes = input.sites.flatMap((s) => s.nodes);
  const perNode = cells !== undefined && allNodes.length <= NODE_LINK_LIMITS.nodes && (cloud?.nodes.length ?? 0) <= NODE_LINK_LIMITS.cloudNodes
    && edges.length <= NODE_LINK_LIMITS.edgeSites && edges.every((s) => s.nodes.length <= NODE_LINK_LIMITS.nodesPerEdgeSite);
  const maxPods = Math.max(1, ...allNodes.map((x) => x.pods.length));
  const listPods = maxPods <= POD_LIST_LIMIT;

  // node size: the same for every node, wide enough for its longest label
  const headLabel = (x: LabSvgNode) => `${x.name}  ${x.address ?? ''}${listPods ? '' : `  ${x.pods.length} pods`}`;
  const nodeW = Math.min(260, Math.max(150, ...allNodes.map((x) => textWidth(headLabel(x), 11) + 16), ...(listPods ? allNodes.flatMap((x) => x.pods.map((p) => textWidth(podLabel(p), 10) + 34)) : [])));
  const dotsPerRow = Math.floor((nodeW - 16) / DOT);
  const nodeH = NODE_HEAD + (listPods ? maxPods * POD_ROW : Math.ceil(maxPods / dotsPerRow) * DOT) + 8;

  const cols = (site: LabSvgSite) => Math.min(site.nodes.length, site.cloud ? 8 : 4);
  const gridW = (site: LabSvgSite) => Math.max(1, cols(site)) * nodeW + Math.max(0, cols(site) - 1) * NODE_GAP;
  const gridH = (site: LabSvgSite) => Math.ceil(site.nodes.length / Math.max(1, cols(site))) * (nodeH + NODE_GAP) - NODE_GAP;
  // arcs of same-site pairs below a single row of nodes: depth grows with the distance in columns
  const arcBand = (site: LabSvgSite) => (perNode && site.nodes.length > 1 ? Math.round(arcDepth(site.nodes.length - 1) * 0.75) + 8 : 0);
  const summaryLines = (site: LabSvgSite) => (cells && !perNode ? (site.cloud ? 1 : 3) : 0);
  const placeNodes = (site: LabSvgSite, x0: number, y0: number): NodeBox[] => {
    const c = Math.max(1, cols(site));
    return site.nodes.map((node, i) => ({ node, x: x0 + (i % c) * (nodeW + NODE_GAP), y: y0 + Math.floor(i / c) * (nodeH + NODE_GAP), w: nodeW, h: nodeH }));
  };

  // title
  let y = MARGIN;
  y += 22;
  const descriptionY = y + 14;
  const description = wrap(input.description ?? '', 120);
  y += 16 * description.length + 2;
  y += 16;

  // cloud site
  const sites: SiteBox[] = [];
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
    sites.push(cloudBox);
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
      sites.push({ x, y: siteTop, w, h, site: s, router, nodes: placeNodes(s, gx, siteTop + SITE_HEAD), arcBand: arcBand(s), wanY: rowWan });
      rowH = Math.max(rowH, ROUTER_H + 14 + h);
      x += w + SITE_GAP;
    }
    wanLines.push({ y: rowWan, right: x - SITE_GAP });
    rowsBottom = rowTop + rowH;
    rowTop = rowsBottom + 40;
  }
  return { perNode, listPods, dotsPerRow, description, descriptionY, sites, ...(cloudBox ? { cloud: cloudBox } : {}), infra, wanY, wanLines, rowsBottom };
}

/** The description's lines at most: the spec (up to two), the Kubernetes view, each fault's verdict (up to two). */
const DESCRIPTION_LINES = 5;

/**
 * Text cut into lines of at most `max` characters at `; `, a part longer than a line after its `, `; at most
 * {@link DESCRIPTION_LINES} lines, the rest cut off with an ellipsis.
 */
function wrap(s: string, max: number): string[] {
  const lines: string[] = [];
  for (const part of s ? s.split('; ') : []) {
    // a part too long for a line (the faults' verdicts) breaks after its commas
    const [head = '', ...rest] = part.length <= max ? [part] : part.split(', ');
    const last = lines.at(-1);
    if (last !== undefined && last.length + 2 + head.length <= max) lines[lines.length - 1] = `${last}; ${head}`;
    else lines.push(head);
    for (const piece of rest) {
      const cur = lines.at(-1) as string;
      if (cur.length + 2 + piece.length <= max) lines[lines.length - 1] = `${cur}, ${piece}`;
      else lines.splice(-1, 1, `${cur},`, piece);
    }
  }
  return lines.length > DESCRIPTION_LINES ? [...lines.slice(0, DESCRIPTION_LINES - 1), `${lines.slice(DESCRIPTION_LINES - 1).join(' ').slice(0, max - 1)}…`] : lines;
}
