import { test } from 'node:test';
import assert from 'node:assert/strict';
import { auditLeases, FreeBlocks } from './blocks.ts';
import { type Cidr, formatCidr, parseCidr } from '../net/ipv4.ts';

const c = (s: string) => parseCidr(s) as Cidr;

test('audit finds leaks and conflicts', () => {
  const lease = (cidr: string, node: string) => ({ cidr, node, leasedAt: 0, block: c(cidr) });
  const problems = auditLeases(
    [lease('10.0.0.0/26', 'a'), lease('10.0.0.0/25', 'b'), lease('10.0.1.0/26', 'gone'), lease('192.168.0.0/26', 'a')],
    new Set(['a', 'b']),
    [c('10.0.0.0/16')],
  );
  assert.deepEqual(problems.map((p) => [p.kind, p.cidr]).sort(), [
    ['conflict', '10.0.0.0/26'], ['conflict', '192.168.0.0/26'], ['leak', '10.0.1.0/26'],
  ]);
});

test('free blocks are taken in order past a cursor that wraps, skipping leases of any size, and released ones come back after the rest', () => {
  const free = new FreeBlocks([c('10.0.0.0/25'), c('10.1.0.0/26')], 26);
  free.reset([c('10.0.0.64/26')]);
  assert.deepEqual([free.take(), free.take()].map((b) => formatCidr(b!)), ['10.0.0.0/26', '10.1.0.0/26']);
  assert.equal(free.take(), undefined, 'every block is taken');
  free.release(c('10.0.0.0/26'));
  assert.equal(formatCidr(free.take()!), '10.0.0.0/26');
  // a lease of a larger size takes every block inside it; one of a smaller size the block around it
  const mixed = new FreeBlocks([c('10.0.0.0/24')], 26);
  mixed.reset([c('10.0.0.0/25'), c('10.0.0.200/30')]);
  assert.equal(mixed.taken, 3);
  assert.equal(formatCidr(mixed.take()!), '10.0.0.128/26');
  assert.equal(mixed.take(), undefined);
  // a block released while others are free is handed out after them (the cursor moved on)
  const ring = new FreeBlocks([c('10.0.0.0/24')], 26);
  const first = ring.take()!;
  ring.release(first);
  assert.deepEqual([ring.take(), ring.take(), ring.take(), ring.take()].map((b) => formatCidr(b!)), ['10.0.0.64/26', '10.0.0.128/26', '10.0.0.192/26', '10.0.0.0/26']);
});
