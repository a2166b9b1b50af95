import { test } from 'node:test';
import assert from 'node:assert/strict';
import { aggregateLinks, escapeXml, labSvgInputOf, PATH_STYLE, renderLabSvg, type LabSvgCell, type LabSvgInput } from './svg.ts';
import { planLab, type LabPlan } from './plan.ts';
import { expectationOf, expectedPath, type LabPath } from './paths.ts';
import { DEFAULT_LAB_SPEC, type LabSpec } from './spec.ts';
import type { CellVerdict } from './report.ts';

const plan = (spec: LabSpec): LabPlan => planLab({ spec, runId: '0abc', dir: '/run/atoll-lab/0abc', bootstrapToken: 'bootstrap-token-0123456789', adminToken: 'admin-token-0123456789', relayToken: 'relay-token-0123456789' });
const podsOf = (p: LabPlan) => p.pods.map((x, i) => ({ name: x.name, node: x.node, ip: `10.100.${Math.floor(i / 60)}.${(i % 60) + 2}` }));

/** Every cell of `p` as the lab judges a healthy run: what should work works, what is not allowed is blocked. */
function cellsOf(p: LabPlan, fail: (from: string, to: string) => boolean = () => false): LabSvgCell[] {
  const pods = podsOf(p);
  return pods.flatMap((a) => pods.filter((b) => b !== a).map((b): LabSvgCell => {
    const path = expectedPath(p, a.node, b.node);
    const verdict: CellVerdict = fail(a.name, b.name) ? 'FAIL' : expectationOf(path) === 'reachable' ? 'ok' : 'blocked as expected';
    return { from: a.name, to: b.name, fromNode: a.node, toNode: b.node, path, verdict, ping: { rttMs: path === 'tunnel direct' ? 1.5 : 0.1 } };
  }));
}

