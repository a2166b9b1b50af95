import { test } from 'node:test';
import assert from 'node:assert/strict';
import { hostVethName, isHostVethName, macForIp, planPod } from './pod-plan.ts';
import { parseCidr, parseIpv4, type Cidr } from '../net/ipv4.ts';

test('the pod plan renders the expected ip -batch lines (golden)', () => {
  const plan = planPod({ containerId: 'abc', ifName: 'eth0', netns: '/var/run/netns/cni-1', ip: parseIpv4('10.244.1.7') as number, block: parseCidr('10.244.1.0/24') as Cidr, bridge: 'atoll0', mtu: 1450 });
  assert.deepEqual(plan.hostLines, [
    `link add ${plan.hostIfName} mtu 1450 address ${plan.hostMac} type veth peer name eth0 mtu 1450 address 0a:58:0a:f4:01:07 netns /var/run/netns/cni-1`,
    `link set dev ${plan.hostIfName} master atoll0`,
    `link set dev ${plan.hostIfName} type bridge_slave hairpin on`,
    `link set dev ${plan.hostIfName} up`,
  ]);
  assert.deepEqual(plan.podLines, ['addr add 10.244.1.7/24 dev eth0', 'link set dev eth0 up', 'route add default via 10.244.1.1 dev eth0']);
  assert.deepEqual(plan.podSysctls, [['net/ipv4/conf/eth0/arp_notify', '1']]);
});

test('host veth names are ours, stable, distinct and fit IFNAMSIZ', () => {
  const a = hostVethName('c1', 'eth0');
  assert.equal(a, hostVethName('c1', 'eth0'));
  assert.notEqual(a, hostVethName('c1', 'eth1'));
  assert.equal(a.length, 15);
  assert.ok(isHostVethName(a));
  assert.ok(!isHostVethName('atoll0'));
  const names = new Set(Array.from({ length: 5000 }, (_, i) => hostVethName(`container-${i}`, 'eth0')));
  assert.equal(names.size, 5000);
});

test('the pod MAC follows the IP, locally administered unicast', () => {
  const mac = macForIp(parseIpv4('10.0.0.2') as number);
  assert.equal(mac, '0a:58:0a:00:00:02');
  assert.equal(parseInt(mac.slice(0, 2), 16) & 3, 2);
});
