import { test } from 'node:test';
import assert from 'node:assert/strict';
import { PeerHoldings, reusableAddresses } from './reuse.ts';
import type { NodePolicyView, ViewPod } from './scope.ts';

const pod = (name: string, ip: string, node = 'owner'): ViewPod => ({ namespace: 'x', name, node, ip, labels: {}, ports: [] });
const view = (...pods: ViewPod[]): NodePolicyView => ({ policies: [], namespaces: [], pods });
const gone = { ip: '10.0.0.5', namespace: 'x', name: 'a' };
const none = () => false;

test('a peer holds what it acknowledged and every view sent after it, across streams, until it acknowledges a later one', () => {
  const h = new PeerHoldings();
  assert.equal(h.holds('p'), undefined, 'nothing known before an acknowledgement');
  h.sent('p', 's1', 0, view(pod('a', '10.0.0.5')));
  assert.equal(h.holds('p'), undefined, 'sent is not applied');
  assert.equal(h.applied('p', 's1', 0), true);
  assert.equal(h.holds('p')?.('10.0.0.5'), true);
  h.sent('p', 's1', 1, view());
  assert.equal(h.holds('p')?.('10.0.0.5'), true, 'the view without it is not acknowledged yet');
  // the stream breaks; a new one sends a snapshot that names the address again (the pod came back), then drops it
  h.sent('p', 's2', 0, view(pod('a', '10.0.0.5')));
  h.sent('p', 's2', 1, view());
  assert.equal(h.applied('p', 's1', 1), true);
  assert.equal(h.holds('p')?.('10.0.0.5'), true, 'later views it may have applied still name it');
  assert.equal(h.applied('p', 's2', 1), true);
  assert.equal(h.holds('p')?.('10.0.0.5'), false);
  assert.equal(h.applied('p', 's2', 1), false, 'a mark answered twice is not known');
  assert.equal(h.applied('p', 'other', 0), false);
  assert.equal(h.applied('q', 's2', 1), false, 'another node cannot answer for p');
});

test('views waiting for an acknowledgement beyond 64 are folded, never forgotten', () => {
  const h = new PeerHoldings();
  h.sent('p', 's', 0, view());
  h.applied('p', 's', 0);
  h.sent('p', 's', 1, view(pod('a', '10.0.0.5')));
  for (let i = 2; i < 100; i++) h.sent('p', 's', i, view());
  assert.equal(h.holds('p')?.('10.0.0.5'), true, 'the folded view still counts');
  assert.equal(h.applied('p', 's', 1), false, 'a folded mark is not known');
  assert.equal(h.applied('p', 's', 99), true);
  assert.equal(h.holds('p')?.('10.0.0.5'), false);
});

test('an address is reusable when the cluster has no pod at it and no peer may hold one there', () => {
  const holds = (...ips: string[]) => (ip: string) => ips.includes(ip);
  assert.deepEqual(reusableAddresses([gone], none, []), ['10.0.0.5'], 'no peer');
  assert.deepEqual(reusableAddresses([gone], (ip) => ip === '10.0.0.5', []), [], 'the API still has a pod there (terminating)');
  assert.deepEqual(reusableAddresses([gone], none, [{ name: 'p', enforces: true, holds: holds('10.0.0.5') }]), []);
  assert.deepEqual(reusableAddresses([gone, { ...gone, ip: '10.0.0.6' }], none, [{ name: 'p', enforces: true, holds: holds('10.0.0.5') }]), ['10.0.0.6']);
  assert.deepEqual(reusableAddresses([gone], none, [{ name: 'p', enforces: true, holds: undefined }]), [], 'an enforcing peer not known may hold anything');
  assert.deepEqual(reusableAddresses([gone], none, [{ name: 'p', enforces: false, holds: undefined }]), ['10.0.0.5'], 'a peer without policy holds no labels');
  assert.deepEqual(reusableAddresses([gone], none, [{ name: 'p', enforces: false, holds: holds('10.0.0.5') }]), [], 'what it said it holds counts, policy or not');
});
