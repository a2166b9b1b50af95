/**
 * How sure a benchmark's ratio is: a percentile bootstrap of ours / reference for one statistic of each side's
 * samples (a percentile, the median); and the same for a difference, ours - reference, where a target is an
 * allowance in the samples' unit (bench/cni-latency.ts --policy: ADD p50 with NetworkPolicy on at most 1 ms more than
 * off). Pure: the randomness is passed in.
 *
 * Why: a target such as "ours / reference <= 1.0" is printed as PASS or MISS from one point estimate; where a ratio's
 * 95 % interval spans 1.0 (bench/kubelet.ts on kubelet v1.34, whose 1 s relist sets the p50), the run cannot tell the
 * two sides apart in either direction, and the interval says so beside the verdict. Each side is resampled on its own,
 * with replacement, as independent draws; samples taken at stratified phases vary less than that, so the interval is
 * wider than the run's true uncertainty, never narrower. It informs; the targets stay the point estimates.
 */
import { nearestRank } from './common.ts';

export interface RatioInterval {
  /** The ratio of the two sides' statistics on the samples as taken. */
  readonly ratio: number;
  /** The 2.5th and 97.5th percentiles of the resampled ratios. */
  readonly low: number;
  readonly high: number;
  /** The share of resampled ratios at or below 1.0. */
  readonly atOrBelowOne: number;
}

/**
 * The percentile bootstrap of stat(ours) / stat(reference) over `draws` resamplings.
 * @param stat the statistic both sides are compared by, e.g. `(xs) => nearestRank(xs, 50)`
 * @param random uniform in [0, 1), e.g. Math.random or a seeded source in tests
 * @throws RangeError when a side has no sample or draws < 40 (too few for a 95 % interval's tails)
 */
export function bootstrapRatio(ours: readonly number[], reference: readonly number[], stat: (xs: readonly number[]) => number, draws: number,
  random: () => number): RatioInterval {
  if (ours.length === 0 || reference.length === 0) throw new RangeError(`bootstrapRatio: both sides need samples (ours ${ours.length}, reference ${reference.length})`);
  if (draws < 40) throw new RangeError(`bootstrapRatio: ${draws} draws are too few for a 95 % interval; use 40 or more`);
  const ratios = resampled(ours, reference, stat, draws, random, (o, r) => o / r);
  return {
    ratio: stat(ours) / stat(reference),
    low: nearestRank(ratios, 2.5),
    high: nearestRank(ratios, 97.5),
    atOrBelowOne: ratios.filter((r) => r <= 1).length / draws,
  };
}

export interface DifferenceInterval {
  /** stat(ours) - stat(reference) on the samples as taken. */
  readonly difference: number;
  /** The 2.5th and 97.5th percentiles of the resampled differences. */
  readonly low: number;
  readonly high: number;
  /** The share of resampled differences at or below `limit`. */
  readonly atOrBelowLimit: number;
}

/**
 * The percentile bootstrap of stat(ours) - stat(reference) over `draws` resamplings, each side resampled on its own
 * (as {@link bootstrapRatio}).
 * @param limit the target's allowance, e.g. 1 for "at most 1 ms more": {@link DifferenceInterval.atOrBelowLimit}
 * @throws RangeError when a side has no sample or draws < 40
 */
export function bootstrapDifference(ours: readonly number[], reference: readonly number[], stat: (xs: readonly number[]) => number, draws: number,
  random: () => number, limit: number): DifferenceInterval {
  if (ours.length === 0 || reference.length === 0) throw new RangeError(`bootstrapDifference: both sides need samples (ours ${ours.length}, reference ${reference.length})`);
  if (draws < 40) throw new RangeError(`bootstrapDifference: ${draws} draws are too few for a 95 % interval; use 40 or more`);
  const diffs = resampled(ours, reference, stat, draws, random, (o, r) => o - r);
  return {
    difference: stat(ours) - stat(reference),
    low: nearestRank(diffs, 2.5),
    high: nearestRank(diffs, 97.5),
    atOrBelowLimit: diffs.filter((d) => d <= limit).length / draws,
  };
}

/** `draws` values of combine(stat(resample of ours), stat(resample of reference)), sorted ascending. */
function resampled(ours: readonly number[], reference: readonly number[], stat: (xs: readonly number[]) => number, draws: number, random: () => number,
  combine: (o: number, r: number) => number): number[] {
  const resample = (xs: readonly number[]) => Array.from(xs, () => xs[Math.floor(random() * xs.length)] as number);
  return Array.from({ length: draws }, () => combine(stat(resample(ours)), stat(resample(reference)))).sort((a, b) => a - b);
}
