import { test } from 'node:test';
import assert from 'node:assert/strict';
import { hostRequests, hostVethName, isHostVethName, macForIp, planPod, podRequests } from './pod-plan.ts';
import { type Cidr, formatIpv4, parseCidr, parseIpv4 } from '../net/ipv4.ts';
import { encodeBatch } from '../net/netlink-codec.ts';

const input = { containerId: 'abc', ifName: 'eth0', netns: '/var/run/netns/cni-1', ip: parseIpv4('10.244.1.7') as number, block: parseCidr('10.244.1.0/24') as Cidr, bridge: 'atoll0', mtu: 1450 };

test('the pod plan: names, MACs, address, route and the same steps as ip commands (golden)', () => {
  const plan = planPod(input);
  assert.equal(plan.hostIfName, 'atl2d0e111d5844');
  assert.equal(plan.hostMac, '0e:2b:86:b6:d9:29');
  assert.deepEqual(plan.veth, {
    host: { name: 'atl2d0e111d5844', mac: '0e:2b:86:b6:d9:29', mtu: 1450 },
    pod: { name: 'eth0', mac: '0a:58:0a:f4:01:07', mtu: 1450 },
    bridge: 'atoll0',
    netns: '/var/run/netns/cni-1',
  });
  assert.deepEqual([plan.address, plan.gateway, plan.podAddress, formatIpv4(plan.podGateway)], ['10.244.1.7/24', '10.244.1.1', { ip: input.ip, prefixLen: 24 }, '10.244.1.1']);
  assert.deepEqual(plan.hostLines, [
    'link add atl2d0e111d5844 mtu 1450 address 0e:2b:86:b6:d9:29 master atoll0 type veth peer name eth0 mtu 1450 address 0a:58:0a:f4:01:07 netns /var/run/netns/cni-1',
    'link set dev atl2d0e111d5844 type bridge_slave hairpin on',
    'link set dev atl2d0e111d5844 up',
  ]);
  assert.deepEqual(plan.podLines, ['addr add 10.244.1.7/24 dev eth0', 'link set dev eth0 up', 'route add default via 10.244.1.1 dev eth0']);
  assert.deepEqual(plan.podSysctls, [['net/ipv4/conf/eth0/arp_notify', '1']]);
});

// The batches as the kernel receives them (sequence numbers from 1). The veth request is laid out exactly as
// iproute2 lays out the first host line (netlink-codec.test.ts checks that against bytes captured from `ip`).
test('the host-side netlink batch: veth with master, hairpin, up, read back (golden bytes)', () => {
  const reqs = hostRequests(planPod(input), { bridgeIndex: 2, podNetnsFd: 4 });
  assert.deepEqual(reqs.map((r) => r.what), [
    'creating veth atl2d0e111d5844 (peer eth0 in /var/run/netns/cni-1)',
    'setting hairpin on on bridge port atl2d0e111d5844',
    'setting link atl2d0e111d5844 up',
    'reading link atl2d0e111d5844',
  ]);
  const golden = [
    // RTM_NEWLINK create|excl|ack: MTU, ADDRESS, MASTER=2, IFNAME, LINKINFO{KIND veth, DATA{PEER{ifinfomsg, MTU, ADDRESS, NET_NS_FD=4, IFNAME eth0}}}
    '9c000000100005060100000000000000 00000000000000000000000000000000 08000400aa050000 0a0001000e2b86b6d9290000 08000a0002000000',
    '1400030061746c32643065313131643538343400 4c001200 0800010076657468 40000200 3c000100 00000000000000000000000000000000',
    '08000400aa050000 0a0001000a580af401070000 08001c0004000000 090003006574683000000000',
    // RTM_NEWLINK by name: LINKINFO{KIND bridge_slave, SLAVE_DATA{BRPORT_MODE=1}}
    '54000000100005000200000000000000 00000000000000000000000000000000 1400030061746c32643065313131643538343400',
    '20001200 100001006272696467655f736c617665 0c000500 0500040001000000',
    // RTM_NEWLINK by name, flags = change = IFF_UP
    '34000000100005000300000000000000 00000000000000000100000001000000 1400030061746c32643065313131643538343400',
    // RTM_GETLINK by name, EXT_MASK = VF | SKIP_STATS
    '3c000000120001000400000000000000 00000000000000000000000000000000 08001d0009000000 1400030061746c32643065313131643538343400',
  ].join('').replace(/\s+/g, '');
  assert.equal(Buffer.from(encodeBatch(reqs, 1)).toString('hex'), golden);
});

test('the pod-side netlink batch: address, up, default route on the pod ifindex (golden bytes)', () => {
  const reqs = podRequests(planPod(input), 2);
  assert.deepEqual(reqs.map((r) => r.what), ['adding address 10.244.1.7/24 to eth0', 'setting link eth0 up', 'adding default route via 10.244.1.1 dev eth0']);
  const golden = [
    '28000000140005060100000000000000 0218000002000000 080002000af40107 080001000af40107', // RTM_NEWADDR 10.244.1.7/24 on #2
    '20000000100005000200000000000000 00000000020000000100000001000000', // RTM_NEWLINK #2 up
    '2c000000180005060300000000000000 02000000fe030001 00000000 080005000af40101 0800040002000000', // RTM_NEWROUTE default via 10.244.1.1 oif #2
  ].join('').replace(/\s+/g, '');
  assert.equal(Buffer.from(encodeBatch(reqs, 1)).toString('hex'), golden);
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
