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

// A child that promotes 10 MB of Buffers to the old generation, drops them, starts the collector with a short
// period and sleeps; it prints the memory its ArrayBuffers hold before and after.
const CHILD = `
import { startIdleGc } from ${JSON.stringify(new URL('./idle-gc.ts', import.meta.url).pathname)};
let kept = Array.from({ length: 10_000 }, () => Buffer.alloc(1024, 1));
for (let i = 0; i < 200; i++) new Array(10_000).fill({ i }); // young garbage: scavenges promote what is kept
kept = undefined;
const before = process.memoryUsage().arrayBuffers;
const c = startIdleGc(200);
await new Promise((r) => setTimeout(r, 1500));
c.stop();
console.log(JSON.stringify({ before, after: process.memoryUsage().arrayBuffers }));
`;

function run(flags: string[]): { before: number; after: number } {
  const out = execFileSync(process.execPath, [...flags, '--max-semi-space-size=1', '--input-type=module', '-e', CHILD], { encoding: 'utf8' });
  return JSON.parse(out) as { before: number; after: number };
}

test('startIdleGc collects an idle process\'s dead Buffers, which V8 alone leaves in the old generation', () => {
  const plain = run([]); // no gc exposed: the collector does nothing, and nothing else collects them
  assert.ok(plain.after > 8 * 1024 * 1024, `without --expose-gc: ${plain.after} bytes of ArrayBuffers left (expected the 10 MB still there)`);
  const exposed = run(['--expose-gc']);
  assert.ok(exposed.before > 8 * 1024 * 1024, `the Buffers were not alive to start with: ${exposed.before} bytes`);
  assert.ok(exposed.after < 2 * 1024 * 1024, `with --expose-gc: ${exposed.after} bytes of ArrayBuffers left (expected under 2 MB)`);
});
