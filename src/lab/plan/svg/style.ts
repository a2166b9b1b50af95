/**
 * Style of the lab picture: the colour and dash of each path kind, how a link is stroked by its status, and the boxes
 * drawn over the links (sites, the wan, routers, controller and relay, nodes with their pods, and in bigger labs a
 * summary per site). Pure.
 */
import { escapeXml, fit, n, rect, text } from './draw.ts';
import { DOT, type LabSvgLayout, MARGIN, NODE_HEAD, type NodeBox, POD_ROW, SITE_PAD, type SiteBox } from './layout.ts';
import { cellsWithinNodes, type LabSvgCell, type LabSvgInput, type LabSvgLink, type LabSvgSite, podLabel, routerLabel, sitesByNode, verdictCounts } from './model.ts';
import { formatMs, PATH_ORDER } from '../report.ts';
import type { LabPath } from '../paths.ts';

/** Stroke of each path kind: colour and dash pattern ('' solid). */
export const PATH_STYLE: Readonly<Record<LabPath, { readonly color: string; readonly dash: string; readonly label: string }>> = Object.freeze({
  'same node': { color: '#2e7d32', dash: '', label: 'same node (pod bridge)' },
  vxlan: { color: '#1565c0', dash: '', label: 'VXLAN (same site)' },
  'direct route': { color: '#00897b', dash: '', label: 'direct route (same site)' },
  'tunnel direct': { color: '#6a1b9a', dash: '', label: 'tunnel direct (cloud <-> edge, through the NAT)' },
  'tunnel hole-punched': { color: '#ef6c00', dash: '', label: 'tunnel hole-punched (edge <-> edge, directly through both NATs)' },
  'tunnel relayed': { color: '#ad1457', dash: '10 3 2 3', label: 'tunnel relayed (edge <-> edge through the relay: a symmetric NAT on the way)' },
  'not allowed': { color: '#9e9e9e', dash: '1 4', label: 'not allowed (no common community)' },
});

/** What carries a tunnel pair's packets: UDP datagrams (the datagram path) or a TLS stream. */
export type TunnelCarrier = 'udp' | 'stream';

/**
 * The legend's label of path kind `p`: {@link PATH_STYLE}'s, and for direct and hole-punched tunnel pairs what carries
 * them (`carriers`, the carriers of the pairs drawn; empty: not known, not said). Relayed pairs are always streams.
 */
export function pathLabel(p: LabPath, carriers: ReadonlySet<TunnelCarrier>): string {
  const label = PATH_STYLE[p].label;
  if ((p !== 'tunnel direct' && p !== 'tunnel hole-punched') || carriers.size === 0) return label;
  const how = carriers.size > 1 ? 'in UDP datagrams, or a TLS stream where UDP is blocked' : carriers.has('udp') ? 'in UDP datagrams' : 'in a TLS stream';
  return `${label.slice(0, -1)} ${how})`;
}
export const FAIL_COLOR = '#d32f2f';
export const OK_POD = '#43a047';
const IDLE_POD = '#9e9e9e';

function describeLink(l: LabSvgLink): string {
  const rtt = l.medianRttMs !== undefined ? `, median ping ${formatMs(l.medianRttMs)} ms` : '';
  const what = l.status === 'failed' ? `${l.failed} of ${l.cells} cells FAIL` : l.status === 'blocked' ? `${l.cells} cells blocked as expected` : `${l.ok}/${l.cells} cells ok`;
  return `${l.a} <-> ${l.b}: ${l.path}, ${what}${rtt}`;
}

/** A link's path `d`, stroked as its path kind and status say, with its cells in the tooltip. */
export function wire(d: string, l: LabSvgLink): string {
  const style = PATH_STYLE[l.path];
  const failed = l.status === 'failed';
  const color = failed ? FAIL_COLOR : style.color;
  const width = failed ? 3 : l.status === 'blocked' ? 1.2 : 2;
  const opacity = l.status === 'blocked' ? 0.6 : 0.9;
  const dash = style.dash && !failed ? ` stroke-dasharray="${style.dash}"` : '';
  return `<path class="link ${l.path.replace(/ /g, '-')}${failed ? ' failed' : ''}" d="${d}" fill="none" stroke="${color}" stroke-width="${width}" stroke-opacity="${opacity}"${dash}><title>${escapeXml(describeLink(l))}</title></path>`;
}

/**
 * The boxes: `sites` goes below the links (site backgrounds, the wan and router lines), `boxes` above them (labels,
 * routers, controller and relay, nodes and pods). `stubbed` edge sites have their wan line drawn as a link.
 */
