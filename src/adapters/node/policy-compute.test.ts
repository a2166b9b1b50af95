import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PolicyCompute } from './policy-compute.ts';

test('a disk that refuses the kept NetworkPolicy view is an answer of the worker, not its failure; it keeps serving (issue #39)', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'atoll-policy-compute-'));
  const failures: Error[] = [];
  const compute = new PolicyCompute((err) => failures.push(err));
  try {
    // a directory that is not there stands for a disk that refuses the write (the root tests fill and remount one)
    const refused = await compute.save(join(dir, 'gone', 'policy-view.json'));
    assert.equal(refused?.errno, 'ENOENT');
    assert.match(refused?.message ?? '', /policy-view\.json/);
    const path = join(dir, 'policy-view.json');
    assert.equal(await compute.save(path), undefined);
    assert.ok(existsSync(path));
    assert.deepEqual(failures, []);
  } finally {
    await compute.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
