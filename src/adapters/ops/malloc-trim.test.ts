import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { testCalls } from '../kernel/libc.ts';
import { trimMalloc } from './malloc-trim.ts';

const rssAnonKiB = () => Number(/RssAnon:\s+(\d+)/.exec(readFileSync('/proc/self/status', 'utf8'))?.[1]);

test('trimMalloc gives the free pages inside the C heap back: 32 MiB freed below live blocks stay resident until it runs', () => {
  const { malloc, free, memset } = testCalls();
  const SIZE = 32 * 1024; // under glibc's mmap threshold: from the heap
  const blocks = Array.from({ length: 2048 }, () => {
    const p = malloc(SIZE);
    memset(p, 1, SIZE); // resident
    return p;
  });
  // every other block freed: 32 MiB of free chunks, each between two live ones, so free() cannot shrink the heap
  for (let i = 0; i < blocks.length; i += 2) free(blocks[i]);
  const before = rssAnonKiB();
  trimMalloc();
  const after = rssAnonKiB();
  for (let i = 1; i < blocks.length; i += 2) free(blocks[i]);
  assert.ok(before - after > 24 * 1024, `RssAnon ${before} KiB before the trim, ${after} after: expected at least 24 MiB less`);
});
