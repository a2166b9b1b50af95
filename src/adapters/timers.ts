/**
 * The real clocks and timer behind the core's {@link Clock} and {@link Sleep} ports (src/core/ports.ts).
 */
import type { Clock, Sleep } from '../core/ports.ts';
import { SteadyClock } from '../core/steady-clock.ts';

/** Milliseconds since the epoch. */
export const wallClock: Clock = () => Date.now();

/** Milliseconds on a clock that never jumps (for deadlines and round trips). */
export const monotonicClock: Clock = () => performance.now();

/** A timer that resolves after `ms`, or at once when `signal` aborts (never rejects). */
export const sleep: Sleep = (ms, signal) => new Promise((resolve) => {
  if (signal?.aborted === true) {
    resolve();
    return;
  }
  const done = () => {
    clearTimeout(t);
    signal?.removeEventListener('abort', done);
    resolve();
  };
  const t = setTimeout(done, ms);
  signal?.addEventListener('abort', done, { once: true });
});

/** How often the steady clock is read when nothing else reads it: a healthy process never steps further between readings. */
const STEADY_TICK_MS = 250;
/** A step larger than this between two readings is a clock jump (or a stall), not time passing. */
const STEADY_MAX_STEP_MS = 2000;
let steady: SteadyClock | undefined;

/**
 * Milliseconds on the process's steady clock (src/core/steady-clock.ts): the monotonic clock with its jumps taken out,
 * for liveness deadlines (keepalives, "nothing heard for 3 s"). The first call starts a ticker (unref'd) that reads
 * the clock every {@link STEADY_TICK_MS}, so a jump is told from time passing however rarely others read it.
 */
export const steadyClock: Clock = () => {
  if (!steady) {
    const clock = new SteadyClock(() => performance.now(), STEADY_MAX_STEP_MS, () => Date.now());
    steady = clock;
    setInterval(() => clock.wallNow(), STEADY_TICK_MS).unref();
  }
  return steady.now();
};

/**
 * Milliseconds since the epoch less the wall clock's jumps this process saw (src/core/steady-clock.ts): what the age
 * of a wall-clock stamp is read on, so a clock stepped by days expires nothing.
 */
export const jumpFreeWallClock: Clock = () => {
  steadyClock();
  return (steady as SteadyClock).wallNow();
};
