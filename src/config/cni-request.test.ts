import { test } from 'node:test';
import assert from 'node:assert/strict';
import { decodeCniArgs, decodeCniRequest, MAX_STDIN_BYTES, versionForErrors } from './cni-request.ts';
import { AtollError } from '../core/errors.ts';

const conf = (extra: Record<string, unknown> = {}, version = '1.0.0') => Buffer.from(JSON.stringify({ cniVersion: version, name: 'atoll', type: 'atoll-cni', ...extra }));
const env = (over: Record<string, string | undefined> = {}) => ({
  CNI_COMMAND: 'ADD', CNI_CONTAINERID: 'c1', CNI_NETNS: '/var/run/netns/x', CNI_IFNAME: 'eth0', CNI_PATH: '/opt/cni/bin', ...over,
});

function codeOf(fn: () => unknown): [string, number] {
  try {
    fn();
  } catch (e) {
    const err = e as AtollError;
    return [err.code, err.cniCode];
  }
  return ['none', 0];
}

test('bad input gets the spec code', () => {
  const cases: [string, () => unknown, number][] = [
    ['no CNI_COMMAND', () => decodeCniRequest(env({ CNI_COMMAND: undefined }), conf()), 4],
    ['unknown CNI_COMMAND', () => decodeCniRequest(env({ CNI_COMMAND: 'FROB' }), conf()), 4],
    ['no CNI_CONTAINERID', () => decodeCniRequest(env({ CNI_CONTAINERID: '' }), conf()), 4],
    ['bad CNI_CONTAINERID', () => decodeCniRequest(env({ CNI_CONTAINERID: '-x;rm' }), conf()), 4],
    ['no CNI_NETNS on ADD', () => decodeCniRequest(env({ CNI_NETNS: undefined }), conf()), 4],
    ['relative CNI_NETNS', () => decodeCniRequest(env({ CNI_NETNS: 'netns' }), conf()), 4],
    ['long CNI_IFNAME', () => decodeCniRequest(env({ CNI_IFNAME: 'a-very-long-ifname' }), conf()), 4],
    ['no CNI_PATH', () => decodeCniRequest(env({ CNI_PATH: undefined }), conf()), 4],
    ['unknown CNI_ARGS key', () => decodeCniRequest(env({ CNI_ARGS: 'FOO=1' }), conf()), 4],
    ['not JSON', () => decodeCniRequest(env(), Buffer.from('{nope')), 6],
    ['JSON array', () => decodeCniRequest(env(), Buffer.from('[]')), 6],
    ['oversized', () => decodeCniRequest(env(), Buffer.alloc(MAX_STDIN_BYTES + 1, 32)), 6],
    ['no cniVersion', () => decodeCniRequest(env(), Buffer.from('{"name":"atoll","type":"atoll-cni"}')), 7],
    ['unsupported version', () => decodeCniRequest(env(), conf({}, '9.9.9')), 1],
    ['CHECK in 0.3.1', () => decodeCniRequest(env({ CNI_COMMAND: 'CHECK' }), conf({}, '0.3.1')), 1],
    ['STATUS in 1.0.0', () => decodeCniRequest(env({ CNI_COMMAND: 'STATUS' }), conf({}, '1.0.0')), 1],
    ['unknown key', () => decodeCniRequest(env(), conf({ bridgee: 'x' })), 7],
    ['no name', () => decodeCniRequest(env(), Buffer.from('{"cniVersion":"1.0.0","type":"atoll-cni"}')), 7],
    ['CHECK without prevResult', () => decodeCniRequest(env({ CNI_COMMAND: 'CHECK' }), conf({}, '1.0.0')), 7],
    ['bad valid-attachments', () => decodeCniRequest(env({ CNI_COMMAND: 'GC' }), conf({ 'cni.dev/valid-attachments': [{ x: 1 }] }, '1.1.0')), 7],
  ];
  for (const [name, fn, code] of cases) assert.equal(codeOf(fn)[1], code, name);
});

test('CNI_IFNAME: 1 to 15 printable ASCII characters (bytes) other than space, / and :', () => {
  const ifName = (name: string) => decodeCniRequest(env({ CNI_IFNAME: name }), conf()).ifName;
  for (const ok of ['eth0', 'net1', 'a', 'x'.repeat(15), '!-.09;@~_Zz', 'eth0.100']) assert.equal(ifName(ok), ok);
  const bad = [
    'eth€', // 4 characters, 6 bytes: fine by length, but not ASCII
    'é'.repeat(15), // 15 characters, 30 bytes
    '\u{1F600}eth0', // a character of two UTF-16 units
    'x'.repeat(16), 'eth 0', 'eth/0', 'eth:0', 'eth\t0', 'eth\u007f', 'eth\u0000', '.', '..',
  ];
  for (const name of bad) {
    assert.deepEqual(codeOf(() => ifName(name)), ['CNI_ENV_INVALID', 4], JSON.stringify(name));
  }
  assert.throws(() => ifName('eth€'), (err: unknown) => err instanceof AtollError && /CNI_IFNAME "eth€" is not valid/.test(err.message) && err.fix === 'it must be an interface name of 1 to 15 printable ASCII characters other than space, / and :');
});

test('DEL accepts an empty CNI_NETNS; STATUS needs no CNI_PATH', () => {
  assert.equal(decodeCniRequest(env({ CNI_COMMAND: 'DEL', CNI_NETNS: '' }), conf()).netns, '');
  assert.equal(decodeCniRequest({ CNI_COMMAND: 'STATUS' }, conf({}, '1.1.0')).verb, 'STATUS');
});

test('CNI_ARGS in any order, IgnoreUnknown honoured', () => {
  const a = decodeCniArgs('K8S_POD_UID=u1;IgnoreUnknown=1;K8S_POD_NAME=web-0;X=y;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_NAMESPACE=default');
  assert.deepEqual(a, { namespace: 'default', name: 'web-0', uid: 'u1', infraContainerId: 'abc' });
  assert.throws(() => decodeCniArgs('K8S_POD_NAME=web-0'), /together/);
});

test('GC valid attachments match keys case-insensitively', () => {
  const r = decodeCniRequest({ CNI_COMMAND: 'GC', CNI_PATH: '/x' }, conf({ 'cni.dev/valid-attachments': [{ containerID: 'a', ifname: 'eth0' }, { ContainerId: 'b', IfName: 'net1' }] }, '1.1.0'));
  assert.deepEqual(r.validAttachments, [{ containerId: 'a', ifName: 'eth0' }, { containerId: 'b', ifName: 'net1' }]);
});

test('every supported version decodes, with prevResult and runtimeConfig', () => {
  for (const v of ['0.3.1', '0.4.0', '1.0.0', '1.1.0']) {
    const r = decodeCniRequest(env(), conf({ prevResult: { ips: [] }, runtimeConfig: { PortMappings: [] } }, v));
    assert.equal(r.cniVersion, v);
  }
});

test('errors answer in the version of the input, even a cut-off one', () => {
  assert.equal(versionForErrors(Buffer.from('{"cniVersion":"0.4.0","name":"x"')), '0.4.0');
  assert.equal(versionForErrors(Buffer.from('{"cniVersion": "1.0.0", "pad": "' + 'x'.repeat(MAX_STDIN_BYTES))), '1.0.0');
  assert.equal(versionForErrors(Buffer.from('garbage')), '1.1.0');
});
