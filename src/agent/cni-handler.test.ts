import { test } from 'node:test';
import assert from 'node:assert/strict';
import { handleCni } from './cni-handler.ts';
import type { PodNetworkPort } from '../core/cni-spec/ports.ts';
import { atollError } from '../core/errors.ts';

const attachment = { hostIfName: 'atl000000000000', hostMac: '0e:00:00:00:00:01', ifName: 'eth0', mac: '0a:58:0a:00:00:02', sandbox: '/run/netns/p', mtu: 1450, address: '10.0.0.2/24', gateway: '10.0.0.1' };
const port = (over: Partial<PodNetworkPort> = {}): PodNetworkPort => ({
  add: async () => attachment, del: async () => {}, check: async () => {}, status: async () => {}, gc: async () => {}, ...over,
});
const env = { CNI_COMMAND: 'ADD', CNI_CONTAINERID: 'c', CNI_NETNS: '/run/netns/p', CNI_IFNAME: 'eth0', CNI_PATH: '/x' };
const conf = (v: string) => Buffer.from(JSON.stringify({ cniVersion: v, name: 'atoll', type: 'atoll-cni' }));

test('ADD answers in the version asked for', async () => {
  for (const v of ['0.3.1', '0.4.0', '1.0.0', '1.1.0']) {
    const res = await handleCni(env, conf(v), port());
    assert.equal(res.exitCode, 0);
    const out = JSON.parse(res.stdout);
    assert.equal(out.cniVersion, v);
    assert.equal(out.ips[0].address, '10.0.0.2/24');
    assert.equal(out.ips[0].version, v.startsWith('0.') ? '4' : undefined);
    assert.equal(out.interfaces[1].mtu, v === '1.1.0' ? 1450 : undefined);
    assert.equal(out.interfaces[1].sandbox, '/run/netns/p');
  }
});

test('VERSION needs no configuration', async () => {
  const res = await handleCni({ CNI_COMMAND: 'VERSION' }, Buffer.alloc(0), port());
  assert.deepEqual(JSON.parse(res.stdout).supportedVersions, ['0.3.1', '0.4.0', '1.0.0', '1.1.0']);
});

test('errors become one spec error object on stdout, in the request version', async () => {
  const res = await handleCni(env, conf('0.4.0'), port({ add: async () => { throw atollError('IPAM_EXHAUSTED', 'all gone', 'add a block'); } }));
  assert.equal(res.exitCode, 1);
  const out = JSON.parse(res.stdout);
  assert.deepEqual([out.cniVersion, out.code, out.msg], ['0.4.0', 999, 'all gone']);
  assert.match(out.details, /add a block/);
});

test('STATUS not ready is code 50; a crash inside is code 999, never a thrown error', async () => {
  const s = await handleCni({ CNI_COMMAND: 'STATUS' }, conf('1.1.0'), port({ status: async () => { throw atollError('AGENT_NOT_READY', 'starting'); } }));
  assert.equal(JSON.parse(s.stdout).code, 50);
  const c = await handleCni({ ...env, CNI_COMMAND: 'DEL' }, conf('1.0.0'), port({ del: async () => { throw new TypeError('boom'); } }));
  assert.equal(JSON.parse(c.stdout).code, 999);
});
