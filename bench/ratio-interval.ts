/**
 * How sure a benchmark's ratio is: a percentile bootstrap of ours / reference for one statistic of each side's
 * samples (a percentile, the median). Pure: the randomness is passed in.
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
  const resample = (xs: readonly number[]) => Array.from(xs, () => xs[Math.floor(random() * xs.length)] as number);
  const ratios = Array.from({ length: draws }, () => stat(resample(ours)) / stat(resample(reference))).sort((a, b) => a - b);
  return {
    ratio: stat(ours) / stat(reference),
    low: nearestRank(ratios, 2.5),
    high: nearestRank(ratios, 97.5),
    atOrBelowOne: ratios.filter((r) => r <= 1).length / draws,
  };
}
