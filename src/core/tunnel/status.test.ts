import { test } from 'node:test';
import assert from 'node:assert/strict';
import { renderPeers, type TunnelStatus } from './status.ts';

test('atoll peers: a row per peer with path, rtt, traffic, age and punch count; then relay, failures, left-out peers and drops', () => {
  const now = 1_000_000;
  const st: TunnelStatus = {
    role: 'edge',
    relay: { address: '192.0.2.2:8476', connected: true, rttMs: 0.42 },
    peers: [
      { name: 'b-1', role: 'edge', mode: 'punch', path: 'direct', rttMs: 0.5, txBytes: 3 * 1024 * 1024, rxBytes: 500, txPackets: 9, rxPackets: 4, since: now - 12_000, punch: { attempts: 2, successes: 1, lastError: '' } },
      { name: 'b-2', role: 'edge', mode: 'punch', path: 'relayed', txBytes: 0, rxBytes: 0, txPackets: 0, rxPackets: 0, since: 0, punch: { attempts: 3, successes: 0, lastError: 'timed out' } },
      { name: 'cloud-1', role: 'cloud', mode: 'dial', path: 'down', txBytes: 2048, rxBytes: 0, txPackets: 1, rxPackets: 0, since: now - 600_000 },
    ],
    skipped: [{ name: 'c-1', reason: 'edge in community red, not ours (blue): not allowed' }],
    dropped: { badSource: 3, noPath: 0 },
    refusedConnections: 2,
  };
  const lines = renderPeers(st, now);
  assert.match(lines[0]!, /^PEER\s+ROLE\s+PATH\s+RTT\s+SENT\s+RECEIVED\s+FOR\s+PUNCHED$/);
  assert.match(lines[1]!, /^b-1\s+edge\s+direct\s+0\.5 ms\s+3\.0 MiB\s+500 B\s+12s\s+1\/2$/);
  assert.match(lines[2]!, /^b-2\s+edge\s+relayed\s+-\s+0 B\s+0 B\s+-\s+0\/3$/);
  assert.match(lines[3]!, /^cloud-1\s+cloud\s+down\s+-\s+2\.0 KiB\s+0 B\s+10m\s+-$/);
  assert.deepEqual(lines.slice(4), [
    'relay 192.0.2.2:8476: connected, rtt 0.4 ms',
    'b-2: last hole punch failed: timed out',
    'no path to c-1: edge in community red, not ours (blue): not allowed',
    'dropped packets: badSource 3',
    'refused connections: 2',
  ]);
  assert.deepEqual(renderPeers({ role: 'cloud', peers: [], skipped: [], dropped: {} }, now).slice(1), ['(no tunnel peers)']);
  const udp = renderPeers({ role: 'edge', peers: [{ name: 'b-3', role: 'edge', mode: 'punch', path: 'udp', txBytes: 0, rxBytes: 0, txPackets: 0, rxPackets: 0, since: 0,
    punch: { attempts: 1, successes: 0, lastError: 'timed out' }, udp: { endpoint: '198.51.100.9:8476', usable: true } }], skipped: [], dropped: { 'udp.replayed': 2 },
    udpCopies: { sent: 12, spared: 9 } }, now);
  assert.match(udp[1]!, /^b-3\s+edge\s+udp 198\.51\.100\.9:8476\s+-/);
  assert.deepEqual(udp.slice(2), ['dropped packets: udp.replayed 2', 'datagram copies: 12 sent (retransmissions and SACKs go twice), 9 set aside (their original came)'],
    'a failed TCP punch is no news while datagrams flow');
  assert.deepEqual(renderPeers({ role: 'edge', peers: [], skipped: [], dropped: {}, udpCopies: { sent: 0, spared: 0 } }, now).slice(2), [], 'no copies: nothing to say');
  const rebuilding = renderPeers({ role: 'edge', peers: [{ name: 'b-4', role: 'edge', mode: 'punch', path: 'down', txBytes: 0, rxBytes: 0, txPackets: 0, rxPackets: 0, since: now - 9000,
    punch: { attempts: 1, successes: 0, lastError: 'the relay is unreachable' }, udp: { endpoint: '198.51.100.9:40123', usable: false, rebuildingSince: now - 7000 } }], skipped: [], dropped: {} }, now);
  assert.deepEqual(rebuilding.slice(2), ['b-4: rebuilding the path without the relay for 7s: hellos to 198.51.100.9:40123']);
  const kept = (keeper: TunnelStatus['keeper']) => renderPeers({ role: 'edge', peers: [], skipped: [], dropped: {}, keeper }, now).slice(2);
  assert.deepEqual(kept({ pid: 4242, takenBack: true }), ['data plane held by keeper 4242 (taken back from the last agent): an agent restart loses no datagram']);
  assert.deepEqual(kept(null), ['no keeper: an agent restart interrupts the datagram path (tunnel.udp.keepMs, the chart\'s agent.keeper)']);
  assert.deepEqual(kept(undefined), [], 'no datagram path: nothing to say');
});
