import { test } from 'node:test';
import assert from 'node:assert/strict';
import { canonicalRequest, ReplayGuard, type SignedRequestFields } from './signing.ts';

const SHA_EMPTY = 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855';
const req: SignedRequestFields = { method: 'post', path: '/v1/nodes/edge-1?x=1', node: 'edge-1', time: 1_700_000_000_000, nonce: '0123456789abcdef', bodySha256: SHA_EMPTY };
const nonce = (i: number) => i.toString(16).padStart(16, '0');

test('the canonical request is a version line then one field a line, method upper-cased', () => {
  assert.equal(canonicalRequest(req), ['ATOLL-REQUEST-V1', 'POST', '/v1/nodes/edge-1?x=1', 'edge-1', '1700000000000', '0123456789abcdef', SHA_EMPTY].join('\n'));
});

test('every field changes the canonical request', () => {
  const base = canonicalRequest(req);
  const changes: Partial<SignedRequestFields>[] = [
    { method: 'PUT' }, { path: '/v1/nodes/edge-2?x=1' }, { node: 'edge-2' }, { time: req.time + 1 }, { nonce: '0123456789abcdee' }, { bodySha256: SHA_EMPTY.replace('e3', 'e4') },
  ];
  for (const change of changes) assert.notEqual(canonicalRequest({ ...req, ...change }), base, JSON.stringify(change));
});

test('fields that could make the canonical request ambiguous are refused', () => {
  const bad: [string, Partial<SignedRequestFields>][] = [
    ['line break in the path', { path: '/a\nedge-2' }],
    ['space in the path', { path: '/a b' }],
    ['relative path', { path: 'v1/nodes' }],
    ['line break in the node', { node: 'edge-1\n1' }],
    ['empty node', { node: '' }],
    ['method with a space', { method: 'GET /' }],
    ['fractional time', { time: 1.5 }],
    ['negative time', { time: -1 }],
    ['upper-case nonce', { nonce: '0123456789ABCDEF' }],
    ['short nonce', { nonce: 'abc' }],
    ['body hash not hex', { bodySha256: 'x'.repeat(64) }],
  ];
  for (const [name, change] of bad) assert.throws(() => canonicalRequest({ ...req, ...change }), RangeError, name);
});

test('a fresh request passes once; its replay is refused; another node may use the same nonce', () => {
  const g = new ReplayGuard({ windowMs: 60_000, maxEntries: 100 });
  assert.equal(g.check('a', 1000, nonce(1), 1000), 'ok');
  assert.equal(g.check('a', 1000, nonce(1), 2000), 'replayed');
  assert.equal(g.check('b', 1000, nonce(1), 2000), 'ok');
  assert.equal(g.check('a', 1000, nonce(2), 2000), 'ok');
});

test('times outside the window either way are refused; its edges are inside', () => {
  const g = new ReplayGuard({ windowMs: 1000, maxEntries: 100 });
  const now = 100_000;
  assert.equal(g.check('a', now - 1001, nonce(1), now), 'stale');
  assert.equal(g.check('a', now + 1001, nonce(2), now), 'future');
  assert.equal(g.check('a', now - 1000, nonce(3), now), 'ok');
  assert.equal(g.check('a', now + 1000, nonce(4), now), 'ok');
});

test('malformed nodes, times and nonces are refused and not remembered', () => {
  const g = new ReplayGuard({ windowMs: 1000, maxEntries: 100 });
  for (const n of ['', 'abc', '0123456789abcde', 'g123456789abcdef', '0123456789ABCDEF', 'a'.repeat(65)]) assert.equal(g.check('a', 0, n, 0), 'malformed', n);
  assert.equal(g.check('', 0, nonce(1), 0), 'malformed');
  assert.equal(g.check('a', Number.NaN, nonce(1), 0), 'malformed');
  assert.equal(g.check('a', 0.5, nonce(1), 0), 'malformed');
  assert.equal(g.check('a', 0, 'f'.repeat(64), 0), 'ok');
  assert.equal(g.size, 1);
});

