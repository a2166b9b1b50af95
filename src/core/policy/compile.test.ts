/**
 * The policy compiler as truth tables, in the spirit of Kubernetes' own Netpol suite (test/e2e/network/netpol):
 * namespaces x, y, z each hold pods a, b, c serving ports 80 and 81 over TCP and UDP (named serve-80-tcp and so on);
 * each case applies policies and checks all 81 pod pairs against the expected matrix.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { compilePolicies, decide, explain, type L4, type PolicyPlan, policyProblems } from './compile.ts';
import { keyOf, type NetworkPolicy, type PolicyNamespace, type PolicyPod, type PolicyRule } from './model.ts';
import { buildPolicyTables, dropCounterOf, renderPolicyDelta, renderPolicyRuleset, renderPolicyTables, tallyDrops } from './nft.ts';
import { parseCidr, parseIpv4, type Cidr } from '../net/ipv4.ts';
import { formatRange, normalizeRanges, subtractRanges } from '../net/ranges.ts';
import { matchesSelector } from './selector.ts';

const NS = ['x', 'y', 'z'] as const;
const PODS = ['a', 'b', 'c'] as const;
const namespaces: PolicyNamespace[] = NS.map((ns) => ({ name: ns, labels: { ns, 'kubernetes.io/metadata.name': ns } }));
const ipOf = (ns: string, pod: string): string => `10.0.${NS.indexOf(ns as 'x') + 1}.${PODS.indexOf(pod as 'a') + 10}`;
const pods: PolicyPod[] = NS.flatMap((ns) =>
  PODS.map((pod) => ({
    namespace: ns,
    name: pod,
    ip: ipOf(ns, pod),
    labels: { pod },
    ports: [80, 81].flatMap((port) => (['TCP', 'UDP'] as const).map((protocol) => ({ name: `serve-${port}-${protocol.toLowerCase()}`, protocol, port }))),
  })),
);
const everyPod = new Set(pods.map(keyOf));

function policy(over: Partial<NetworkPolicy> & { name: string }): NetworkPolicy {
  return { namespace: 'x', podSelector: {}, policyTypes: ['Ingress'], ingress: [], egress: [], ...over };
}

function compile(policies: NetworkPolicy[]): PolicyPlan {
  return compilePolicies({ policies, namespaces, pods, local: everyPod });
}

/**
 * The matrix as text, one row per source: `X` allowed, `.` refused, for the destinations in order x/a x/b ... z/c.
 */
function matrix(plan: PolicyPlan, protocol: L4 = 'tcp', port = 80): string[] {
  return pods.map((from) =>
    `${keyOf(from)} ` +
    pods.map((to) => (decide(plan, { src: parseIpv4(from.ip) as number, dst: parseIpv4(to.ip) as number, protocol, port }).allowed ? 'X' : '.')).join(''),
  );
}

/** A matrix where `allowed(from, to)` says each cell. */
function expect(allowed: (from: PolicyPod, to: PolicyPod) => boolean): string[] {
  return pods.map((from) => `${keyOf(from)} ` + pods.map((to) => (allowed(from, to) ? 'X' : '.')).join(''));
}

const all = () => true;
const rule = (over: Partial<PolicyRule>): PolicyRule => ({ peers: [], ports: [], ...over });

test('no policy: every pair allowed', () => {
  assert.deepEqual(matrix(compile([])), expect(all));
});

test('a policy that selects no pod changes nothing', () => {
  const plan = compile([policy({ name: 'nobody', podSelector: { matchLabels: { pod: 'nope' } } })]);
  assert.deepEqual(plan.pods, []);
  assert.deepEqual(matrix(plan), expect(all));
});

test('default deny ingress in x: nothing gets into x, x still sends', () => {
  assert.deepEqual(matrix(compile([policy({ name: 'deny' })])), expect((_, to) => to.namespace !== 'x'));
});

test('default deny egress in x: nothing leaves x, x still receives', () => {
  assert.deepEqual(matrix(compile([policy({ name: 'deny', policyTypes: ['Egress'] })])), expect((from) => from.namespace !== 'x'));
});

test('allow all ingress (one empty rule) undoes a deny in the same namespace', () => {
  assert.deepEqual(matrix(compile([policy({ name: 'deny' }), policy({ name: 'all', ingress: [rule({})] })])), expect(all));
});

