import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import {
  estimateRelist, lastAtOrBefore, nextTimeAtPhase, observedPhase, phaseDifference, podRelistLine, predictedRelistBefore, relistLineTime,
  stratifiedOffsets,
} from './relist-phase.ts';
import { seeded } from './seeded.ts';

const close = (actual: number, expected: number, what: string) => assert.ok(Math.abs(actual - expected) < 1e-9, `${what}: ${actual} != ${expected}`);

describe('stratifiedOffsets', () => {
  test('one round: k / P shifted by half a step, every one once, shuffled', () => {
    const got = stratifiedOffsets(10, 0, 1, seeded(1));
    assert.deepEqual([...got].sort((a, b) => a - b).map((x) => x.toFixed(6)), Array.from({ length: 10 }, (_, k) => ((k + 0.5) / 10).toFixed(6)));
    assert.notDeepEqual(got, [...got].sort((a, b) => a - b));
  });

  test('rounds interleave into evenly spaced phases over [0, 1)', () => {
    const rounds = 3;
    const all = Array.from({ length: rounds }, (_, r) => stratifiedOffsets(10, r, rounds, seeded(r))).flat().sort((a, b) => a - b);
    assert.equal(all.length, 30);
    all.forEach((x, j) => close(x, (j + 0.5) / 30, `phase ${j}`));
  });

  test('a shift moves the whole grid by a fraction of one step', () => {
    const all = [0, 1].map((r) => stratifiedOffsets(4, r, 2, seeded(r), 0.25)).flat().sort((a, b) => a - b);
    all.forEach((x, j) => close(x, (j + 0.25) / 8, `phase ${j}`));
  });

  test('none or one pod', () => {
    assert.deepEqual(stratifiedOffsets(0, 0, 1, Math.random), []);
    assert.deepEqual(stratifiedOffsets(1, 0, 1, Math.random), [0.5]);
  });
});

describe('relistLineTime', () => {
  test('reads the klog header of the relist line as local time', () => {
    const line = 'I1124 05:18:27.123456   12345 generic.go:240] "GenericPLEG: Relisting"';
    close(relistLineTime(line, 2026) as number, new Date(2026, 10, 24, 5, 18, 27).getTime() + 123.456, 'time');
  });

  test('other lines and lines without a header are not relists', () => {
    assert.equal(relistLineTime('I1124 05:18:27.123456   12345 generic.go:199] "GenericPLEG" podUID="x"', 2026), undefined);
    assert.equal(relistLineTime('"GenericPLEG: Relisting"', 2026), undefined);
  });

  test('the on-demand relist of one pod (v1.36+) is not a global relist', () => {
    assert.equal(relistLineTime('I1124 05:18:27.123456   12345 generic.go:418] "GenericPLEG: Relisting Pod" podUID="0b9c-11"', 2026), undefined);
  });
});

describe('podRelistLine', () => {
  test('reads the time and the pod UID of an on-demand relist', () => {
    const got = podRelistLine('I1124 05:18:27.123456   12345 generic.go:418] "GenericPLEG: Relisting Pod" podUID="6f1d2c3e-0b9c-4b0e-9a51-5e6f7a8b9c0d"', 2026);
    assert.equal(got?.podUid, '6f1d2c3e-0b9c-4b0e-9a51-5e6f7a8b9c0d');
    close(got?.time as number, new Date(2026, 10, 24, 5, 18, 27).getTime() + 123.456, 'time');
  });

  test('global relists, other lines and lines without a UID or header are not', () => {
    assert.equal(podRelistLine('I1124 05:18:27.123456   12345 generic.go:294] "GenericPLEG: Relisting"', 2026), undefined);
    assert.equal(podRelistLine('I1124 05:18:27.123456   12345 generic.go:418] "GenericPLEG: Relisting Pod"', 2026), undefined);
    assert.equal(podRelistLine('"GenericPLEG: Relisting Pod" podUID="x"', 2026), undefined);
  });
});

describe('estimateRelist', () => {
  test('the latest start and the median interval, leaving out gaps of missed relists', () => {
    assert.deepEqual(estimateRelist([0, 1004, 2010, 3012, 5020, 6024]), { last: 6024, period: 1004 });
    assert.deepEqual(estimateRelist([0, 1004, 2010, 3014]), { last: 3014, period: 1004 });
  });

  test('only the last `intervals` intervals count: the period follows a drift', () => {
    const starts = [0, 1002, 2004, 3006, 4026, 5046, 6066];
    assert.equal(estimateRelist(starts, 3)?.period, 1020);
  });

  test('nothing usable yet', () => {
    assert.equal(estimateRelist([]), undefined);
    assert.equal(estimateRelist([5]), undefined);
    assert.equal(estimateRelist([0, 2500]), undefined);
  });
});

describe('prediction', () => {
  const est = { last: 10_000, period: 1010 };

  test('nextTimeAtPhase: the first time at the offset not before `earliest`', () => {
    assert.equal(nextTimeAtPhase(est, 0.5, 10_100), 10_505);
    assert.equal(nextTimeAtPhase(est, 0.5, 10_505), 10_505);
    assert.equal(nextTimeAtPhase(est, 0.5, 10_506), 11_515);
    assert.equal(nextTimeAtPhase(est, 0, 12_000), 12_020);
    assert.equal(nextTimeAtPhase(est, 0.25, 9_000), 9_242.5);
  });

  test('predictedRelistBefore extends the grid both ways', () => {
    assert.equal(predictedRelistBefore(est, 12_500), 12_020);
    assert.equal(predictedRelistBefore(est, 10_000), 10_000);
    assert.equal(predictedRelistBefore(est, 9_999), 8_990);
  });
});

describe('observed phases', () => {
  const starts = [1000, 2005, 3010];

  test('lastAtOrBefore', () => {
    assert.equal(lastAtOrBefore(starts, 999), -1);
    assert.equal(lastAtOrBefore(starts, 1000), 0);
    assert.equal(lastAtOrBefore(starts, 2004), 0);
    assert.equal(lastAtOrBefore(starts, 5000), 2);
  });

  test('observedPhase: the fraction of the interval it fell in, or undefined outside the observed ones', () => {
    close(observedPhase(starts, 1502.5) as number, 0.5, 'middle');
    close(observedPhase(starts, 2005) as number, 0, 'on a relist');
    assert.equal(observedPhase(starts, 500), undefined);
    assert.equal(observedPhase(starts, 3500), undefined);
  });

  test('phaseDifference wraps into [-0.5, 0.5)', () => {
    close(phaseDifference(0.95, 0.05), -0.1, 'across 1');
    close(phaseDifference(0.05, 0.95), 0.1, 'across 0');
    close(phaseDifference(0.3, 0.2), 0.1, 'plain');
    close(phaseDifference(0.7, 0.2), -0.5, 'half');
  });
});
