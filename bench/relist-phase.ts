/**
 * When to create a pod in bench/kubelet.ts: at a chosen phase of the kubelet's PLEG relist (pure; bench/README.md,
 * "Stratified creation", explains why).
 *
 * The kubelet reports a started pod `Running` only after its generic PLEG's next relist of the runtime, which runs
 * every 1 s after the previous relist FINISHED (`wait.Until`): its period is 1 s plus the relist's own duration, so
 * the phase drifts, and a relist that had pod changes to inspect lasts longer. A pod's create-to-Running is therefore
 * its start latency plus the wait from the start to the next relist, and the second term depends on where between two
 * relists the pod was created. Creating each side's pods at the same spread of phases (stratified offsets) takes the
 * phase out of the comparison.
 *
 * The relists are observed directly: the kubelet runs with `--vmodule=generic=5`, so its PLEG logs
 * `"GenericPLEG: Relisting"` at the start of each relist with a microsecond klog timestamp.
 */

/** The kubelet's generic PLEG relist period (pkg/kubelet/kubelet.go, `genericPlegRelistPeriod`). */
export const RELIST_PERIOD_MS = 1000;

/**
 * With the `EventedPLEG` gate (v1.34, pkg/kubelet/pleg/evented.go, `globalCacheUpdatePeriod`): how often the evented
 * PLEG moves the pod cache's global timestamp to now. A started pod's status from containerd's ContainerStarted event
 * is stamped with the event's time, which falls inside the pod worker's sync that started the container; the worker's
 * next sync waits for a status newer than that sync's end (`GetNewerThan` in pod_workers.go), which only this tick
 * gives. Running is then reported at the first tick after the start: the quantum the evented benchmark's phases are
 * spread over. The tick is a `wait.Until` of a function that takes microseconds, so a fixed grid of this period keeps
 * a constant (unknown) phase to it over a run.
 */
export const EVENTED_CACHE_TICK_MS = 5000;

/** What the relists look like from the latest observations: the latest start and the period (ms). */
export interface RelistEstimate {
  /** The start of the latest relist observed. */
  readonly last: number;
  /** The median interval between the latest consecutive relists (1 s plus a typical relist duration). */
  readonly period: number;
}

/**
 * The creation offsets (fractions of the relist period, in [0, 1)) for round `round` of `rounds`, `pods` of them,
 * in a shuffled order (`random` returns [0, 1), as Math.random). Round r takes (k + (r + shift) / rounds) / pods for
 * k = 0 .. pods - 1, so each round is spread evenly over the period and all rounds together interleave into
 * rounds * pods evenly spaced phases; `shift` in [0, 1) (one per run; default the middle of each step) moves that
 * grid, so that runs pooled together fill in between each other's phases. Both sides of a round use the same array.
 */
export function stratifiedOffsets(pods: number, round: number, rounds: number, random: () => number, shift = 0.5): number[] {
  const start = (round + shift) / rounds;
  const offsets = Array.from({ length: pods }, (_, k) => (k + start) / pods);
  for (let i = offsets.length - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [offsets[i], offsets[j]] = [offsets[j] as number, offsets[i] as number];
  }
  return offsets;
}

const KLOG_HEADER = /^[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{6})\s/;

/**
 * The time of a klog line (ms since the epoch, its header read as local time, as klog writes it); `year` supplies the
 * year its header lacks. Undefined without a header.
 */
function klogTime(line: string, year: number): number | undefined {
  const m = KLOG_HEADER.exec(line);
  if (!m) return undefined;
  const [, mo, d, h, mi, s, us] = m.map(Number) as [number, number, number, number, number, number, number];
  return new Date(year, mo - 1, d, h, mi, s).getTime() + us / 1000;
}

/**
 * The time (ms since the epoch, the header read as local time, as klog writes it) of a kubelet log line that
 * reports the start of a global PLEG relist (`"GenericPLEG: Relisting"`); undefined for every other line, the
 * on-demand relist of one pod (`"GenericPLEG: Relisting Pod"`, v1.36+) included. klog's header has no year: `year`
 * supplies it.
 */
