import { test } from 'node:test';
import assert from 'node:assert/strict';
import { compilePolicies, explain } from '../policy/compile.ts';
import type { NetworkPolicy } from '../policy/model.ts';
import { parseIpv4 } from '../net/ipv4.ts';
import { parseL4, policyTraceOf, renderPolicyTrace } from './policy-trace.ts';

const pods = [['a', '10.100.0.10', 'api'], ['w', '10.100.0.11', 'web'], ['o', '10.100.0.12', 'other']].map(([name, ip, role]) => ({ namespace: 'x', name: name as string, ip: ip as string, labels: { role: role as string }, ports: [] }));
const policies: NetworkPolicy[] = [
  { namespace: 'x', name: 'deny-all', podSelector: {}, policyTypes: ['Ingress'], ingress: [], egress: [] },
  { namespace: 'x', name: 'allow-web', podSelector: { matchLabels: { role: 'api' } }, policyTypes: ['Ingress'], egress: [], ingress: [{ peers: [{ ipBlock: { cidr: '192.0.2.0/24', except: [] } }], ports: [] }, { peers: [{ podSelector: { matchLabels: { role: 'web' } } }], ports: [{ protocol: 'TCP', port: 80 }] }] },
];
const plan = compilePolicies({ policies, namespaces: [{ name: 'x', labels: {} }], pods, local: new Set(['x/a', 'x/w', 'x/o']) });
const trace = (from: string, to: string, port?: string) => {
  const l4 = port === undefined ? undefined : parseL4(port);
  const t = policyTraceOf(explain(plan, { src: parseIpv4(from) as number, dst: parseIpv4(to) as number, ...(l4 ? { l4 } : {}) }));
  return renderPolicyTrace(t, { from, to, ...(l4 ? { l4 } : {}), self: 'n1', toNode: to.startsWith('10.100.0.') ? 'n1' : 'n2' });
};

test('a trace names the policy and rule that let a packet in, or the side that drops it and the policies isolating it', () => {
  assert.deepEqual(trace('10.100.0.11', '10.100.0.10', 'tcp/80'), { verdict: 'allowed', lines: [
    'egress of 10.100.0.11: open, no NetworkPolicy isolates it for egress',
    'ingress to x/a: allowed by x/allow-web rule 1 (from pods role=web of x, TCP 80)',
  ] });
  assert.deepEqual(trace('10.100.0.12', '10.100.0.10', 'TCP/80'), { verdict: 'dropped', lines: [
    'egress of 10.100.0.12: open, no NetworkPolicy isolates it for egress',
    'ingress to x/a: DROPPED: x/a is isolated for ingress by x/allow-web, x/deny-all; no rule allows 10.100.0.12 TCP 80',
  ] });
  // without a port: the rules and the ports they allow; dropped only when a side allows nothing at all
  assert.deepEqual(trace('10.100.0.11', '10.100.0.10'), { verdict: 'depends', lines: [
    'egress of 10.100.0.11: open, no NetworkPolicy isolates it for egress',
    'ingress to x/a: x/a is isolated for ingress by x/allow-web, x/deny-all; for 10.100.0.11, only what these rules allow: x/allow-web rule 1 (from pods role=web of x, TCP 80)',
  ] });
  assert.equal(trace('10.100.0.10', '10.100.0.12').verdict, 'dropped');
  // another node's pod: its ingress is that node's to judge
  assert.deepEqual(trace('10.100.0.10', '10.200.0.5', 'udp/53').lines[1], 'ingress to 10.200.0.5: judged on node n2, by the policies of its own pods (this node holds no rules for it)');
});

test('a port is PROTOCOL/NUMBER', () => {
  assert.deepEqual(parseL4('udp/53'), { protocol: 'udp', port: 53 });
  assert.deepEqual(parseL4('SCTP/9'), { protocol: 'sctp', port: 9 });
  for (const bad of ['80', 'tcp/0', 'tcp/65536', 'icmp/1', 'tcp/', 'tcp/80x']) assert.equal(parseL4(bad), undefined, bad);
});
