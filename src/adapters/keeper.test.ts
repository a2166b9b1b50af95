import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { closeSync, existsSync, fstatSync, mkdtempSync, openSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { keeperQuit } from './datagram-native.ts';
import { installRoot } from './install-root.ts';
import { KEEPER_PROGRAM, startKeeper, stopKeeper, takeHeld } from './keeper.ts';
import { until } from '../../test/support/wait.ts';

/** Whether process `pid` is gone (or a zombie). */
function gone(pid: number): boolean {
  try {
    return /^State:\s+Z/m.test(readFileSync(`/proc/${pid}/status`, 'utf8'));
  } catch {
    return true;
  }
}

describe('keeper (bin/atoll-keeper)', () => {
  const dir = mkdtempSync(join(tmpdir(), 'atoll-keeper-'));
  const pids: number[] = [];
  after(() => {
    for (const pid of pids) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // gone
      }
    }
    rmSync(dir, { recursive: true, force: true });
  });

  test('holds what it was given and hands the same files to whoever connects; gives up once no agent came back within its grace', async () => {
    const socket = join(dir, 'a.sock');
    const files = ['one', 'two'].map((n) => openSync(join(dir, n), 'w'));
    const { held, why } = await startKeeper(socket, files, 300);
    assert.ok(held, why);
    pids.push(held.pid);
    for (const fd of files) closeSync(fd);
    // an agent that died: its connection closes; a new one connects within the grace and gets the same files
    closeSync(held.connection);
    const back = takeHeld(socket);
    assert.ok(back);
    assert.equal(back.pid, held.pid);
    assert.deepEqual(back.fds.map((fd) => fstatSync(fd).ino), ['one', 'two'].map((n) => fstatSync(openSync(join(dir, n), 'r')).ino));
    for (const fd of back.fds) closeSync(fd);
    await new Promise((r) => setTimeout(r, 600));
    assert.equal(gone(held.pid), false, 'an agent is connected: it stays past its grace');
    closeSync(back.connection);
    await until('the keeper to give up after its grace', () => gone(held.pid), 5000, 20);
    assert.equal(existsSync(socket), false, 'its socket removed');
    assert.equal(takeHeld(socket), undefined);
  });

  test('exits when asked (\'q\'), and stopKeeper stops one by its socket', async () => {
    const socket = join(dir, 'b.sock');
    const fd = openSync(join(dir, 'three'), 'w');
    const first = await startKeeper(socket, [fd], 60_000);
    assert.ok(first.held, first.why);
    pids.push(first.held.pid);
    keeperQuit(first.held.connection);
    await until('the keeper to exit when asked', () => gone(first.held?.pid as number), 5000, 20);
    const second = await startKeeper(socket, [fd], 60_000);
    assert.ok(second.held, second.why);
    pids.push(second.held.pid);
    closeSync(fd);
    assert.equal(await stopKeeper(socket), second.held.pid);
    assert.equal(gone(second.held.pid), true);
    assert.equal(await stopKeeper(socket), undefined, 'none there any more');
  });

  test('bad arguments: a usage error, status 2, nothing held', () => {
    const program = join(installRoot(), KEEPER_PROGRAM);
    for (const args of [[], [join(dir, 'c.sock'), '0', '10'], [join(dir, 'c.sock'), '1', 'x'], [join(dir, 'c.sock'), '3', '10']]) {
      const r = spawnSync(program, args, { encoding: 'utf8', stdio: ['ignore', 'ignore', 'pipe'] });
      assert.equal(r.status, 2, `${args.join(' ')}: ${r.stderr}`);
      assert.match(r.stderr, /atoll-keeper: .*\nusage: atoll-keeper SOCKET COUNT GRACE_MS|not open/);
    }
    assert.equal(existsSync(join(dir, 'c.sock')), false);
  });
});
