// Property-based tests of the controller's stream lines as agents and relays decode them: the watch stream
// (decodeWatchLine) and the policy stream (decodePolicyLine, which also reads the agent's kept view,
// <dataDir>/policy-view.json). harness/fuzz.ts says how to run them long.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { anyText, decodesOrRefuses, fuzzParams, mutatedJson, mutatedText } from '../../harness/fuzz.ts';
import type { NodeRecord } from '../core/cluster/model.ts';
import type { PolicyLine } from '../core/policy/scope.ts';
import { decodePolicyLine } from './policy-line.ts';
import { decodeWatchLine, type WatchLine } from './watch-line.ts';

const text = fc.string({ maxLength: 24 });
const name = fc.string({ minLength: 1, maxLength: 24 });
/**
 * Records whose keys are any text, now and then __proto__: zod drops that key on purpose (it would set the result's
 * prototype), so the round trips leave it out and a case of its own below says what happens to it.
 */
const labels = fc.dictionary(fc.oneof({ arbitrary: text, weight: 30 }, fc.constant('__proto__')), text, { maxKeys: 4, noNullPrototype: true });
const noProtoKey = (v: unknown) => !JSON.stringify(v).includes('"__proto__"');
const time = fc.integer({ min: 0, max: 2 ** 45 });
const revision = fc.nat();

const nodeRecord: fc.Arbitrary<NodeRecord> = fc.record({
  name, identity: text, site: text, community: text, addresses: fc.array(text, { maxLength: 3 }), observedAddress: text,
  vtepMac: text, tunnelKey: text, agentVersion: text, annotations: labels, blocks: fc.array(text, { maxLength: 3 }),
  registeredAt: time, updatedAt: time,
});
const watchLine: fc.Arbitrary<WatchLine> = fc.oneof(
  fc.record({ type: fc.constant('snapshot' as const), revision, nodes: fc.array(nodeRecord, { maxLength: 3 }) }),
  fc.record({ type: fc.constant('put' as const), node: nodeRecord, revision }),
  fc.record({ type: fc.constant('delete' as const), name, revision }),
  fc.record({ type: fc.constant('ping' as const) }),
);

const protocol = fc.constantFrom('TCP' as const, 'UDP' as const, 'SCTP' as const);
const portNumber = fc.integer({ min: 1, max: 65_535 });
const selector = fc.record({
  matchLabels: labels,
  matchExpressions: fc.array(fc.record({ key: text, operator: fc.constantFrom('In' as const, 'NotIn' as const, 'Exists' as const, 'DoesNotExist' as const), values: fc.array(text, { maxLength: 2 }) }), { maxLength: 2 }),
}, { requiredKeys: [] });
const port = fc.record({ protocol, port: fc.oneof(portNumber, fc.string({ minLength: 1, maxLength: 15 })), endPort: portNumber }, { requiredKeys: ['protocol'] });
const peer = fc.oneof(
  fc.record({ ipBlock: fc.record({ cidr: text, except: fc.array(text, { maxLength: 2 }) }) }),
  fc.record({ podSelector: selector, namespaceSelector: selector }, { requiredKeys: [] }),
);
const rule = fc.record({ peers: fc.array(peer, { maxLength: 2 }), ports: fc.array(port, { maxLength: 2 }) });
const policy = fc.record({
  namespace: name, name, podSelector: selector, policyTypes: fc.subarray(['Ingress', 'Egress'] as ('Ingress' | 'Egress')[]),
  ingress: fc.array(rule, { maxLength: 2 }), egress: fc.array(rule, { maxLength: 2 }),
});
const namespace = fc.record({ name, labels });
const pod = fc.record({ namespace: name, name, node: name, ip: text, labels, ports: fc.array(fc.record({ name: text, protocol, port: portNumber }), { maxLength: 2 }) });
const policyLine: fc.Arbitrary<PolicyLine> = fc.oneof(
  fc.record({ type: fc.constant('snapshot' as const), policies: fc.array(policy, { maxLength: 2 }), namespaces: fc.array(namespace, { maxLength: 2 }), pods: fc.array(pod, { maxLength: 2 }) }),
  fc.record({ type: fc.constant('put' as const), policy, namespace, pod }, { requiredKeys: ['type'] }),
  fc.record({ type: fc.constant('delete' as const), policy: name, namespace: name, pod: name }, { requiredKeys: ['type'] }),
  fc.record({ type: fc.constant('ping' as const) }),
);

/** Lines near real ones and far from them: any text, any JSON, a valid line with one field changed, edited bytes. */
/** `v` as JSON.parse gives it back: the expected result of a decoder that only checks (fast-check builds some objects
 * without a prototype). */
const plain = (v: unknown): unknown => JSON.parse(JSON.stringify(v));

const linesNear = (valid: fc.Arbitrary<unknown>) => fc.oneof(anyText, mutatedJson(valid).map((v) => JSON.stringify(v) ?? ''), mutatedText(valid.map((v) => JSON.stringify(v))));

test('any line: decodeWatchLine returns a watch line or refuses with CONTROLLER_WATCH_INVALID', () => {
  fc.assert(fc.property(linesNear(watchLine), (line) => {
    decodesOrRefuses(() => decodeWatchLine(line, 'https://c:6443'), ['CONTROLLER_WATCH_INVALID']);
  }), fuzzParams());
});

test('round trip: decodeWatchLine(JSON.stringify(x)) is x', () => {
  fc.assert(fc.property(watchLine.filter(noProtoKey), (line) => {
    assert.deepEqual(decodeWatchLine(JSON.stringify(line), 'https://c:6443'), plain(line));
  }), fuzzParams(200));
});

test('any line: decodePolicyLine returns a policy line or refuses with CONTROLLER_WATCH_INVALID', () => {
  fc.assert(fc.property(linesNear(policyLine), (line) => {
    decodesOrRefuses(() => decodePolicyLine(line, 'https://c:6443'), ['CONTROLLER_WATCH_INVALID']);
  }), fuzzParams());
});

test('round trip: decodePolicyLine(JSON.stringify(x)) is x', () => {
  fc.assert(fc.property(policyLine.filter(noProtoKey), (line) => {
    assert.deepEqual(decodePolicyLine(JSON.stringify(line), 'https://c:6443'), plain(line));
  }), fuzzParams(200));
});

test('a label or annotation named __proto__ is dropped, and sets no prototype', () => {
  const ns = decodePolicyLine('{"type":"put","namespace":{"name":"a","labels":{"__proto__":{"x":"1"},"k":"v"}}}', 'https://c:6443');
  assert.deepEqual(ns, { type: 'put', namespace: { name: 'a', labels: { k: 'v' } } });
  const labelsOut = ns.type === 'put' ? ns.namespace?.labels : undefined;
  assert.equal(Object.getPrototypeOf(labelsOut), Object.prototype);
});
