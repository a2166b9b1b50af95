import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { readdirSync, readFileSync, readlinkSync } from 'node:fs';
import { type AddressInfo, connect, createServer, type Server, type Socket } from 'node:net';
import { testCalls } from '../kernel/libc.ts';
import { type SpliceJoin, SpliceJoins } from './splice-native.ts';
import { until } from '../../../harness/wait.ts';

/** A TCP server listening on loopback (its connections are the relay's ends in these tests). */
async function listening(): Promise<Server> {
  const server = createServer();
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return server;
}

/** A connected pair on loopback: `outer` (ours, as a node's end) and `inner` (the relay's accepted end, paused). */
async function pair(server: Server): Promise<{ outer: Socket; inner: Socket }> {
  const accepted = new Promise<Socket>((resolve) => server.once('connection', (s: Socket) => {
    s.pause();
    resolve(s);
  }));
  const outer = connect((server.address() as AddressInfo).port, '127.0.0.1');
  await new Promise((r) => outer.once('connect', r));
  return { outer, inner: await accepted };
}

function collect(s: Socket): Buffer[] {
  const got: Buffer[] = [];
  s.on('data', (c: Buffer) => got.push(c));
  return got;
}

describe('sockets joined in the kernel (the relay\'s circuits)', () => {
  test('bytes read before the join go first, then both directions flow, are counted, and one end closing ends the other', async () => {
    const server = await listening();
    const done: SpliceJoin[] = [];
    const joins = new SpliceJoins((j) => done.push(j));
    try {
      const x = await pair(server);
      const y = await pair(server);
      const toY = collect(y.outer);
      const toX = collect(x.outer);
      // what x sent before the join has been read by Node already (read() hands it back), as the relay's token reader leaves it
      x.outer.write('early from x|');
      await until('the early bytes to reach the relay end', () => x.inner.readableLength > 0, 5000, 5);
      const j = joins.join(x.inner, y.inner, 'x<->y');
      assert.ok(x.inner.destroyed && y.inner.destroyed, 'the sockets are handed over');
      const big = randomBytes(4 << 20);
      x.outer.write(big);
      y.outer.write('back from y');
      await until('4 MiB to cross', () => Buffer.concat(toY).length >= 13 + big.length, 10_000, 5);
      await until('the answer to cross', () => Buffer.concat(toX).toString() === 'back from y', 10_000, 5);
      const got = Buffer.concat(toY);
      assert.equal(got.subarray(0, 13).toString(), 'early from x|');
      assert.ok(got.subarray(13).equals(big), 'the stream arrives whole and in order');
      assert.equal(j.bytes, 13 + big.length + 11);
      assert.equal(joins.size, 1);
      const yClosed = new Promise((r) => y.outer.once('close', r));
      x.outer.destroy();
      await yClosed;
      await until('the join to be reported done', () => done.length === 1, 5000, 5);
      assert.equal(done[0], j);
      assert.equal(j.bytes, 13 + big.length + 11, 'a freed join keeps its count');
      assert.equal(joins.size, 0);
    } finally {
      joins.close();
      server.close();
    }
  });

  test('closing the joins ends the ones still running; a socket without a descriptor is refused and destroyed', async () => {
    const server = await listening();
    const joins = new SpliceJoins(() => assert.fail('no join ends by itself here'));
    const x = await pair(server);
    const y = await pair(server);
    joins.join(x.inner, y.inner, 'x<->y');
    const closed = Promise.all([x.outer, y.outer].map((s) => new Promise((r) => s.once('close', r).resume())));
    joins.close();
    await closed;
    assert.equal(joins.size, 0);
    const z = await pair(server);
    const gone = await pair(server);
    gone.inner.destroy();
    const other = new SpliceJoins(() => {});
    assert.throws(() => other.join(z.inner, gone.inner, 'z<->gone'), /no descriptor/);
    assert.equal(other.size, 0);
    other.close();
    assert.ok(z.inner.destroyed, 'nothing is left half-joined');
    z.outer.destroy();
    gone.outer.destroy();
    server.close();
  });

  test('each direction\'s pipe starts at 64 KiB and grows to 1 MiB only once that direction carries bulk', async () => {
    const server = await listening();
    const { fcntl } = testCalls();
    const F_GETPIPE_SZ = 1032;
    const pipes = () => new Set(readdirSync('/proc/self/fd').filter((fd) => {
      try {
        return readlinkSync(`/proc/self/fd/${fd}`).startsWith('pipe:');
      } catch {
        return false;
      }
    }).map(Number));
    const joins = new SpliceJoins(() => {});
    try {
      const x = await pair(server);
      const y = await pair(server);
      const toY = collect(y.outer);
      const before = pipes();
      joins.join(x.inner, y.inner, 'x<->y');
      const ours = [...pipes()].filter((fd) => !before.has(fd));
      assert.equal(ours.length, 4, 'two pipes, both ends');
      const sizes = () => ours.map((fd) => fcntl(fd, F_GETPIPE_SZ, 0)).sort((a, b) => a - b);
      assert.deepEqual(sizes(), [65536, 65536, 65536, 65536]);
      y.outer.write('a keepalive');
      const big = randomBytes(4 << 20);
      x.outer.write(big);
      await until('4 MiB to cross', () => Buffer.concat(toY).length >= big.length, 10_000, 5);
      assert.deepEqual(sizes(), [65536, 65536, 1 << 20, 1 << 20], 'x -> y grew; y -> x, which carried 11 bytes, did not');
      x.outer.destroy();
      y.outer.destroy();
    } finally {
      joins.close();
      server.close();
    }
  });

  test('200 circuits at once, one of them stalled by a reader that never reads: the others all cross whole, on a fixed number of threads', async () => {
    const server = await listening();
    const joins = new SpliceJoins(() => {});
    const threads = () => Number(/^Threads:\s+(\d+)/m.exec(readFileSync('/proc/self/status', 'utf8'))?.[1]);
    const opened: Socket[] = [];
    let flooding: NodeJS.Timeout | undefined;
    try {
      // the stalled circuit first, so that the round robin puts others on its thread: its far end is never read
      const sx = await pair(server);
      const sy = await pair(server);
      opened.push(sx.outer, sy.outer);
      joins.join(sx.inner, sy.inner, 'stalled');
      const flood = randomBytes(1 << 20);
      flooding = setInterval(() => { if (sx.outer.writableLength < 8 << 20) sx.outer.write(flood); }, 2);
      const before = threads();
      const circuits: { x: Socket; y: Socket; toX: Buffer[]; toY: Buffer[]; up: Buffer; down: Buffer }[] = [];
      for (let i = 0; i < 200; i++) {
        const x = await pair(server);
        const y = await pair(server);
        opened.push(x.outer, y.outer);
        joins.join(x.inner, y.inner, `c${i}`);
        circuits.push({ x: x.outer, y: y.outer, toX: collect(x.outer), toY: collect(y.outer), up: randomBytes(64 << 10), down: randomBytes(16 << 10) });
      }
      assert.ok(threads() - before <= 8, `joining 200 circuits started ${threads() - before} threads`);
      for (const c of circuits) {
        c.x.write(c.up);
        c.y.write(c.down);
      }
      await until('every circuit\'s bytes to cross', () => circuits.every((c) => Buffer.concat(c.toY).length === c.up.length && Buffer.concat(c.toX).length === c.down.length), 20_000, 10);
      for (const c of circuits) {
        assert.ok(Buffer.concat(c.toY).equals(c.up) && Buffer.concat(c.toX).equals(c.down), 'each stream arrives whole and in order');
      }
      assert.equal(joins.size, 201);
    } finally {
      clearInterval(flooding);
      joins.close();
      for (const s of opened) s.destroy();
      server.close();
    }
  });
});
