/**
 * NetworkPolicy in the kernel: a node namespace with a bridge and three pods (x/a, x/b, x/c) on veths named as the
 * agent names them, and one remote pod (y/r) behind a routed link, as a pod across VXLAN or the tunnel is. The
 * compiled policies are rendered and applied with nft; then every pod pair, over TCP 80, TCP 81 and UDP 80, must do
 * exactly what the compiler's own `decide` says (unit-tested against truth tables), a dropped packet counts on the drop
 * counter of the side `explain` (what `atoll trace` says) names, the node itself still reaches its pods, and a pod
 * cannot pass a rule by sending from a neighbour's address or a remote pod's.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { type ChildProcess, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { addNetns, delNetns, inNetns, rootSkipReason, sh } from '../../harness/netns.ts';
import { until } from '../../harness/wait.ts';
import { PROJECT_NODE } from '../../src/lab/agent-process.ts';
import { compilePolicies, decide, explain, type L4, type PolicyPlan } from '../../src/core/policy/compile.ts';
import type { NetworkPolicy, PolicyPod } from '../../src/core/policy/model.ts';
import { buildPolicyTables, dropCounterOf, renderPolicyDelta, renderPolicyRuleset, renderPolicyTables, tallyDrops } from '../../src/core/policy/nft.ts';
import { type Cidr, parseCidr, parseIpv4 } from '../../src/core/net/ipv4.ts';
import { Nft } from '../../src/adapters/kernel/nft.ts';

const PROBE = fileURLToPath(new URL('../support/l4-probe.ts', import.meta.url));

/**
 * A namespace's nftables ruleset as comparable data: no handles, counters (anonymous and named) zeroed, sets and
 * chains by name with their elements sorted, each chain's rules in order.
 */
function normalizedRuleset(ns: string): unknown {
  const items = (JSON.parse(sh('ip', ['netns', 'exec', ns, 'nft', '-j', 'list', 'ruleset'])) as { nftables: Record<string, Record<string, unknown>>[] }).nftables;
  const strip = (v: unknown): unknown => {
    if (Array.isArray(v)) return v.map(strip);
    if (v && typeof v === 'object') {
      const o = v as Record<string, unknown>;
      if ('counter' in o && Object.keys(o).length === 1) return { counter: {} };
      return Object.fromEntries(Object.entries(o).filter(([k]) => k !== 'handle').map(([k, x]) => [k, strip(x)]));
    }
    return v;
  };
  const out: Record<string, unknown> = {};
  const rules: Record<string, unknown[]> = {};
  for (const item of items) {
    const [kind, body] = Object.entries(item)[0] as [string, Record<string, unknown>];
    if (kind === 'metainfo') continue;
    const b = strip(body) as Record<string, unknown>;
    if (kind === 'rule') (rules[`${b.family} ${b.table} ${b.chain}`] ??= []).push(b.expr);
    else {
      if (Array.isArray(b.elem)) b.elem = [...b.elem].map((e) => JSON.stringify(e)).sort();
      if (kind === 'counter') b.packets = b.bytes = 0;
      out[`${kind} ${b.family} ${b.table ?? ''} ${b.name}`] = b;
    }
  }
  return { objects: Object.fromEntries(Object.entries(out).sort()), rules: Object.fromEntries(Object.entries(rules).sort()) };
}

/** The remote pod y/r. */
const y = (pods: readonly Bed[]) => pods.find((p) => p.name === 'y/r') as Bed;

interface Bed {
  readonly name: string;
  readonly ns: string;
  readonly ip: string;
  readonly veth?: string;
  server?: ChildProcess;
  heard: string;
}

