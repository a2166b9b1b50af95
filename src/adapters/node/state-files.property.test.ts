// Property-based tests of the state files the agent reads back from its data directory: cluster-state.json, vtep.json,
// tunnel-udp.json (the datagram path's state), the node key (PEM), and the kept region's endpoints (parseEndpoint).
// The IPAM records have their own (src/core/ipam/record-codec.property.test.ts), the kept policy view is a policy line
// (src/config/stream-lines.property.test.ts). harness/fuzz.ts says how to run them long.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { generateKeyPairSync } from 'node:crypto';
import fc from 'fast-check';
import { anyText, decodesOrRefuses, fuzzParams, mutatedJson, mutatedText } from '../../../harness/fuzz.ts';
import { decodeDatagramState, type DatagramLocalState, encodeDatagramState } from '../tunnel/datagram-state-file.ts';
import { parseEndpoint } from '../tunnel/datagram-peer-state.ts';
import { type ClusterState, decodeClusterState, encodeClusterState } from './cluster-state-file.ts';
import { identityFromPem, verifySignature } from './node-identity.ts';
import { decodeVtepState, encodeVtepState } from './vtep-state.ts';

const plain = (v: unknown): unknown => JSON.parse(JSON.stringify(v));
/** Texts near the files' own: any text, the valid JSON with one part changed, the valid text with bytes edited or cut. */
const textsNear = <T>(valid: fc.Arbitrary<T>, encode: (v: T) => string) =>
  fc.oneof(anyText, mutatedJson(valid).map((v) => JSON.stringify(v) ?? ''), mutatedText(valid.map(encode)));

const text = fc.string({ maxLength: 16 });
const clusterState: fc.Arbitrary<ClusterState> = fc.record({
  blocks: fc.array(fc.constantFrom('10.244.1.0/26', '10.244.1.64/26'), { maxLength: 2 }),
  revision: fc.nat(),
  peers: fc.array(fc.record({
    name: text, identity: text, site: text, community: text, addresses: fc.array(text, { maxLength: 2 }), observedAddress: text, vtepMac: text,
    tunnelKey: text, agentVersion: text, annotations: fc.dictionary(text, text, { maxKeys: 2, noNullPrototype: true }), blocks: fc.array(text, { maxLength: 2 }),
    registeredAt: fc.nat(), updatedAt: fc.nat(),
  }), { maxLength: 2 }),
});

test('any text: the cluster state decodes or is refused with CONFIG_FILE_INVALID; round trip', () => {
  fc.assert(fc.property(textsNear(clusterState, encodeClusterState), (t) => {
    decodesOrRefuses(() => decodeClusterState(t, '/var/lib/atoll/cluster-state.json'), ['CONFIG_FILE_INVALID']);
  }), fuzzParams());
  fc.assert(fc.property(clusterState, (s) => {
    assert.deepEqual(decodeClusterState(encodeClusterState(s), 'x'), plain(s));
  }), fuzzParams(200));
});

const mac = fc.uint8Array({ minLength: 6, maxLength: 6 }).map((b) => [...b].map((x) => x.toString(16).padStart(2, '0')).join(':'));

test('any text: the VTEP state decodes or is refused with CONFIG_FILE_INVALID; round trip', () => {
  fc.assert(fc.property(textsNear(mac, encodeVtepState), (t) => {
    decodesOrRefuses(() => decodeVtepState(t, '/var/lib/atoll/vtep.json'), ['CONFIG_FILE_INVALID']);
  }), fuzzParams());
  fc.assert(fc.property(mac, (m) => assert.equal(decodeVtepState(encodeVtepState(m), 'x'), m)), fuzzParams(200));
});

const datagramState: fc.Arbitrary<DatagramLocalState> = fc.record({
  port: fc.integer({ min: 0, max: 65_535 }),
  generation: fc.integer({ min: 0, max: 2 ** 52 - 1 }),
  peers: fc.dictionary(text, fc.record({ pin: text, endpoint: text, seenGeneration: fc.nat() }, { requiredKeys: ['pin'] }), { maxKeys: 3, noNullPrototype: true }),
});

test('any text: the datagram state (tunnel-udp.json) decodes or is refused with CONFIG_FILE_INVALID; round trip', () => {
  fc.assert(fc.property(textsNear(datagramState, encodeDatagramState), (t) => {
    decodesOrRefuses(() => decodeDatagramState(t, '/var/lib/atoll/tunnel-udp.json'), ['CONFIG_FILE_INVALID']);
  }), fuzzParams());
  fc.assert(fc.property(datagramState, (s) => {
    fc.pre(!Object.keys(s.peers).includes('__proto__'));
    assert.deepEqual(decodeDatagramState(encodeDatagramState(s), 'x'), plain(s));
  }), fuzzParams(200));
});

test('any text: a kept endpoint parses as host:port or not at all', () => {
  fc.assert(fc.property(fc.oneof(anyText, mutatedText(fc.tuple(fc.ipV4(), fc.integer({ min: 0, max: 65_535 })).map(([h, p]) => `${h}:${p}`))), (t) => {
    decodesOrRefuses(() => parseEndpoint(t), []);
  }), fuzzParams());
  fc.assert(fc.property(fc.ipV4(), fc.integer({ min: 0, max: 65_535 }), (host, port) => {
    assert.deepEqual([parseEndpoint(`${host}:${port}`)?.host, parseEndpoint(`${host}:${port}`)?.port], [host, port]);
  }), fuzzParams(100));
});

test('any text: the node key gives an identity or is refused with NODE_IDENTITY_INVALID; a real key round trips', () => {
  const pem = generateKeyPairSync('ed25519').privateKey.export({ type: 'pkcs8', format: 'pem' }) as string;
  const other = generateKeyPairSync('x25519').privateKey.export({ type: 'pkcs8', format: 'pem' }) as string;
  // fewer cases: each one asks OpenSSL to parse a key
  fc.assert(fc.property(fc.oneof(anyText, mutatedText(fc.constantFrom(pem, other))), (t) => {
    decodesOrRefuses(() => identityFromPem(t, '/var/lib/atoll/node.key'), ['NODE_IDENTITY_INVALID']);
  }), fuzzParams(150));
  const id = identityFromPem(pem, 'x');
  fc.assert(fc.property(fc.string(), (data) => assert.ok(verifySignature(id.publicKey, data, id.sign(data)))), fuzzParams(20));
});

test('regression (found by the property): a VTEP state file that is empty, cut short, null or holds a MAC in an array is refused with CONFIG_FILE_INVALID', () => {
  // before: SyntaxError and TypeError escaped uncoded, and ["aa:..."] passed the MAC pattern as a string
  for (const t of ['', '{"vtepMac":"0a:58:0a', 'null', '{"vtepMac":["0a:58:0a:f4:01:05"]}']) {
    assert.throws(() => decodeVtepState(t, '/var/lib/atoll/vtep.json'), { code: 'CONFIG_FILE_INVALID' }, t);
  }
});
