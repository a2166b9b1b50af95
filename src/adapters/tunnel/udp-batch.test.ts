import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createSocket } from 'node:dgram';
import { AtollError } from '../../core/errors.ts';
import { UdpBatchSocket, type UdpSource } from './udp-batch.ts';
import { until } from '../../../harness/wait.ts';

function collect(s: UdpBatchSocket): { got: { bytes: number[]; from: UdpSource }[] } {
  const got: { bytes: number[]; from: UdpSource }[] = [];
  s.start((n) => {
    for (let i = 0; i < n; i++) got.push({ bytes: [...s.payload(i)], from: s.sourceOf(i) });
  });
  return { got };
}

describe('UDP socket received in batches', () => {
  test('binds a free port and hands over datagrams in order, with their source', async () => {
    const s = new UdpBatchSocket({ host: '127.0.0.1', port: 0, bufferBytes: 1 << 20 });
    const { got } = collect(s);
    const tx = createSocket('udp4');
    try {
      assert.ok(s.port > 0);
      await new Promise<void>((r) => tx.bind(0, '127.0.0.1', () => r()));
      for (let i = 0; i < 200; i++) tx.send(new Uint8Array([i, 1, 2, 3]), s.port, '127.0.0.1');
      await until('200 datagrams', () => got.length >= 200, 5000);
      assert.deepEqual(got.map((g) => g.bytes[0]), Array.from({ length: 200 }, (_, i) => i));
      assert.deepEqual(got[0]?.from, { address: '127.0.0.1', port: tx.address().port });
      assert.equal(got[0], got[0]); // same source object for the same address
      assert.equal(got[0]?.from, got[199]?.from);
      assert.ok(s.stats.batches >= 1 && s.stats.buffers === 200);
    } finally {
      tx.close();
      s.close();
    }
  });

  test('a port in use is refused with TUNNEL_UNREACHABLE naming it', () => {
    const a = new UdpBatchSocket({ host: '127.0.0.1', port: 0, bufferBytes: 1 << 16 });
    try {
      assert.throws(() => new UdpBatchSocket({ host: '127.0.0.1', port: a.port, bufferBytes: 1 << 16 }),
        (err: unknown) => err instanceof AtollError && err.code === 'TUNNEL_UNREACHABLE' && err.message.includes(`127.0.0.1:${a.port}`));
      assert.throws(() => new UdpBatchSocket({ host: 'localhost', port: 0, bufferBytes: 1 << 16 }), (err: unknown) => err instanceof AtollError && err.code === 'TUNNEL_UNREACHABLE');
    } finally {
      a.close();
    }
  });

  test('close wakes the waiting receive and frees the port', async () => {
    const s = new UdpBatchSocket({ host: '127.0.0.1', port: 0, bufferBytes: 1 << 16 });
    s.start(() => {});
    const port = s.port;
    s.close();
    s.close();
    await until('the port to be free', () => {
      try {
        new UdpBatchSocket({ host: '127.0.0.1', port, bufferBytes: 1 << 16 }).close();
        return true;
      } catch {
        return false;
      }
    }, 5000);
  });
});
