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
 * from the relay in the cloud site down through both edge routers, hole-punched pairs (directly between the edges,
 * in UDP datagrams or, where UDP is off or blocked, a TLS stream: the legend says which) as arcs below the edge
 * sites. A pair with a failed cell is solid red, drawn over the others; a pair that is
 * not allowed is a faint grey dotted arc. Bigger labs (more than {@link NODE_LINK_LIMITS}) degrade: edge sites wrap
 * into rows, each row on its own wan line; cloud <-> edge is the line from the wan to each edge router (per site pair,
 * red when a cell failed); the rest is summed up as text in each site, with a red line between the routers of edge
 * site pairs that failed. Nodes with many pods show them as dots, names in tooltips.
 */
import { labChartEndpoints } from './kubernetes.ts';
import { describeLabSpec, labUsesUdp } from './spec.ts';
import type { LabPlan } from './plan.ts';
import { escapeXml, fit, n, text, textWidth } from './svg/draw.ts';
import { linkGeometry } from './svg/geometry.ts';
import { layoutLab, MARGIN } from './svg/layout.ts';
import { drawLegend, verdictLine } from './svg/legend.ts';
import type { LabSvgCell, LabSvgInput, LabSvgSite } from './svg/model.ts';
import { drawBoxes } from './svg/style.ts';

export { escapeXml } from './svg/draw.ts';
export {
  aggregateLinks, type LabSvgCell, type LabSvgInput, type LabSvgLink, type LabSvgNode, type LabSvgPod, type LabSvgSite, type LinkStatus, NODE_LINK_LIMITS, POD_LIST_LIMIT,
} from './svg/model.ts';
export { PATH_STYLE } from './svg/style.ts';

/** What the picture adds to the lab's description under the title. */
export interface LabSvgExtras {
  /**
   * With `--kubernetes`: the Kubernetes view in one line (kubernetesLine in ./kubernetes.ts). The controller and the
   * relay are then drawn at the addresses of the chart's pods (labChartEndpoints), not at the lab's own.
   */
  readonly kubernetes?: string;
  /** After `run`'s faults: each one's verdict, in a line of its own. */
  readonly faults?: readonly { readonly kind: string; readonly ok: boolean; readonly skipped?: string }[];
}

/**
 * The picture's input from a lab plan, the pods' addresses (and pods the plan does not place: `--kubernetes`'s
 * workloads, drawn on their nodes after the plan's), (after `run`) the cells, and the {@link LabSvgExtras}.
 */
export function labSvgInputOf(plan: LabPlan, pods: readonly { readonly name: string; readonly node: string; readonly ip?: string }[], cells?: readonly LabSvgCell[], extras: LabSvgExtras = {}): LabSvgInput {
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
      ...(edge?.udpBlocked ? { udpBlocked: true } : {}),
      nodes: plan.nodes.filter((n) => n.site === site).map((n) => ({
        name: n.name, address: n.underlay,
        pods: [
          ...plan.pods.filter((p) => p.node === n.name).map((p) => {
            const ip = pods.find((x) => x.name === p.name)?.ip;
            return { name: p.name, ...(ip ? { ip } : {}) };
          }),
          // pods the plan does not place (`--kubernetes`: the workloads' pods, where the scheduler put them)
          ...pods.filter((x) => x.node === n.name && !plan.pods.some((p) => p.name === x.name)).map((x) => ({ name: x.name, ...(x.ip ? { ip: x.ip } : {}) })),
        ],
      })),
    };
  });
  const chart = extras.kubernetes === undefined ? undefined : labChartEndpoints(plan);
  const description = [describeLabSpec(plan.spec), ...(extras.kubernetes ? [extras.kubernetes] : []), ...(extras.faults?.length ? [faultsLine(extras.faults)] : [])];
  return {
    runId: plan.runId, description: description.join('; '),
    controller: chart ? chart.controllers.join(', ') : plan.controller.url.replace(/^https:\/\//, ''),
    relay: { address: chart ? `${chart.relay.address} (${chart.relay.node})` : `${plan.relay.address}:${plan.relay.port}` }, sites, ...(cells ? { cells } : {}),
    tunnelUdp: labUsesUdp(plan.spec),
  };
}

/** `faults: a ok, b FAIL; 2 skipped`. */
function faultsLine(faults: NonNullable<LabSvgExtras['faults']>): string {
  const ran = faults.filter((f) => f.skipped === undefined);
  const skipped = faults.length - ran.length;
  return `faults: ${ran.map((f) => `${f.kind} ${f.ok ? 'ok' : 'FAIL'}`).join(', ') || 'none ran'}${skipped > 0 ? `; ${skipped} skipped` : ''}`;
}

const FONT = 'font-family="DejaVu Sans, Verdana, Arial, sans-serif"';

/**
 * The picture as an SVG document. Precondition: node and pod names are unique; the first site is the cloud (edge
 * sites alone are drawn too, without a cloud box). Deterministic. In phases: {@link layoutLab} places the boxes,
 * {@link linkGeometry} routes the links between them, {@link drawBoxes} styles the boxes, {@link drawLegend} writes
 * the legend below; the title and the document's size come last.
 */
export function renderLabSvg(input: LabSvgInput): string {
  const layout = layoutLab(input);
  const geometry = linkGeometry(input, layout);
  const { sites, boxes } = drawBoxes(input, layout, geometry.stubbed);
  const legend = drawLegend(input, layout, geometry);
  const title = `Atoll lab ${input.runId}: ${input.cells ? verdictLine(input.cells) : 'topology (no checks run)'}`;
  const height = legend.bottom + MARGIN;
  const width = Math.max(MARGIN * 2 + 820, textWidth(title, 17) + 2 * MARGIN, ...layout.sites.map((s) => s.x + s.w + MARGIN));
  const head = [
    text(MARGIN, MARGIN + 16, title, { size: 17, weight: 'bold' }),
    ...layout.description.map((line, i) => text(MARGIN, layout.descriptionY + 16 * i, fit(line, width - 2 * MARGIN, 11), { size: 11, fill: '#616161' })),
  ];
  return [
    '<?xml version="1.0" encoding="UTF-8"?>',
    `<svg xmlns="http://www.w3.org/2000/svg" width="${n(width)}" height="${n(height)}" viewBox="0 0 ${n(width)} ${n(height)}" ${FONT}>`,
    `<title>${escapeXml(title)}</title>`,
    `<rect x="0" y="0" width="${n(width)}" height="${n(height)}" fill="#ffffff"/>`,
    ...head, '<g class="sites">', ...sites, '</g>', '<g class="links">', ...geometry.wires, '</g>', '<g class="boxes">', ...boxes, '</g>', '<g class="legend">', ...legend.lines, '</g>', '</svg>', '',
  ].join('\n');
}
