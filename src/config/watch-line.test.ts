import { test } from 'node:test';
import assert from 'node:assert/strict';
import { AtollError } from '../core/errors.ts';
import { decodeWatchLine } from './watch-line.ts';

const node = {
  name: 'edge-a', identity: 'aWQ=', site: 's1', community: '', addresses: ['198.51.100.1'], observedAddress: '198.51.100.1', vtepMac: '',
  tunnelKey: '', agentVersion: 'v', annotations: { 'a/b': 'c' }, blocks: ['10.244.0.0/26'], registeredAt: 1, updatedAt: 2,
};

test('decodeWatchLine returns the four kinds of line; keys a newer controller adds to a node are dropped', () => {
  assert.deepEqual(decodeWatchLine('{"type":"ping"}', 'https://c'), { type: 'ping' });
  assert.deepEqual(decodeWatchLine(JSON.stringify({ type: 'snapshot', revision: 4, nodes: [node] }), 'https://c'), { type: 'snapshot', revision: 4, nodes: [node] });
  assert.deepEqual(decodeWatchLine(JSON.stringify({ type: 'put', revision: 5, node: { ...node, later: 1 } }), 'https://c'), { type: 'put', revision: 5, node });
  assert.deepEqual(decodeWatchLine('{"type":"delete","name":"edge-a","revision":6}', 'https://c'), { type: 'delete', name: 'edge-a', revision: 6 });
});

const bad: [string, string, RegExp][] = [
  ['not JSON', '{"type":', /https:\/\/c sent a line that is not JSON: "\{\\"type\\":"/],
  ['not an object', '[1]', /not a watch line/],
  ['an unknown type', '{"type":"bookmark","revision":1}', /not a watch line \(type: /],
  ['a negative revision', '{"type":"delete","name":"a","revision":-1}', /revision: /],
  ['a node without blocks', JSON.stringify({ type: 'put', revision: 1, node: { ...node, blocks: undefined } }), /node\.blocks: /],
  ['a snapshot node of the wrong type', JSON.stringify({ type: 'snapshot', revision: 1, nodes: [{ ...node, addresses: '198.51.100.1' }] }), /nodes\.0\.addresses: /],
];
for (const [name, text, message] of bad) {
  test(`decodeWatchLine refuses ${name} with CONTROLLER_WATCH_INVALID`, () => {
    assert.throws(() => decodeWatchLine(text, 'https://c'), (err: unknown) => {
      assert.ok(err instanceof AtollError);
      assert.equal(err.code, 'CONTROLLER_WATCH_INVALID');
      assert.match(err.message, message);
      assert.ok(err.fix);
      return true;
    });
  });
}
