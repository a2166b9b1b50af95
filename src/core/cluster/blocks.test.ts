import { test } from 'node:test';
import assert from 'node:assert/strict';
import { auditLeases, carveBlocks, firstFreeBlock } from './blocks.ts';
import { type Cidr, formatCidr, parseCidr } from '../net/ipv4.ts';

const c = (s: string) => parseCidr(s) as Cidr;

test('cluster CIDRs are carved into blocks in order', () => {
  assert.deepEqual([...carveBlocks([c('10.0.0.0/24'), c('10.1.0.0/25')], 26)].map(formatCidr), [
    '10.0.0.0/26', '10.0.0.64/26', '10.0.0.128/26', '10.0.0.192/26', '10.1.0.0/26', '10.1.0.64/26',
  ]);
});

test('the first free block skips leased ones; none when all are leased', () => {
  assert.equal(formatCidr(firstFreeBlock([c('10.0.0.0/24')], 26, new Set(['10.0.0.0/26', '10.0.0.128/26']))!), '10.0.0.64/26');
  assert.equal(firstFreeBlock([c('10.0.0.0/25')], 26, new Set(['10.0.0.0/26', '10.0.0.64/26'])), undefined);
});

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
