import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, writeFileSync } from 'node:fs';
import { agentConfigFor, interfaceNames, labPrefix, nodeContainerdSocket, nodeHostDirs, planLab, relayConfigFor, runIdOfNetns, type LabNode, type LabPlan } from './plan.ts';
import { classifyRoute, expectedPath } from './paths.ts';
import { natRuleset, renderLabSetup, uplinkQdiscLines } from './setup.ts';
import { DEFAULT_LAB_SPEC, describeLabSpec, labSpecProblems, type EdgeSiteSpec, type LabSpec } from './spec.ts';
import { judgeCell, renderFailures, renderMatrix, renderSummary, summarize, verdictOf, type LabCell } from './report.ts';

const GOLDEN = new URL('./testdata/small-lab.golden.txt', import.meta.url);
const edge = (name: string, over: Partial<EdgeSiteSpec> = {}): EdgeSiteSpec => ({ name, nodes: 2, community: 'edge', nat: 'endpoint-independent', uplink: {}, ...over });
const plan = (spec: LabSpec, runId = '0abc'): LabPlan =>
  planLab({ spec, runId, dir: `/run/atoll-lab/${runId}`, bootstrapToken: 'bootstrap-token-0123456789', adminToken: 'admin-token-0123456789', relayToken: 'relay-token-0123456789' });

function renderText(p: LabPlan): string {
  return renderLabSetup(p).flatMap((phase, i) => phase.map((s) => `# phase ${i}: ${s.tool} in ${s.netns ?? '(host)'}\n${s.lines.join('\n')}\n`)).join('');
}

test('the default spec: cloud 2 nodes, edge a and b with 2 nodes each in one community, 2 pods per node', () => {
  assert.deepEqual(labSpecProblems(DEFAULT_LAB_SPEC), []);
  const p = plan(DEFAULT_LAB_SPEC);
  assert.deepEqual(p.nodes.map((n) => `${n.name}@${n.underlay}`), ['cloud-1@192.0.2.11', 'cloud-2@192.0.2.12', 'a-1@172.16.1.11', 'a-2@172.16.1.12', 'b-1@172.16.2.11', 'b-2@172.16.2.12']);
  assert.equal(p.pods.length, 12);
  assert.equal(p.nat.length, 2);
  assert.equal(describeLabSpec(DEFAULT_LAB_SPEC),
    'cloud 2 nodes; edge a 2 nodes (NAT endpoint-independent, community edge); edge b 2 nodes (NAT endpoint-independent, community edge); 2 pods per node; same-site VXLAN');
});

test('small lab with a symmetric NAT, delay and rate: the rendered setup (golden)', () => {
  const p = plan({ cloudNodes: 1, podsPerNode: 1, sameSite: 'vxlan', edges: [edge('a', { nat: 'symmetric', uplink: { delayMs: 20, rateMbit: 100 } })] });
  const text = renderText(p);
  if (process.env.UPDATE_GOLDEN) writeFileSync(GOLDEN, text);
  assert.equal(text, readFileSync(GOLDEN, 'utf8'));
});

test('without netem: a delay line spliced into each delayed uplink (bridges, persistent TAP devices), tbf alone on the ends', () => {
  const spec: LabSpec = { cloudNodes: 1, podsPerNode: 1, sameSite: 'vxlan', edges: [edge('a', { uplink: { delayMs: 10, rateMbit: 1000 } }), edge('b', { uplink: { rateMbit: 1000 } })] };
  const p = planLab({ spec, runId: '0abc', dir: '/run/atoll-lab/0abc', bootstrapToken: 'bootstrap-token-0123456789', adminToken: 'admin-token-0123456789', relayToken: 'relay-token-0123456789', delayBy: 'delay-line' });
  const dly = `${labPrefix('0abc')}a-dly`;
  assert.deepEqual(p.delayLines.map((d) => [d.netns, d.delayMs, d.ports.map((x) => `${x.tap}@${x.bridge}`).join(' ')]), [[dly, 10, 'tapr@brr tapw@brw']]);
  assert.deepEqual(p.namespaces.filter((n) => n.role === 'delay').map((n) => n.name), [dly], 'only the delayed uplink gets one');
  const ends = (ifname: string, netns: string) => p.veths.find((v) => (v.a.ifname === ifname && v.a.netns === netns) || (v.b.ifname === ifname && v.b.netns === netns));
  assert.equal(ends('up0', `${labPrefix('0abc')}a-router`)?.a.netns, dly, "a's router reaches the wan through the delay namespace");
  assert.equal(ends('p-a', `${labPrefix('0abc')}wan`)?.b.netns, dly);
  assert.equal(ends('up0', `${labPrefix('0abc')}b-router`)?.a.netns, `${labPrefix('0abc')}wan`, "b's uplink is a plain veth");
  assert.ok(p.qdiscs.every((q) => q.tc.every((l) => !l.includes('netem'))), 'no netem anywhere');
  assert.equal(p.qdiscs.filter((q) => q.site === 'a').length, 2, 'tbf still on both ends of the delayed uplink');
  const steps = renderLabSetup(p).flat().filter((x) => x.netns === dly).flatMap((x) => x.lines);
  assert.ok(steps.includes('tuntap add dev tapr mode tap vnet_hdr') && steps.includes('link set tapr master brr txqueuelen 65536 up'), steps.join('\n'));
  assert.ok(steps.includes('link set brw up') && !steps.some((l) => l.startsWith('addr add')), 'the bridges only join ports');
  const wires = renderLabSetup(p).flat().filter((x) => x.tool === 'sysctl' && x.ifPresent && x.lines.includes('net/bridge/bridge-nf-call-iptables=0'));
  assert.deepEqual(wires.map((x) => x.netns).sort(), [dly, `${labPrefix('0abc')}wan`], 'frames crossing a wire\'s bridges skip netfilter; routers and nodes keep the default');
  assert.equal(plan(spec).delayLines.length, 0, 'netem (the default) needs no delay line');
});

