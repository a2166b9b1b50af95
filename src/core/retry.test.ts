import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { Sleep } from './ports.ts';
import { Backoff, pollUntil } from './retry.ts';

/** A clock that moves only when told, and a Sleep on it: `advance` fires the sleeps that fall due, in order. */
class ManualClock {
  now = 0;
  readonly slept: number[] = [];
  #timers: { at: number; wake: () => void }[] = [];

  readonly clock = (): number => this.now;

  readonly sleep: Sleep = (ms, signal) => new Promise((resolve) => {
    this.slept.push(ms);
    if (signal?.aborted === true) return resolve();
    const timer = { at: this.now + ms, wake: resolve };
    this.#timers.push(timer);
    signal?.addEventListener('abort', () => {
      this.#timers = this.#timers.filter((t) => t !== timer);
      resolve();
    }, { once: true });
  });

  /** Moves time on by `ms`, waking each sleep that falls due and letting its continuation run. */
  async advance(ms: number): Promise<void> {
    const end = this.now + ms;
    for (;;) {
      await settle();
      const due = this.#timers.filter((t) => t.at <= end).sort((a, b) => a.at - b.at)[0];
      if (!due) break;
      this.#timers = this.#timers.filter((t) => t !== due);
      this.now = due.at;
      due.wake();
    }
    this.now = end;
    await settle();
  }

  get pending(): number {
    return this.#timers.length;
  }
}

/** Lets every queued promise continuation run. */
const settle = () => new Promise<void>((resolve) => setImmediate(resolve));

describe('Backoff', () => {
  test('waits start at minMs, double after each wait and stop at maxMs', async () => {
    const t = new ManualClock();
    const b = new Backoff({ minMs: 500, maxMs: 5000 }, t.sleep);
    const delays: number[] = [];
    for (let i = 0; i < 6; i++) {
      delays.push(b.delayMs);
      const waited = b.wait();
      await t.advance(b.delayMs);
      await waited;
    }
    assert.deepEqual(delays, [500, 1000, 2000, 4000, 5000, 5000]);
    assert.deepEqual(t.slept, delays);
    assert.equal(t.now, 17_500);
  });

  test('with jitter each wait is cut by up to its fraction, at random; the delays still double', async () => {
    const t = new ManualClock();
    const draws = [0, 1, 0.5];
    const b = new Backoff({ minMs: 1000, maxMs: 8000, jitter: { fraction: 0.5, random: () => draws.shift() ?? 0 } }, t.sleep);
    for (let i = 0; i < 3; i++) {
      const waited = b.wait();
      await t.advance(1000 * 2 ** i);
      await waited;
    }
    assert.deepEqual(t.slept, [1000, 1000, 3000]);
    assert.equal(b.delayMs, 8000);
  });

  test('reset starts over at minMs; a reset during a wait still doubles after it, as the loops it replaced did', async () => {
    const t = new ManualClock();
    const b = new Backoff({ minMs: 250, maxMs: 5000 }, t.sleep);
    await Promise.all([b.wait(), t.advance(250)]);
    await Promise.all([b.wait(), t.advance(500)]);
    assert.equal(b.delayMs, 1000);
    b.reset();
    assert.equal(b.delayMs, 250);
    const waited = b.wait();
    b.reset();
    await t.advance(250);
    await waited;
    assert.equal(b.delayMs, 500);
  });

  test('a wait ends early when its signal aborts, and at once when it already has', async () => {
    const t = new ManualClock();
    const b = new Backoff({ minMs: 1000, maxMs: 60_000 }, t.sleep);
    const stop = new AbortController();
    let done = false;
    const waited = b.wait(stop.signal).then(() => (done = true));
    await t.advance(999);
    assert.equal(done, false);
    stop.abort();
    await waited;
    assert.equal(t.now, 999, 'no time passed beyond the abort');
    assert.equal(t.pending, 0);
    await b.wait(stop.signal);
    assert.equal(t.pending, 0);
  });
});

describe('pollUntil', () => {
  test('true at once when the condition already holds, without sleeping', async () => {
    const t = new ManualClock();
    assert.equal(await pollUntil(() => true, { intervalMs: 50, timeoutMs: 1000 }, t), true);
    assert.deepEqual(t.slept, []);
  });

  test('checks every intervalMs until the condition holds', async () => {
    const t = new ManualClock();
    const checkedAt: number[] = [];
    const polled = pollUntil(() => {
      checkedAt.push(t.now);
      return t.now >= 300;
    }, { intervalMs: 100, timeoutMs: 1000 }, t);
    await t.advance(400);
    assert.equal(await polled, true);
    assert.deepEqual(checkedAt, [0, 100, 200, 300]);
  });

  test('async conditions are awaited', async () => {
    const t = new ManualClock();
    let n = 0;
    const polled = pollUntil(async () => ++n === 3, { intervalMs: 10, timeoutMs: 100 }, t);
    await t.advance(20);
    assert.equal(await polled, true);
    assert.equal(n, 3);
  });

  test('false when a check at or past the timeout fails: the last check comes after the timeout', async () => {
    const t = new ManualClock();
    const checkedAt: number[] = [];
    const polled = pollUntil(() => {
      checkedAt.push(t.now);
      return false;
    }, { intervalMs: 150, timeoutMs: 500 }, t);
    await t.advance(10_000);
    assert.equal(await polled, false);
    assert.deepEqual(checkedAt, [0, 150, 300, 450, 600]);
    assert.equal(t.pending, 0);
  });

  test('a condition that came true during the last pause is seen', async () => {
    const t = new ManualClock();
    const polled = pollUntil(() => t.now >= 450, { intervalMs: 100, timeoutMs: 500 }, t);
    await t.advance(10_000);
    assert.equal(await polled, true);
    assert.equal(t.now, 10_000);
  });

  test('without a timeout it polls until the signal aborts, then gives up', async () => {
    const t = new ManualClock();
    const stop = new AbortController();
    let checks = 0;
    const polled = pollUntil(() => {
      checks++;
      return false;
    }, { intervalMs: 250, signal: stop.signal }, t);
    await t.advance(100_000);
    assert.equal(checks, 401);
    stop.abort();
    assert.equal(await polled, false);
    assert.equal(checks, 401, 'no check after the abort');
  });
});
