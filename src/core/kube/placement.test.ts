import { test } from 'node:test';
import assert from 'node:assert/strict';
import { annotationPatch, indexCommunities, placementOf, publishedAnnotations } from './placement.ts';

const none = indexCommunities([], new Set());

test('role, site and community from labels, with the documented precedence', () => {
  const cases: [string, Record<string, string>, unknown][] = [
    ['no labels: a cloud node without site or community', {}, { role: 'cloud', site: '', community: '' }],
    ['KubeEdge edge label (any value)', { 'node-role.kubernetes.io/edge': '' }, { role: 'edge', site: '', community: '' }],
    ['OpenYurt true', { 'openyurt.io/is-edge-worker': 'true' }, { role: 'edge', site: '', community: '' }],
    ['OpenYurt false', { 'openyurt.io/is-edge-worker': 'false' }, { role: 'cloud', site: '', community: '' }],
    ['atoll.dev/site wins over the zone', { 'atoll.dev/site': 'a', 'topology.kubernetes.io/zone': 'z' }, { role: 'cloud', site: 'a', community: '' }],
    ['zone when no site label', { 'topology.kubernetes.io/zone': 'z' }, { role: 'cloud', site: 'z', community: '' }],
    ['community label', { 'atoll.dev/community': 'c1' }, { role: 'cloud', site: '', community: 'c1' }],
  ];
  for (const [name, labels, want] of cases) assert.deepEqual(placementOf('n', labels, none), want, name);
});

test('malformed labels are NODE_LABELS_INVALID naming the node and the label', () => {
  const bad: Record<string, string>[] = [{ 'openyurt.io/is-edge-worker': 'maybe' }, { 'atoll.dev/site': '' }, { 'atoll.dev/community': '-bad' }];
  for (const labels of bad) {
    const p = placementOf('edge-1', labels, none);
    assert.ok(!('role' in p));
    assert.equal(p.code, 'NODE_LABELS_INVALID');
    assert.match(p.message, /Node edge-1: label /);
  }
});

test('Community objects: membership, unknown nodes, a node in two, and a disagreeing label', () => {
  const idx = indexCommunities([{ name: 'c1', members: ['a', 'ghost'] }, { name: 'c2', members: ['b'] }, { name: 'c3', members: ['b'] }], new Set(['a', 'b']));
  assert.equal(idx.byNode.get('a'), 'c1');
  assert.equal(idx.byNode.has('b'), false, 'in two communities: in neither');
  assert.deepEqual(idx.problems.map((p) => p.code), ['COMMUNITY_INVALID', 'COMMUNITY_INVALID']);
  assert.match(idx.problems.map((p) => p.message).join('\n'), /c1 names nodes that do not exist: ghost[\s\S]*node b is a member of 2 Communities \(c2, c3\)/);
  assert.deepEqual(placementOf('a', {}, idx), { role: 'cloud', site: '', community: 'c1' });
  const clash = placementOf('a', { 'atoll.dev/community': 'other' }, idx);
  assert.ok(!('role' in clash) && clash.code === 'NODE_LABELS_INVALID' && /disagrees with Community c1/.test(clash.message));
});

test('published annotations and the merge patch that brings a Node in step', () => {
  const want = publishedAnnotations({ vtepMac: '02:00:00:00:00:01', observedAddress: '', addresses: ['192.0.2.5'], blocks: ['10.0.0.0/26', '10.0.0.64/26'], tunnelPin: '' });
  assert.deepEqual(want, { 'atoll.dev/backend-data': '{"VtepMAC":"02:00:00:00:00:01"}', 'atoll.dev/blocks': '10.0.0.0/26,10.0.0.64/26', 'atoll.dev/public-ip': '192.0.2.5' });
  assert.equal(annotationPatch(want, want), undefined);
  assert.deepEqual(annotationPatch({ ...want, 'atoll.dev/tunnel-pin': 'old', 'other/keep': 'x' }, want), { 'atoll.dev/tunnel-pin': null });
  assert.deepEqual(annotationPatch({}, want), want);
});