test('every namespace carries the run prefix; interface names fit 15 characters; addresses are unique', () => {
  const p = plan({ cloudNodes: 200, podsPerNode: 1, sameSite: 'vxlan', edges: Array.from({ length: 1 }, () => edge('abcdef', { nodes: 199 })) });
  assert.ok(p.namespaces.every((n) => n.name.startsWith(labPrefix('0abc')) && runIdOfNetns(n.name) === '0abc'));
  assert.equal(new Set(p.namespaces.map((n) => n.name)).size, p.namespaces.length);
  const long = interfaceNames(p).filter((n) => n.length > 15);
  assert.deepEqual(long, []);
  const addrs = [...p.bridges.map((b) => b.address), ...p.veths.flatMap((v) => [v.a.address, v.b.address]).filter((a) => a !== undefined)];
  assert.equal(new Set(addrs).size, addrs.length);
  assert.ok(addrs.every((a) => /^(192\.0\.2|198\.51\.100|172\.16\.\d+)\.\d+\/24$|^10\.254\.\d+\.\d+\/16$/.test(a as string)), 'TEST-NET for public links, 172.16 for edge LANs, 10.254/16 for monitoring');
  assert.ok(addrs.every((a) => Number((a as string).split('/')[0]?.split('.')[3]) < 255));
  // interface names are unique inside each namespace
  for (const ns of p.namespaces) {
    const here = [...p.bridges.filter((b) => b.netns === ns.name).map((b) => b.ifname), ...p.veths.flatMap((v) => [v.a, v.b]).filter((e) => e.netns === ns.name).map((e) => e.ifname)];
    assert.equal(new Set(here).size, here.length, ns.name);
  }
});

test('spec problems name the value', () => {
  assert.deepEqual(labSpecProblems({ ...DEFAULT_LAB_SPEC, cloudNodes: 0 }), ['cloud nodes must be 1 to 200, not 0 (the controller\'s site needs a node)']);
  assert.match(labSpecProblems({ ...DEFAULT_LAB_SPEC, edges: [edge('cloud')] }).join(), /not "cloud"/);
  assert.match(labSpecProblems({ ...DEFAULT_LAB_SPEC, edges: [edge('a'), edge('a')] }).join(), /appears twice/);
  assert.match(labSpecProblems({ ...DEFAULT_LAB_SPEC, edges: [edge('a', { uplink: { rateMbit: 0 } })] }).join(), /rate must be 1 to/);
  assert.match(labSpecProblems({ ...DEFAULT_LAB_SPEC, podsPerNode: 50, cloudNodes: 10 }).join(), /more than 400/);
});

