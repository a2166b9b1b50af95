import assert from 'node:assert/strict';
import { test } from 'node:test';
import { labNodeLabels, labPodObject } from './kubernetes.ts';

test('cloud nodes carry their site; edge nodes their site, community and the edge role', () => {
  assert.deepEqual(labNodeLabels({ site: 'cloud', community: '' }), { 'atoll.dev/site': 'cloud' });
  assert.deepEqual(labNodeLabels({ site: 'a', community: 'edge' }), { 'atoll.dev/site': 'a', 'atoll.dev/community': 'edge', 'openyurt.io/is-edge-worker': 'true' });
});

test('a lab pod is bound to its node and never pulls its image', () => {
  const pod = labPodObject({ name: 'a-1-p1', node: 'a-1' }, 'localhost/atoll-pause:test') as { metadata: { namespace: string }; spec: { nodeName: string; containers: { imagePullPolicy: string }[] } };
  assert.equal(pod.spec.nodeName, 'a-1');
  assert.equal(pod.metadata.namespace, 'lab');
  assert.equal(pod.spec.containers[0]?.imagePullPolicy, 'Never');
});