const policies: NetworkPolicy[] = [
  {
    namespace: 'x', name: 'a-from-b', podSelector: { matchLabels: { pod: 'a' } }, policyTypes: ['Ingress'], egress: [],
    ingress: [{ peers: [{ podSelector: { matchLabels: { pod: 'b' } } }], ports: [{ protocol: 'TCP', port: 80 }, { protocol: 'UDP', port: 80 }] }],
  },
  {
    namespace: 'x', name: 'b-from-y', podSelector: { matchLabels: { pod: 'b' } }, policyTypes: ['Ingress'], egress: [],
    ingress: [{ peers: [{ namespaceSelector: { matchLabels: { ns: 'y' } } }], ports: [{ protocol: 'TCP', port: 'web-alt' }, { protocol: 'UDP', port: 80 }] }],
  },
  {
    namespace: 'x', name: 'c-out', podSelector: { matchLabels: { pod: 'c' } }, policyTypes: ['Egress'], ingress: [],
    egress: [{ peers: [{ ipBlock: { cidr: '10.0.2.0/24', except: [] } }], ports: [] }],
  },
];

describe('NetworkPolicy enforced by nftables', { skip: rootSkipReason(), timeout: 120_000 }, () => {
  let node = '';
  const pods: Bed[] = [];
  let plan: PolicyPlan;
  let model: PolicyPod[] = [];
  let ruleset = '';

  const attempts = (targets: readonly Bed[]) => targets.flatMap((t) => (['tcp/80', 'tcp/81', 'udp/80'] as const).map((k) => ({ ip: t.ip, proto: k.slice(0, 3) as L4, port: Number(k.slice(4)), to: t.name })));
  function probe(fromNs: string, list: { ip: string; proto: L4; port: number; from?: string }[]): boolean[] {
    const res = inNetns(fromNs, PROJECT_NODE, [PROBE, 'try', JSON.stringify(list)], 15_000);
    assert.equal(res.status, 0, `the prober in ${fromNs} failed: ${res.stderr}`);
    return JSON.parse(res.stdout) as boolean[];
  }
  /** Every pod to every other: `from -> to proto/port: yes|no`, one line each. */
  function observed(): string[] {
    return pods.flatMap((from) => {
      const list = attempts(pods.filter((t) => t !== from));
      const got = probe(from.ns, list);
      return list.map((a, i) => `${from.name} -> ${a.to} ${a.proto}/${a.port}: ${got[i] ? 'yes' : 'no'}`);
    });
  }
  function expected(allowed: (from: Bed, to: string, proto: L4, port: number) => boolean): string[] {
    return pods.flatMap((from) => attempts(pods.filter((t) => t !== from)).map((a) => `${from.name} -> ${a.to} ${a.proto}/${a.port}: ${allowed(from, a.ip, a.proto, a.port) ? 'yes' : 'no'}`));
  }
  const failureDump = () => `\n${inNetns(node, 'nft', ['list', 'ruleset']).stdout}`;

  before(async () => {
    node = addNetns('pol-node');
    sh('ip', ['netns', 'exec', node, 'sysctl', '-qw', 'net.ipv4.ip_forward=1', 'net.bridge.bridge-nf-call-iptables=1']);
    sh('ip', ['-n', node, 'link', 'add', 'atb0', 'type', 'bridge']);
    sh('ip', ['-n', node, 'addr', 'add', '10.0.1.1/24', 'dev', 'atb0']);
    sh('ip', ['-n', node, 'link', 'set', 'atb0', 'up']);
    ['a', 'b', 'c'].forEach((name, i) => {
      const ns = addNetns(`pol-${name}`);
      const veth = `atl00000000000${i + 1}`;
      const ip = `10.0.1.${10 + i}`;
      sh('ip', ['-n', node, 'link', 'add', veth, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns]);
      sh('ip', ['-n', node, 'link', 'set', veth, 'master', 'atb0', 'up']);
      sh('ip', ['-n', ns, 'addr', 'add', `${ip}/24`, 'dev', 'eth0']);
      sh('ip', ['-n', ns, 'link', 'set', 'eth0', 'up']);
      sh('ip', ['-n', ns, 'route', 'add', 'default', 'via', '10.0.1.1']);
      pods.push({ name: `x/${name}`, ns, ip, veth, heard: '' });
    });
    // the remote pod: a routed link, as VXLAN and the tunnel's TUN are
    const r = addNetns('pol-r');
    sh('ip', ['-n', node, 'link', 'add', 'rt0', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', r]);
    sh('ip', ['-n', node, 'addr', 'add', '10.0.9.1/32', 'dev', 'rt0']);
    sh('ip', ['-n', node, 'link', 'set', 'rt0', 'up']);
    sh('ip', ['-n', node, 'route', 'add', '10.0.2.10/32', 'dev', 'rt0']);
    sh('ip', ['-n', r, 'addr', 'add', '10.0.2.10/32', 'dev', 'eth0']);
    sh('ip', ['-n', r, 'link', 'set', 'eth0', 'up']);
    sh('ip', ['-n', r, 'route', 'add', '10.0.9.1', 'dev', 'eth0']);
    sh('ip', ['-n', r, 'route', 'add', 'default', 'via', '10.0.9.1']);
    pods.push({ name: 'y/r', ns: r, ip: '10.0.2.10', heard: '' });

    for (const p of pods) {
      p.server = spawn('ip', ['netns', 'exec', p.ns, PROJECT_NODE, PROBE, 'serve', '80', '81'], { stdio: ['ignore', 'pipe', 'inherit'] });
      p.server.stdout?.on('data', (d: Buffer) => (p.heard += d.toString()));
      await until(`the prober serving in ${p.ns}`, () => sh('ss', ['-N', p.ns, '-Hltn', 'sport', '=', ':81']).trim() !== '', 10_000, 20);
    }

    model = pods.map((p) => ({
      namespace: p.name.split('/')[0] as string,
      name: p.name.split('/')[1] as string,
      ip: p.ip,
      labels: { pod: p.name.split('/')[1] as string },
      ports: p.name === 'x/b' ? [{ name: 'web-alt', protocol: 'TCP', port: 81 }] : [],
    }));
    plan = compilePolicies({
      policies,
      namespaces: [{ name: 'x', labels: { ns: 'x' } }, { name: 'y', labels: { ns: 'y' } }],
      pods: model,
      local: new Set(['x/a', 'x/b', 'x/c']),
    });
    ruleset = renderPolicyRuleset(plan, { sources: pods.filter((p) => p.veth).map((p) => ({ port: p.veth as string, ip: p.ip })), localBlocks: [parseCidr('10.0.1.0/24') as Cidr] });
  });

  after(() => {
    for (const p of pods) p.server?.kill('SIGKILL');
    for (const p of pods) delNetns(p.ns);
    if (node) delNetns(node);
  });

  test('without the ruleset every pair talks (the bed works)', () => {
    assert.deepEqual(observed(), expected(() => true));
  });

  test('with it, every pair over TCP 80, TCP 81 and UDP 80 does what the compiled plan says, whatever the path', async () => {
    await new Nft().apply(ruleset, { netns: `/run/netns/${node}` });
    const want = expected((from, to, proto, port) => decide(plan, { src: parseIpv4(from.ip) as number, dst: parseIpv4(to) as number, protocol: proto, port }).allowed);
    assert.ok(want.some((l) => l.endsWith('no')) && want.some((l) => l.endsWith('yes')), 'the policies both allow and refuse');
    assert.deepEqual(observed(), want, failureDump());
    // spelled out, the cases that matter most
    for (const line of ['x/b -> x/a tcp/80: yes', 'x/c -> x/a tcp/80: no', 'x/b -> x/a tcp/81: no', 'y/r -> x/b tcp/81: yes', 'y/r -> x/b tcp/80: no', 'x/c -> y/r tcp/80: yes', 'x/c -> x/b udp/80: no']) {
      assert.ok(want.includes(line), line);
    }
    // applying the same ruleset again changes nothing
    await new Nft().apply(ruleset, { netns: `/run/netns/${node}` });
    assert.deepEqual(observed(), want, failureDump());
  });

  test('a dropped packet counts on the drop counter of the side explain names, an allowed one on none; reading counters commits nothing', async () => {
    const [a, b, c] = pods as [Bed, Bed, Bed];
    const netns = `/run/netns/${node}`;
    const ip = (p: Bed) => parseIpv4(p.ip) as number;
    const sides = (from: Bed, to: Bed, protocol: L4, port: number) => explain(plan, { src: ip(from), dst: ip(to), l4: { protocol, port } })
      .map((s) => `${s.direction} ${s.pod} [${s.isolatedBy.join(' ')}]: ${s.allowedBy.map((r) => `${r.policy} rule ${r.rule}`).join('; ') || 'DROP'}`);
    const moved = (was: ReadonlyMap<string, number>, now: ReadonlyMap<string, number>) => [...now].filter(([k, n]) => n !== (was.get(k) ?? 0)).map(([k]) => k).sort();
    const t0 = await new Nft().counters('inet atoll_policy', { netns });
    assert.ok(t0.has(dropCounterOf('ingress', ip(a))) && t0.has(dropCounterOf('egress', ip(c))), `a counter per pod chain: ${[...t0.keys()].join(' ')}`);

    assert.deepEqual(sides(b, a, 'tcp', 80), ['ingress x/a [x/a-from-b]: x/a-from-b rule 0']);
    assert.deepEqual(probe(b.ns, [{ ip: a.ip, proto: 'tcp', port: 80 }]), [true]);
    const t1 = await new Nft().counters('inet atoll_policy', { netns });
    assert.deepEqual(moved(t0, t1), [], 'an allowed packet counts on no drop counter');

    assert.deepEqual(sides(c, a, 'tcp', 80), ['egress x/c [x/c-out]: DROP', 'ingress x/a [x/a-from-b]: DROP']);
    assert.deepEqual(sides(y(pods), a, 'tcp', 80), ['ingress x/a [x/a-from-b]: DROP']);
    assert.deepEqual(sides(c, b, 'udp', 80), ['egress x/c [x/c-out]: DROP', 'ingress x/b [x/b-from-y]: DROP']);
    assert.deepEqual(probe(y(pods).ns, [{ ip: a.ip, proto: 'tcp', port: 80 }]), [false]);
    const t2 = await new Nft().counters('inet atoll_policy', { netns });
    assert.deepEqual(moved(t1, t2), [dropCounterOf('ingress', ip(a))], 'refused at the ingress of x/a, the side explain names');
    assert.deepEqual(probe(c.ns, [{ ip: b.ip, proto: 'udp', port: 80 }]), [false]);
    const t3 = await new Nft().counters('inet atoll_policy', { netns });
    assert.deepEqual(moved(t2, t3), [dropCounterOf('egress', ip(c))], 'refused at the egress of x/c first: the ingress of x/b never sees it');
    // as the agent's metric labels them
    const tally = tallyDrops(plan, t3, new Map(t1));
    assert.ok((tally.get('ingress x/a-from-b') ?? 0) >= 1 && (tally.get('egress x/c-out') ?? 0) >= 1 && (tally.get('ingress x/b-from-y') ?? 0) === 0, JSON.stringify([...tally]));

    // reading the counters is no commit: the ruleset generation the agent compares stays, so its next change is a delta
    const generations = inNetns(node, PROJECT_NODE, ['--input-type=module', '-e', `import { Nft } from ${JSON.stringify(new URL('../../src/adapters/kernel/nft.ts', import.meta.url).href)};
      const nft = new Nft(); const g = await nft.generation(); await nft.counters('inet atoll_policy'); console.log(JSON.stringify([g, await nft.generation()]));`]);
    const [g0, g1] = JSON.parse(generations.stdout) as [number, number];
    assert.equal(g1, g0, generations.stderr);
  });

  test('the node itself still reaches a pod that refuses every other pod on that port', () => {
    assert.deepEqual(probe(node, [{ ip: '10.0.1.10', proto: 'tcp', port: 81 }, { ip: '10.0.1.11', proto: 'tcp', port: 80 }]), [true, true]);
  });

  test('a delta (only what changed) leaves the kernel holding what the whole new ruleset would, and enforcing it', async () => {
    const sources = pods.filter((p) => p.veth).map((p) => ({ port: p.veth as string, ip: p.ip }));
    const localBlocks = [parseCidr('10.0.1.0/24') as Cidr];
    const before = buildPolicyTables(plan, { sources, localBlocks });
    // a-from-b gone, c now refuses everyone but y, b2 a new pod labelled b on another node (a peer of nothing now)
    const nextPlan = compilePolicies({
      policies: [...policies.filter((p) => p.name !== 'a-from-b'), { namespace: 'x', name: 'c-from-y', podSelector: { matchLabels: { pod: 'c' } }, policyTypes: ['Ingress'], egress: [], ingress: [{ peers: [{ namespaceSelector: { matchLabels: { ns: 'y' } } }], ports: [] }] }],
      namespaces: [{ name: 'x', labels: { ns: 'x' } }, { name: 'y', labels: { ns: 'y' } }],
      pods: [...model, { namespace: 'y', name: 'r2', ip: '10.0.2.11', labels: { pod: 'r2' }, ports: [] }],
      local: new Set(['x/a', 'x/b', 'x/c']),
    });
    const after = buildPolicyTables(nextPlan, { sources, localBlocks });
    const delta = renderPolicyDelta(before, after);
    assert.ok(delta.length > 0 && !delta.includes('delete table'), delta);
    await new Nft().apply(delta, { netns: `/run/netns/${node}` });
    const fresh = addNetns('pol-fresh');
    try {
      await new Nft().apply(renderPolicyTables(after), { netns: `/run/netns/${fresh}` });
      assert.deepEqual(normalizedRuleset(node), normalizedRuleset(fresh), `the delta:\n${delta}`);
    } finally {
      delNetns(fresh);
    }
    const want = expected((from, to, proto, port) => decide(nextPlan, { src: parseIpv4(from.ip) as number, dst: parseIpv4(to) as number, protocol: proto, port }).allowed);
    assert.ok(want.includes('x/b -> x/a tcp/81: yes') && want.includes('x/a -> x/c tcp/80: no') && want.includes('y/r -> x/c tcp/80: yes'), 'a opened, c closed but to y');
    assert.deepEqual(observed(), want, failureDump());
  });

  test("a pod cannot pass a rule by sending from a neighbour's address or a remote pod's", async () => {
    const [a, b, c] = pods as [Bed, Bed, Bed];
    /** c sends one datagram to `to` from `address` (added to its interface for the moment); true when `to` heard it. */
    const spoof = async (address: string, to: Bed, expectHeard: boolean): Promise<void> => {
      to.heard = '';
      sh('ip', ['-n', c.ns, 'addr', 'add', `${address}/32`, 'dev', 'eth0']);
      try {
        probe(c.ns, [{ ip: to.ip, proto: 'udp', port: 80, from: address }]);
        if (expectHeard) await until(`${to.name} hearing the datagram c sent from ${address}`, () => to.heard.includes(`udp ${address} `), 5_000, 50);
        else assert.equal(to.heard, '', `${to.name} heard c sending from ${address}${failureDump()}`);
      } finally {
        sh('ip', ['-n', c.ns, 'addr', 'del', `${address}/32`, 'dev', 'eth0']);
      }
    };
    await spoof(b.ip, a, false);
    await spoof('10.0.2.10', b, false);
    // the control: without the bridge table the same datagrams get through, so the table is what stops them
    sh('ip', ['netns', 'exec', node, 'nft', 'delete', 'table', 'bridge', 'atoll_policy']);
    await spoof(b.ip, a, true);
    await spoof('10.0.2.10', b, true);
  });
});