/** A tiny XML check: tags nest and close, attribute values are quoted, no stray `<` or `&` in text. */
function assertWellFormed(svg: string): void {
  const body = svg.replace(/^<\?xml[^?]*\?>\n/, '');
  const stack: string[] = [];
  let i = 0;
  let root = 0;
  for (const m of body.matchAll(/<(\/?)([A-Za-z][\w:-]*)((?:\s+[\w:-]+="[^"<]*")*)\s*(\/?)>|<|&(?!(?:amp|lt|gt|quot|apos|#\d+);)/g)) {
    assert.ok(m[2], `stray "${m[0]}" at ${m.index}: ${body.slice((m.index ?? 0) - 40, (m.index ?? 0) + 40)}`);
    i = m.index ?? 0;
    if (m[1]) assert.equal(stack.pop(), m[2], `</${m[2]}> closes the wrong tag at ${i}`);
    else if (!m[4]) {
      if (stack.length === 0) root++;
      stack.push(m[2]);
    } else if (stack.length === 0) root++;
  }
  assert.deepEqual(stack, [], 'every opened tag is closed');
  assert.equal(root, 1, 'one root element');
  assert.match(body, /^<svg /);
}

const defaultPlan = plan(DEFAULT_LAB_SPEC);
const defaultInput = (cells?: LabSvgCell[]): LabSvgInput => labSvgInputOf(defaultPlan, podsOf(defaultPlan), cells);
const linksOf = (svg: string, kind: LabPath) => [...svg.matchAll(new RegExp(`<path class="link ${kind.replace(/ /g, '-')}( failed)?" d="([^"]*)" fill="none" stroke="([^"]*)" stroke-width="([^"]*)" stroke-opacity="([^"]*)"(?: stroke-dasharray="([^"]*)")?>`, 'g'))]
  .map((m) => ({ failed: m[1] !== undefined, d: m[2] as string, stroke: m[3], width: m[4], opacity: m[5], dash: m[6] ?? '' }));

interface Rect { x: number; y: number; w: number; h: number }
/** The box whose tooltip starts with `title` (a node: `node a-1 `, the relay: `relay `). */
function boxOf(svg: string, title: string): Rect {
  const m = new RegExp(`<rect x="([\\d.]+)" y="([\\d.]+)" width="([\\d.]+)" height="([\\d.]+)"[^>]*><title>${title.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}`).exec(svg);
  assert.ok(m, `a box titled ${title}`);
  return { x: Number(m[1]), y: Number(m[2]), w: Number(m[3]), h: Number(m[4]) };
}
/** The points where the pieces of a path start (after M) and where it ends (its last point). */
const startsOf = (d: string) => [...d.matchAll(/M([\d.]+) ([\d.]+)/g)].map((m) => ({ x: Number(m[1]), y: Number(m[2]) }));
function endOf(d: string): { x: number; y: number } {
  const nums = d.match(/[\d.]+/g) ?? [];
  return { x: Number(nums.at(-2)), y: Number(nums.at(-1)) };
}
const onBottom = (p: { x: number; y: number }, b: Rect) => p.y === b.y + b.h && p.x > b.x && p.x < b.x + b.w;
const onTop = (p: { x: number; y: number }, b: Rect) => p.y === b.y && p.x > b.x && p.x < b.x + b.w;
/** A lab whose edge b is behind a symmetric NAT (so a <-> b is relayed) and whose edge c has no community. */
const symmetricPlan = (sameSite: LabSpec['sameSite'] = 'vxlan') => plan({ ...DEFAULT_LAB_SPEC, sameSite, edges: [
  { name: 'a', nodes: 1, community: 'x', nat: 'endpoint-independent', uplink: {} }, { name: 'b', nodes: 1, community: 'x', nat: 'symmetric', uplink: {} },
  { name: 'c', nodes: 1, community: '', nat: 'endpoint-independent', uplink: {} }] });
const NOT_BUILT = /not built|no path yet|pending|faded|reachable before/;

test('svg of the default lab: well-formed, every node and pod with its IP, the relay with its address, the verdict in the title', () => {
  const svg = renderLabSvg(defaultInput(cellsOf(defaultPlan)));
  assertWellFormed(svg);
  for (const node of defaultPlan.nodes) assert.ok(svg.includes(`>${node.name}</text>`), `node ${node.name}`);
  for (const pod of podsOf(defaultPlan)) assert.ok(svg.includes(`>${pod.name}  ${pod.ip}</text>`), `pod ${pod.name}`);
  for (const r of ['a-router 198.51.100.11', 'b-router 198.51.100.12', 'endpoint-independent NAT', 'controller', '192.0.2.2:7443', 'relay', '192.0.2.2:8476']) {
    assert.ok(svg.includes(`>${r}</text>`), r);
  }
  assert.match(svg, /<title>Atoll lab 0abc: 132\/132 cells ok, 0 FAIL<\/title>/, 'every pair is allowed: no blocked count');
  assert.doesNotMatch(svg, NOT_BUILT);
  assert.doesNotMatch(svg, /<rect [^>]*stroke-dasharray/, 'no box is drawn as not there');
});

test('svg: one line per node pair, styled by path kind; hole-punched pairs as solid arcs between the edge nodes', () => {
  const svg = renderLabSvg(defaultInput(cellsOf(defaultPlan)));
  const vxlan = linksOf(svg, 'vxlan');
  const direct = linksOf(svg, 'tunnel direct');
  const punched = linksOf(svg, 'tunnel hole-punched');
  assert.equal(vxlan.length, 3, 'cloud-1/cloud-2, a-1/a-2, b-1/b-2');
  assert.equal(direct.length, 8, '2 cloud nodes x 4 edge nodes');
  assert.equal(punched.length, 4, '2 a nodes x 2 b nodes');
  assert.ok(vxlan.every((l) => l.stroke === PATH_STYLE.vxlan.color && l.dash === '' && !l.failed));
  assert.ok(direct.every((l) => l.stroke === PATH_STYLE['tunnel direct'].color && l.opacity === '0.9'));
  assert.ok(punched.every((l) => l.stroke === PATH_STYLE['tunnel hole-punched'].color && l.dash === '' && l.opacity === '0.9' && l.width === '2' && !l.failed));
  const a = ['a-1', 'a-2'].map((x) => boxOf(svg, `node ${x} (`));
  const b = ['b-1', 'b-2'].map((x) => boxOf(svg, `node ${x} (`));
  for (const l of punched) {
    const [from, to] = [startsOf(l.d), endOf(l.d)];
    assert.equal(from.length, 1, 'one arc, straight from node to node (not through a router or the relay)');
    assert.ok(a.some((x) => onBottom(from[0] as { x: number; y: number }, x)), `starts below an a node: ${l.d}`);
    assert.ok(b.some((x) => onBottom(to, x)), `ends below a b node: ${l.d}`);
  }
  assert.equal(linksOf(svg, 'tunnel relayed').length + linksOf(svg, 'not allowed').length, 0);
  assert.match(svg, />tunnel hole-punched \([^<]*\): 32 cells, 32 ok; median ping 0\.10 ms<\/text>/);
});

/** The legend's line of path kind `kind`: its label (what carries the pairs) and its counts. */
const legendLine = (svg: string, kind: LabPath) => new RegExp(`>(${kind} \\([^<]*\\))(?:: [^<]*)?</text>`).exec(svg)?.[1];

test('svg legend: direct and hole-punched pairs say what carries them, as the plan has it (datagram path on, off, or UDP blocked at a site)', () => {
  const on = renderLabSvg(defaultInput(cellsOf(defaultPlan)));
  assert.equal(legendLine(on, 'tunnel hole-punched'), 'tunnel hole-punched (edge &lt;-&gt; edge, directly through both NATs in UDP datagrams)');
  assert.equal(legendLine(on, 'tunnel direct'), 'tunnel direct (cloud &lt;-&gt; edge, through the NAT in UDP datagrams)');
  assert.equal(legendLine(on, 'tunnel relayed'), 'tunnel relayed (edge &lt;-&gt; edge through the relay: a symmetric NAT on the way)');
  assert.doesNotMatch(on, /stream/, 'no pair of the default lab is on a stream');
  assert.equal(legendLine(renderLabSvg(defaultInput()), 'tunnel hole-punched'), 'tunnel hole-punched (edge &lt;-&gt; edge, directly through both NATs in UDP datagrams)', 'lab up: from the sites');

  const off = plan({ ...DEFAULT_LAB_SPEC, tunnelUdp: false });
  const streams = renderLabSvg(labSvgInputOf(off, podsOf(off), cellsOf(off)));
  assert.equal(legendLine(streams, 'tunnel hole-punched'), 'tunnel hole-punched (edge &lt;-&gt; edge, directly through both NATs in a TLS stream)');
  assert.equal(legendLine(streams, 'tunnel direct'), 'tunnel direct (cloud &lt;-&gt; edge, through the NAT in a TLS stream)');

  const blocked = plan({ ...DEFAULT_LAB_SPEC, edges: DEFAULT_LAB_SPEC.edges.map((e) => (e.name === 'b' ? { ...e, udpBlocked: true } : e)) });
  const mixed = renderLabSvg(labSvgInputOf(blocked, podsOf(blocked), cellsOf(blocked)));
  assert.equal(legendLine(mixed, 'tunnel hole-punched'), 'tunnel hole-punched (edge &lt;-&gt; edge, directly through both NATs in a TLS stream)', 'every a <-> b pair has b on the way');
  assert.equal(legendLine(mixed, 'tunnel direct'), 'tunnel direct (cloud &lt;-&gt; edge, through the NAT in UDP datagrams, or a TLS stream where UDP is blocked)', 'a in datagrams, b on streams');

  const { tunnelUdp: _, ...unknown } = defaultInput(cellsOf(defaultPlan));
  assert.equal(legendLine(renderLabSvg(unknown), 'tunnel hole-punched'), 'tunnel hole-punched (edge &lt;-&gt; edge, directly through both NATs)', 'not known: not said');
});

test('svg: with a symmetric NAT, relayed pairs go from the relay through both routers; not-allowed pairs are faint grey dots', () => {
  const p = symmetricPlan('direct');
  const svg = renderLabSvg(labSvgInputOf(p, podsOf(p), cellsOf(p)));
  assertWellFormed(svg);
  // 10 pods, 90 cells; c's 2 pods and the 4 pods of a and b are not allowed to talk: 2 x 2 x 4 = 16 cells
  assert.match(svg, /<title>Atoll lab 0abc: 74\/74 cells ok, 0 FAIL, 16 blocked as expected<\/title>/);
  assert.doesNotMatch(svg, NOT_BUILT);
  assert.equal(linksOf(svg, 'direct route').length, 1);
  assert.ok(linksOf(svg, 'direct route').every((l) => l.stroke === PATH_STYLE['direct route'].color));
  assert.equal(linksOf(svg, 'tunnel hole-punched').length, 0, 'a <-> b cannot punch through b\'s symmetric NAT');
  const relayed = linksOf(svg, 'tunnel relayed');
  assert.equal(relayed.length, 1, 'a-1 <-> b-1');
  const [l] = relayed as [(typeof relayed)[number]];
  assert.ok(l.stroke === PATH_STYLE['tunnel relayed'].color && l.dash === PATH_STYLE['tunnel relayed'].dash && l.opacity === '0.9' && !l.failed);
  const relay = boxOf(svg, 'relay 192.0.2.2:8476');
  const starts = startsOf(l.d);
  assert.equal(starts.length, 2, 'two legs, one to each edge node');
  for (const start of starts) assert.ok(onBottom(start, relay), `both legs start at the relay: ${l.d}`);
  const legs = l.d.split(' M').map((x, i) => (i === 0 ? x : `M${x}`));
  assert.ok(onTop(endOf(legs[0] as string), boxOf(svg, 'node a-1 (')), 'the first leg ends at a-1');
  assert.ok(onTop(endOf(legs[1] as string), boxOf(svg, 'node b-1 (')), 'the second leg ends at b-1');
  for (const [leg, site] of [[legs[0], 'a'], [legs[1], 'b']] as const) {
    const router = boxOf(svg, `${site}-router `);
    assert.ok([...(leg as string).matchAll(/([\d.]+) ([\d.]+)/g)].some((m) => onTop({ x: Number(m[1]), y: Number(m[2]) }, router)), `through ${site}-router`);
  }
  const blocked = linksOf(svg, 'not allowed');
  assert.equal(blocked.length, 2, 'c to a and c to b');
  assert.ok(blocked.every((l) => l.stroke === PATH_STYLE['not allowed'].color && l.dash === '1 4' && Number(l.opacity) < 1 && Number(l.width) < 2));
  assert.match(svg, />tunnel relayed \([^<]*\): 8 cells, 8 ok; median ping 0\.10 ms<\/text>/);
  assert.match(svg, />not allowed \([^<]*\): 16 cells, 16 blocked as expected<\/text>/);
});

test('svg: a failed relayed pair and a forbidden pair that is reachable are solid red, drawn last, and counted', () => {
  const p = symmetricPlan();
  const svg = renderLabSvg(labSvgInputOf(p, podsOf(p), cellsOf(p, (from, to) => (from === 'a-1-p1' && to === 'b-1-p2') || (from === 'c-1-p1' && to === 'a-1-p1'))));
  assertWellFormed(svg);
  assert.match(svg, /<title>Atoll lab 0abc: 73\/74 cells ok, 2 FAIL, 15 blocked as expected<\/title>/);
  assert.deepEqual(linksOf(svg, 'tunnel relayed').map((l) => [l.failed, l.stroke, l.width, l.dash]), [[true, '#d32f2f', '3', '']]);
  assert.deepEqual(linksOf(svg, 'not allowed').map((l) => [l.failed, l.stroke]), [[false, PATH_STYLE['not allowed'].color], [true, '#d32f2f']], 'b-1 <-> c-1 blocked, then the failed a-1 <-> c-1');
  const links = svg.slice(svg.indexOf('<g class="links">'), svg.indexOf('<g class="boxes">'));
  assert.match(links, /failed"[^\n]*\n(<path class="link [^"]*failed"[^\n]*\n)*<\/g>/, 'the failed pairs come last');
  assert.match(svg, />a-1 &lt;-&gt; b-1 \(tunnel relayed\): 1 cells FAIL<\/text>/);
  assert.match(svg, />a-1 &lt;-&gt; c-1 \(not allowed\): 1 cells FAIL<\/text>/);
});

test('svg: a failed node pair is drawn red, its pods and nodes marked, and listed', () => {
  const svg = renderLabSvg(defaultInput(cellsOf(defaultPlan, (from, to) => from === 'cloud-2-p1' && to === 'b-2-p2')));
  assertWellFormed(svg);
  const direct = linksOf(svg, 'tunnel direct');
  assert.deepEqual(direct.filter((l) => l.failed).map((l) => [l.stroke, l.width]), [['#d32f2f', '3']]);
  assert.equal(direct.filter((l) => l.stroke === '#d32f2f').length, 1);
  assert.match(svg, /<title>cloud-2 &lt;-&gt; b-2: tunnel direct, 1 of 8 cells FAIL/);
  assert.match(svg, />cloud-2 &lt;-&gt; b-2 \(tunnel direct\): 1 cells FAIL<\/text>/);
  assert.match(svg, /<circle class="pod" [^>]*fill="#d32f2f"><title>pod b-2-p2 /);
  assert.match(svg, /<title>Atoll lab 0abc: 131\/132 cells ok, 1 FAIL<\/title>/);
});

test('svg: text is escaped for XML', () => {
  const input: LabSvgInput = {
    runId: '<&>', description: 'spec "quoted" & \'single\'', controller: 'ctl<1>',
    sites: [{ name: 'cl<oud>', cloud: true, nodes: [{ name: 'n<&>1', address: '192.0.2.11', pods: [{ name: 'p<&>"1', ip: '10.0.0.1' }] }] },
      { name: 'e&', cloud: false, community: 'c<>', nat: 'symmetric', routerAddress: '198.51.100.11', nodes: [{ name: 'e&-1', pods: [{ name: 'x>y' }] }] }],
    cells: [{ from: 'p<&>"1', to: 'x>y', fromNode: 'n<&>1', toNode: 'e&-1', path: 'tunnel direct', verdict: 'FAIL' }],
  };
  const svg = renderLabSvg(input);
  assertWellFormed(svg);
  assert.ok(svg.includes('>n&lt;&amp;&gt;1</text>'));
  assert.ok(svg.includes('p&lt;&amp;&gt;&quot;1  10.0.0.1'));
  assert.ok(svg.includes('Atoll lab &lt;&amp;&gt;:'));
  assert.ok(!svg.includes('n<&>1') && !svg.includes('x>y'));
  assert.equal(escapeXml(`<a href="x">&'`), '&lt;a href=&quot;x&quot;&gt;&amp;&apos;');
});

test('svg: deterministic, and topology only without cells (lab up)', () => {
  const cells = cellsOf(defaultPlan);
  assert.equal(renderLabSvg(defaultInput(cells)), renderLabSvg(defaultInput([...cells].reverse())));
  const up = renderLabSvg(defaultInput());
  assertWellFormed(up);
  assert.match(up, /topology \(no checks run\)/);
  assert.equal(linksOf(up, 'tunnel direct').length + linksOf(up, 'vxlan').length, 0);
  for (const pod of podsOf(defaultPlan)) assert.ok(up.includes(pod.name));
});

test('svg of a big lab: lines per site pair, pods as dots with their names in tooltips, a failed site pair red', () => {
  const edges = Array.from({ length: 26 }, (_, i) => ({ name: String.fromCharCode(97 + i), nodes: 3, community: i % 2 ? 'odd' : 'even', nat: 'endpoint-independent' as const, uplink: {} }));
  const p = plan({ cloudNodes: 4, edges, podsPerNode: 4, sameSite: 'vxlan' });
  const svg = renderLabSvg(labSvgInputOf(p, podsOf(p), cellsOf(p, (from, to) => from === 'a-1-p1' && to === 'c-2-p1')));
  assertWellFormed(svg);
  assert.equal(linksOf(svg, 'tunnel direct').length, 26, 'cloud to each edge site');
  assert.equal(linksOf(svg, 'tunnel hole-punched').filter((l) => l.failed).length, 1, 'the failed site pair a <-> c');
  assert.equal(linksOf(svg, 'vxlan').length, 0);
  for (const pod of p.pods) assert.ok(svg.includes(`>pod ${pod.name} `), pod.name);
  const width = Number(/<svg [^>]*width="([\d.]+)"/.exec(svg)?.[1]);
  assert.ok(width < 2000, `wraps edge sites into rows (width ${width})`);
  const many = plan({ cloudNodes: 2, edges: [edges[0] as (typeof edges)[number]], podsPerNode: 50, sameSite: 'vxlan' });
  const dots = renderLabSvg(labSvgInputOf(many, podsOf(many), cellsOf(many)));
  assertWellFormed(dots);
  assert.ok(!dots.includes('>cloud-1-p50  '), 'no pod list beyond the limit');
  assert.ok(dots.includes('<title>pod cloud-1-p50 '));
});

test('aggregateLinks: both directions of a node pair in one link, in node order, with the median RTT', () => {
  const cell = (from: string, to: string, verdict: CellVerdict, rttMs: number, path: LabPath = 'vxlan'): LabSvgCell => ({ from: `${from}-p`, to: `${to}-p`, fromNode: from, toNode: to, path, verdict, ping: { rttMs } });
  const links = aggregateLinks([cell('y', 'x', 'ok', 3), cell('x', 'y', 'ok', 1), cell('x', 'x', 'ok', 9), cell('z', 'x', 'FAIL', 100),
    cell('w', 'y', 'blocked as expected', 1, 'not allowed'), cell('y', 'w', 'blocked as expected', 1, 'not allowed')], ['x', 'y', 'z', 'w']);
  assert.deepEqual(links, [
    { a: 'x', b: 'y', path: 'vxlan', cells: 2, ok: 2, failed: 0, medianRttMs: 2, status: 'ok' },
    { a: 'x', b: 'z', path: 'vxlan', cells: 1, ok: 0, failed: 1, status: 'failed' },
    { a: 'y', b: 'w', path: 'not allowed', cells: 2, ok: 0, failed: 0, status: 'blocked' },
  ]);
});

test('with --kubernetes the picture carries the Kubernetes view under the title, and the controller and the relay where the chart runs them', () => {
  const p = planLab({ spec: DEFAULT_LAB_SPEC, runId: '0abc', dir: '/run/atoll-lab/0abc', bootstrapToken: 'b', adminToken: 'a', relayToken: 'r' });
  const svg = renderLabSvg(labSvgInputOf(p, [], undefined, { kubernetes: 'Kubernetes v1.34.4 at 192.0.2.2:6443: 6/6 Nodes Ready' }));
  assert.match(svg, /Kubernetes v1\.34\.4 at 192\.0\.2\.2:6443: 6\/6 Nodes Ready/);
  assert.ok(boxOf(svg, 'controller 192.0.2.11:7443, 192.0.2.12:7443'), 'a replica on each cloud node');
  assert.ok(boxOf(svg, 'relay 192.0.2.11:8476 (cloud-1)'));
  assert.ok(!svg.includes('192.0.2.2:7443') && !svg.includes('192.0.2.2:8476'), 'not the lab\'s own controller and relay, which do not run');
});

test('after the faults the picture says each one\'s verdict under the title', () => {
  const p = planLab({ spec: DEFAULT_LAB_SPEC, runId: '0abc', dir: '/run/atoll-lab/0abc', bootstrapToken: 'b', adminToken: 'a', relayToken: 'r' });
  const faults = [{ kind: 'controller-kill', ok: true, skipped: 'not here' }, { kind: 'pod-recreate', ok: true }, { kind: 'node-delete', ok: false }];
  assert.match(renderLabSvg(labSvgInputOf(p, [], [], { faults })), />faults: pod-recreate ok, node-delete FAIL; 1 skipped</);
  assert.ok(!renderLabSvg(labSvgInputOf(p, [], [])).includes('faults:'));
});

test('with --kubernetes the workloads\' pods are drawn on the nodes the scheduler put them on, after the plan\'s', () => {
  const p = planLab({ spec: DEFAULT_LAB_SPEC, runId: '0abc', dir: '/run/atoll-lab/0abc', bootstrapToken: 'b', adminToken: 'a', relayToken: 'r' });
  const input = labSvgInputOf(p, [{ name: 'lab-db-0', node: 'a-1', ip: '10.100.1.9' }, { name: 'cloud-1-p1', node: 'cloud-1', ip: '10.100.0.2' }]);
  const a1 = input.sites.flatMap((s) => s.nodes).find((n) => n.name === 'a-1');
  assert.deepEqual(a1?.pods.map((x) => x.name), [...p.pods.filter((x) => x.node === 'a-1').map((x) => x.name), 'lab-db-0']);
  assert.equal(a1?.pods.at(-1)?.ip, '10.100.1.9');
  assert.equal(input.sites.flatMap((s) => s.nodes).flatMap((n) => n.pods).filter((x) => x.name === 'cloud-1-p1').length, 1, 'a planned pod once');
  assert.match(renderLabSvg(input), /lab-db-0/);
});
