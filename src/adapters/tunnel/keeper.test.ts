import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { closeSync, existsSync, fstatSync, mkdtempSync, openSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { spawn } from 'node:child_process';
import { keeperQuit } from './datagram-native.ts';
import { installRoot } from '../install-root.ts';
import { handTo, type Held, KEEPER_PROGRAM, release, startKeeper, stopKeeper, takeHeld } from './keeper.ts';
import { until } from '../../../harness/wait.ts';

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
  /** A keeper the agent would start, holding `fds`; its pid is killed after the tests. */
  const started = async (socket: string, fds: number[], graceMs: number): Promise<Held> => {
    const { held, why } = await startKeeper(socket, fds, graceMs);
    assert.ok(held, why);
    pids.push(held.pid);
    return held;
  };
  /** A standing keeper (COUNT 0), as the chart runs it; its pid is killed after the tests. */
  const standing = (socket: string, graceMs: number) => {
    const proc = spawn(join(installRoot(), KEEPER_PROGRAM), [socket, '0', String(graceMs)], { stdio: 'ignore' });
    pids.push(proc.pid as number);
    return proc;
  };

  test('holds what it was given and hands the same files to whoever connects; gives up once no agent came back within its grace', async () => {
    const socket = join(dir, 'a.sock');
    const files = ['one', 'two'].map((n) => openSync(join(dir, n), 'w'));
    const held = await started(socket, files, 300);
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
    const first = await started(socket, [fd], 60_000);
    keeperQuit(first.connection);
    await until('the keeper to exit when asked', () => gone(first.pid), 5000, 20);
    const second = await started(socket, [fd], 60_000);
    closeSync(fd);
    assert.equal(await stopKeeper(socket), second.pid);
    assert.equal(gone(second.pid), true);
    assert.equal(await stopKeeper(socket), undefined, 'none there any more');
  });

  test('a standing keeper (COUNT 0) holds what an agent hands it, lets go of it at \'q\' or after its grace, and stays', async () => {
    const socket = join(dir, 's.sock');
    const proc = standing(socket, 400);
    await until('the standing keeper to listen', () => existsSync(socket), 5000, 20);
    const first = takeHeld(socket);
    assert.ok(first);
    assert.deepEqual(first.fds, [], 'it holds nothing yet');
    const file = openSync(join(dir, 'four'), 'w');
    assert.equal(handTo(first, [file]), undefined);
    closeSync(file);
    closeSync(first.connection); // the agent dies
    const back = takeHeld(socket);
    assert.equal(back?.fds.length, 1, 'the next agent gets what the last one handed over');
    assert.equal(fstatSync(back?.fds[0] as number).ino, fstatSync(openSync(join(dir, 'four'), 'r')).ino);
    closeSync(back?.fds[0] as number);
    keeperQuit(back?.connection as number);
    await new Promise((r) => setTimeout(r, 100));
    const empty = takeHeld(socket);
    assert.deepEqual([empty?.pid, empty?.fds], [proc.pid, []], 'asked to let go: it did, and stays');
    assert.ok(empty);
    assert.equal(handTo(empty, [openSync(join(dir, 'four'), 'r')]), undefined);
    closeSync(empty.connection);
    await new Promise((r) => setTimeout(r, 700));
    const later = takeHeld(socket);
    assert.deepEqual([later?.pid, later?.fds], [proc.pid, []], 'no agent for its grace: it let go, and stays');
    closeSync(later?.connection as number);
    const exited = new Promise((r) => proc.once('exit', r));
    proc.kill('SIGTERM');
    await exited;
    assert.equal(existsSync(socket), false, 'SIGTERM: gone, its socket removed');
  });

  test('a standing keeper that finds a keeper the agent started takes over what it holds, and that one goes', async () => {
    const socket = join(dir, 't.sock');
    const file = openSync(join(dir, 'five'), 'w');
    const spawned = await started(socket, [file], 60_000);
    closeSync(file);
    const proc = standing(socket, 60_000);
    await until('the agent\'s keeper to go', () => gone(spawned.pid), 5000, 20);
    // the standing keeper binds once the other's socket is gone: it never takes a live keeper's
    let now: Held | undefined;
    await until('the standing keeper to answer at the socket', () => {
      now = takeHeld(socket);
      if (now && now.pid !== proc.pid) release(now);
      return now?.pid === proc.pid;
    }, 5000, 10);
    assert.equal(fstatSync(now?.fds[0] as number).ino, fstatSync(openSync(join(dir, 'five'), 'r')).ino, 'the same file, held by the standing keeper');
    closeSync(now?.fds[0] as number);
    closeSync(now?.connection as number);
    closeSync(spawned.connection);
    proc.kill('SIGTERM');
  });

  test('no keeper takes the socket of a keeper that answers there: the agent\'s own, started while a standing keeper listens, leaves it be and the data plane goes to that one; a socket file nobody answers on is replaced', async () => {
    // the agent starting its own keeper just as the chart's standing keeper comes up: each used to unlink the other's
    // socket, leaving one listening where nobody could reach it
    const socket = join(dir, 'r.sock');
    const proc = standing(socket, 60_000);
    await until('the standing keeper to listen', () => {
      const h = takeHeld(socket);
      if (h) release(h);
      return h?.pid === proc.pid;
    }, 5000, 20);
    const file = openSync(join(dir, 'six'), 'w');
    const held = await started(socket, [file], 60_000);
    assert.equal(held.pid, proc.pid, 'the agent is connected to the standing keeper, not to a keeper of its own');
    const now = takeHeld(socket);
    assert.equal(now?.pid, proc.pid, 'the standing keeper still answers at the socket');
    assert.equal(now?.fds.length, 1, 'and holds the data plane');
    assert.equal(fstatSync(now?.fds[0] as number).ino, fstatSync(file).ino);
    closeSync(file);
    release(now as Held);
    closeSync(held.connection);
    proc.kill('SIGKILL'); // its socket file stays, and nobody answers on it
    await until('the standing keeper to go', () => gone(proc.pid as number), 5000, 20);
    assert.equal(existsSync(socket), true);
    const other = openSync(join(dir, 'seven'), 'w');
    const next = await started(socket, [other], 60_000);
    closeSync(other);
    assert.notEqual(next.pid, proc.pid, 'a keeper of its own replaced the dead one\'s socket');
    closeSync(next.connection);
  });

  test('bad arguments: a usage error, status 2, nothing held', () => {
    const program = join(installRoot(), KEEPER_PROGRAM);
    for (const args of [[], [join(dir, 'c.sock'), '9', '10'], [join(dir, 'c.sock'), '1', 'x'], [join(dir, 'c.sock'), '3', '10']]) {
      const r = spawnSync(program, args, { encoding: 'utf8', stdio: ['ignore', 'ignore', 'pipe'] });
      assert.equal(r.status, 2, `${args.join(' ')}: ${r.stderr}`);
      assert.match(r.stderr, /atoll-keeper: .*\nusage: atoll-keeper SOCKET COUNT GRACE_MS|not open/);
    }
    assert.equal(existsSync(join(dir, 'c.sock')), false);
  });
});
