/**
 * The lab picture's words: the verdict line of the title, and the legend below the drawing (a line per path kind with
 * its counts and median ping, what red means, and the failed pairs). Pure.
 */
import { text } from './draw.ts';
import type { LabSvgGeometry } from './geometry.ts';
import { type LabSvgLayout, MARGIN } from './layout.ts';
import { aggregateLinks, cellsWithinNodes, type LabSvgCell, type LabSvgInput, verdictCounts } from './model.ts';
import { FAIL_COLOR, OK_POD, PATH_STYLE, pathLabel, type TunnelCarrier } from './style.ts';
import { type CellVerdict, formatMs, median, PATH_ORDER } from '../report.ts';
import { expectationOf, type LabPath } from '../paths.ts';

/**
 * E.g. `116/116 cells ok, 0 FAIL, 16 blocked as expected`, as the terminal counts: ok of the cells that should work,
 * every failed cell, and the forbidden cells that are blocked (that part only when the lab has forbidden pairs).
 */
export function verdictLine(cells: readonly LabSvgCell[]): string {
  const count = (v: CellVerdict) => cells.filter((c) => c.verdict === v).length;
  const allowed = cells.filter((c) => expectationOf(c.path) === 'reachable').length;
  const parts = [`${count('ok')}/${allowed} cells ok`, `${count('FAIL')} FAIL`];
  if (allowed < cells.length) parts.push(`${count('blocked as expected')} blocked as expected`);
  return parts.join(', ');
}

function legendStats(of: readonly LabSvgCell[]): string {
  const m = median(of.flatMap((c) => (c.verdict === 'ok' && c.ping?.rttMs !== undefined ? [c.ping.rttMs] : [])));
  return `${[`${of.length} cells`, ...verdictCounts(of)].join(', ')}${m !== undefined ? `; median ping ${formatMs(m)} ms` : ''}`;
}

/**
 * What carries the tunnel pairs of path kind `p` (only direct and hole-punched pairs differ): with the datagram path
 * on, UDP datagrams unless a node of the pair is in a site that blocks UDP, then its TLS stream. The pairs are those
 * of `of` (the cells of `p`), or before the checks every edge site's. Empty when `input` does not say.
 */
function carriersOf(input: LabSvgInput, p: LabPath, of: readonly LabSvgCell[]): Set<TunnelCarrier> {
  if ((p !== 'tunnel direct' && p !== 'tunnel hole-punched') || input.tunnelUdp === undefined) return new Set();
  if (!input.tunnelUdp) return new Set(['stream']);
  const blocked = new Set(input.sites.filter((s) => s.udpBlocked).flatMap((s) => s.nodes.map((x) => x.name)));
  if (input.cells) return new Set(of.map((c) => (blocked.has(c.fromNode) || blocked.has(c.toNode) ? 'stream' : 'udp')));
  return new Set(input.sites.filter((s) => !s.cloud).map((s) => (s.udpBlocked ? 'stream' : 'udp')));
}

/** The legend and the failed pairs, below `geometry`'s lowest point; `bottom` is the baseline of its last line. */
export function drawLegend(input: LabSvgInput, layout: LabSvgLayout, geometry: LabSvgGeometry): { lines: string[]; bottom: number } {
  const cells = input.cells;
  let ly = geometry.bottom + (geometry.bottomArcs > 0 ? 20 : 36);
  const legend: string[] = [text(MARGIN, ly, cells ? (layout.perNode ? 'Paths (one line per node pair, all pod pairs in both directions)' : 'Paths (cloud <-> edge: the line from the wan to each edge router; the rest summed up in each site)') : 'Paths (not checked)', { size: 12, weight: 'bold' })];
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
    legend.push(text(MARGIN + 50, ly, `${pathLabel(p, carriersOf(input, p, of))}${stats}`, { size: 11, fill: present.has(p) || !cells ? '#212121' : '#9e9e9e' }));
  }
  ly += 22;
  legend.push(`<line x1="${MARGIN}" y1="${ly - 4}" x2="${MARGIN + 40}" y2="${ly - 4}" stroke="${FAIL_COLOR}" stroke-width="3"/>`,
    text(MARGIN + 50, ly, 'red: a pair (node, pod) with a failed cell;  pods: green checked, grey not checked', { size: 11 }));
  const nodeOrder = input.sites.flatMap((s) => s.nodes).map((x) => x.name);
  const failed = cells ? aggregateLinks(cells.filter((c) => c.verdict === 'FAIL'), nodeOrder) : [];
  const failedSame = [...cellsWithinNodes(cells ?? [])].filter(([, c]) => c.some((x) => x.verdict === 'FAIL'));
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
  return { lines: legend, bottom: ly };
}