test('podSelector peer: only x/b reaches x/a', () => {
  const plan = compile([policy({ name: 'a-from-b', podSelector: { matchLabels: { pod: 'a' } }, ingress: [rule({ peers: [{ podSelector: { matchLabels: { pod: 'b' } } }] })] })]);
  assert.deepEqual(matrix(plan), expect((from, to) => keyOf(to) !== 'x/a' || keyOf(from) === 'x/b'));
});

test('namespaceSelector peer: every pod of y reaches x/a', () => {
  const plan = compile([policy({ name: 'a-from-y', podSelector: { matchLabels: { pod: 'a' } }, ingress: [rule({ peers: [{ namespaceSelector: { matchLabels: { ns: 'y' } } }] })] })]);
  assert.deepEqual(matrix(plan), expect((from, to) => keyOf(to) !== 'x/a' || from.namespace === 'y'));
});

test('both selectors in one peer: only y/b; in two peers: y/* and x/b', () => {
  const one = compile([policy({ name: 'p', podSelector: { matchLabels: { pod: 'a' } }, ingress: [rule({ peers: [{ namespaceSelector: { matchLabels: { ns: 'y' } }, podSelector: { matchLabels: { pod: 'b' } } }] })] })]);
  assert.deepEqual(matrix(one), expect((from, to) => keyOf(to) !== 'x/a' || keyOf(from) === 'y/b'));
  const two = compile([policy({ name: 'p', podSelector: { matchLabels: { pod: 'a' } }, ingress: [rule({ peers: [{ namespaceSelector: { matchLabels: { ns: 'y' } } }, { podSelector: { matchLabels: { pod: 'b' } } }] })] })]);
  assert.deepEqual(matrix(two), expect((from, to) => keyOf(to) !== 'x/a' || from.namespace === 'y' || keyOf(from) === 'x/b'));
});

test('matchExpressions: NotIn, Exists and DoesNotExist', () => {
  const plan = compile([policy({ name: 'p', ingress: [rule({ peers: [{ namespaceSelector: { matchExpressions: [{ key: 'ns', operator: 'NotIn', values: ['y'] }] }, podSelector: { matchExpressions: [{ key: 'pod', operator: 'In', values: ['a', 'c'] }] } }] })] })]);
  assert.deepEqual(matrix(plan), expect((from, to) => to.namespace !== 'x' || (from.namespace !== 'y' && from.name !== 'b')));
  assert.equal(matchesSelector({ matchExpressions: [{ key: 'k', operator: 'Exists', values: [] }] }, { k: '' }), true);
  assert.equal(matchesSelector({ matchExpressions: [{ key: 'k', operator: 'DoesNotExist', values: [] }] }, { k: '' }), false);
  assert.equal(matchesSelector({ matchExpressions: [{ key: 'k', operator: 'NotIn', values: ['v'] }] }, {}), true);
});

test('ipBlock with except: every pod of the cluster but y/c reaches x', () => {
  const plan = compile([policy({ name: 'p', ingress: [rule({ peers: [{ ipBlock: { cidr: '10.0.0.0/16', except: [`${ipOf('y', 'c')}/32`] } }] })] })]);
  assert.deepEqual(matrix(plan), expect((from, to) => to.namespace !== 'x' || keyOf(from) !== 'y/c'));
});

test('ports: a number, a range (endPort), a name resolved on the selected pod; the protocol must match', () => {
  const on80 = compile([policy({ name: 'p', ingress: [rule({ ports: [{ protocol: 'TCP', port: 80 }] })] })]);
  assert.deepEqual(matrix(on80, 'tcp', 80), expect(all));
  assert.deepEqual(matrix(on80, 'tcp', 81), expect((_, to) => to.namespace !== 'x'));
  assert.deepEqual(matrix(on80, 'udp', 80), expect((_, to) => to.namespace !== 'x'));
  const range = compile([policy({ name: 'p', ingress: [rule({ ports: [{ protocol: 'UDP', port: 80, endPort: 81 }] })] })]);
  assert.deepEqual(matrix(range, 'udp', 81), expect(all));
  assert.deepEqual(matrix(range, 'tcp', 81), expect((_, to) => to.namespace !== 'x'));
  const named = compile([policy({ name: 'p', ingress: [rule({ ports: [{ protocol: 'TCP', port: 'serve-81-tcp' }] })] })]);
  assert.deepEqual(matrix(named, 'tcp', 81), expect(all));
  assert.deepEqual(matrix(named, 'tcp', 80), expect((_, to) => to.namespace !== 'x'));
  const wrongProto = compile([policy({ name: 'p', ingress: [rule({ ports: [{ protocol: 'UDP', port: 'serve-81-tcp' }] })] })]);
  assert.deepEqual(matrix(wrongProto, 'udp', 81), expect((_, to) => to.namespace !== 'x'));
  const wholeProtocol = compile([policy({ name: 'p', ingress: [rule({ ports: [{ protocol: 'UDP' }] })] })]);
  assert.deepEqual(matrix(wholeProtocol, 'udp', 81), expect(all));
  assert.deepEqual(matrix(wholeProtocol, 'tcp', 81), expect((_, to) => to.namespace !== 'x'));
});