test('expected paths: same node, same site, tunnel direct, hole-punched or relayed by NAT, not allowed across communities', () => {
  const cases: { name: string; spec: LabSpec; from: string; to: string; want: string }[] = [
    { name: 'same node', spec: DEFAULT_LAB_SPEC, from: 'a-1', to: 'a-1', want: 'same node' },
    { name: 'same site, vxlan', spec: DEFAULT_LAB_SPEC, from: 'a-1', to: 'a-2', want: 'vxlan' },
    { name: 'same site, direct', spec: { ...DEFAULT_LAB_SPEC, sameSite: 'direct' }, from: 'cloud-1', to: 'cloud-2', want: 'direct route' },
    { name: 'edge to cloud, even behind symmetric NAT', spec: { ...DEFAULT_LAB_SPEC, edges: [edge('a', { nat: 'symmetric' })] }, from: 'a-1', to: 'cloud-1', want: 'tunnel direct' },
    { name: 'one community, EI NATs', spec: DEFAULT_LAB_SPEC, from: 'a-1', to: 'b-2', want: 'tunnel hole-punched' },
    { name: 'one community, a symmetric NAT', spec: { ...DEFAULT_LAB_SPEC, edges: [edge('a'), edge('b', { nat: 'symmetric' })] }, from: 'a-1', to: 'b-1', want: 'tunnel relayed' },
    { name: 'different communities', spec: { ...DEFAULT_LAB_SPEC, edges: [edge('a', { community: 'x' }), edge('b', { community: 'y' })] }, from: 'a-1', to: 'b-1', want: 'not allowed' },
    { name: 'no community', spec: { ...DEFAULT_LAB_SPEC, edges: [edge('a', { community: '' }), edge('b', { community: '' })] }, from: 'a-1', to: 'b-1', want: 'not allowed' },
  ];
  for (const c of cases) assert.equal(expectedPath(plan(c.spec), c.from, c.to), c.want, c.name);
});

test('routes as `ip route get` reports them are classified by device and gateway', () => {
  const node = { gateway: '172.16.1.1' };
  assert.equal(classifyRoute(node, { dev: 'atoll0' }), 'same node');
  assert.equal(classifyRoute(node, { dev: 'atoll.1', gateway: '10.100.0.64' }), 'vxlan');
  assert.equal(classifyRoute(node, { dev: 'atoll.tun' }), 'tunnel');
  assert.equal(classifyRoute(node, { dev: 'eth0', gateway: '172.16.1.12' }), 'direct route');
  assert.equal(classifyRoute(node, { dev: 'eth0', gateway: '172.16.1.1' }), 'default route');
  assert.equal(classifyRoute(node, undefined), 'no route');
  assert.equal(classifyRoute(node, { dev: 'lo', type: 'unreachable' }), 'no route');
});

test('uplink qdiscs: netem for delay, tbf for rate, tbf under netem for both, nothing without conditions', () => {
  assert.deepEqual(uplinkQdiscLines('up0', {}), []);
  assert.deepEqual(uplinkQdiscLines('up0', { delayMs: 5 }), ['qdisc replace dev up0 root netem delay 5ms limit 100000']);
  assert.deepEqual(uplinkQdiscLines('up0', { rateMbit: 1000 }), ['qdisc replace dev up0 root tbf rate 1000mbit burst 1250000 latency 50ms']);
  assert.match(natRuleset({ site: 'a', type: 'endpoint-independent', lan: '172.16.1.0/24', uplink: 'up0', lanDev: 'lan0' }), /ip saddr 172\.16\.1\.0\/24 masquerade\n/);
});

const ping = (ok: boolean, rttMs?: number) => ({ ok, sent: 3, received: ok ? 3 : 0, rttMs });
const tcp = (ok: boolean, connectMs?: number) => ({ ok, connectMs, error: ok ? undefined : 'ETIMEDOUT' });

test('cells: what should work must work over its path (a tunnel pair over the right one: direct stream or relay); forbidden must fail', () => {
  assert.deepEqual(judgeCell('vxlan', 'vxlan', ping(true, 0.1), tcp(true, 0.2)), { verdict: 'ok' });
  assert.deepEqual(judgeCell('vxlan', 'default route', ping(true, 0.1), tcp(true, 0.2)), { verdict: 'FAIL', note: 'the node routes it by default route, expected vxlan' });
  assert.deepEqual(judgeCell('same node', 'same node', ping(false), tcp(true)), { verdict: 'FAIL', note: 'ping: 0/3 replies' });
  assert.deepEqual(judgeCell('tunnel direct', 'tunnel', ping(true, 0.5), tcp(true, 0.6)), { verdict: 'ok' });
  assert.equal(judgeCell('tunnel direct', 'default route', ping(false), tcp(false)).verdict, 'FAIL');
  assert.deepEqual(judgeCell('tunnel hole-punched', 'tunnel', ping(true, 0.9), tcp(true, 1)), { verdict: 'ok' });
  assert.deepEqual(judgeCell('tunnel hole-punched', 'tunnel relayed', ping(true, 0.9), tcp(true, 1)), { verdict: 'FAIL', note: 'the node routes it by tunnel relayed, expected tunnel' });
  assert.deepEqual(judgeCell('tunnel relayed', 'tunnel relayed', ping(true, 2), tcp(true, 3)), { verdict: 'ok' });
  assert.equal(judgeCell('tunnel relayed', 'tunnel down', ping(false), tcp(false)).verdict, 'FAIL');
  assert.deepEqual(judgeCell('not allowed', 'default route', ping(false), tcp(false)), { verdict: 'blocked as expected' });
  assert.equal(judgeCell('not allowed', 'default route', ping(true, 1), tcp(false)).verdict, 'FAIL');
});

