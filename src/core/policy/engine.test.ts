import { test } from 'node:test';
import assert from 'node:assert/strict';
import { parseCidr, parseIpv4 } from '../net/ipv4.ts';
import type { IpamRecord } from '../ipam/sticky-pool.ts';
import { PolicyEngine } from './engine.ts';
import type { NetworkPolicy } from './model.ts';
import { policyRevision } from './scope.ts';

const node = 'n1';
const denyAll: NetworkPolicy = { namespace: 'x', name: 'deny', podSelector: { matchLabels: { app: 'db' } }, policyTypes: ['Ingress'], ingress: [], egress: [] };
const fromWeb: NetworkPolicy = {
  namespace: 'x', name: 'from-web', podSelector: { matchLabels: { app: 'db' } }, policyTypes: ['Ingress'], egress: [],
  ingress: [{ peers: [{ podSelector: { matchLabels: { app: 'web' } } }], ports: [] }],
};
const record = (name: string, ip: string): IpamRecord => ({ ip: parseIpv4(ip) as number, namespace: 'x', name, containerId: `c-${name}`, ifName: 'eth0' });
const blocks = [parseCidr('10.1.0.0/24', false)!];
const db = record('db', '10.1.0.2');

function engineWith(...policies: NetworkPolicy[]): PolicyEngine {
  const e = new PolicyEngine();
  e.apply({
    type: 'snapshot', policies, namespaces: [{ name: 'x', labels: {} }],
    pods: [{ namespace: 'x', name: 'db', ip: '', labels: { app: 'db' }, ports: [], node }, { namespace: 'x', name: 'web', ip: '10.2.0.5', labels: { app: 'web' }, ports: [], node: 'n2' }],
  });
  return e;
}

test('the engine compiles whole first, then deltas from what was committed as kept; nothing is in force before the commit', () => {
  const e = engineWith(denyAll);
  const first = e.compile({ nodeName: node, active: [db], blocks, classified: [], readsSandboxes: false, givenUp: [], keptValid: false });
  assert.equal(first.delta, false);
  assert.match(first.text, /table inet atoll_policy/);
  assert.deepEqual(first.summary, { policies: 1, names: ['x/deny'], revision: policyRevision([denyAll]), isolatedPods: 1 });
  assert.deepEqual(e.explain({ src: parseIpv4('10.2.0.5') as number, dst: db.ip }), [], 'not committed: the plan in force is still empty');
  e.committed(true);
  assert.equal(e.explain({ src: parseIpv4('10.2.0.5') as number, dst: db.ip })[0]?.allowedBy.length, 0, 'db is isolated and nothing lets web in');
  const same = e.compile({ nodeName: node, active: [db], blocks, classified: [], readsSandboxes: false, givenUp: [], keptValid: true });
  assert.deepEqual([same.delta, same.text], [true, ''], 'nothing changed: an empty delta');
  e.apply({ type: 'put', policy: fromWeb });
  const changed = e.compile({ nodeName: node, active: [db], blocks, classified: [], readsSandboxes: false, givenUp: [], keptValid: true });
  assert.equal(changed.delta, true);
  assert.match(changed.text, /10\.2\.0\.5/, 'the delta adds web to db\'s peers');
  assert.doesNotMatch(changed.text, /^table inet atoll_policy \{/m, 'a delta, not the table whole');
  assert.match(e.whole(), /^table inet atoll_policy \{/m, 'the same plan whole, for a delta the kernel refused');
  assert.equal(e.compile({ nodeName: node, active: [db], blocks, classified: [], readsSandboxes: false, givenUp: [], keptValid: false }).delta, false, 'the kernel changed since: whole again');
  e.committed(false);
  assert.equal(e.compile({ nodeName: node, active: [db], blocks, classified: [], readsSandboxes: false, givenUp: [], keptValid: true }).delta, false, 'committed as not kept: no delta from it');
});

test('the engine names the records its view does not know, and takes their labels from the sandboxes given', () => {
  const e = engineWith(denyAll);
  const stranger = record('stranger', '10.1.0.3');
  assert.deepEqual(e.unknown([db, stranger], node), [stranger]);
  const res = e.compile({ nodeName: node, active: [db, stranger], blocks, classified: [['c-stranger', { namespace: 'x', name: 'stranger', uid: 'u', labels: { app: 'db' } }]], readsSandboxes: true, givenUp: [], keptValid: false });
  assert.deepEqual(res.unknown, [stranger]);
  assert.equal(res.summary.isolatedPods, 2, 'the stranger is a db pod by its sandbox\'s labels');
});

test('a pod the view does not know is closed while its sandbox is being read, in the directions its namespace\'s policies cover; open once given up on, or without a runtime', () => {
  const e = engineWith(denyAll); // x/deny: Ingress only
  const stranger = record('stranger', '10.1.0.3');
  const elsewhere: IpamRecord = { ...record('other', '10.1.0.4'), namespace: 'y' }; // no policy in y
  const run = (over: { readsSandboxes: boolean; givenUp?: string[]; classified?: [string, { namespace: string; name: string; uid: string; labels: Record<string, string> }][] }) =>
    e.compile({ nodeName: node, active: [db, stranger, elsewhere], blocks, classified: over.classified ?? [], readsSandboxes: over.readsSandboxes, givenUp: over.givenUp ?? [], keptValid: false });
  const reading = run({ readsSandboxes: true });
  assert.equal(reading.summary.isolatedPods, 2, 'db by its policy, the stranger closed while read; y/other open (no policy in y could select it)');
  e.committed(false);
  const inbound = e.explain({ src: parseIpv4('10.2.0.5') as number, dst: stranger.ip });
  assert.deepEqual(inbound.map((s) => [s.direction, s.isolatedBy, s.allowedBy.length]), [['ingress', ['(its CRI sandbox being read)'], 0]]);
  assert.deepEqual(e.explain({ src: stranger.ip, dst: parseIpv4('10.2.0.5') as number }), [], 'egress open: no policy of x covers egress');
  assert.match(reading.text, /chain ingress_10_1_0_3 \{\n\s+counter name "drop_ingress_10_1_0_3" drop/, 'a chain with nothing allowed');
  assert.equal(run({ readsSandboxes: true, givenUp: ['c-stranger'] }).summary.isolatedPods, 1, 'given up on: left to the view, open');
  assert.equal(run({ readsSandboxes: false }).summary.isolatedPods, 1, 'no runtime to ask: open, as before');
  assert.equal(run({ readsSandboxes: true, classified: [['c-stranger', { namespace: 'x', name: 'stranger', uid: 'u', labels: { app: 'web' } }]] }).summary.isolatedPods, 1, 'read: a web pod, which no policy selects');
});
