import { test } from 'node:test';
import assert from 'node:assert/strict';
import { IpamState, type IpamChange } from './sticky-pool.ts';
import { parseCidr, formatIpv4, type Cidr } from '../net/ipv4.ts';
import { AtollError } from '../errors.ts';

const block = (s: string) => parseCidr(s) as Cidr;

function alloc(state: IpamState, req: { namespace?: string; name?: string; containerId: string; ifName?: string; now?: number }) {
  const plan = state.planAllocate({ ifName: 'eth0', now: 0, ...req });
  state.apply(plan.changes);
  return { ip: formatIpv4(plan.record.ip), plan };
}

function release(state: IpamState, containerId: string, now: number): IpamChange[] {
  const c = state.planRelease(containerId, 'eth0', now);
  state.apply(c);
  return c;
}

test('addresses skip the network, gateway and broadcast addresses', () => {
  const s = new IpamState([block('10.0.0.0/30')]);
  assert.equal(alloc(s, { containerId: 'a' }).ip, '10.0.0.2');
  assert.throws(() => alloc(s, { containerId: 'b' }), (e: AtollError) => e.code === 'IPAM_EXHAUSTED');
});

test('a re-created pod gets its previous address back, whatever its container ID', () => {
  const s = new IpamState([block('10.0.0.0/24')]);
  const first = alloc(s, { namespace: 'default', name: 'web-0', containerId: 'c1' }).ip;
  alloc(s, { namespace: 'default', name: 'other', containerId: 'c2' });
  release(s, 'c1', 1000);
  const again = alloc(s, { namespace: 'default', name: 'web-0', containerId: 'c3', now: 2000 });
  assert.equal(again.ip, first);
  assert.equal(again.plan.how, 'sticky');
  assert.equal(again.plan.displaced, undefined);
});

test('a repeated ADD of the same attachment is idempotent', () => {
  const s = new IpamState([block('10.0.0.0/24')]);
  const a = alloc(s, { namespace: 'ns', name: 'p', containerId: 'c1' });
  const b = alloc(s, { namespace: 'ns', name: 'p', containerId: 'c1' });
  assert.equal(a.ip, b.ip);
  assert.equal(b.plan.how, 'existing');
  assert.equal(b.plan.changes.length, 0);
});

test('a pod re-created without a DEL displaces its stale attachment', () => {
  const s = new IpamState([block('10.0.0.0/24')]);
  alloc(s, { namespace: 'ns', name: 'p', containerId: 'old' });
  const b = alloc(s, { namespace: 'ns', name: 'p', containerId: 'new' });
  assert.equal(b.plan.displaced?.containerId, 'old');
  assert.equal(s.findAttachment('old', 'eth0'), undefined);
});

test('pods without a Kubernetes identity are not sticky', () => {
  const s = new IpamState([block('10.0.0.0/24')]);
  alloc(s, { containerId: 'x' });
  const changes = release(s, 'x', 5);
  assert.equal(changes[0]?.op, 'remove');
  assert.equal(s.records().length, 0);
});

test('under pressure the oldest reservation is reclaimed first, never an active address', () => {
  const s = new IpamState([block('10.0.0.0/29')]); // .2 .. .6: five addresses
  for (let i = 0; i < 5; i++) alloc(s, { namespace: 'n', name: `p${i}`, containerId: `c${i}` });
  release(s, 'c3', 300);
  release(s, 'c1', 100);
  release(s, 'c4', 200);
  const got = alloc(s, { namespace: 'n', name: 'new', containerId: 'cn', now: 400 });
  assert.equal(got.plan.how, 'reclaimed');
  assert.equal(got.ip, '10.0.0.3'); // p1's, released at 100
  assert.equal(s.findPod('n', 'p1'), undefined);
  assert.ok(s.findPod('n', 'p3'));
  const ips = s.records().map((r) => r.ip);
  assert.equal(new Set(ips).size, ips.length);
});

test('reservations expire after the TTL', () => {
  const s = new IpamState([block('10.0.0.0/24')]);
  alloc(s, { namespace: 'n', name: 'p', containerId: 'c' });
  release(s, 'c', 1000);
  assert.equal(s.planExpire(1500, 1000).length, 0);
  const exp = s.planExpire(2000, 1000);
  assert.equal(exp.length, 1);
  s.apply(exp);
  assert.equal(s.records().length, 0);
});

test('undo of a failed ADD restores the state before it', () => {
  const s = new IpamState([block('10.0.0.0/29')]);
  for (let i = 0; i < 5; i++) alloc(s, { namespace: 'n', name: `p${i}`, containerId: `c${i}` });
  release(s, 'c2', 10);
  const before = JSON.stringify(s.records());
  const plan = s.planAllocate({ namespace: 'n', name: 'z', containerId: 'cz', ifName: 'eth0', now: 20 });
  s.apply(plan.changes);
  s.apply(plan.undo);
  assert.equal(JSON.stringify(s.records()), before);
});

