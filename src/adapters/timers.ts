/**
 * The real clocks and timer behind the core's {@link Clock} and {@link Sleep} ports (src/core/ports.ts).
 */
import type { Clock, Sleep } from '../core/ports.ts';

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