test('summary, verdict and matrix rendering', () => {
  const cell = (from: string, to: string, path: LabCell['path'], ok: boolean): LabCell => {
    const p = ping(ok, ok ? 0.123 : undefined);
    const t = tcp(ok, ok ? 0.3 : undefined);
    const route = path === 'vxlan' || path === 'same node' ? path : 'default route';
    return { from, to, fromNode: from.slice(0, 3), toNode: to.slice(0, 3), fromIp: '10.100.0.2', toIp: '10.100.0.66', path, expect: path === 'not allowed' ? 'blocked' : 'reachable', route, ping: p, tcp: t, ...judgeCell(path, route, p, t) };
  };
  const cells = [cell('a-1-p1', 'a-2-p1', 'vxlan', true), cell('a-2-p1', 'a-1-p1', 'vxlan', true), cell('a-1-p1', 'c-1-p1', 'not allowed', false),
    cell('c-1-p1', 'a-1-p1', 'not allowed', false), cell('a-2-p1', 'c-1-p1', 'not allowed', false), cell('c-1-p1', 'a-2-p1', 'not allowed', false)];
  const v = verdictOf(cells);
  assert.deepEqual({ ok: v.ok, should: v.shouldWork, working: v.working, blocked: v.blocked }, { ok: true, should: 2, working: 2, blocked: 4 });
  assert.deepEqual(renderSummary(summarize(cells)), [
    'path         expected   pairs  ping ok  tcp ok  failed  ping RTT (median)  tcp connect (median)',
    'vxlan        reachable      2        2       2       0            0.12 ms               0.30 ms',
    'not allowed  blocked        4        0       0       0                  -                     -',
  ]);
  assert.deepEqual(renderMatrix(['a-1-p1', 'a-2-p1', 'c-1-p1'], cells).slice(0, 4), [
    '                1      2      3',
    '  1 a-1-p1        V 0.12 X   --',
    '  2 a-2-p1 V 0.12        X   --',
    '  3 c-1-p1 X   -- X   --',
  ]);
});

test('a failed cell shows in the matrix, the summary and the failure list', () => {
  const p = ping(false);
  const t = tcp(true, 0.4);
  const c: LabCell = { from: 'a-1-p1', to: 'a-2-p1', fromNode: 'a-1', toNode: 'a-2', fromIp: '10.100.0.2', toIp: '10.100.0.66', path: 'vxlan', expect: 'reachable', route: 'vxlan', ping: p, tcp: t, ...judgeCell('vxlan', 'vxlan', p, t) };
  assert.equal(verdictOf([c]).ok, false);
  assert.equal(renderMatrix(['a-1-p1', 'a-2-p1'], [c])[1], '  1 a-1-p1        V FAIL');
  assert.deepEqual(renderFailures([c]), ['a-1-p1 (10.100.0.2) -> a-2-p1 (10.100.0.66), vxlan: ping: 0/3 replies']);
  assert.equal(summarize([c])[0]?.failed, 1);
});

test('the datagram path: the agents\' default, tunnel.udp false with --no-udp; a site that blocks UDP drops it both ways on the uplink, before anything is accepted', () => {
  const spec: LabSpec = { ...DEFAULT_LAB_SPEC, edges: [edge('a'), edge('b', { udpBlocked: true })] };
  const p = plan(spec);
  assert.ok(p.nodes.every((n) => !('udp' in (n.agentConfig.tunnel as Record<string, unknown>))), 'on: the agents\' default');
  assert.ok(plan({ ...DEFAULT_LAB_SPEC, tunnelUdp: false }).nodes.every((n) => (n.agentConfig.tunnel as Record<string, unknown>).udp === false));
  const rules = (site: string) => p.nat.find((n) => n.site === site)?.ruleset.split('\n') ?? [];
  assert.equal(rules('a').some((l) => l.includes('udp drop')), false);
  const b = rules('b');
  const forward = b.indexOf('  chain forward {');
  assert.deepEqual(b.slice(forward + 2, forward + 5).map((l) => l.trim()), [
    'oifname "up0" meta l4proto udp drop', 'iifname "up0" meta l4proto udp drop', 'iifname "up0" oifname "lan0" ct state established,related accept',
  ]);
  assert.match(describeLabSpec(spec), /edge b 2 nodes \(NAT endpoint-independent, community edge, UDP blocked\)/);
  assert.match(describeLabSpec({ ...spec, tunnelUdp: false }), /tunnel datagram path off \(streams only\)/);
});

