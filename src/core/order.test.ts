import { test } from 'node:test';
import assert from 'node:assert/strict';
import { compareText } from './order.ts';

test('compareText orders by code units, locale-free: digits before capitals before small letters, prefixes first', () => {
  assert.deepEqual(['b-1', 'a-10', 'B-2', 'a-2', 'a-1', 'a'].sort(compareText), ['B-2', 'a', 'a-1', 'a-10', 'a-2', 'b-1']);
  assert.equal(compareText('x', 'x'), 0);
  assert.equal(compareText('é', 'z') > 0, true, 'by code unit, not by a locale\'s collation');
});
