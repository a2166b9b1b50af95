import { test } from 'node:test';
import assert from 'node:assert/strict';
import { decodeRecord, encodeRecord, recordFileName } from './record-codec.ts';
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
  assert.match(decodeRecord('10.0.0.1_ns_p', '') as string, /lacks/);
  assert.match(decodeRecord('10.0.0.1_ns_p', 'c\neth0\nbogus') as string, /unreadable/);
  assert.match(decodeRecord('10.0.0.1_ns_p', 'c\neth0\nreleased 5\nbogus') as string, /unreadable fourth/);
  assert.match(decodeRecord('10.0.0.1_ns_p', 'c\neth0\n\nreusable') as string, /unreadable fourth/);
});
