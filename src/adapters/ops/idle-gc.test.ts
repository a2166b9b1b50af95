import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { isIdle } from './idle-gc.ts';

test('isIdle: under 2% of a core over the period', () => {
  assert.equal(isIdle(1_199_000, 60_000), true);
  assert.equal(isIdle(1_200_000, 60_000), false);
  assert.equal(isIdle(0, 200), true);
  assert.equal(isIdle(5_000, 200), false);
});

// A child that promotes 10,000 Buffers to the old generation, drops them, starts the collector with a short period
// and then idles (or keeps a core busy) for 2 s. It prints how many forced full collections ran (V8 flags the ones
// `gc()` asks for) and how many of 100 of the Buffers, followed by weak references, were still alive at the start and
// at the end.
const child = (busy: boolean) => `
import { PerformanceObserver, constants } from 'node:perf_hooks';
import { startIdleGc } from ${JSON.stringify(new URL('./idle-gc.ts', import.meta.url).pathname)};
let forced = 0;
new PerformanceObserver((list) => {
  for (const e of list.getEntries()) if (e.detail.flags & constants.NODE_PERFORMANCE_GC_FLAGS_FORCED) forced++;
}).observe({ entryTypes: ['gc'] });
let kept = Array.from({ length: 10_000 }, () => Buffer.alloc(1024, 1));
const refs = kept.filter((_, i) => i % 100 === 0).map((b) => new WeakRef(b));
for (let i = 0; i < 50; i++) new Array(10_000).fill({ i }); // young garbage: scavenges promote what is kept
kept = undefined;
const alive = () => refs.filter((r) => r.deref() !== undefined).length;
const before = alive();
const c = startIdleGc(200);
const end = Date.now() + 2000;
if (${busy}) while (Date.now() < end) for (let i = 0; i < 1e5; i++) Math.sqrt(i); // on a core all along, no timers
await new Promise((r) => setTimeout(r, Math.max(0, end - Date.now())));
c.stop();
await new Promise((r) => setImmediate(r)); // the observer's last entries
console.log(JSON.stringify({ forced, before, after: alive() }));
`;

function run(flags: string[], busy = false): { forced: number; before: number; after: number } {
  const out = execFileSync(process.execPath, [...flags, '--max-semi-space-size=1', '--input-type=module', '-e', child(busy)], { encoding: 'utf8' });
  return JSON.parse(out) as { forced: number; before: number; after: number };
}

test('startIdleGc runs full collections in an idle process, which free the Buffers it promoted and dropped', () => {
  const idle = run(['--expose-gc']);
  assert.equal(idle.before, 100, `the Buffers were not alive to start with: ${JSON.stringify(idle)}`);
  assert.ok(idle.forced >= 1, `no forced collection in 2 s at a 200 ms period: ${JSON.stringify(idle)}`);
  assert.equal(idle.after, 0, `Buffers left after the collections: ${JSON.stringify(idle)}`);
});

test('startIdleGc leaves a busy process, and one without gc exposed, to V8', () => {
  const busy = run(['--expose-gc'], true);
  assert.equal(busy.forced, 0, `a process on a core all along was collected: ${JSON.stringify(busy)}`);
  const plain = run([]);
  assert.equal(plain.forced, 0, `without --expose-gc: ${JSON.stringify(plain)}`);
});
