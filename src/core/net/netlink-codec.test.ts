import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  decodeAck, decodeDone, decodeGeneration, decodeLink, decodeMessages, decodeNeigh, decodeRoute, delLink, encodeBatch, encodeRequest, getLink, newAddr4, newDefaultRoute4, newVeth, NLMSG_ERROR,
  type NlRequest, parseMac, setBridgePortHairpin, setMaster, setUp,
} from './netlink-codec.ts';
import { parseIpv4 } from './ipv4.ts';

const SEQ = 0x6b0254ee;
const hex = (b: Uint8Array) => Buffer.from(b).toString('hex');
const bytes = (h: string) => new Uint8Array(Buffer.from(h.replace(/\s+/g, ''), 'hex'));
const ip = (t: string) => parseIpv4(t) as number;

// Golden bytes: what iproute2 6.x sends for the same command, captured with `strace -e trace=sendmsg -e write=3`
// (same sequence number; the veth's namespace descriptor was 4, the bridge ifindex 2, the host veth ifindex 3).
const cases: { name: string; req: NlRequest; iproute2: string }[] = [
  {
    name: 'ip link add atl000000000001 mtu 1450 address 0e:01:02:03:04:05 master <#2> type veth peer name eth0 mtu 1450 address 0a:58:0a:f4:01:07 netns <fd 4>',
    req: newVeth({ name: 'atl000000000001', mac: '0e:01:02:03:04:05', mtu: 1450, masterIndex: 2, peer: { name: 'eth0', mac: '0a:58:0a:f4:01:07', mtu: 1450, netnsFd: 4, netnsPath: '/run/netns/p' } }),
    iproute2: `9c00000010000506ee54026b00000000 00000000000000000000000000000000 08000400aa050000 0a0001000e0102030405 0000 08000a0002000000
      1400030061746c30303030303030303030303100 4c001200 0800010076657468 40000200 3c000100 00000000000000000000000000000000
      08000400aa050000 0a0001000a580af40107 0000 08001c0004000000 090003006574683000 000000`,
  },
  {
    name: 'ip link set dev <#3> type bridge_slave hairpin on',
    req: setBridgePortHairpin({ index: 3 }),
    iproute2: '4000000010000500ee54026b00000000 00000000030000000000000000000000 20001200 100001006272696467655f736c617665 0c000500 050004000100 0000',
  },
  { name: 'ip link set dev <#3> up', req: setUp({ index: 3 }), iproute2: '2000000010000500ee54026b00000000 00000000030000000100000001000000' },
  {
    name: 'ip addr add 10.244.1.7/24 dev <#2>',
    req: newAddr4({ index: 2, ip: ip('10.244.1.7'), prefixLen: 24, ifName: 'eth0' }),
    iproute2: '2800000014000506ee54026b00000000 0218000002000000 080002000af40107 080001000af40107',
  },
  {
    name: 'ip route add default via 10.244.1.1 dev <#2>',
    req: newDefaultRoute4({ gateway: ip('10.244.1.1'), oif: 2, ifName: 'eth0' }),
    iproute2: '2c00000018000506ee54026b00000000 02000000fe030001 00000000 080005000af40101 0800040002000000',
  },
  { name: 'ip link del dev <#3>', req: delLink({ index: 3 }), iproute2: '2000000011000500ee54026b00000000 00000000030000000000000000000000' },
];

for (const c of cases) {
  test(`netlink request matches iproute2 byte for byte: ${c.name}`, () => {
    assert.equal(hex(encodeRequest(c.req, SEQ)), hex(bytes(c.iproute2)));
  });
}

test('links named rather than numbered carry IFLA_IFNAME and a zero index (golden)', () => {
  assert.equal(hex(encodeRequest(delLink({ name: 'atl0' }), 7)),
    '2c00000011000500070000000000000000000000000000000000000000000000' + '0900030061746c3000000000');
  assert.equal(hex(encodeRequest(setMaster({ name: 'x' }, 2), 1)),
    '30000000100005000100000000000000000000000000000000000000000000000600030078000000' + '08000a0002000000');
  // getLink asks for no statistics (IFLA_EXT_MASK = RTEXT_FILTER_VF | RTEXT_FILTER_SKIP_STATS), as iproute2 does.
  assert.equal(hex(encodeRequest(getLink({ name: 'br0' }), 1)),
    '30000000120001000100000000000000000000000000000000000000000000000800' + '1d0009000000' + '08000300627230' + '00');
});

test('a batch is the requests back to back with consecutive sequence numbers', () => {
  const reqs = [setUp({ index: 3 }), delLink({ index: 3 })];
  const b = encodeBatch(reqs, 41);
  assert.equal(b.length, 64);
  assert.deepEqual(decodeMessages(b).map((m) => [m.type, m.seq, m.payload.length]), [[16, 41, 16], [17, 42, 16]]);
});

test('labels name links numbered by index in errors, without renaming them', () => {
  const r = setUp({ index: 5, label: 'eth0' });
  assert.equal(r.what, 'setting link eth0 up');
  assert.equal(encodeRequest(r, 1).length, 32);
});

test('a veth request names both ends and the namespace', () => {
  const r = newVeth({ name: 'atl1', mac: '0e:00:00:00:00:01', mtu: 1500, peer: { name: 'eth0', mac: '0a:58:00:00:00:01', mtu: 1500, netnsFd: 9, netnsPath: '/run/netns/pod' } });
  assert.equal(r.what, 'creating veth atl1 (peer eth0 in /run/netns/pod)');
});

