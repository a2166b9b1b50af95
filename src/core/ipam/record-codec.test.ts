import { test } from 'node:test';
import assert from 'node:assert/strict';
import { damagedHold, decodeRecord, decodeRecordFileName, encodeRecord, recordFileName } from './record-codec.ts';
import type { IpamRecord } from './sticky-pool.ts';
import { parseIpv4 } from '../net/ipv4.ts';

const ip = parseIpv4('10.244.1.5') as number;

test('records round-trip in the OpenYurt file layout', () => {
  const cases = [
    { ip, namespace: 'default', name: 'web-0', containerId: 'abc123', ifName: 'eth0' },
    { ip, namespace: 'kube-system', name: 'dns.x', containerId: 'c', ifName: 'net1', releasedAt: 1700000000000 },
    { ip, namespace: '', name: 'plain_container_1', containerId: 'plain_container_1', ifName: 'eth0' },
    { ip, namespace: 'ns', name: 'gone', containerId: 'c', ifName: 'eth0', releasedAt: 1700000000000, reusable: true as const },
  ];
  for (const r of cases) {
    const file = recordFileName(r);
    assert.deepEqual(decodeRecord(file, encodeRecord(r)), r);
  }
  assert.equal(recordFileName(cases[0] as never), '10.244.1.5_default_web-0');
  assert.equal(encodeRecord(cases[0] as never), 'abc123\neth0\n');
});

test('damaged or foreign files are reported, not loaded', () => {
  assert.match(decodeRecord('last_reserved_ip.0', '10.0.0.1') as string, /IPv4/);
  assert.match(decodeRecord('lock', '') as string, /not \{ip\}/);
  assert.match(decodeRecord('10.0.0.1_ns_p', '\n') as string, /lacks/);
  assert.match(decodeRecord('10.0.0.1_ns_p', 'c\neth0\nbogus\n') as string, /unreadable/);
  assert.match(decodeRecord('10.0.0.1_ns_p', 'c\neth0\nreleased 5\nbogus\n') as string, /unreadable fourth/);
  assert.match(decodeRecord('10.0.0.1_ns_p', 'c\neth0\n\nreusable\n') as string, /unreadable fourth/);
});

/**
 * A power cut that tears a write leaves a prefix of the new content. At every byte offset the decoder must refuse it
 * or read a state that holds the address at least as firmly as the record being written: never another pod's, never
 * a reservation for an active record, never an earlier release time, never "reusable" that was not written.
 */
test('a record torn at every byte offset is refused or reads as a more holding state of the same record', () => {
  const cases: IpamRecord[] = [
    { ip, namespace: 'default', name: 'web-0', containerId: 'abc123', ifName: 'eth0' },
    { ip, namespace: 'default', name: 'web-0', containerId: 'abc123', ifName: 'eth0', releasedAt: 1700000000123 },
    { ip, namespace: 'ns', name: 'gone', containerId: 'c', ifName: 'eth0', releasedAt: 1700000000000, reusable: true },
    { ip, namespace: '', name: 'plain_1', containerId: 'plain_1', ifName: 'net1' },
  ];
  let refused = 0;
  for (const r of cases) {
    const full = encodeRecord(r);
    for (let cut = 0; cut < full.length; cut++) {
      const got = decodeRecord(recordFileName(r), full.slice(0, cut));
      if (typeof got === 'string') {
        refused++;
        continue;
      }
      assert.deepEqual({ ...got, releasedAt: undefined, reusable: undefined }, { ...r, releasedAt: undefined, reusable: undefined }, `cut at ${cut}`);
      if (got.releasedAt !== undefined) assert.equal(got.releasedAt, r.releasedAt, `cut at ${cut}: another release time`);
      if (got.reusable) assert.equal(r.reusable, true, `cut at ${cut}: reusable not written`);
      assert.ok(got.releasedAt === undefined || r.releasedAt !== undefined, `cut at ${cut}: released, not written so`);
    }
    assert.deepEqual(decodeRecord(recordFileName(r), full), r);
  }
  assert.ok(refused > 0);
  // the cases the rule is for: a release time or a word cut short
  assert.match(decodeRecord('10.0.0.1_ns_p', 'c\neth0\nreleased 17') as string, /line break/);
  assert.match(decodeRecord('10.0.0.1_ns_p', 'c\neth') as string, /line break/);
  assert.match(decodeRecord('10.0.0.1_ns_p', '') as string, /line break/);
});

test('a damaged record with a record name holds its address as a reservation for its pod', () => {
  const key = decodeRecordFileName('10.244.1.5_default_web-0');
  assert.deepEqual(key, { ip, namespace: 'default', name: 'web-0' });
  const hold = damagedHold(key as Exclude<typeof key, string>, 42);
  assert.equal(hold.releasedAt, 42);
  assert.equal(hold.reusable, undefined);
  assert.deepEqual(decodeRecord(recordFileName(hold), encodeRecord(hold)), hold, 'written back (a mark, a reclaim), it stays a readable reservation');
  assert.match(decodeRecordFileName('lock') as string, /not \{ip\}/);
});