test('egress to a named port resolves on each destination pod', () => {
  const withPort = pods.map((p) => (keyOf(p) === 'z/c' ? { ...p, ports: [{ name: 'web', protocol: 'TCP' as const, port: 81 }] } : keyOf(p) === 'y/c' ? { ...p, ports: [{ name: 'web', protocol: 'TCP' as const, port: 80 }] } : p));
  const plan = compilePolicies({ policies: [policy({ name: 'p', policyTypes: ['Egress'], egress: [rule({ ports: [{ protocol: 'TCP', port: 'web' }] })] })], namespaces, pods: withPort, local: everyPod });
  const can = (from: string, to: string, port: number) => decide(plan, { src: parseIpv4(ipOf(from[0] as string, from[2] as string)) as number, dst: parseIpv4(ipOf(to[0] as string, to[2] as string)) as number, protocol: 'tcp', port }).allowed;
  assert.equal(can('x/a', 'z/c', 81), true);
  assert.equal(can('x/a', 'z/c', 80), false);
  assert.equal(can('x/a', 'y/c', 80), true);
  assert.equal(can('x/a', 'y/c', 81), false);
  assert.equal(can('x/a', 'y/a', 80), false);
  assert.equal(can('y/a', 'y/b', 80), true, 'y is not isolated');
});

test('egress and ingress together: x/a may only talk to y, and y/b takes only x', () => {
  const plan = compile([
    policy({ name: 'out', podSelector: { matchLabels: { pod: 'a' } }, policyTypes: ['Egress'], egress: [rule({ peers: [{ namespaceSelector: { matchLabels: { ns: 'y' } } }] })] }),
    policy({ name: 'in', namespace: 'y', podSelector: { matchLabels: { pod: 'b' } }, ingress: [rule({ peers: [{ namespaceSelector: { matchLabels: { ns: 'x' } } }] })] }),
  ]);
  assert.deepEqual(matrix(plan), expect((from, to) => (keyOf(from) !== 'x/a' || to.namespace === 'y') && (keyOf(to) !== 'y/b' || from.namespace === 'x')));
  const d = decide(plan, { src: parseIpv4(ipOf('x', 'a')) as number, dst: parseIpv4(ipOf('y', 'b')) as number, protocol: 'tcp', port: 80 });
  assert.deepEqual(d, { allowed: true, egressBy: { policy: 'x/out', rule: 0 }, ingressBy: { policy: 'y/in', rule: 0 } });
  const refused = decide(plan, { src: parseIpv4(ipOf('z', 'a')) as number, dst: parseIpv4(ipOf('y', 'b')) as number, protocol: 'tcp', port: 80 });
  assert.deepEqual(refused, { allowed: false, deniedAt: 'ingress of y/b' });
});

test('policies add up: two policies on x/a, each letting one pod in', () => {
  const plan = compile([
    policy({ name: 'p1', podSelector: { matchLabels: { pod: 'a' } }, ingress: [rule({ peers: [{ podSelector: { matchLabels: { pod: 'b' } } }] })] }),
    policy({ name: 'p2', podSelector: { matchLabels: { pod: 'a' } }, ingress: [rule({ peers: [{ podSelector: { matchLabels: { pod: 'c' } } }] })] }),
  ]);
  assert.deepEqual(matrix(plan), expect((from, to) => keyOf(to) !== 'x/a' || (from.namespace === 'x' && from.name !== 'a')));
  assert.deepEqual(plan.pods.find((p) => p.pod === 'x/a')?.policies, ['x/p1', 'x/p2']);
});