test('kernel answers decode: acks and errors, with and without the echoed request and extended-ack text (golden)', () => {
  // Captured with `strace -e read=3` from iproute2 (which sets NETLINK_EXT_ACK but not NETLINK_CAP_ACK):
  // `ip route add default via 10.9.9.9 dev brx` refused with ENETUNREACH and a message, the whole request echoed.
  const unreachable = bytes(`60000000 0200 0002 1255026b eb430000 9bffffff 2c000000 1800 0506 1255026b 00000000
    02000000 fe030001 00000000 08000500 0a090909 08000400 02000000
    20000100 4e657874686f702068617320696e76616c6964206761746577617900`);
  // `ip link add brx type bridge` when brx exists: EEXIST, no text.
  const exists = bytes(`4c000000 0200 0000 0e55026b 9f430000 efffffff 38000000 1000 0506 0e55026b 00000000
    00000000 00000000 00000000 00000000 08000300 62727800 10001200 0a000100 62726964676500 00`);
  // `ip link set dev brx up`: a plain ack, capped to the request's header.
  const ack = bytes('24000000 0200 0001 0e55026b a8430000 00000000 20000000 1000 0500 0e55026b 00000000');
  const msgs = decodeMessages(new Uint8Array([...unreachable, ...exists, ...ack]));
  assert.deepEqual(msgs.map((m) => m.type), [NLMSG_ERROR, NLMSG_ERROR, NLMSG_ERROR]);
  assert.deepEqual(decodeAck(msgs[0]!), { errno: 101, seq: 0x6b025512, message: 'Nexthop has invalid gateway' });
  assert.deepEqual(decodeAck(msgs[1]!), { errno: 17, seq: 0x6b02550e });
  assert.deepEqual(decodeAck(msgs[2]!), { errno: 0, seq: 0x6b02550e });
});

test('an ack that echoes the whole request (no NETLINK_CAP_ACK) still finds its TLVs', () => {
  const req = encodeRequest(setUp({ index: 3 }), 9);
  const tlv = bytes('0800 0100 686900 00');
  const len = 16 + 4 + req.length + tlv.length;
  const head = new Uint8Array(20);
  const v = new DataView(head.buffer);
  v.setUint32(0, len, true);
  v.setUint16(4, NLMSG_ERROR, true);
  v.setUint16(6, 0x200, true);
  v.setInt32(16, -22, true);
  const [m] = decodeMessages(new Uint8Array([...head, ...req, ...tlv]));
  assert.deepEqual(decodeAck(m!), { errno: 22, seq: 9, message: 'hi' });
});

test('a truncated datagram is refused', () => {
  assert.throws(() => decodeMessages(bytes('ff000000 1000 0000 01000000 00000000')), /claims 255 bytes/);
});

test('link answers decode: index, flags, name, MTU, MAC, master, peer index and kind', () => {
  const payload = bytes(`00000100 05000000 43100100 00000000
    1400 0300 61746c30303030303030303030303100 0800 0400 aa050000 0a00 0100 0e0102030405 0000
    0800 0a00 02000000 0800 0500 02000000 1000 1200 0800 0100 76657468 0400 0200`);
  const head = new Uint8Array(16);
  new DataView(head.buffer).setUint32(0, 16 + payload.length, true);
  head[4] = 16;
  const [m] = decodeMessages(new Uint8Array([...head, ...payload]));
  assert.deepEqual(decodeLink(m!), { family: 0, index: 5, flags: 0x11043, name: 'atl000000000001', mtu: 1450, mac: '0e:01:02:03:04:05', master: 2, link: 2, kind: 'veth' });
});

test('MAC addresses and names are checked before they reach the kernel', () => {
  assert.throws(() => parseMac('0e:01:02:03:04'), /not a MAC address/);
  assert.throws(() => encodeRequest(delLink({ name: 'é' }), 1), /printable ASCII/);
});

/** A message of `type` with `payload`, as decodeMessages returns it. */
function message(type: number, payload: Uint8Array, flags = 0): ReturnType<typeof decodeMessages>[number] {
  const head = new Uint8Array(16);
  const v = new DataView(head.buffer);
  v.setUint32(0, 16 + payload.length, true);
  v.setUint16(4, type, true);
  v.setUint16(6, flags, true);
  return decodeMessages(new Uint8Array([...head, ...payload]))[0]!;
}

test('route answers decode: the default route has no RTA_DST, RTA_TABLE overrides rtm_table, onlink from rtm_flags', () => {
  // rtmsg: AF_INET, dst_len 0, src_len 0, tos 0, table 254, protocol 44, scope 0, type 1, flags RTNH_F_ONLINK
  const def = decodeRoute(message(24, bytes('02000000 fe2c0001 04000000 0800 0500 0a4c0301 0800 0400 03000000')));
  assert.deepEqual(def, { family: 2, dst: '0.0.0.0/0', gateway: '10.76.3.1', oif: 3, table: 254, protocol: 44, scope: 0, type: 1, onlink: true });
  const t1000 = decodeRoute(message(24, bytes('02180000 fc2c0001 00000000 0800 0f00 e8030000 0800 0100 0a4c0500')));
  assert.deepEqual(t1000, { family: 2, dst: '10.76.5.0/24', table: 1000, protocol: 44, scope: 0, type: 1, onlink: false });
});

test('a dump\'s end carries its outcome, and the nftables generation is read in network order', () => {
  assert.equal(decodeDone(message(3, bytes('00000000'))), 0);
  assert.equal(decodeDone(message(3, bytes('f0ffffff'))), 16); // -EBUSY
  assert.equal(decodeGeneration(message(0x0a0f, bytes('00000000 0800 0100 00000102'))), 258);
  assert.throws(() => decodeGeneration(message(0x0a10, bytes('00000000'))), /expected an nftables generation message/);
  assert.throws(() => decodeNeigh(message(28, bytes('07000000'))), /too short/);
});