export function drawBoxes(input: LabSvgInput, layout: LabSvgLayout, stubbed: ReadonlySet<string>): { sites: string[]; boxes: string[] } {
  const cells = input.cells;
  const siteOfNode = sitesByNode(input);
  const failedPods = new Set((cells ?? []).filter((c) => c.verdict === 'FAIL').flatMap((c) => [c.from, c.to]));
  const failedNodes = new Set((cells ?? []).filter((c) => c.verdict === 'FAIL').flatMap((c) => [c.fromNode, c.toNode]));
  const sameNode = cellsWithinNodes(cells ?? []);
  const { listPods, wanY } = layout;
  const sites: string[] = [];
  const boxes: string[] = [];

  const drawNode = (b: NodeBox): string[] => {
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
        const cx = b.x + 8 + (i % layout.dotsPerRow) * DOT + DOT / 2;
        const cy = b.y + NODE_HEAD + Math.floor(i / layout.dotsPerRow) * DOT + DOT / 2;
        parts.push(`<circle class="pod" cx="${n(cx)}" cy="${n(cy)}" r="4" fill="${fill}">${tip}</circle>`);
      }
    });
    return parts;
  };

  /** Bigger labs: what the lines no longer show, as text at the bottom of each site box. */
  const siteSummary = (s: SiteBox): string[] => {
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
  };

  if (input.sites.some((s) => !s.cloud)) {
    const wanRight = Math.max(MARGIN + 300, layout.cloud ? layout.cloud.x + layout.cloud.w : 0, ...layout.sites.map((s) => s.x + s.w));
    const trunk = MARGIN / 2;
    for (const [i, w] of layout.wanLines.entries()) sites.push(`<line x1="${i === 0 ? MARGIN : trunk}" y1="${n(w.y)}" x2="${n(i === 0 ? wanRight : w.right)}" y2="${n(w.y)}" stroke="#90a4ae" stroke-width="3"/>`);
    if (layout.wanLines.length > 1) sites.push(`<path d="M${MARGIN} ${n(wanY)} H${trunk} V${n((layout.wanLines.at(-1) as { y: number }).y)}" fill="none" stroke="#90a4ae" stroke-width="3"/>`);
    boxes.push(text(MARGIN, wanY - 6, 'wan (the internet, 198.51.100.0/24)', { size: 10, fill: '#607d8b', halo: '#ffffff' }));
  }
  for (const s of layout.sites) {
    const bg = s.site.cloud ? '#e3f2fd' : '#fff8e1';
    sites.push(rect(s, { fill: bg, stroke: s.site.cloud ? '#64b5f6' : '#ffb74d', width: 1.5, rx: 10 }));
    const label = s.site.cloud ? `${s.site.name}: public addresses` : `edge ${s.site.name}: ${s.site.community ? `community ${s.site.community}` : 'no community'}`;
    boxes.push(text(s.x + SITE_PAD, s.y + 17, fit(label, s.w - 2 * SITE_PAD, 12), { size: 12, weight: 'bold', fill: s.site.cloud ? '#0d47a1' : '#e65100', halo: bg }));
    if (s.router) {
      const r = s.router;
      if (!stubbed.has(s.site.name)) sites.push(`<line x1="${n(r.x + r.w / 2)}" y1="${n(s.wanY ?? wanY)}" x2="${n(r.x + r.w / 2)}" y2="${n(r.y)}" stroke="#90a4ae" stroke-width="2"/>`);
      sites.push(`<line x1="${n(r.x + r.w / 2)}" y1="${n(r.y + r.h)}" x2="${n(r.x + r.w / 2)}" y2="${n(s.y)}" stroke="#90a4ae" stroke-width="2"/>`);
      boxes.push(rect(r, { fill: '#eceff1', stroke: '#546e7a', rx: 4, title: `${s.site.name}-router ${s.site.routerAddress ?? ''}: NAT ${s.site.nat ?? ''}` }));
      boxes.push(text(r.x + r.w / 2, r.y + 14, fit(`${s.site.name}-router ${s.site.routerAddress ?? ''}`.trim(), r.w - 8, 11), { size: 11, weight: 'bold', anchor: 'middle' }));
      boxes.push(text(r.x + r.w / 2, r.y + 27, fit(routerLabel(s.site), r.w - 8, 10), { size: 10, fill: '#455a64', anchor: 'middle' }));
    }
    if (cells && !layout.perNode) boxes.push(...siteSummary(s));
    for (const b of s.nodes) boxes.push(...drawNode(b));
  }
  for (const [k, b] of layout.infra) {
    const isRelay = k === 'relay';
    if (isRelay && !input.relay) continue;
    const addr = isRelay ? (input.relay?.address ?? '') : (input.controller ?? '');
    const tip = isRelay ? `relay ${addr}: carries edge <-> edge tunnels that cannot punch through (a symmetric NAT on the way)` : `controller ${addr}`;
    boxes.push(rect(b, { fill: '#ffffff', stroke: isRelay ? PATH_STYLE['tunnel relayed'].color : '#1565c0', width: 1.5, rx: 4, title: tip }));
    boxes.push(text(b.x + 8, b.y + 14, fit(isRelay ? 'relay' : 'controller', b.w - 16, 11), { size: 11, weight: 'bold' }));
    boxes.push(text(b.x + 8, b.y + 27, fit(addr, b.w - 16, 10), { size: 10, fill: '#616161' }));
  }
  return { sites, boxes };
}
