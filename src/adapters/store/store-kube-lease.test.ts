import { test } from 'node:test';
import assert from 'node:assert/strict';
import { leaseVerdict, microTime, nextLeaseSpec } from './store-kube-lease.ts';

const T0 = new Date('2025-03-01T12:00:00.123Z');

test('verdicts: absent, free, mine, and expiry by the local clock since the record last changed', () => {
  assert.equal(leaseVerdict(undefined, 'a', 0, 0), 'absent');
  assert.equal(leaseVerdict({ leaseDurationSeconds: 15 }, 'a', 0, 0), 'free');
  assert.equal(leaseVerdict({ holderIdentity: '', leaseDurationSeconds: 15 }, 'a', 0, 0), 'free');
  assert.equal(leaseVerdict({ holderIdentity: 'a', leaseDurationSeconds: 15 }, 'a', 0, 1e9), 'mine');
  const b = { holderIdentity: 'b', leaseDurationSeconds: 15, renewTime: '1999-01-01T00:00:00.000000Z' };
  // renewTime, however old by this machine's wall clock, does not count: only how long the record stood still here.
  assert.equal(leaseVerdict(b, 'a', 1000, 1000), 'held');
  assert.equal(leaseVerdict(b, 'a', 1000, 15_999), 'held');
  assert.equal(leaseVerdict(b, 'a', 1000, 16_000), 'expired');
});

test('the spec written: a takeover counts a transition and sets acquireTime; a renewal keeps them', () => {
  const first = nextLeaseSpec(undefined, 'a', 15, T0);
  assert.deepEqual(first, { holderIdentity: 'a', leaseDurationSeconds: 15, acquireTime: '2025-03-01T12:00:00.123000Z', renewTime: '2025-03-01T12:00:00.123000Z', leaseTransitions: 0 });
  const later = new Date(T0.getTime() + 5000);
  const renewed = nextLeaseSpec(first, 'a', 15, later);
  assert.equal(renewed.acquireTime, first.acquireTime);
  assert.equal(renewed.renewTime, microTime(later));
  assert.equal(renewed.leaseTransitions, 0);
  const taken = nextLeaseSpec(renewed, 'b', 15, later);
  assert.equal(taken.holderIdentity, 'b');
  assert.equal(taken.acquireTime, microTime(later));
  assert.equal(taken.leaseTransitions, 1);
  // Taking a released lease (no holder) is not a transition between holders.
  assert.equal(nextLeaseSpec({ ...taken, holderIdentity: undefined }, 'a', 15, later).leaseTransitions, 1);
});

test('MicroTime has six fractional digits', () => {
  assert.equal(microTime(new Date('2025-01-02T03:04:05.006Z')), '2025-01-02T03:04:05.006000Z');
});