test('GC releases every attachment not listed as valid', () => {
  const s = new IpamState([block('10.0.0.0/24')]);
  alloc(s, { namespace: 'n', name: 'a', containerId: 'ca' });
  alloc(s, { namespace: 'n', name: 'b', containerId: 'cb' });
  const changes = s.planGc([{ containerId: 'ca', ifName: 'eth0' }], 50);
  assert.deepEqual(changes.map((c) => c.record.containerId), ['cb']);
});

test('no blocks gives a clear error', () => {
  const s = new IpamState([]);
  assert.throws(() => alloc(s, { containerId: 'a' }), (e: AtollError) => e.code === 'IPAM_NO_BLOCKS' && /podCidrs/.test(e.fix ?? ''));
});

test('usage counts allocated, reserved and free addresses', () => {
  const s = new IpamState([block('10.0.0.0/28')]);
  alloc(s, { namespace: 'n', name: 'a', containerId: 'ca' });
  alloc(s, { namespace: 'n', name: 'b', containerId: 'cb' });
  release(s, 'cb', 1);
  assert.deepEqual(s.usage(), { capacity: 13, allocated: 1, reserved: 1, free: 11 });
});

test('guarded reuse: a reservation goes to another pod only once marked reusable, past its TTL too', () => {
  const s = new IpamState([block('10.0.0.0/30')], [], { guardReuse: true }); // one address: 10.0.0.2
  alloc(s, { namespace: 'ns', name: 'old', containerId: 'c1' });
  release(s, 'c1', 1000);
  assert.deepEqual(s.awaitingReuse().map((r) => r.name), ['old']);
  assert.equal(s.canAllocate(), false);
  assert.throws(() => alloc(s, { namespace: 'ns', name: 'new', containerId: 'c2' }), (e: AtollError) => e.code === 'IPAM_EXHAUSTED' && /peers' NetworkPolicy/.test(e.message));
  assert.deepEqual(s.planExpire(10_000_000, 1000), [], 'an expired reservation peers may still hold stays');
  // its own pod still comes back to it
  assert.equal(alloc(s, { namespace: 'ns', name: 'old', containerId: 'c3' }).plan.how, 'sticky');
  const second = release(s, 'c3', 2000);
  // a clearance of the first release no longer applies: the pod came back and left again
  assert.deepEqual(s.planReusable([{ ip: 0x0a000002, namespace: 'ns', name: 'old', releasedAt: 1000 }]), []);
  assert.deepEqual(s.planReusable([{ ip: 0x0a000002, namespace: 'ns', name: 'other', releasedAt: 2000 }]), []);
  const marked = s.planReusable([{ ip: 0x0a000002, namespace: 'ns', name: 'old', releasedAt: 2000 }]);
  assert.equal(marked.length, 1);
  s.apply(marked);
  assert.deepEqual(s.planReusable([{ ip: 0x0a000002, namespace: 'ns', name: 'old', releasedAt: 2000 }]), [], 'marked once');
  assert.deepEqual(s.awaitingReuse(), []);
  assert.equal(s.canAllocate(), true);
  assert.equal(second.length, 1);
  const taken = alloc(s, { namespace: 'ns', name: 'new', containerId: 'c4', now: 3000 });
  assert.equal(taken.plan.how, 'reclaimed');
  // the new pod's own reservation is not reusable: it has a release of its own to be cleared
  release(s, 'c4', 4000);
  assert.deepEqual(s.awaitingReuse().map((r) => r.name), ['new']);
});

test('guarded reuse: a reusable reservation expires after its TTL; a pod without a Kubernetes identity frees at once', () => {
  const s = new IpamState([block('10.0.0.0/29')], [], { guardReuse: true });
  alloc(s, { namespace: 'ns', name: 'a', containerId: 'c1' });
  alloc(s, { containerId: 'plain' });
  release(s, 'c1', 1000);
  release(s, 'plain', 1000);
  assert.equal(s.usage().reserved, 1, 'the plain container left no reservation');
  s.apply(s.planReusable([{ ip: 0x0a000002, namespace: 'ns', name: 'a', releasedAt: 1000 }]));
  assert.deepEqual(s.planExpire(1500, 1000), []);
  assert.equal(s.planExpire(2000, 1000).length, 1);
});

test('unguarded (no NetworkPolicy): nothing awaits reuse, the oldest reservation is reclaimed as before', () => {
  const s = new IpamState([block('10.0.0.0/30')]);
  alloc(s, { namespace: 'ns', name: 'old', containerId: 'c1' });
  release(s, 'c1', 1000);
  assert.deepEqual(s.awaitingReuse(), []);
  assert.equal(alloc(s, { namespace: 'ns', name: 'new', containerId: 'c2' }).plan.how, 'reclaimed');
});