test('pairs are forgotten once the window has passed them, and their replay is then stale', () => {
  const g = new ReplayGuard({ windowMs: 1000, maxEntries: 100 });
  for (let i = 0; i < 10; i++) assert.equal(g.check('a', i * 100, nonce(i), i * 100), 'ok');
  assert.equal(g.size, 10);
  assert.equal(g.check('b', 1450, nonce(99), 1450), 'ok');
  assert.equal(g.size, 6, 'times 0 to 400 are more than 1000 ms before 1450');
  assert.equal(g.check('a', 400, nonce(4), 1450), 'stale');
  assert.equal(g.check('a', 500, nonce(5), 1450), 'replayed');
  g.check('c', 5000, nonce(100), 5000);
  assert.equal(g.size, 1);
});

test('beyond maxEntries the oldest pairs are forgotten and nothing up to their time is accepted again', () => {
  const g = new ReplayGuard({ windowMs: 60_000, maxEntries: 3 });
  const now = 100_000;
  assert.equal(g.check('a', now - 10, nonce(1), now), 'ok');
  assert.equal(g.check('a', now - 30, nonce(2), now), 'ok');
  assert.equal(g.check('a', now - 20, nonce(3), now), 'ok');
  assert.equal(g.check('a', now, nonce(4), now), 'ok');
  assert.equal(g.size, 3);
  assert.equal(g.check('a', now - 30, nonce(2), now), 'stale', 'the evicted pair cannot be replayed');
  assert.equal(g.check('a', now - 31, nonce(5), now), 'stale', 'older than the newest forgotten time');
  assert.equal(g.check('a', now - 20, nonce(3), now), 'replayed');
  assert.equal(g.check('a', now - 29, nonce(6), now), 'ok', 'newer than every forgotten pair');
  assert.equal(g.size, 3);
});

test('a clock that steps back does not reopen forgotten pairs', () => {
  const g = new ReplayGuard({ windowMs: 1000, maxEntries: 100 });
  assert.equal(g.check('a', 1000, nonce(1), 1000), 'ok');
  g.check('a', 5000, nonce(2), 5000);
  assert.equal(g.size, 1);
  assert.equal(g.check('a', 1000, nonce(1), 1500), 'stale');
});

test('under a random mix of clocks, times, replays and evictions no signed request is accepted twice', () => {
  let seed = 42;
  const rand = (n: number) => {
    seed = (seed * 1_103_515_245 + 12_345) % 2 ** 31;
    return Math.floor((seed / 2 ** 31) * n);
  };
  const g = new ReplayGuard({ windowMs: 500, maxEntries: 50 });
  const sent: { node: string; time: number; nonce: string }[] = [];
  const accepted = new Set<string>();
  let fullest = 0;
  let now = 10_000;
  for (let i = 0; i < 20_000; i++) {
    now += rand(30) - 10;
    const r = sent.length > 0 && rand(2) === 0
      ? (sent[sent.length - 1 - rand(Math.min(sent.length, 200))] as (typeof sent)[number])
      : { node: `n${rand(3)}`, time: now + rand(1200) - 600, nonce: nonce(rand(1_000_000)) };
    sent.push(r);
    if (g.check(r.node, r.time, r.nonce, now) === 'ok') {
      const key = `${r.node} ${r.time} ${r.nonce}`;
      assert.ok(!accepted.has(key), `accepted twice: ${key}`);
      accepted.add(key);
    }
    fullest = Math.max(fullest, g.size);
  }
  assert.ok(accepted.size > 5000, `only ${accepted.size} accepted`);
  assert.equal(fullest, 50, 'the guard should fill and never hold more than maxEntries');
});

test('notBefore refuses requests signed before a restart', () => {
  const g = new ReplayGuard({ windowMs: 60_000, maxEntries: 100, notBefore: 50_000 });
  assert.equal(g.check('a', 50_000, nonce(1), 50_001), 'stale');
  assert.equal(g.check('a', 50_001, nonce(2), 50_001), 'ok');
});

test('the guard refuses a window or capacity that cannot work', () => {
  assert.throws(() => new ReplayGuard({ windowMs: 0, maxEntries: 10 }), RangeError);
  assert.throws(() => new ReplayGuard({ windowMs: 1000, maxEntries: 0 }), RangeError);
});
