import { test } from 'node:test';
import assert from 'node:assert/strict';
import { aggregateLinks, escapeXml, labSvgInputOf, PATH_STYLE, renderLabSvg, type LabSvgCell, type LabSvgInput } from './svg.ts';
import { expectationOf, expectedPath, planLab, type LabPath, type LabPlan } from './plan.ts';
import { DEFAULT_LAB_SPEC, type LabSpec } from './spec.ts';
import type { CellVerdict } from './report.ts';

const plan = (spec: LabSpec): LabPlan => planLab({ spec, runId: '0abc', dir: '/run/atoll-lab/0abc', bootstrapToken: 'bootstrap-token-0123456789', adminToken: 'admin-token-0123456789' });
const podsOf = (p: LabPlan) => p.pods.map((x, i) => ({ name: x.name, node: x.node, ip: `10.100.${Math.floor(i / 60)}.${(i % 60) + 2}` }));

/** Every cell of `p` as today's lab judges a healthy run: what should work works, the rest has no path or is blocked. */
function cellsOf(p: LabPlan, fail: (from: string, to: string) => boolean = () => false): LabSvgCell[] {
  const pods = podsOf(p);
  return pods.flatMap((a) => pods.filter((b) => b !== a).map((b): LabSvgCell => {
    const path = expectedPath(p, a.node, b.node);
    const e = expectationOf(path);
    const verdict: CellVerdict = fail(a.name, b.name) ? 'FAIL' : e === 'reachable' ? 'ok' : e === 'blocked' ? 'blocked as expected' : 'no path yet (hole punching/relay not built)';
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
const linksOf = (svg: string, kind: LabPath) => [...svg.matchAll(new RegExp(`<path class="link ${kind.replace(/ /g, '-')}( failed)?" d="[^"]*" fill="none" stroke="([^"]*)" stroke-width="([^"]*)" stroke-opacity="([^"]*)"(?: stroke-dasharray="([^"]*)")?>`, 'g'))]
  .map((m) => ({ failed: m[1] !== undefined, stroke: m[2], width: m[3], opacity: m[4], dash: m[5] ?? '' }));

test('svg of the default lab: well-formed, every node and pod with its IP, the verdict in the title', () => {
  const svg = renderLabSvg(defaultInput(cellsOf(defaultPlan)));
  assertWellFormed(svg);
  for (const node of defaultPlan.nodes) assert.ok(svg.includes(`>${node.name}</text>`), `node ${node.name}`);
  for (const pod of podsOf(defaultPlan)) assert.ok(svg.includes(`>${pod.name}  ${pod.ip}</text>`), `pod ${pod.name}`);
  for (const r of ['a-router 198.51.100.11', 'b-router 198.51.100.12', 'endpoint-independent NAT', 'controller', 'relay (not built yet)']) assert.ok(svg.includes(`>${r}</text>`), r);
  assert.match(svg, /<title>Atoll lab 0abc: 100\/132 cells ok, 0 FAIL, 32 no path yet<\/title>/);
});

test('svg: one line per node pair, styled by path kind; edge <-> edge not built yet is faded', () => {
  const svg = renderLabSvg(defaultInput(cellsOf(defaultPlan)));
  const vxlan = linksOf(svg, 'vxlan');
  const direct = linksOf(svg, 'tunnel direct');
  const punched = linksOf(svg, 'tunnel hole-punched');
  assert.equal(vxlan.length, 3, 'cloud-1/cloud-2, a-1/a-2, b-1/b-2');
  assert.equal(direct.length, 8, '2 cloud nodes x 4 edge nodes');
  assert.equal(punched.length, 4, '2 a nodes x 2 b nodes');
  assert.ok(vxlan.every((l) => l.stroke === PATH_STYLE.vxlan.color && l.dash === '' && !l.failed));
  assert.ok(direct.every((l) => l.stroke === PATH_STYLE['tunnel direct'].color && l.opacity === '0.9'));
  assert.ok(punched.every((l) => l.stroke === PATH_STYLE['tunnel hole-punched'].color && l.dash === '7 4' && l.opacity === '0.35'));
  assert.equal(linksOf(svg, 'tunnel relayed').length + linksOf(svg, 'not allowed').length, 0);
});

test('svg: relayed pairs go through the relay, not-allowed pairs are faint grey dots, same-site direct routes', () => {
  const p = plan({ ...DEFAULT_LAB_SPEC, sameSite: 'direct', edges: [
    { name: 'a', nodes: 1, community: 'x', nat: 'symmetric', uplink: {} }, { name: 'b', nodes: 1, community: 'x', nat: 'endpoint-independent', uplink: {} },
    { name: 'c', nodes: 1, community: '', nat: 'endpoint-independent', uplink: {} }] });
  const svg = renderLabSvg(labSvgInputOf(p, podsOf(p), cellsOf(p)));
  assertWellFormed(svg);
  assert.equal(linksOf(svg, 'direct route').length, 1);
  assert.ok(linksOf(svg, 'direct route').every((l) => l.stroke === PATH_STYLE['direct route'].color));
  const relayed = linksOf(svg, 'tunnel relayed');
  assert.equal(relayed.length, 1);
  assert.equal(relayed[0]?.dash, PATH_STYLE['tunnel relayed'].dash);
  const relay = /<rect x="([\d.]+)" y="([\d.]+)" width="([\d.]+)" height="([\d.]+)"[^>]*stroke-dasharray="4 3"/.exec(svg);
  assert.ok(relay, 'the relay box, dashed while not built');
  const relayBottom = Number(relay[2]) + Number(relay[4]);
  const d = /<path class="link tunnel-relayed" d="([^"]*)"/.exec(svg)?.[1] ?? '';
  assert.equal(d.match(/M/g)?.length, 2, 'two legs, one to each edge node');
  for (const start of d.matchAll(/M([\d.]+) ([\d.]+)/g)) {
    assert.equal(Number(start[2]), relayBottom, 'both legs start at the relay');
    assert.ok(Number(start[1]) > Number(relay[1]) && Number(start[1]) < Number(relay[1]) + Number(relay[3]));
  }
  const blocked = linksOf(svg, 'not allowed');
  assert.equal(blocked.length, 2, 'c to a and c to b');
  assert.ok(blocked.every((l) => l.stroke === PATH_STYLE['not allowed'].color && l.dash === '1 4' && Number(l.opacity) < 1));
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
  assert.match(svg, /100\/132|99\/132/);
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
  const cell = (from: string, to: string, verdict: CellVerdict, rttMs: number): LabSvgCell => ({ from: `${from}-p`, to: `${to}-p`, fromNode: from, toNode: to, path: 'vxlan', verdict, ping: { rttMs } });
  const links = aggregateLinks([cell('y', 'x', 'ok', 3), cell('x', 'y', 'ok', 1), cell('x', 'x', 'ok', 9), cell('z', 'x', 'FAIL', 100)], ['x', 'y', 'z']);
  assert.deepEqual(links, [
    { a: 'x', b: 'y', path: 'vxlan', cells: 2, ok: 2, failed: 0, medianRttMs: 2, status: 'ok' },
    { a: 'x', b: 'z', path: 'vxlan', cells: 1, ok: 0, failed: 1, status: 'failed' },
  ]);
});
