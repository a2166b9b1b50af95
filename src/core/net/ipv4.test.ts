import { test } from 'node:test';
import assert from 'node:assert/strict';
import { cidrsOverlap, formatCidr, parseCidr, parseIpv4, podRange } from './ipv4.ts';

test('parses and refuses IPv4 text', () => {
  assert.equal(parseIpv4('10.0.0.1'), 0x0a000001);
  for (const bad of ['10.0.0', '256.0.0.1', '1.2.3.4.5', 'a.b.c.d', '']) assert.equal(parseIpv4(bad), undefined, bad);
});

test('prefixes: strict parsing, overlap, pod range', () => {
  assert.equal(parseCidr('10.0.0.1/24'), undefined);
  assert.equal(formatCidr(parseCidr('10.0.0.1/24', false)!), '10.0.0.0/24');
  assert.equal(parseCidr('10.0.0.0/33'), undefined);
  assert.ok(cidrsOverlap(parseCidr('10.0.0.0/8')!, parseCidr('10.9.0.0/16')!));
  assert.ok(!cidrsOverlap(parseCidr('10.0.0.0/24')!, parseCidr('10.0.1.0/24')!));
  assert.deepEqual(podRange(parseCidr('10.0.0.0/29')!), { first: 0x0a000002, last: 0x0a000006 });
  assert.equal(podRange(parseCidr('10.0.0.0/31')!), undefined);
});
