// Property-based tests of the atoll-cni frame as the agent decodes it (harness/fuzz.ts says how to run them long).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { anyBytes, decodesOrRefuses, fuzzParams, mutatedBytes, wellFormed } from '../../../harness/fuzz.ts';
import { type CniInvocation, decodeRequest, encodeRequest, MAX_ENV_BYTES } from './shim-protocol.ts';

const MAX_STDIN = 4096;

/** An environment the shim can send: keys without `=` or NUL, values without NUL. */
const envKey = fc.string({ unit: 'binary', minLength: 1, maxLength: 24 }).filter((k) => !/[=\0]/.test(k));
const invocation: fc.Arbitrary<CniInvocation> = fc.record({
  env: fc.dictionary(envKey, fc.string({ unit: 'binary', maxLength: 64 }).filter((v) => !v.includes('\0')), { maxKeys: 8, noNullPrototype: true }),
  stdin: fc.uint8Array({ maxLength: MAX_STDIN + 1 }).map((b) => Buffer.from(b)),
});
/** UTF-8 round-trips only well-formed UTF-16: lone surrogates become U+FFFD on the way, as they do in the shim's C. */
const envWellFormed = (inv: CniInvocation) => Object.entries(inv.env).every(([k, v]) => wellFormed(k) && wellFormed(v));

test('any bytes: decodeRequest returns a request, asks for more, or refuses with CNI_FRAME_INVALID', () => {
  const frame = fc.oneof(anyBytes(), fc.uint8Array({ maxLength: 64 }).map((b) => Buffer.concat([Buffer.from('ATL1'), b])), mutatedBytes(invocation.map(encodeRequest)));
  fc.assert(fc.property(frame, (b) => {
    decodesOrRefuses(() => decodeRequest(Buffer.from(b), MAX_STDIN), ['CNI_FRAME_INVALID']);
  }), fuzzParams());
});

test('round trip: decodeRequest(encodeRequest(x)) is x, and every proper prefix asks for more', () => {
  fc.assert(fc.property(invocation.filter(envWellFormed), fc.nat(), (inv, cut) => {
    const bytes = encodeRequest(inv);
    fc.pre(bytes.length - 12 - inv.stdin.length <= MAX_ENV_BYTES);
    const back = decodeRequest(bytes, MAX_STDIN);
    assert.deepEqual(back && { env: { ...back.env }, stdin: Buffer.from(back.stdin) }, { env: { ...inv.env }, stdin: inv.stdin });
    assert.equal(decodeRequest(bytes.subarray(0, cut % bytes.length), MAX_STDIN), undefined);
  }), fuzzParams(200));
});

test('regression (found by the round trip): a variable named __proto__ is kept as the others are', () => {
  const env = Object.fromEntries([['__proto__', 'x'], ['CNI_COMMAND', 'ADD']]) as Record<string, string>;
  const back = decodeRequest(encodeRequest({ env, stdin: Buffer.alloc(0) }), MAX_STDIN);
  assert.deepEqual(Object.entries(back?.env ?? {}), [['__proto__', 'x'], ['CNI_COMMAND', 'ADD']]);
  assert.equal(Object.getPrototypeOf(back?.env), Object.prototype);
});
