/**
 * `atoll lab run --prometheus` on a small lab: a real Prometheus scrapes every agent, the controller and the relay;
 * its answers match the lab (targets, nodes, blocks, peers per path), every query of the Grafana dashboard names a
 * scraped metric, and the relay kill shows (relayed peers down, then back). `atoll trace` of every cell agrees with
 * the matrix. Kept small (four nodes, one pod each, no other faults) so it runs in about a minute.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { LabPrometheusReport } from '../../src/lab/prometheus.ts';
import type { LabTraceCheck } from '../../src/lab/lab-checks.ts';
import { rootSkipReason } from '../../harness/netns.ts';
import { runAtoll } from '../support/atoll-cli.ts';

/** Cloud 1; edge a and b behind endpoint-independent NATs (a <-> b hole-punched), c behind a symmetric one (relayed). */
const SPEC = {
  cloudNodes: 1, podsPerNode: 1, sameSite: 'vxlan',
  edges: [
    { name: 'a', nodes: 1, community: 'x', nat: 'endpoint-independent', uplink: {} },
    { name: 'b', nodes: 1, community: 'x', nat: 'endpoint-independent', uplink: {} },
    { name: 'c', nodes: 1, community: 'x', nat: 'symmetric', uplink: {} },
  ],
};

function skipReason(): string | false {
  return rootSkipReason() || (existsSync('/usr/bin/prometheus') ? false : 'prometheus is not installed (apt-get install prometheus)');
}

test('atoll lab run --prometheus: PromQL answers match the lab, the dashboard\'s metrics exist, the relay kill shows; trace agrees with the matrix', { skip: skipReason(), timeout: 200_000 }, async (t) => {
  const tmp = mkdtempSync(join(tmpdir(), 'atoll-lab-prom-'));
  try {
    const specFile = join(tmp, 'spec.json');
    const json = join(tmp, 'report.json');
    writeFileSync(specFile, JSON.stringify(SPEC));
    const res = await runAtoll(['lab', 'run', '--spec', specFile, '--faults', 'none', '--pods', 'direct', '--prometheus', '--json', json], 180_000);
    assert.equal(res.code, 0, res.out);
    t.diagnostic(res.out);
    const report = JSON.parse(readFileSync(json, 'utf8')) as { runId: string; traces: LabTraceCheck[]; prometheus: LabPrometheusReport };
    // 4 pods: 12 cells, each traced with the path the matrix measured
    assert.equal(report.traces.length, 12);
    assert.deepEqual(report.traces.filter((t) => !t.ok), []);
    assert.deepEqual(new Set(report.traces.map((t) => t.traced)), new Set(['tunnel direct', 'tunnel hole-punched', 'tunnel relayed']));

    const p = report.prometheus;
    assert.ok(p.ok, res.out);
    const got = (phase: string, query: string) => p.checks.find((c) => c.phase === phase && c.query === query)?.got;
    assert.equal(got('healthy', 'sum(up)'), 6);
    assert.equal(got('healthy', 'max(atoll_controller_registered_nodes)'), 4);
    // cloud <-> each edge both ways: 6 direct; a <-> b: 2 hole-punched; c <-> a, b: 4 relayed
    // the datagram path (the default) carries the cloud pairs (6) and the hole-punched ones (2); the symmetric NAT's stay relayed
    assert.equal(got('healthy', 'sum(atoll_tunnel_peers{path="udp"})'), 8);
    assert.equal(got('healthy', 'sum(atoll_tunnel_peers{path="direct"})'), 0);
    assert.equal(got('healthy', 'sum(atoll_tunnel_peers{path="hole-punched"})'), 0);
    assert.equal(got('healthy', 'sum(atoll_tunnel_peers{path="relayed"})'), 4);
    assert.equal(got('relay killed', 'sum(atoll_tunnel_peers{path="down"})'), 4);
    assert.equal(got('relay killed', 'sum(atoll_tunnel_peers{path="udp"})'), 8);
    assert.equal(got('relay back', 'sum(atoll_tunnel_peers{path="relayed"})'), 4);
    assert.deepEqual(p.dashboardMissing, []);
    assert.ok(p.dashboardQueries >= 10);
    assert.deepEqual(readdirSync('/var/run/netns').filter((n) => n.startsWith(`atl-lab-${report.runId}-`)), [], 'nothing of the run is left');
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
});
