// Property-based tests of the IPAM record files the agent reads back (harness/fuzz.ts says how to run them long).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { anyText, decodesOrRefuses, fuzzParams, mutatedText } from '../../../harness/fuzz.ts';
import { decodeRecord, encodeRecord, recordFileName } from './record-codec.ts';
import type { IpamRecord } from './sticky-pool.ts';

/** Records as the agent writes them: no `_` in the namespace, no line breaks or edge spaces in the two lines. */
const line = fc.stringMatching(/^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/);
const record: fc.Arbitrary<IpamRecord> = fc.record({
  ip: fc.integer({ min: 0, max: 0xffff_ffff }),
  namespace: fc.stringMatching(/^[a-z0-9.-]{0,20}$/),
  name: fc.stringMatching(/^[a-z0-9._-]{1,40}$/),
  containerId: line,
  ifName: fc.stringMatching(/^[A-Za-z0-9.-]{1,15}$/),
  releasedAt: fc.integer({ min: 0, max: Number.MAX_SAFE_INTEGER }),
  reusable: fc.constant(true as const),
}, { requiredKeys: ['ip', 'namespace', 'name', 'containerId', 'ifName'], noNullPrototype: true })
  .map(({ reusable, ...r }) => (r.releasedAt !== undefined && reusable ? { ...r, reusable } : r));

test('any file name and content: decodeRecord returns a record or a reason, never throws', () => {
  const names = fc.oneof(anyText, mutatedText(record.map(recordFileName)));
  const contents = fc.oneof(anyText, mutatedText(record.map(encodeRecord)));
  fc.assert(fc.property(names, contents, (n, c) => {
    const r = decodesOrRefuses(() => decodeRecord(n, c), []);
    if (typeof r === 'object' && !(r instanceof Error)) assert.ok(r.name !== '' && r.containerId !== '' && r.ifName !== '');
  }), fuzzParams(400));
});

test('round trip: decodeRecord(recordFileName(x), encodeRecord(x)) is x', () => {
  fc.assert(fc.property(record, (r) => {
    assert.deepEqual(decodeRecord(recordFileName(r), encodeRecord(r)), r);
  }), fuzzParams(200));
});

test('a record torn at any byte offset is refused or reads as a more holding state of the same record', () => {
  fc.assert(fc.property(record, fc.nat(), (r, n) => {
    const full = encodeRecord(r);
    const cut = n % full.length;
    const got = decodeRecord(recordFileName(r), full.slice(0, cut));
    if (typeof got === 'string') return;
    const { releasedAt, reusable, ...same } = got;
    assert.deepEqual(same, { ip: r.ip, namespace: r.namespace, name: r.name, containerId: r.containerId, ifName: r.ifName });
    if (releasedAt !== undefined) assert.equal(releasedAt, r.releasedAt);
    if (reusable) assert.equal(r.reusable, true);
  }), fuzzParams(200));
});
