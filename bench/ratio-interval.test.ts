import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { nearestRank } from './common.ts';
import { bootstrapDifference, bootstrapRatio } from './ratio-interval.ts';
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

describe('bootstrapDifference', () => {
  test('a clear difference of about 2: the interval lies wholly above an allowance of 1', () => {
    const r = seeded(11);
    const on = spreadOver(200, 7, 9, 0.2, r);
    const off = spreadOver(200, 5, 7, 0.2, r);
    const got = bootstrapDifference(on, off, p50, 2000, seeded(12), 1);
    assert.ok(Math.abs(got.difference - 2) < 0.2, `difference ${got.difference}`);
    assert.ok(got.low <= got.difference && got.difference <= got.high, `${got.low} <= ${got.difference} <= ${got.high}`);
    assert.ok(got.low > 1, `low ${got.low}`);
    assert.ok(got.atOrBelowLimit < 0.01, `share ${got.atOrBelowLimit}`);
  });

  test('equal sides: the interval holds 0 and every resample is within an allowance of 1', () => {
    const r = seeded(13);
    const on = spreadOver(100, 5, 7, 0.1, r);
    const off = spreadOver(100, 5, 7, 0.1, r);
    const got = bootstrapDifference(on, off, p50, 2000, seeded(14), 1);
    assert.ok(got.low < 0 && got.high > 0, `${got.low} .. ${got.high}`);
    assert.equal(got.atOrBelowLimit, 1);
  });

  test('the same seed gives the same interval; the point estimate is the statistic on the samples as taken', () => {
    const on = [3, 1, 2, 10];
    const off = [1, 1, 1, 1];
    assert.equal(bootstrapDifference(on, off, p50, 100, seeded(15), 1).difference, 1);
    assert.deepEqual(bootstrapDifference(on, off, p95, 500, seeded(16), 1), bootstrapDifference(on, off, p95, 500, seeded(16), 1));
  });

  test('refuses an empty side and too few draws', () => {
    assert.throws(() => bootstrapDifference([1], [], p50, 100, Math.random, 1), /both sides need samples \(ours 1, reference 0\)/);
    assert.throws(() => bootstrapDifference([1], [1], p50, 39, Math.random, 1), /39 draws are too few/);
  });
});
