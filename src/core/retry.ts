/**
 * Waiting between attempts, in one place: exponential backoff for loops that retry a failing operation, and bounded
 * polling for code that waits for a condition. Pure: time comes in through the {@link Clock} and {@link Sleep}
 * ports, so both are tested with a manual clock.
 */
import type { Clock, Sleep } from './ports.ts';

export interface BackoffInit {
  /** The first wait, and the wait after {@link Backoff.reset}. */
  readonly minMs: number;
  /** Waits double up to this. */
  readonly maxMs: number;
  /**
   * With a random source: each wait is cut by up to this fraction of it, at random, so that many clients that lost
   * one server together (agents whose controller replica died) do not all come back at the same instant.
   */
  readonly jitter?: { readonly fraction: number; readonly random: () => number };
}

/**
 * Exponential backoff, with jitter when asked: waits start at `minMs` and double after each wait up to `maxMs`; `reset()`
 * (an attempt succeeded) starts over. Callers decide when to reset, so "succeeded" can mean "a stream lived long
 * enough" as well as "the call returned".
 */
export class Backoff {
  readonly #init: BackoffInit;
  readonly #sleep: Sleep;
  #delayMs: number;

  constructor(init: BackoffInit, sleep: Sleep) {
    this.#init = init;
    this.#sleep = sleep;
    this.#delayMs = init.minMs;
  }

  /** How long the next {@link wait} lasts (for "retrying in" log lines). */
  get delayMs(): number {
    return this.#delayMs;
  }

  /** Starts over at `minMs`. */
  reset(): void {
    this.#delayMs = this.#init.minMs;
  }

  /** Waits the current delay (less when `signal` aborts), then doubles it up to `maxMs`. */
  async wait(signal?: AbortSignal): Promise<void> {
    const j = this.#init.jitter;
    await this.#sleep(j ? Math.round(this.#delayMs * (1 - j.fraction * j.random())) : this.#delayMs, signal);
    this.#delayMs = Math.min(this.#init.maxMs, this.#delayMs * 2);
  }
}

export interface PollInit {
  /** The pause between two checks. */
  readonly intervalMs: number;
  /** Give up once a check fails this long or longer after the start; never when absent (then stop it with `signal`). */
  readonly timeoutMs?: number;
  readonly signal?: AbortSignal;
}

export interface PollTimers {
  readonly clock: Clock;
  readonly sleep: Sleep;
}

/**
 * Checks `check` at once and then every `intervalMs` until it holds. Bounded: gives up when a check fails at or past
 * `timeoutMs` from the start (so the last check comes after the timeout, and a condition that came true during the
 * last pause is seen), or when `signal` aborts (no check after that).
 * @returns true when `check` held, false when it gave up.
 */
export async function pollUntil(check: () => boolean | Promise<boolean>, init: PollInit, timers: PollTimers): Promise<boolean> {
  const deadline = timers.clock() + (init.timeoutMs ?? Number.POSITIVE_INFINITY);
  const aborted = () => init.signal?.aborted === true;
  for (;;) {
    if (await check()) return true;
    if (aborted() || timers.clock() >= deadline) return false;
    await timers.sleep(init.intervalMs, init.signal);
    if (aborted()) return false;
  }
}
