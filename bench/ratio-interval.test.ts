import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { nearestRank } from './common.ts';
import { bootstrapRatio } from './ratio-interval.ts';
import { seeded } from './seeded.ts';

/** n samples spread evenly over [from, to) plus a seeded jitter of +-jitter. */
function spreadOver(n: number, from: number, to: number, jitter: number, random: () => number): number[] {
  return Array.from({ length: n }, (_, k) => from + ((k + 0.5) / n) * (to - from) + (random() * 2 - 1) * jitter);
}

const p50 = (xs: readonly number[]) => nearestRank(xs, 50);
const p95 = (xs: readonly number[]) => nearestRank(xs, 95);

describe('nearestRank', () => {
  test('the smallest sample whose rank covers p percent', () => {
    assert.equal(nearestRank([5, 1, 4, 2, 3], 50), 3);
    assert.equal(nearestRank([5, 1, 4, 2, 3], 95), 5);
    assert.equal(nearestRank([5, 1, 4, 2, 3], 20), 1);
    assert.ok(Number.isNaN(nearestRank([], 50)));
  });
});

describe('bootstrapRatio', () => {
  test('a clear difference: the interval lies wholly below 1.0', () => {
    const r = seeded(1);
    const ours = spreadOver(200, 150, 250, 10, r);
    const ref = spreadOver(200, 165, 265, 10, r);
    const got = bootstrapRatio(ours, ref, p50, 2000, seeded(2));
    assert.ok(got.ratio < 0.95, `ratio ${got.ratio}`);
    assert.ok(got.low < got.ratio && got.ratio < got.high, `${got.low} < ${got.ratio} < ${got.high}`);
    assert.ok(got.high < 1, `high ${got.high}`);
    assert.ok(got.atOrBelowOne > 0.99, `share ${got.atOrBelowOne}`);
  });

  test('a tie with a wide spread: the interval spans 1.0 on both sides', () => {
    const r = seeded(3);
    const ours = spreadOver(30, 200, 1200, 50, r);
    const ref = spreadOver(30, 200, 1200, 50, r);
    const got = bootstrapRatio(ours, ref, p50, 2000, seeded(4));
    assert.ok(got.low < 0.95 && got.high > 1.05, `${got.low} .. ${got.high}`);
    assert.ok(got.atOrBelowOne > 0.2 && got.atOrBelowOne < 0.8, `share ${got.atOrBelowOne}`);
  });

  test('the same seed gives the same interval', () => {
    const ours = spreadOver(50, 100, 200, 5, seeded(5));
    const ref = spreadOver(50, 100, 210, 5, seeded(6));
    assert.deepEqual(bootstrapRatio(ours, ref, p95, 500, seeded(7)), bootstrapRatio(ours, ref, p95, 500, seeded(7)));
  });

  test('refuses an empty side and too few draws', () => {
    assert.throws(() => bootstrapRatio([], [1], p50, 100, Math.random), /both sides need samples \(ours 0, reference 1\)/);
    assert.throws(() => bootstrapRatio([1], [1], p50, 10, Math.random), /10 draws are too few/);
  });
});
