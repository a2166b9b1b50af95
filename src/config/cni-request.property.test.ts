// Property-based tests of the CNI request decoding on the agent's side (harness/fuzz.ts says how to run them long).
import { test } from 'node:test';
import fc from 'fast-check';
import { anyText, decodesOrRefuses, fuzzParams, mutatedJson, mutatedText } from '../../harness/fuzz.ts';
import { CNI_VERBS } from '../core/cni-spec/model.ts';
import { decodeCniArgs, decodeCniRequest, decodeVerb, versionForErrors } from './cni-request.ts';

/** Every code decodeCniRequest documents (its checks in order: command, environment, configuration). */
const CNI_CODES = ['CNI_ENV_INVALID', 'CNI_INPUT_TOO_LARGE', 'CNI_DECODE', 'CNI_CONFIG_INVALID', 'CNI_VERSION_UNSUPPORTED', 'CNI_VERB_NOT_IN_VERSION'] as const;

/** Environments near a runtime's: each CNI_* variable valid, missing, or any text. */
const maybe = (valid: fc.Arbitrary<string>) => fc.oneof({ arbitrary: valid, weight: 8 }, fc.constant(undefined), anyText);
const env = fc.record({
  CNI_COMMAND: maybe(fc.constantFrom(...CNI_VERBS)),
  CNI_CONTAINERID: maybe(fc.stringMatching(/^[a-f0-9]{1,64}$/)),
  CNI_IFNAME: maybe(fc.constantFrom('eth0', 'net1')),
  CNI_NETNS: maybe(fc.constant('/var/run/netns/cni-1234')),
  CNI_PATH: maybe(fc.constant('/opt/cni/bin')),
  CNI_ARGS: maybe(fc.constantFrom('K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_UID=1', 'IgnoreUnknown=1;X=y', '')),
}, { requiredKeys: [] });
/** An environment that passes, so the configuration's checks are reached. */
const goodEnv = fc.record({
  CNI_COMMAND: fc.constantFrom(...CNI_VERBS), CNI_CONTAINERID: fc.constant('c0ffee'), CNI_IFNAME: fc.constant('eth0'),
  CNI_NETNS: fc.constant('/var/run/netns/cni-1234'), CNI_PATH: fc.constant('/opt/cni/bin'), CNI_ARGS: fc.constant('K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0'),
});

/** Network configurations as a runtime sends them, for ADD, CHECK and DEL. */
const netConf = fc.record({
  cniVersion: fc.constantFrom('0.3.1', '0.4.0', '1.0.0', '1.1.0'),
  name: fc.constant('atoll'),
  type: fc.constant('atoll'),
  agentSocket: fc.constant('/run/atoll/cni.sock'),
  args: fc.dictionary(fc.string(), fc.jsonValue({ maxDepth: 2 }), { maxKeys: 3, noNullPrototype: true }),
  prevResult: fc.record({
    ips: fc.array(fc.record({ address: fc.constant('10.244.1.5/24') }), { maxLength: 2 }),
    interfaces: fc.array(fc.record({ name: fc.constant('eth0'), mac: fc.constant('0a:58:0a:f4:01:05'), sandbox: fc.constant('/var/run/netns/x') }), { maxLength: 2 }),
  }),
  'cni.dev/valid-attachments': fc.array(fc.record({ containerID: fc.string(), ifname: fc.string() }), { maxLength: 2 }),
}, { requiredKeys: ['cniVersion', 'name', 'type'] });

const stdin = fc.oneof(
  anyText,
  { arbitrary: netConf.map((c) => JSON.stringify(c)), weight: 3 },
  mutatedJson(netConf).map((c) => JSON.stringify(c) ?? ''),
  mutatedText(netConf.map((c) => JSON.stringify(c))),
).map((s) => new TextEncoder().encode(s));

test('any environment and stdin: decodeCniRequest returns a request or refuses with a CNI code', () => {
  fc.assert(fc.property(fc.oneof(env, goodEnv), stdin, (e, s) => {
    decodesOrRefuses(() => decodeCniRequest(e, s), CNI_CODES);
    decodesOrRefuses(() => versionForErrors(s), []);
  }), fuzzParams(400));
});

test('any text: decodeVerb and decodeCniArgs return or refuse with CNI_ENV_INVALID', () => {
  const args = fc.oneof(anyText, fc.array(fc.tuple(fc.constantFrom('K8S_POD_NAMESPACE', 'K8S_POD_NAME', 'K8S_POD_UID', 'IgnoreUnknown', '', 'X'), anyText), { maxLength: 5 })
    .map((kv) => kv.map(([k, v]) => `${k}=${v}`).join(';')));
  fc.assert(fc.property(anyText, args, (verb, a) => {
    decodesOrRefuses(() => decodeVerb({ CNI_COMMAND: verb }), ['CNI_ENV_INVALID']);
    decodesOrRefuses(() => decodeCniArgs(a), ['CNI_ENV_INVALID']);
  }), fuzzParams());
});
