import { test } from 'node:test';
import assert from 'node:assert/strict';
import { generateKeyPairSync } from 'node:crypto';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { AtollError } from '../../core/errors.ts';
import { ReplayGuard, SIGNATURE_HEADERS } from '../../core/cluster/signing.ts';
import { loadOrCreateIdentity, sha256Hex, signRequest, verifyRequest, verifySignature } from './node-identity.ts';

const NOW = 1_700_000_000_000;

function withDir(fn: (dir: string) => void): void {
  const dir = mkdtempSync(join(tmpdir(), 'atoll-identity-'));
  try {
    fn(dir);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

function isInvalidIdentity(path: string, message: RegExp) {
  return (err: unknown) => {
    assert.ok(err instanceof AtollError);
    assert.equal(err.code, 'NODE_IDENTITY_INVALID');
    assert.ok(err.message.includes(path), err.message);
    assert.match(err.message, message);
    assert.match(err.fix ?? '', /restore it from a backup|readable/);
    return true;
  };
}

test('the key is created once as 0600 PKCS#8 PEM, then reused', () => withDir((dir) => {
  const path = join(dir, 'state', 'node.key');
  const first = loadOrCreateIdentity(path);
  assert.equal(statSync(path).mode & 0o777, 0o600);
  assert.equal(statSync(join(dir, 'state')).mode & 0o777, 0o700);
  assert.match(readFileSync(path, 'utf8'), /^-----BEGIN PRIVATE KEY-----\n/);
  assert.deepEqual(readdirSync(join(dir, 'state')), ['node.key'], 'no temporary file is left');
  const again = loadOrCreateIdentity(path);
  assert.equal(again.publicKey, first.publicKey);
  assert.equal(Buffer.from(first.publicKey, 'base64').length, 44, 'ed25519 SPKI DER');
  assert.ok(verifySignature(first.publicKey, 'hello', again.sign('hello')));
}));

test('a corrupt, foreign or unreadable key file is an error naming the file, and is left alone', () => withDir((dir) => {
  const garbage = join(dir, 'garbage.key');
  writeFileSync(garbage, 'not a key', { mode: 0o600 });
  assert.throws(() => loadOrCreateIdentity(garbage), isInvalidIdentity(garbage, /not a PEM private key/));
  assert.equal(readFileSync(garbage, 'utf8'), 'not a key');

  const ec = join(dir, 'ec.key');
  writeFileSync(ec, generateKeyPairSync('ec', { namedCurve: 'P-256' }).privateKey.export({ type: 'pkcs8', format: 'pem' }));
  assert.throws(() => loadOrCreateIdentity(ec), isInvalidIdentity(ec, /is a ec key, not ed25519/));

  const directory = join(dir, 'dir.key');
  mkdirSync(directory);
  assert.throws(() => loadOrCreateIdentity(directory), isInvalidIdentity(directory, /cannot read/));
}));

test('verifySignature is false, never throws, on malformed input', () => withDir((dir) => {
  const id = loadOrCreateIdentity(join(dir, 'node.key'));
  const sig = id.sign('data');
  const ecKey = generateKeyPairSync('ec', { namedCurve: 'P-256' }).publicKey.export({ type: 'spki', format: 'der' }).toString('base64');
  assert.equal(verifySignature(id.publicKey, 'data', sig), true);
  assert.equal(verifySignature(id.publicKey, Buffer.from('data'), sig), true);
  assert.equal(verifySignature(id.publicKey, 'datA', sig), false);
  for (const [key, s] of [['', sig], ['!!!', sig], [id.publicKey.slice(4), sig], [ecKey, sig], [id.publicKey, ''], [id.publicKey, sig.slice(0, -4)], [id.publicKey, `${sig}\n`], [id.publicKey, 'x'.repeat(88)]]) {
    assert.equal(verifySignature(key as string, 'data', s as string), false, `${key} ${s}`);
  }
}));

test('sha256Hex hashes strings as UTF-8 and buffers as bytes', () => {
  assert.equal(sha256Hex(''), 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855');
  assert.equal(sha256Hex('é'), sha256Hex(Buffer.from([0xc3, 0xa9])));
});

test('a signed request verifies once; any change to it, its replay or another key fails', () => withDir((dir) => {
  const id = loadOrCreateIdentity(join(dir, 'a.key'));
  const other = loadOrCreateIdentity(join(dir, 'b.key'));
  const body = '{"podCidr":"10.0.1.0/24"}';
  const headers = signRequest(id, { method: 'put', path: '/v1/nodes/edge-1?x=1', node: 'edge-1', body, now: NOW });
  assert.deepEqual(Object.keys(headers).sort(), Object.values(SIGNATURE_HEADERS).sort());
  assert.match(headers[SIGNATURE_HEADERS.nonce] as string, /^[0-9a-f]{32}$/);
  const guard = () => new ReplayGuard({ windowMs: 30_000, maxEntries: 100 });
  const verify = (over: { key?: string; headers?: Record<string, string | string[] | undefined>; method?: string; path?: string; body?: Buffer | string; now?: number } = {}, g = guard()) =>
    verifyRequest(over.key ?? id.publicKey, over.headers ?? headers, over.method ?? 'PUT', over.path ?? '/v1/nodes/edge-1?x=1', over.body ?? body, g, over.now ?? NOW + 1000);

  assert.deepEqual(verify(), { ok: true, node: 'edge-1' });
  assert.deepEqual(verify({ body: Buffer.from(body) }), { ok: true, node: 'edge-1' }, 'a Buffer body hashes as its string');
  const failures: [string, Parameters<typeof verify>[0], RegExp][] = [
    ['tampered body', { body: body.replace('1.0', '2.0') }, /bad signature/],
    ['tampered path', { path: '/v1/nodes/edge-1?x=2' }, /bad signature/],
    ['tampered method', { method: 'DELETE' }, /bad signature/],
    ['tampered time', { headers: { ...headers, [SIGNATURE_HEADERS.time]: String(NOW + 1) } }, /bad signature/],
    ['tampered node', { headers: { ...headers, [SIGNATURE_HEADERS.node]: 'edge-2' } }, /bad signature/],
    ['tampered nonce', { headers: { ...headers, [SIGNATURE_HEADERS.nonce]: '00'.repeat(16) } }, /bad signature/],
    ['another node key', { key: other.publicKey }, /bad signature/],
    ['missing signature', { headers: { ...headers, [SIGNATURE_HEADERS.signature]: undefined } }, /missing or repeated header x-atoll-signature/],
    ['repeated nonce header', { headers: { ...headers, [SIGNATURE_HEADERS.nonce]: ['a', 'b'] } }, /missing or repeated header x-atoll-nonce/],
    ['time not a number', { headers: { ...headers, [SIGNATURE_HEADERS.time]: '1e12' } }, /not milliseconds/],
    ['line break in the path', { path: '/v1/nodes\nedge-1' }, /malformed request/],
    ['stale', { now: NOW + 31_000 }, /too old.*check the node's clock/],
    ['from the future', { now: NOW - 31_000 }, /too far ahead/],
  ];
  for (const [name, over, reason] of failures) {
    const r = verify(over);
    assert.equal(r.ok, false, name);
    if (!r.ok) assert.match(r.reason, reason, name);
  }

  const g = guard();
  assert.equal(verify({}, g).ok, true);
  const replay = verify({}, g);
  assert.equal(replay.ok, false);
  if (!replay.ok) assert.match(replay.reason, /replayed/);
}));

test('a forged request does not use up the nonce of the real one', () => withDir((dir) => {
  const id = loadOrCreateIdentity(join(dir, 'a.key'));
  const headers = signRequest(id, { method: 'GET', path: '/v1/x', node: 'n', body: '', now: NOW, nonce: 'ab'.repeat(8) });
  const g = new ReplayGuard({ windowMs: 30_000, maxEntries: 100 });
  assert.equal(verifyRequest(id.publicKey, { ...headers, [SIGNATURE_HEADERS.signature]: 'A'.repeat(86) + '==' }, 'GET', '/v1/x', '', g, NOW).ok, false);
  assert.equal(g.size, 0);
  assert.deepEqual(verifyRequest(id.publicKey, headers, 'GET', '/v1/x', '', g, NOW), { ok: true, node: 'n' });
}));