test('a pod only on another node is never compiled, but is a peer', () => {
  const plan = compilePolicies({ policies: [policy({ name: 'p', ingress: [rule({ peers: [{ namespaceSelector: { matchLabels: { ns: 'y' } } }] })] })], namespaces, pods, local: new Set(['x/a']) });
  assert.deepEqual(plan.pods.map((p) => p.pod), ['x/a']);
  assert.deepEqual(plan.pods[0]?.ingress?.[0]?.peers, [{ first: parseIpv4('10.0.2.10'), last: parseIpv4('10.0.2.12') }]);
});

test('a prefix that does not parse is reported and opens nothing', () => {
  const plan = compile([policy({ name: 'p', ingress: [rule({ peers: [{ ipBlock: { cidr: '10.0.0.0/33', except: [] } }] })] })]);
  assert.deepEqual(plan.problems, [{ policy: 'x/p', message: 'ipBlock cidr "10.0.0.0/33" is not an IPv4 or IPv6 prefix; the peer matches nothing' }]);
  assert.deepEqual(matrix(plan), expect((_, to) => to.namespace !== 'x'));
  const v6 = compile([policy({ name: 'p', ingress: [rule({ peers: [{ ipBlock: { cidr: 'fd00::/8', except: [] } }] })] })]);
  assert.deepEqual(v6.problems, []);
  assert.deepEqual(matrix(v6), expect((_, to) => to.namespace !== 'x'));
});

test('ranges: subtract, merge, and the shortest nft element', () => {
  const c = (s: string) => parseCidr(s) as Cidr;
  const r = subtractRanges([{ first: c('10.0.0.0/24').base, last: c('10.0.0.0/24').base + 255 }], [{ first: c('10.0.0.128/25').base, last: c('10.0.0.128/25').base + 127 }, { first: c('10.0.0.0/24').base, last: c('10.0.0.0/24').base }]);
  assert.deepEqual(r.map(formatRange), ['10.0.0.1-10.0.0.127']);
  assert.deepEqual(normalizeRanges([{ first: 5, last: 6 }, { first: 1, last: 2 }, { first: 3, last: 4 }]), [{ first: 1, last: 6 }]);
  assert.equal(formatRange({ first: c('10.0.0.64/26').base, last: c('10.0.0.64/26').base + 63 }), '10.0.0.64/26');
});

test('the ruleset (golden): maps by address, chains named by address, one set per distinct peers named by what they are, egress returns, ingress accepts', () => {
  const plan = compilePolicies({
    policies: [
      policy({ name: 'web', podSelector: { matchLabels: { pod: 'a' } }, policyTypes: ['Ingress', 'Egress'], ingress: [rule({ peers: [{ podSelector: { matchLabels: { pod: 'b' } } }], ports: [{ protocol: 'TCP', port: 80 }, { protocol: 'TCP', port: 8000, endPort: 8080 }, { protocol: 'UDP' }] })], egress: [rule({ peers: [{ podSelector: { matchLabels: { pod: 'b' } } }] })] }),
    ],
    namespaces,
    pods,
    local: new Set(['x/a', 'x/b']),
  });
  const text = renderPolicyRuleset(plan, { sources: [{ port: 'atl000000000002', ip: '10.0.1.11' }, { port: 'atl000000000001', ip: '10.0.1.10' }], localBlocks: [parseCidr('10.0.1.0/24') as Cidr] });
  assert.equal(text, [
    'table inet atoll_policy',
    'delete table inet atoll_policy',
    'table inet atoll_policy {',
    '  comment "managed by atoll; do not edit"',
    '  set pods_2a40cf793c08 { type ipv4_addr; elements = { 10.0.1.11 }; }',
    '  counter drop_egress_10_0_1_10 { }',
    '  counter drop_ingress_10_0_1_10 { }',
    '  map egress { type ipv4_addr : verdict; elements = { 10.0.1.10 : jump egress_10_0_1_10 }; }',
    '  map ingress { type ipv4_addr : verdict; elements = { 10.0.1.10 : jump ingress_10_0_1_10 }; }',
    '  chain forward {',
    '    type filter hook forward priority filter; policy accept;',
    '    ct state established,related accept',
    '    ip saddr vmap @egress',
    '    ip daddr vmap @ingress',
    '  }',
    '  chain egress_10_0_1_10 {',
    '    ip daddr @pods_2a40cf793c08 return comment "x/web egress rule 0"',
    '    counter name "drop_egress_10_0_1_10" drop comment "egress of x/a: no rule allows"',
    '  }',
    '  chain ingress_10_0_1_10 {',
    '    ip saddr @pods_2a40cf793c08 meta l4proto tcp th dport { 80, 8000-8080 } accept comment "x/web ingress rule 0"',
    '    ip saddr @pods_2a40cf793c08 meta l4proto udp accept comment "x/web ingress rule 0"',
    '    counter name "drop_ingress_10_0_1_10" drop comment "ingress of x/a: no rule allows"',
    '  }',
    '}',
    'table bridge atoll_policy',
    'delete table bridge atoll_policy',
    'table bridge atoll_policy {',
    '  comment "managed by atoll; do not edit"',
    '  set local_blocks { type ipv4_addr; flags interval; elements = { 10.0.1.0/24 }; }',
    '  set pod_addresses { type ipv4_addr; elements = { 10.0.1.10, 10.0.1.11 }; }',
    '  set pod_sources { type ifname . ipv4_addr; elements = { "atl000000000001" . 10.0.1.10, "atl000000000002" . 10.0.1.11 }; }',
    '  chain prerouting {',
    '    type filter hook prerouting priority filter; policy accept;',
    `    iifname "atl*" ether type ip ip saddr != @local_blocks counter drop comment "a pod sending from outside the node's blocks"`,
    `    iifname "atl*" ether type ip ip saddr @pod_addresses iifname . ip saddr != @pod_sources counter drop comment "a pod sending from another pod's address"`,
    '  }',
    '}',
    '',
  ].join('\n'));
});

