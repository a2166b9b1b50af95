import { test } from 'node:test';
import assert from 'node:assert/strict';
import { afterProbe, DIRECT_LOSS_GRACE_MS, PROBE_RETRY_MS, PROBE_TTL_MS, probeDue } from './reach.ts';

test('a direct path outlives failed probes for the grace, probed again more often meanwhile; an answer restores it at once', () => {
  let r = afterProbe(undefined, true, 0);
  assert.deepEqual(r, { reachable: true, at: 0 });
  assert.equal(probeDue(r, PROBE_TTL_MS), false);
  assert.equal(probeDue(r, PROBE_TTL_MS + 1), true);
  // its agent restarts: the probe goes unanswered, the path stays
  r = afterProbe(r, false, 100_000);
  assert.deepEqual(r, { reachable: true, at: 100_000, failingSince: 100_000 });
  assert.equal(probeDue(r, 100_000 + PROBE_RETRY_MS + 1), true);
  r = afterProbe(r, false, 100_000 + DIRECT_LOSS_GRACE_MS - 1);
  assert.equal(r.reachable, true);
  // back within the grace: as if nothing happened
  assert.deepEqual(afterProbe(r, true, 150_000), { reachable: true, at: 150_000 });
  // silent past the grace: gone
  r = afterProbe(r, false, 100_000 + DIRECT_LOSS_GRACE_MS);
  assert.deepEqual(r, { reachable: false, at: 100_000 + DIRECT_LOSS_GRACE_MS });
  assert.equal(probeDue(r, 100_000 + DIRECT_LOSS_GRACE_MS + PROBE_RETRY_MS + 1), false, 'an unreachable peer is probed at the usual period');
});

test('a peer never reached directly is unreachable from its first failed probe', () => {
  assert.deepEqual(afterProbe(undefined, false, 5), { reachable: false, at: 5 });
  assert.deepEqual(afterProbe({ reachable: false, at: 0 }, false, 70_000), { reachable: false, at: 70_000 });
});
