/**
 * `atoll lab run --udp` with the faults of an edge site cut off from the cloud (#16): its agents restarted in turn,
 * its NAT rebooted, its agents' clocks jumped by days, all while the relay and the controller are unreachable. The
 * edge-to-edge paths must heal without them (the datagram path's hellos), the same-site VXLAN pair must not notice.
 * And what cannot heal so (both sites' public addresses changed meanwhile) stays down cleanly until the cloud is back.
 * Small (a cloud node; edge a with two nodes, edge b with one, one community) and with direct CNI calls, so it runs
 * in about a minute.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { LIBFAKETIME } from '../../src/lab/agent-process.ts';
import type { LabFaultResult } from '../../src/lab/plan/fault-results.ts';
import { rootSkipReason } from '../../harness/netns.ts';
import { runAtoll } from '../support/atoll-cli.ts';

const SPEC = {
  cloudNodes: 1, podsPerNode: 1, sameSite: 'vxlan', tunnelUdp: true,
  edges: [
    { name: 'a', nodes: 2, community: 'x', nat: 'endpoint-independent', uplink: {} },
    { name: 'b', nodes: 1, community: 'x', nat: 'endpoint-independent', uplink: {} },
  ],
};

function skipReason(): string | false {
  return rootSkipReason() || (LIBFAKETIME ? false : 'needs libfaketime (make setup)') || (existsSync('/usr/sbin/conntrack') ? false : 'needs conntrack (make setup)');
}

test('a site cut off from the cloud: its agents restarted in turn, its NAT rebooted, its clocks jumped by days; edge paths heal without the relay', { skip: skipReason(), timeout: 240_000 }, async () => {
  const tmp = mkdtempSync(join(tmpdir(), 'atoll-lab-offline-'));
  try {
    const specFile = join(tmp, 'spec.json');
    const json = join(tmp, 'report.json');
    writeFileSync(specFile, JSON.stringify(SPEC));
    const res = await runAtoll(['lab', 'run', '--spec', specFile, '--pods', 'direct', '--faults', 'offline-restart-all,nat-reboot-offline,clock-jump,readdress-offline', '--json', json], 220_000);
    assert.equal(res.code, 0, res.out);
    const report = JSON.parse(readFileSync(json, 'utf8')) as { faults: readonly LabFaultResult[] };
    assert.deepEqual(report.faults.map((f) => [f.kind, f.ok, f.skipped]), [['offline-restart-all', true, undefined], ['nat-reboot-offline', true, undefined], ['clock-jump', true, undefined],
      ['readdress-offline', true, undefined]], res.out);
    const [restarts, nat, clock, moved] = report.faults as [LabFaultResult, LabFaultResult, LabFaultResult, LabFaultResult];
    for (const f of report.faults) {
      const samples = f.samples ?? [];
      // a-1 <-> b-1 both ways, a-2 -> b-1 (hole-punched), a-1 -> a-2 (VXLAN)
      assert.deepEqual(samples.map((s) => `${s.from}>${s.to}`), ['a-1-p1>b-1-p1', 'a-2-p1>b-1-p1', 'b-1-p1>a-1-p1', 'a-1-p1>a-2-p1'], f.kind);
      assert.ok(samples.every((s) => s.lostOutsideWindows === 0 && s.convergenceMs !== undefined), `${f.kind}: ${JSON.stringify(samples)}`);
      assert.equal(samples[3]?.received, samples[3]?.sent, `${f.kind}: the VXLAN pair lost nothing`);
    }
    // the first restart was felt: a-1's agent down past its peers' 3 s, so its pairs' packets waited in its keeper's
    // queues (late) or were lost, inside the window; and it was watched from the other site
    const a1 = (restarts.samples ?? []).filter((s) => s.from === 'a-1-p1' || s.to === 'a-1-p1').slice(0, 2);
    assert.ok(a1.some((s) => s.maxGapMs > 3000 && s.late + s.sent - s.received > 0), JSON.stringify(restarts));
    assert.match(restarts.facts?.[0] ?? '', /`atoll peers` on b-1: a-1: rebuilding the path without the relay for \d+s: hellos to 198\.51\.100\.\d+:\d+/);
    assert.ok((clock.samples ?? []).every((s) => s.received === s.sent), `the clock jump cost nothing: ${JSON.stringify(clock.samples)}`);
    assert.ok((nat.maxGapMs ?? Infinity) < 5000, JSON.stringify(nat));
    // both ends moved while a is cut off: down (cleanly) until the cloud is back, then healed through it
    const edge = (moved.samples ?? []).slice(0, 3);
    assert.ok(edge.every((s) => s.maxGapMs > 7000 && s.convergenceMs !== undefined), `the moved pairs stayed down until the heal: ${JSON.stringify(edge)}`);
    assert.match(moved.facts?.[0] ?? '', /`atoll peers` on b-1: a-1: rebuilding the path without the relay/);
    assert.match(res.out, /^PASS: every fault healed/m);
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
});
