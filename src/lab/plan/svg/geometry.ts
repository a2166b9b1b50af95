/**
 * Geometry of the lab picture's links: one path per node pair (or, in bigger labs, per site pair), where it starts and
 * ends on the boxes and how it bends: same-site pairs as arcs below their nodes, cloud <-> edge through the edge's
 * router, relayed pairs from the relay down through both routers, hole-punched pairs as arcs below the edge sites.
 * Endpoints on one box edge are spread so that lines do not start at one point. Pure.
 */
import { type Box, n, type Point } from './draw.ts';
import { arcDepth, type LabSvgLayout, type SiteBox } from './layout.ts';
import { aggregateLinks, type LabSvgInput, type LabSvgLink, type LabSvgSite, sitesByNode } from './model.ts';
import { wire } from './style.ts';

export interface LabSvgGeometry {
  /** The links as styled paths, failed ones last so that no other line hides them. */
  readonly wires: readonly string[];
  /** Edge sites whose router's line from the wan is a link (so not also drawn as a plain wan line). */
  readonly stubbed: ReadonlySet<string>;
  /** How many arcs run below the edge sites (hole-punched pairs). */
  readonly bottomArcs: number;
  /** The lowest point of the drawing above the legend. */
  readonly bottom: number;
}

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

type Draw = (p: Map<number, Point>) => string;

/** The links of `input.cells` on `layout`'s boxes (none without cells). */
export function linkGeometry(input: LabSvgInput, layout: LabSvgLayout): LabSvgGeometry {
  const cells = input.cells;
  const cloud = input.sites.find((s) => s.cloud);
  const nodeOrder = input.sites.flatMap((s) => s.nodes).map((x) => x.name);
  const siteOfNode = sitesByNode(input);
  const siteBoxes = layout.sites;
  const nodeBoxes = new Map<string, Box>(siteBoxes.flatMap((s) => s.nodes.map((b) => [b.node.name, b] as const)));
  const slotBoxes = new Map<string, Box>([...nodeBoxes, ...[...layout.infra].map(([k, b]) => [`@${k}`, b] as const), ...siteBoxes.flatMap((s) => (s.router ? [[`@router ${s.site.name}`, s.router] as const] : []))]);
  const slots = new Slots();
  const want = (name: string, side: 'top' | 'bottom', towardX: number) => slots.want(`${name}\n${side}`, towardX);
  const center = (name: string) => {
    const b = slotBoxes.get(name) as Box;
    return b.x + b.w / 2;
  };
  const draws: Draw[] = [];
  let bottomArcs = 0;
  const belowEdges = layout.rowsBottom + 12;
  const stubbed = new Set<string>();

  /** From a point above (a cloud node or the relay) down through an edge router into an edge node; twice for relayed pairs. */
  const throughRouter = (from: number, site: LabSvgSite, node: string, l: LabSvgLink, from2?: number, site2?: LabSvgSite, node2?: string): Draw => {
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
  };

  if (cells && layout.perNode) {
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
        draws.push(() => wire(`M${n(r.x + r.w / 2)} ${n(sb.wanY ?? layout.wanY)} L${n(r.x + r.w / 2)} ${n(r.y)}`, link));
      } else if (l.status === 'failed') {
        const ra = siteBoxes.find((s) => s.site.name === l.a)?.router as Box;
        const rb = siteBoxes.find((s) => s.site.name === l.b)?.router as Box;
        draws.push(() => wire(`M${n(ra.x + ra.w / 2)} ${n(ra.y + ra.h / 2)} L${n(rb.x + rb.w / 2)} ${n(rb.y + rb.h / 2)}`, link));
      }
    }
  }

  const points = slots.resolve(slotBoxes);
  const wires = draws.map((d) => d(points));
  return {
    wires: [...wires.filter((w) => !w.includes(' failed"')), ...wires.filter((w) => w.includes(' failed"'))],
    stubbed, bottomArcs, bottom: bottomArcs > 0 ? belowEdges + 18 + 7 * (bottomArcs - 1) + 10 : layout.rowsBottom,
  };
}
