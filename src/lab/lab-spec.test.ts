import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { labPodsFromFlag, labSpecFromFlags, labSpecSchema } from './lab-spec.ts';
import { DEFAULT_LAB_SPEC, labUsesUdp } from './plan/spec.ts';
import { AtollError } from '../core/errors.ts';

test('no flags: the default spec', () => {
  assert.deepEqual(labSpecFromFlags({}), DEFAULT_LAB_SPEC);
});

test('sizes, per-site and all-site conditions', () => {
  const spec = labSpecFromFlags({
    'cloud-nodes': '1', 'edge-sites': '3', 'nodes-per-site': '1', 'pods-per-node': '4',
    nat: ['symmetric', 'a=endpoint-independent'], community: ['c='], delay: ['b=20ms'], rate: ['1gbit'], 'same-site': 'direct',
  });
  assert.equal(spec.cloudNodes, 1);
  assert.equal(spec.podsPerNode, 4);
  assert.equal(spec.sameSite, 'direct');
  assert.deepEqual(spec.edges.map((e) => [e.name, e.nodes, e.nat, e.community, e.uplink.delayMs, e.uplink.rateMbit]), [
    ['a', 1, 'endpoint-independent', 'edge', undefined, 1000],
    ['b', 1, 'symmetric', 'edge', 20, 1000],
    ['c', 1, 'symmetric', '', undefined, 1000],
  ]);
  assert.ok(Object.isFrozen(spec));
});

test('bad flags are refused with LAB_SPEC_INVALID naming the value', () => {
  const refuses = (flags: Parameters<typeof labSpecFromFlags>[0], pattern: RegExp) =>
    assert.throws(() => labSpecFromFlags(flags), (e: unknown) => e instanceof AtollError && e.code === 'LAB_SPEC_INVALID' && pattern.test(e.message));
  refuses({ 'cloud-nodes': 'two' }, /--cloud-nodes must be a whole number, not "two"/);
  refuses({ nat: ['z=symmetric'] }, /no edge site "z"/);
  refuses({ nat: ['full-cone'] }, /--nat must be endpoint-independent or symmetric/);
  refuses({ delay: ['20s'] }, /--delay must be milliseconds/);
  refuses({ 'edge-sites': '0', 'cloud-nodes': '0' }, /cloud nodes must be 1 to 200, not 0/);
});

test('a JSON spec file, strict, changed by flags', () => {
  const dir = mkdtempSync(join(tmpdir(), 'atoll-lab-spec-'));
  try {
    const file = join(dir, 'spec.json');
    writeFileSync(file, JSON.stringify({ cloudNodes: 1, edges: [{ name: 'x', nodes: 3, community: 'c1', nat: 'symmetric', uplink: { rateMbit: 10 } }] }));
    const spec = labSpecFromFlags({ spec: file, 'pods-per-node': '1' });
    assert.deepEqual(spec.edges, [{ name: 'x', nodes: 3, community: 'c1', nat: 'symmetric', uplink: { rateMbit: 10 } }]);
    assert.equal(spec.podsPerNode, 1);
    writeFileSync(file, JSON.stringify({ cloudNodes: 1, sites: [] }));
    assert.throws(() => labSpecFromFlags({ spec: file }), /sites/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('--pods: auto by default, cri or direct, anything else refused', () => {
  assert.equal(labPodsFromFlag(undefined), 'auto');
  assert.equal(labPodsFromFlag('cri'), 'cri');
  assert.equal(labPodsFromFlag('direct'), 'direct');
  assert.throws(() => labPodsFromFlag('containerd'), (e: unknown) => e instanceof AtollError && e.code === 'LAB_SPEC_INVALID' && /--pods must be auto, cri, direct, not "containerd"/.test(e.message));
});

test('the datagram path is on unless --no-udp (--udp wins over a spec file that turns it off); --block-udp SITE blocks UDP at that site\'s router', () => {
  const spec = labSpecFromFlags({ udp: true, 'block-udp': ['b'] });
  assert.equal(labUsesUdp(spec), true);
  assert.deepEqual(spec.edges.map((e) => [e.name, e.udpBlocked === true]), [['a', false], ['b', true]]);
  assert.equal(labSpecFromFlags({}).tunnelUdp, undefined, 'on by default, as the agents\' own default');
  assert.equal(labSpecFromFlags({ 'no-udp': true }).tunnelUdp, false);
  assert.throws(() => labSpecFromFlags({ 'block-udp': ['z'] }), (e: unknown) => e instanceof AtollError && /--block-udp z: there is no edge site "z"/.test(e.message));
});

test('--no-metrics (or "metrics": false in the spec file) leaves the metrics listeners out; on by default', () => {
  assert.equal(labSpecFromFlags({ 'no-metrics': true }).metrics, false);
  assert.equal(labSpecFromFlags({}).metrics, undefined, 'on by default');
  assert.equal(labSpecSchema.parse({ metrics: false }).metrics, false);
});