test('the delta (golden): only what changed, new things first, gone things last; nothing when nothing changed', () => {
  const tables = (policies: NetworkPolicy[], morePods: PolicyPod[] = []) => buildPolicyTables(
    compilePolicies({ policies, namespaces, pods: [...pods, ...morePods], local: new Set(['x/a', 'x/b']) }),
    { sources: [{ port: 'atl000000000001', ip: '10.0.1.10' }], localBlocks: [parseCidr('10.0.1.0/24') as Cidr] },
  );
  const fromB = policy({ name: 'a-from-b', podSelector: { matchLabels: { pod: 'a' } }, ingress: [rule({ peers: [{ podSelector: { matchLabels: { pod: 'b' } } }] })] });
  const before = tables([fromB]);
  assert.equal(renderPolicyDelta(before, before), '');
  // another pod labelled b: one element added to the set, nothing else
  const extra: PolicyPod = { namespace: 'x', name: 'b2', ip: '10.0.1.20', labels: { pod: 'b' }, ports: [] };
  assert.equal(renderPolicyDelta(before, tables([fromB], [extra])), 'add element inet atoll_policy pods_2a40cf793c08 { 10.0.1.20 }\n');
  // the policy replaced by a deny for b: a's chain and its set go (after its map entry), b's chain comes
  const denyB = policy({ name: 'deny-b', podSelector: { matchLabels: { pod: 'b' } } });
  assert.equal(renderPolicyDelta(before, tables([denyB])), [
    'add counter inet atoll_policy drop_ingress_10_0_1_11',
    'add chain inet atoll_policy ingress_10_0_1_11',
    'add rule inet atoll_policy ingress_10_0_1_11 counter name "drop_ingress_10_0_1_11" drop comment "ingress of x/b: no rule allows"',
    'delete element inet atoll_policy ingress { 10.0.1.10 }',
    'add element inet atoll_policy ingress { 10.0.1.11 : jump ingress_10_0_1_11 }',
    'flush chain inet atoll_policy ingress_10_0_1_10',
    'delete chain inet atoll_policy ingress_10_0_1_10',
    'delete counter inet atoll_policy drop_ingress_10_0_1_10',
    'delete set inet atoll_policy pods_2a40cf793c08',
    '',
  ].join('\n'));
});

