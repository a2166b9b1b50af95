import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SteadyClock } from './steady-clock.ts';

function manual(start = 1000) {
  let t = start;
  return { clock: () => t, set: (v: number) => (t = v), add: (d: number) => (t += d) };
}

test('time passing in small steps is steady time, one to one', () => {
  const m = manual();
  const c = new SteadyClock(m.clock, 2000);
  const t0 = c.now();
  for (let i = 0; i < 40; i++) {
    m.add(250);
    c.now();
  }
  assert.equal(c.now() - t0, 10_000);
  assert.equal(c.jumps, 0);
});

test('a jump forward of days is taken out: deadlines count from the jump', () => {
  const m = manual();
  const c = new SteadyClock(m.clock, 2000);
  const heard = c.now();
  m.add(200);
  c.now();
  m.add(8 * 86_400_000);
  const after = c.now();
  assert.equal(after - heard, 200, 'the 8 days do not count as silence');
  m.add(300);
  assert.equal(c.now() - heard, 500, 'time counts on normally after it');
  assert.deepEqual([c.jumps, c.jumpedMs], [1, 8 * 86_400_000]);
});

test('a jump backwards never makes steady time go back', () => {
  const m = manual(10_000_000);
  const c = new SteadyClock(m.clock, 2000);
  const t0 = c.now();
  m.add(-5_000_000);
  const t1 = c.now();
  assert.equal(t1, t0);
  m.add(100);
  assert.equal(c.now(), t0 + 100);
  assert.equal(c.jumps, 1);
});

test('a step just within the largest is time passing; just above it, a jump', () => {
  const m = manual();
  const c = new SteadyClock(m.clock, 2000);
  const t0 = c.now();
  m.add(2000);
  assert.equal(c.now() - t0, 2000);
  m.add(2001);
  assert.equal(c.now() - t0, 2000);
  assert.equal(c.jumps, 1);
});

test('the wall clock less its jumps: a jump of the wall clock alone, or of both clocks, does not age stamps', () => {
  const mono = manual(5000);
  const wall = manual(1_700_000_000_000);
  const c = new SteadyClock(mono.clock, 2000, wall.clock);
  const stamp = c.wallNow();
  for (let i = 0; i < 4; i++) {
    mono.add(250);
    wall.add(250);
    c.now();
  }
  wall.add(8 * 86_400_000); // an NTP step: the wall clock alone
  mono.add(250);
  wall.add(250);
  assert.equal(c.wallNow() - stamp, 1250);
  mono.add(8 * 86_400_000); // both (a VM restored, libfaketime)
  wall.add(8 * 86_400_000);
  assert.equal(c.wallNow() - stamp, 1250);
  mono.add(1000);
  wall.add(1000);
  assert.equal(c.wallNow() - stamp, 2250, 'time passing still counts');
  wall.add(-3 * 86_400_000); // stepped back
  assert.equal(c.wallNow() - stamp, 2250);
});