export function relistLineTime(line: string, year: number): number | undefined {
  if (!line.includes('"GenericPLEG: Relisting"')) return undefined;
  return klogTime(line, year);
}

/** An on-demand relist of one pod, as the kubelet logged its start. */
export interface PodRelist {
  /** ms since the epoch (see {@link relistLineTime}). */
  readonly time: number;
  readonly podUid: string;
}

/**
 * The on-demand relist of one pod a kubelet v1.36+ logs at its start (pkg/kubelet/pleg/generic.go, `relistPod`,
 * V(5): `"GenericPLEG: Relisting Pod" podUID="<uid>"`; the kubelet requests it after a pod worker's SyncPod that took an
 * action without error, such as starting the sandbox and the container; gate `PLEGOnDemandRelist`); undefined for
 * every other line.
 */
export function podRelistLine(line: string, year: number): PodRelist | undefined {
  if (!line.includes('"GenericPLEG: Relisting Pod"')) return undefined;
  const uid = /\spodUID="([^"]+)"/.exec(line)?.[1];
  const time = klogTime(line, year);
  return uid === undefined || time === undefined ? undefined : { time, podUid: uid };
}

/**
 * The estimate from relist starts (ascending, ms): the latest start, and the median of the last `intervals`
 * intervals between consecutive starts, leaving out those above 1.5 periods (a stalled kubelet or a line not yet
 * read). Undefined while no interval is usable.
 */
export function estimateRelist(starts: readonly number[], intervals = 8): RelistEstimate | undefined {
  const last = starts.at(-1);
  if (last === undefined) return undefined;
  const gaps: number[] = [];
  for (let i = starts.length - 1; i > 0 && gaps.length < intervals; i--) {
    const gap = (starts[i] as number) - (starts[i - 1] as number);
    if (gap > 0 && gap <= 1.5 * RELIST_PERIOD_MS) gaps.push(gap);
  }
  if (gaps.length === 0) return undefined;
  gaps.sort((a, b) => a - b);
  const mid = gaps.length >> 1;
  const period = gaps.length % 2 === 1 ? (gaps[mid] as number) : ((gaps[mid - 1] as number) + (gaps[mid] as number)) / 2;
  return { last, period };
}

/** The earliest time >= `earliest` whose phase after the predicted relists is `offset` (a fraction of the period). */
export function nextTimeAtPhase(est: RelistEstimate, offset: number, earliest: number): number {
  const first = est.last + offset * est.period;
  return first + Math.ceil((earliest - first) / est.period) * est.period;
}

/** The predicted relist start at or before `t`. */
export function predictedRelistBefore(est: RelistEstimate, t: number): number {
  return est.last + Math.floor((t - est.last) / est.period) * est.period;
}

/** The index of the last of `starts` (ascending) at or before `t`; -1 when none is. */
export function lastAtOrBefore(starts: readonly number[], t: number): number {
  let lo = 0;
  let hi = starts.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if ((starts[mid] as number) <= t) lo = mid + 1;
    else hi = mid;
  }
  return lo - 1;
}

/**
 * Where `t` fell between the observed relists `starts` (ascending): the fraction of the interval between the
 * relist at or before it and the next one. Undefined when `t` is not between two observed relists.
 */
export function observedPhase(starts: readonly number[], t: number): number | undefined {
  const i = lastAtOrBefore(starts, t);
  if (i < 0 || i + 1 >= starts.length) return undefined;
  const a = starts[i] as number;
  return (t - a) / ((starts[i + 1] as number) - a);
}

/** `x - y` for two phases, wrapped into [-0.5, 0.5). */
export function phaseDifference(x: number, y: number): number {
  const d = (((x - y) % 1) + 1.5) % 1;
  return d - 0.5;
}
