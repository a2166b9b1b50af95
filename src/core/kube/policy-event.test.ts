import { test } from 'node:test';
import assert from 'node:assert/strict';
import { policyGenerationKey, policyUnsupportedEvent } from './policy-event.ts';

const ref = { namespace: 'shop', name: 'odd', uid: '7fa9d88c-c82d-4905-a00f-a9e695329d6f', generation: 3, resourceVersion: '188' };

test('the Event of a policy generation: a name fixed by uid and generation, a MicroTime, about the NetworkPolicy', () => {
  const e = policyUnsupportedEvent(ref, ['NetworkPolicy shop/odd: spec.ingress[0].ports[0] has protocol "ICMP"'], 'controller-1', Date.UTC(2026, 0, 2, 3, 4, 5, 678));
  assert.equal(e.metadata.name, policyUnsupportedEvent(ref, ['another text'], 'controller-2', 0).metadata.name, 'the same name from any replica, at any time');
  assert.notEqual(e.metadata.name, policyUnsupportedEvent({ ...ref, generation: 4 }, [], 'c', 0).metadata.name);
  assert.notEqual(e.metadata.name, policyUnsupportedEvent({ ...ref, uid: 'other' }, [], 'c', 0).metadata.name, 'a policy deleted and made again');
  assert.match(e.metadata.name, /^odd\.[0-9a-f]{8}$/);
  assert.equal(e.eventTime, '2026-01-02T03:04:05.678000Z');
  assert.deepEqual(e.regarding, { apiVersion: 'networking.k8s.io/v1', kind: 'NetworkPolicy', namespace: 'shop', name: 'odd', uid: ref.uid, resourceVersion: '188' });
  assert.deepEqual([e.type, e.reason, e.reportingController, e.reportingInstance], ['Warning', 'PolicyUnsupported', 'atoll.dev/controller', 'controller-1']);
  assert.match(e.note, /^Atoll enforces this policy more strictly than written \(POLICY_UNSUPPORTED\): NetworkPolicy shop\/odd: /);
  assert.equal(policyGenerationKey(ref), `shop/odd@${ref.uid}/3`);
});

test('a long note is cut to the 1 kB the API takes, a long name to a valid one', () => {
  const e = policyUnsupportedEvent({ ...ref, name: 'p'.repeat(253) }, Array.from({ length: 40 }, (_, i) => `problem ${i} `.repeat(5)), 'c', 0);
  assert.equal(Buffer.byteLength(e.note), 1024);
  assert.ok(e.note.endsWith('...'));
  assert.ok(e.metadata.name.length <= 253);
});
