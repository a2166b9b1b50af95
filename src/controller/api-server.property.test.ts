// Property-based tests of what the controller's API decodes from a request: the JSON bodies of join, node update and
// usage report, the %-escaped path segment, and a node's signature headers (harness/fuzz.ts says how to run them long).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { anyBytes, anyText, decodesOrRefuses, fuzzParams, mutatedBytes, mutatedJson } from '../../harness/fuzz.ts';
import { joinRequestSchema, nodeFieldsSchema, usageReportSchema } from '../config/controller-config.ts';
import { verifyRequest } from '../adapters/node/node-identity.ts';
import { ReplayGuard } from '../core/cluster/signing.ts';
import { decodePathPart, parseJson } from './api-server.ts';

const label = fc.stringMatching(/^[a-z0-9]{0,8}$/);
const nodeFields = fc.record({
  site: label, community: label, addresses: fc.array(fc.ipV4(), { maxLength: 3 }), vtepMac: fc.constantFrom('', '0a:58:0a:f4:01:05'),
  tunnelKey: fc.constantFrom('', `sha256:${'ab'.repeat(32)}`), agentVersion: fc.string({ maxLength: 64 }),
  annotations: fc.dictionary(fc.stringMatching(/^[a-z]{1,8}$/), fc.string({ maxLength: 32 }), { maxKeys: 3, noNullPrototype: true }),
}, { noNullPrototype: true });
const join = fc.tuple(nodeFields, fc.stringMatching(/^[a-z0-9]{1,12}$/), fc.base64String({ maxLength: 64 }).filter((s) => s !== ''))
  .map(([f, name, identity]) => ({ ...f, token: 'bootstrap', name, identity }));
const usage = fc.record({ capacity: fc.nat(), allocated: fc.nat(), reserved: fc.nat(), free: fc.nat() }, { noNullPrototype: true });

type BodySchema = Parameters<typeof parseJson<unknown>>[0];
const SCHEMAS: readonly [string, BodySchema, fc.Arbitrary<unknown>][] = [['join', joinRequestSchema, join], ['node fields', nodeFieldsSchema, nodeFields], ['usage', usageReportSchema, usage]];
const utf8 = (v: unknown) => Buffer.from(JSON.stringify(v) ?? '');

for (const [what, schema, valid] of SCHEMAS) {
  test(`any body: the ${what} body decodes or is refused with API_BAD_REQUEST; round trip`, () => {
    const body = fc.oneof(anyBytes(), anyText.map((s) => Buffer.from(s)), mutatedJson(valid).map(utf8), mutatedBytes(valid.map(utf8)));
    fc.assert(fc.property(body, (b) => {
      decodesOrRefuses(() => parseJson(schema, Buffer.from(b)), ['API_BAD_REQUEST']);
    }), fuzzParams());
    fc.assert(fc.property(valid, (v) => assert.deepEqual(parseJson(schema, utf8(v)), v)), fuzzParams(150));
  });
}

test('any path segment: decodePathPart decodes it or refuses with API_BAD_REQUEST; encodeURIComponent round trips', () => {
  fc.assert(fc.property(fc.oneof(anyText, fc.string({ unit: fc.constantFrom('%', 'a', 'F', '0', 'e', '/') })), (s) => {
    decodesOrRefuses(() => decodePathPart(s), ['API_BAD_REQUEST']);
  }), fuzzParams());
  fc.assert(fc.property(fc.string({ unit: 'grapheme' }), (s) => assert.equal(decodePathPart(encodeURIComponent(s)), s)), fuzzParams(200));
});

test('any signature headers: verifyRequest answers ok or a reason, never throws', () => {
  const header = fc.option(fc.oneof(anyText, fc.array(fc.string(), { maxLength: 2 }), fc.stringMatching(/^\d{1,17}$/)), { nil: undefined });
  const headers = fc.record({ 'x-atoll-node': header, 'x-atoll-time': header, 'x-atoll-nonce': header, 'x-atoll-signature': header });
  fc.assert(fc.property(headers, anyText, anyText, anyText, (h, key, method, path) => {
    const r = decodesOrRefuses(() => verifyRequest(key, h, method, path, Buffer.alloc(0), new ReplayGuard({ windowMs: 300_000, maxEntries: 1000 }), 1_000_000), []);
    if (!(r instanceof Error)) assert.equal(r.ok, false);
  }), fuzzParams());
});
