import { test } from 'node:test';
import assert from 'node:assert/strict';
import { keyOfName, kindOfKey, objectName, storeTag } from './store-kube-names.ts';

const DNS_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;

const KEYS = [
  'blocks/10.244.1.0-26', 'nodes/edge-7', 'usage/edge-7', 'a', 'p/a', 'p/A', 'p/a.', 'p/.a', 'p//a', 'blocks/X', 'blocks/x',
  'nodes/', 'blocks/', '~filler', 'w/a', 'w-a', 'w.a', 'W.a', 'a--b', 'a-b', 'dur/a', 'ü', 'x'.repeat(300), `${'x'.repeat(300)}y`,
  'blocks/a--b', 'q/x', 'k', 'k-', '-k', 'K', 'k.k', 'k/k',
];

test('every key gets a valid object name; distinct keys never share one', () => {
  for (const tag of ['atoll-controller', storeTag('atoll.controller'), storeTag('t-0a1b2c3d')]) {
    const seen = new Map<string, string>();
    for (const key of KEYS) {
      const name = objectName(tag, key);
      assert.ok(name.length <= 253, `${key}: ${name.length} characters`);
      assert.match(name, DNS_SUBDOMAIN, key);
      assert.ok(name.startsWith(`${tag}.`));
      const clash = seen.get(`${kindOfKey(key)}/${name}`);
      assert.equal(clash, undefined, `${key} and ${clash} share ${name}`);
      seen.set(`${kindOfKey(key)}/${name}`, key);
    }
  }
});

test('plain names read as the key and give it back; others carry a hash', () => {
  const cases: [string, string, string | undefined][] = [
    ['blocks/10.244.1.0-26', 'atoll-controller.10.244.1.0-26', 'blocks/10.244.1.0-26'],
    ['nodes/edge-7', 'atoll-controller.edge-7', 'nodes/edge-7'],
    ['usage/edge-7', 'atoll-controller.usage-edge-7--', undefined],
    ['blocks/X', 'atoll-controller.x--', undefined],
    ['k.k', 'atoll-controller.k.k', 'k.k'],
  ];
  for (const [key, namePrefix, back] of cases) {
    const name = objectName('atoll-controller', key);
    assert.ok(name.startsWith(namePrefix), `${key} -> ${name}`);
    assert.equal(keyOfName('atoll-controller', kindOfKey(key), name), back, key);
    if (back === undefined) assert.match(name, /--[0-9a-f]{20}$/);
  }
  assert.equal(keyOfName('other', 'IPBlock', 'atoll-controller.10.0.0.0-26'), undefined);
  assert.equal(objectName('t', 'x'.repeat(300)).length, 253);
});

test('store tags: a DNS label as it is, anything else hashed without dots', () => {
  assert.equal(storeTag('atoll-controller'), 'atoll-controller');
  assert.match(storeTag('atoll.controller'), /^atoll-controller--[0-9a-f]{20}$/);
  assert.notEqual(storeTag('a.b'), storeTag('a-b'));
  assert.ok(storeTag('x'.repeat(200)).length <= 63);
});

test('kinds by key', () => {
  assert.equal(kindOfKey('blocks/10.0.0.0-26'), 'IPBlock');
  assert.equal(kindOfKey('nodes/a'), 'NodeRegistration');
  assert.equal(kindOfKey('usage/a'), 'StoreEntry');
  assert.equal(kindOfKey('blocks'), 'StoreEntry');
});
