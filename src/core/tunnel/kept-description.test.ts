import { test } from 'node:test';
import assert from 'node:assert/strict';
import { parseKeptDescription } from './kept-description.ts';

const peer = {
  id: 'cloud-1', pin: 'sha256:ab', usable: true, heard: 1_700_000_000_000, endpoint: '192.0.2.1:8477', announced: { host: '192.0.2.1', port: 8477 },
  send: { slot: 0, id: 7, createdAt: 1_700_000_000_000 }, pending: { slot: 1, id: 8, at: 1_700_000_000_000 }, recv: [{ slot: 2, id: 9, expiresAt: null }, { slot: 3, id: 10, expiresAt: 5 }],
};

test('kept description: a well-formed one reads back as written', () => {
  assert.deepEqual(parseKeptDescription(JSON.stringify({ v: 1, peers: [peer] })), { v: 1, peers: [peer] });
  assert.deepEqual(parseKeptDescription(JSON.stringify({ v: 1, peers: [{ id: 'b', pin: '', usable: false, recv: [] }] }))?.peers, [{ id: 'b', pin: '', usable: false, recv: [] }]);
});

test('kept description: not one at all (cut short, another version, not JSON) is none; bad peers are left out, the rest kept', () => {
  const text = JSON.stringify({ v: 1, peers: [peer] });
  for (const bad of ['', text.slice(0, text.length - 3), '{"v":2,"peers":[]}', '{"v":1,"peers":{}}', 'null', '[]', '{"v":1}']) {
    assert.equal(parseKeptDescription(bad), undefined, bad);
  }
  const broken = [
    { ...peer, id: 5 }, { ...peer, id: '' }, { ...peer, usable: 'yes' }, { ...peer, recv: {} }, { ...peer, recv: [{ slot: -1, id: 1, expiresAt: null }] },
    { ...peer, recv: [{ slot: 1, id: 1.5, expiresAt: null }] }, { ...peer, send: { slot: 0, id: 7 } }, { ...peer, pending: { slot: 'x', id: 1, at: 0 } }, null, 'peer', [],
  ];
  const read = parseKeptDescription(JSON.stringify({ v: 1, peers: [...broken, { ...peer, id: 'ok' }, { ...peer, id: 'ok', pin: 'second' }] }));
  assert.deepEqual(read?.peers.map((p) => [p.id, p.pin]), [['ok', 'sha256:ab']], 'only the well-formed peer, once');
  // optional fields of the wrong type are dropped, not the peer
  const loose = parseKeptDescription(JSON.stringify({ v: 1, peers: [{ ...peer, heard: 'then', endpoint: 4, announced: { host: 'h', port: 70_000 } }] }));
  assert.deepEqual(Object.keys(loose?.peers[0] ?? {}).sort(), ['id', 'pending', 'pin', 'recv', 'send', 'usable']);
});

test('kept description: random bytes and mutated descriptions never throw', () => {
  const text = JSON.stringify({ v: 1, peers: [peer, { ...peer, id: 'b' }] });
  let seed = 42;
  const rnd = () => ((seed = (seed * 1_103_515_245 + 12_345) % 2 ** 31) / 2 ** 31);
  for (let i = 0; i < 2000; i++) {
    const chars = [...text];
    for (let k = 0; k < 1 + Math.floor(rnd() * 4); k++) chars[Math.floor(rnd() * chars.length)] = String.fromCharCode(32 + Math.floor(rnd() * 95));
    const out = parseKeptDescription(chars.join(''));
    if (out) for (const p of out.peers) assert.ok(typeof p.id === 'string' && Array.isArray(p.recv));
  }
});