test('with --kubernetes a node\'s agent paths are the manifest\'s hostPaths in the node\'s own directories', () => {
  const input = { spec: DEFAULT_LAB_SPEC, runId: '0abc', dir: '/run/atoll-lab/0abc', bootstrapToken: 'b', adminToken: 'a', relayToken: 'r' };
  const node = planLab({ ...input, kubernetes: true }).nodes[0];
  assert.ok(node);
  assert.deepEqual(nodeHostDirs(node), [
    { source: '/run/atoll-lab/0abc/cloud-1/host/opt/cni/bin', target: '/opt/cni/bin' },
    { source: '/run/atoll-lab/0abc/cloud-1/host/etc/cni/net.d', target: '/etc/cni/net.d' },
    { source: '/run/atoll-lab/0abc/cloud-1/host/var/lib/atoll', target: '/var/lib/atoll' },
    { source: '/run/atoll-lab/0abc/cloud-1/host/run/atoll', target: '/run/atoll' },
    { source: '/run/atoll-lab/0abc/cloud-1/host/var/run/netns', target: '/var/run/netns' },
    { source: '/run/atoll-lab/0abc/cloud-1/host/run/containerd', target: '/run/containerd' },
    { source: '/run/atoll-lab/0abc/cloud-1/host/var/lib/kubelet', target: '/var/lib/kubelet' },
    { source: '/run/atoll-lab/0abc/cloud-1/host/var/log/containers', target: '/var/log/containers' },
  ]);
  // the agent's defaults (/var/lib/atoll, /run/atoll/atoll.sock, ...) as the lab reads them
  assert.equal(node.dataDir, '/run/atoll-lab/0abc/cloud-1/host/var/lib/atoll');
  assert.equal(node.socketPath, '/run/atoll-lab/0abc/cloud-1/host/run/atoll/atoll.sock');
  assert.equal(node.cniBinDir, '/run/atoll-lab/0abc/cloud-1/host/opt/cni/bin');
  assert.equal(node.cniConfDir, '/run/atoll-lab/0abc/cloud-1/host/etc/cni/net.d');
  // its containerd serves in its own /run/containerd, where the chart's criSocket is
  assert.equal(nodeContainerdSocket(node), '/run/atoll-lab/0abc/cloud-1/host/run/containerd/containerd.sock');
  assert.equal(planLab(input).nodes[0]?.dataDir, '/run/atoll-lab/0abc/cloud-1/data');
});

test('metrics: by default the agents, the controller and the relay listen on the monitoring network; with metrics false none of their configurations has a listener, the rest is the same', () => {
  const relay = (p: LabPlan) => ({ plan: p.relay, pin: 'sha256:00' });
  const on = plan(DEFAULT_LAB_SPEC);
  assert.deepEqual(on.controller.config.metrics, { listen: '10.254.0.1:9471' });
  assert.deepEqual(relayConfigFor(on.relay, 'sha256:ca').metrics, { listen: '10.254.0.1:9472' });
  assert.deepEqual(on.nodes.map((n) => agentConfigFor(n, 'sha256:ca', relay(on)).metrics), on.nodes.map((n) => ({ listen: `${n.monitorAddress}:9470` })));
  const off = plan({ ...DEFAULT_LAB_SPEC, metrics: false });
  assert.equal('metrics' in off.controller.config, false);
  assert.equal('metrics' in relayConfigFor(off.relay, 'sha256:ca'), false);
  assert.ok(off.nodes.every((n) => !('metrics' in agentConfigFor(n, 'sha256:ca', relay(off)))));
  const { metrics: _c, ...controllerRest } = on.controller.config;
  assert.deepEqual(off.controller.config, controllerRest);
  for (const [i, n] of off.nodes.entries()) {
    const { metrics: _a, ...agentRest } = (on.nodes[i] as LabNode).agentConfig;
    assert.deepEqual(n.agentConfig, agentRest);
  }
  assert.deepEqual(renderLabSetup(off), renderLabSetup(on), 'the same namespaces, devices and addresses (the monitoring network stays)');
  assert.ok(describeLabSpec({ ...DEFAULT_LAB_SPEC, metrics: false }).endsWith('; metrics listeners off'));
});