test('explain names the policies isolating each side and the rules letting a flow through, the same ones decide takes', () => {
  const plan = compile([
    policy({ name: 'deny-all', podSelector: {} }),
    policy({ name: 'allow-web', podSelector: { matchLabels: { pod: 'a' } }, ingress: [
      rule({ peers: [{ ipBlock: { cidr: '192.0.2.0/24', except: [] } }] }),
      rule({ peers: [{ podSelector: { matchLabels: { pod: 'b' } } }], ports: [{ protocol: 'TCP', port: 80 }, { protocol: 'UDP', port: 'serve-81-udp' }] }),
      rule({ peers: [{ podSelector: { matchExpressions: [{ key: 'pod', operator: 'In', values: ['b', 'c'] }] }, namespaceSelector: { matchLabels: { ns: 'y' } } }], ports: [{ protocol: 'TCP', port: 8000, endPort: 8080 }] }),
    ] }),
    policy({ name: 'out', namespace: 'y', podSelector: { matchLabels: { pod: 'b' } }, policyTypes: ['Egress'], egress: [rule({ peers: [{ namespaceSelector: {} }], ports: [{ protocol: 'TCP' }] })] }),
  ]);
  const ip = (ns: string, pod: string) => parseIpv4(ipOf(ns, pod)) as number;
  const sides = (from: [string, string], to: [string, string], l4?: { protocol: L4; port: number }) =>
    explain(plan, { src: ip(...from), dst: ip(...to), ...(l4 ? { l4 } : {}) }).map((s) => `${s.direction} ${s.pod} [${s.isolatedBy.join(' ')}]: ${s.allowedBy.map((r) => `${r.policy}#${r.rule} (${r.what})`).join('; ') || 'DROP'}`);

  assert.deepEqual(sides(['x', 'b'], ['x', 'a'], { protocol: 'tcp', port: 80 }), ['ingress x/a [x/allow-web x/deny-all]: x/allow-web#1 (from pods pod=b of x, TCP 80, UDP 81)']);
  assert.deepEqual(sides(['x', 'c'], ['x', 'a'], { protocol: 'tcp', port: 80 }), ['ingress x/a [x/allow-web x/deny-all]: DROP']);
  assert.deepEqual(sides(['x', 'b'], ['x', 'a'], { protocol: 'tcp', port: 81 }), ['ingress x/a [x/allow-web x/deny-all]: DROP']);
  // without a port: every rule naming the remote address, with what it allows
  assert.deepEqual(sides(['y', 'b'], ['x', 'a']), [
    'egress y/b [y/out]: y/out#0 (to every pod in every namespace, TCP every port)',
    'ingress x/a [x/allow-web x/deny-all]: x/allow-web#2 (from pods pod in (b,c) in namespaces ns=y, TCP 8000-8080)',
  ]);
  assert.deepEqual(sides(['y', 'b'], ['x', 'a'], { protocol: 'udp', port: 8000 }), ['egress y/b [y/out]: DROP', 'ingress x/a [x/allow-web x/deny-all]: DROP']);
  // a pod only deny-all isolates, and a pair no policy touches
  assert.deepEqual(sides(['x', 'a'], ['x', 'c']), ['ingress x/c [x/deny-all]: DROP']);
  assert.deepEqual(sides(['z', 'a'], ['z', 'b']), []);
  assert.equal(plan.pods.find((p) => p.pod === 'x/a')?.ingress?.[0]?.what, 'from 192.0.2.0/24, every port');

  // decide is explain's first rule per side, refused at the first side with none
  assert.deepEqual(decide(plan, { src: ip('y', 'b'), dst: ip('x', 'a'), protocol: 'tcp', port: 8080 }), { allowed: true, egressBy: { policy: 'y/out', rule: 0 }, ingressBy: { policy: 'x/allow-web', rule: 2 } });
  assert.deepEqual(decide(plan, { src: ip('y', 'b'), dst: ip('x', 'a'), protocol: 'udp', port: 8080 }), { allowed: false, deniedAt: 'egress of y/b' });
});

test('policyProblems finds, from the policy alone, the ipBlocks the compiler cannot read (once each)', () => {
  const bad = policy({ name: 'bad', ingress: [rule({ peers: [{ ipBlock: { cidr: '10.0.0.0/33', except: [] } }] }), rule({ peers: [{ ipBlock: { cidr: '10.0.0.0/33', except: [] } }, { ipBlock: { cidr: '10.0.0.0/8', except: ['nope'] } }] })] });
  assert.deepEqual(policyProblems(bad).map((p) => `${p.policy}: ${p.message}`), [
    'x/bad: ipBlock cidr "10.0.0.0/33" is not an IPv4 or IPv6 prefix; the peer matches nothing',
    'x/bad: ipBlock except "nope" is not a prefix; the peer matches nothing',
  ]);
  assert.deepEqual(policyProblems(bad), compile([bad]).problems, 'the same problems as the compiler meets');
  assert.deepEqual(policyProblems(policy({ name: 'ok', ingress: [rule({ peers: [{ ipBlock: { cidr: '2001:db8::/32', except: [] } }] })] })), []);
});

test('drops are tallied per direction and isolating policies from the pods\' drop counters, through a counter made anew', () => {
  const plan = compile([policy({ name: 'deny', podSelector: {} }), policy({ name: 'web', podSelector: { matchLabels: { pod: 'a' } } }), policy({ name: 'out', namespace: 'y', policyTypes: ['Egress'] })]);
  const last = new Map<string, number>();
  const ip = (ns: string, pod: string) => parseIpv4(ipOf(ns, pod)) as number;
  const read = (entries: [string, number][]) => tallyDrops(plan, new Map(entries), last);
  assert.deepEqual(read([[dropCounterOf('ingress', ip('x', 'a')), 5], [dropCounterOf('ingress', ip('x', 'b')), 2], [dropCounterOf('ingress', ip('x', 'c')), 1], [dropCounterOf('egress', ip('y', 'a')), 7], ['drop_ingress_10_9_9_9', 100]]),
    new Map([['ingress x/deny,x/web', 5], ['ingress x/deny', 3], ['egress y/out', 7]]));
  // since then: a's count went on, b's counter was made anew (a whole apply) and holds 1, c's chain is gone
  assert.deepEqual(read([[dropCounterOf('ingress', ip('x', 'a')), 9], [dropCounterOf('ingress', ip('x', 'b')), 1], [dropCounterOf('egress', ip('y', 'a')), 7]]),
    new Map([['ingress x/deny,x/web', 4], ['ingress x/deny', 1], ['egress y/out', 0]]));
  assert.deepEqual([...last.keys()].sort(), [dropCounterOf('egress', ip('y', 'a')), dropCounterOf('ingress', ip('x', 'a')), dropCounterOf('ingress', ip('x', 'b'))].sort());
});

test('a selector with thousands of matches is one rule and one set; pod addresses go one by one into a hash set, ipBlocks into an interval set', () => {
  // 6,000 remote pods in 30 namespaces, on 24 nodes' /24s: every one matched by an empty namespaceSelector
  const many: PolicyPod[] = Array.from({ length: 6000 }, (_, i) => ({
    namespace: `ns${i % 30}`, name: `p${i}`, ip: `10.9.${Math.floor(i / 250)}.${(i % 250) + 2}`, labels: { app: 'client' }, ports: [],
  }));
  const target: PolicyPod = { namespace: 'x', name: 'db', ip: '10.8.0.2', labels: { app: 'db' }, ports: [] };
  const clients = { namespaceSelector: {}, podSelector: { matchLabels: { app: 'client' } } };
  const fromAll = policy({ name: 'from-everyone', podSelector: { matchLabels: { app: 'db' } }, ingress: [{ peers: [clients], ports: [] }, { peers: [clients, { ipBlock: { cidr: '192.168.0.0/16', except: [] } }], ports: [] }] });
  const plan = compilePolicies({
    policies: [fromAll], namespaces: [...namespaces, ...Array.from({ length: 30 }, (_, i) => ({ name: `ns${i}`, labels: {} }))], pods: [...many, target], local: new Set(['x/db']),
  });
  const rules = plan.pods[0]?.ingress ?? [];
  assert.deepEqual(rules.map((r) => [r.podsOnly, r.peers === 'any' ? 'any' : r.peers.length]), [[true, 24], [false, 25]], 'each node\'s 250 contiguous addresses one interval in the plan');
  const tables = buildPolicyTables(plan, { sources: [{ port: 'atlx', ip: '10.8.0.2' }], localBlocks: [parseCidr('10.8.0.0/24', false) as Cidr] });
  const sets = [...tables.sets.values()];
  assert.deepEqual(sets.map((set) => [set.addresses, set.items.length]), [[true, 6000], [false, 25]], 'the pods one by one; with the ipBlock, intervals');
  const text = renderPolicyTables(tables);
  assert.match(text, /set pods_\w+ \{ type ipv4_addr; elements = \{ 10\.9\.0\.2, /);
  assert.match(text, /set peers_\w+ \{ type ipv4_addr; flags interval; elements = \{ 10\.9\.0\.2-10\.9\.0\.251, /);
  assert.equal(decide(plan, { src: parseIpv4('10.9.23.251') as number, dst: parseIpv4('10.8.0.2') as number, protocol: 'tcp', port: 5432 }).allowed, true);
});
