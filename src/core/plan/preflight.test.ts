import { test } from 'node:test';
import assert from 'node:assert/strict';
import { preflight, type PreflightInput } from './preflight.ts';
import { parseCidr, type Cidr } from '../net/ipv4.ts';

const base: PreflightInput = {
  confFiles: ['10-atoll.conflist'], confDir: '/etc/cni/net.d', ourConf: '10-atoll.conflist',
  podBlocks: [parseCidr('10.244.1.0/24') as Cidr], bridgeName: 'atoll0',
  hostAddresses: [{ ifname: 'eth0', cidr: '192.168.1.10/24' }], hostRoutes: [{ dst: 'default' }, { dst: '192.168.1.0/24', dev: 'eth0' }],
};

test('a clean node passes', () => {
  assert.deepEqual(preflight(base), []);
});

const cases: [string, Partial<PreflightInput>, string, RegExp][] = [
  ['a conf that sorts first', { confFiles: ['05-flannel.conflist', '10-atoll.conflist', '99-loopback.conf'] }, 'PREFLIGHT_CNI_CONF_ORDER', /05-flannel/],
  ['an overlapping host address', { hostAddresses: [{ ifname: 'eth1', cidr: '10.244.1.77/16' }] }, 'PREFLIGHT_RANGE_OVERLAP', /eth1/],
  ['an overlapping route', { hostRoutes: [{ dst: '10.244.0.0/16', dev: 'tun0' }] }, 'PREFLIGHT_RANGE_OVERLAP', /tun0/],
  ['a bridge name taken by a veth', { bridge: { kind: 'veth', addresses: [] } }, 'PREFLIGHT_FOREIGN_DEVICE', /not a bridge/],
  ['a bridge with a foreign address', { bridge: { kind: 'bridge', addresses: ['172.17.0.1/16'] } }, 'PREFLIGHT_FOREIGN_DEVICE', /172.17.0.1/],
];

for (const [name, over, code, msg] of cases) {
  test(`refuses ${name}`, () => {
    const problems = preflight({ ...base, ...over });
    assert.equal(problems.length, 1);
    assert.equal(problems[0]?.code, code);
    assert.match(problems[0]?.message ?? '', msg);
    assert.ok(problems[0]?.fix);
  });
}

test('our own bridge and its routes are not a conflict', () => {
  const p = preflight({ ...base, bridge: { kind: 'bridge', addresses: ['10.244.1.1/24'] }, hostAddresses: [{ ifname: 'atoll0', cidr: '10.244.1.1/24' }], hostRoutes: [{ dst: '10.244.1.0/24', dev: 'atoll0' }] });
  assert.deepEqual(p, []);
});

test("the overlay's own addresses and routes are not a conflict", () => {
  const p = preflight({ ...base, ownDevices: ['atoll.1'], hostAddresses: [{ ifname: 'atoll.1', cidr: '10.244.1.0/32' }],
    hostRoutes: [{ dst: '10.244.1.0/24', dev: 'atoll.1' }, { dst: '10.244.1.0/26', dev: 'eth0', protocol: '44' }] });
  assert.deepEqual(p, []);
});
