import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { NodeRecord } from '../../core/cluster/model.ts';
import { WatchBatch } from './watch-batch.ts';

const rec = (name: string, updatedAt = 0): NodeRecord => ({
  name, identity: '', site: '', community: '', addresses: [], observedAddress: '', vtepMac: '', tunnelKey: '', agentVersion: '',
  annotations: {}, blocks: [], registeredAt: 0, updatedAt,
});

test('lines are applied to the current list in order and handed on once, sorted, with the last revision', () => {
  const handed: [string[], number][] = [];
  let current: readonly NodeRecord[] = [rec('b'), rec('z')];
  const batch = new WatchBatch(60_000, () => current, (nodes, revision) => {
    current = nodes;
    handed.push([nodes.map((n) => `${n.name}${n.updatedAt}`), revision]);
  });
  batch.add({ type: 'put', node: rec('a'), revision: 5 });
  batch.add({ type: 'put', node: rec('b', 1), revision: 6 });
  batch.add({ type: 'delete', name: 'z', revision: 7 });
  assert.equal(handed.length, 0, 'nothing until it settles');
  batch.settle();
  batch.settle();
  assert.deepEqual(handed, [[['a0', 'b1'], 7]]);
  // a snapshot replaces the list; lines after it apply to it
  batch.add({ type: 'put', node: rec('q'), revision: 8 });
  batch.add({ type: 'snapshot', nodes: [rec('m'), rec('c')], revision: 9 });
  batch.add({ type: 'put', node: rec('d'), revision: 10 });
  batch.settle();
  assert.deepEqual(handed.at(-1), [['c0', 'd0', 'm0'], 10]);
});

test('an open batch settles by itself after its time', async () => {
  let handed = 0;
  const batch = new WatchBatch(20, () => [], () => handed++);
  batch.add({ type: 'put', node: rec('a'), revision: 1 });
  batch.add({ type: 'put', node: rec('b'), revision: 2 });
  await new Promise((r) => setTimeout(r, 100));
  assert.equal(handed, 1);
});
