import { test } from 'node:test';
import assert from 'node:assert/strict';
import { jsonLogger } from '../ops/json-logger.ts';
import { StateWriter } from './state-writer.ts';

/** A writer over a fake disk that fails with `fault` (an errno code) while it is set. */
function setup() {
  const lines: { level: string; msg: string; code?: string; err?: string }[] = [];
  const log = jsonLogger({ level: 'debug', write: (l) => lines.push(JSON.parse(l)) });
  const disk = { fault: undefined as string | undefined, file: undefined as number | undefined };
  const writer = new StateWriter<number>({
    log,
    write: (v) => {
      if (disk.fault) throw Object.assign(new Error(`${disk.fault}: failed, write`), { code: disk.fault });
      disk.file = v;
    },
  }, { what: 'the test state', path: '/data/test.json', meanwhile: 'going on from memory' });
  const at = (level: string) => lines.filter((l) => l.level === level);
  return { writer, disk, lines, at };
}

test('a failed write is not thrown; it stays pending and the next change or flush writes the newest state', () => {
  const { writer, disk } = setup();
  assert.equal(writer.save(1), true);
  disk.fault = 'ENOSPC';
  assert.equal(writer.save(2), false);
  assert.equal(writer.save(3), false);
  assert.equal(disk.file, 1);
  assert.equal(writer.pending, true);
  assert.equal(writer.flush(), false);
  disk.fault = undefined;
  assert.equal(writer.flush(), true);
  assert.equal(disk.file, 3, 'the newest state, not the first that failed');
  assert.equal(writer.pending, false);
  assert.equal(writer.flush(), true, 'nothing pending: a no-op');
  disk.fault = 'EROFS';
  assert.equal(writer.save(4), false);
  disk.fault = undefined;
  assert.equal(writer.save(5), true, 'the next change writes it');
  assert.equal(disk.file, 5);
});

test('each distinct failure is logged once with NODE_STATE_WRITE_FAILED, repeats at debug level, a recovery once', () => {
  const { writer, disk, at } = setup();
  disk.fault = 'ENOSPC';
  writer.save(1);
  writer.flush();
  writer.save(2);
  assert.equal(at('error').length, 1);
  assert.equal(at('error')[0]?.code, 'NODE_STATE_WRITE_FAILED');
  assert.match(at('error')[0]?.err ?? '', /cannot write the test state \/data\/test\.json: ENOSPC/);
  assert.equal(at('debug').length, 2);
  disk.fault = 'EROFS';
  writer.flush();
  assert.equal(at('error').length, 2, 'another failure is said');
  disk.fault = undefined;
  writer.flush();
  writer.save(3);
  assert.deepEqual(at('info').map((l) => l.msg), ['the test state written again']);
  disk.fault = 'EROFS';
  writer.save(4);
  assert.equal(at('error').length, 3, 'the same failure after a recovery is said again');
});
