import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { AtollError } from '../errors.ts';
import { parseCidr, parseIpv4 } from '../net/ipv4.ts';
import { packetDestination, packetSource, PeerRoutes, VNET_HDR_LEN } from './routing.ts';

const cidr = (t: string) => parseCidr(t) ?? assert.fail(t);
const ip = (t: string) => parseIpv4(t) ?? assert.fail(t);

/** A virtio header then a minimal IPv4 header from `src` to `dst`. */
function packet(src: string, dst: string, version = 4): Uint8Array {
  const p = new Uint8Array(VNET_HDR_LEN + 20);
  p[VNET_HDR_LEN] = (version << 4) | 5;
  p.set(src.split('.').map(Number), VNET_HDR_LEN + 12);
  p.set(dst.split('.').map(Number), VNET_HDR_LEN + 16);
  return p;
}

describe('tunnel routing', () => {
  const routes = new PeerRoutes([
    { id: 'wide', blocks: [cidr('10.0.0.0/8')] },
    { id: 'b', blocks: [cidr('10.210.2.0/24'), cidr('10.210.9.0/26')] },
    { id: 'c', blocks: [cidr('10.210.9.64/26')] },
  ]);

  test('addresses of the packet sit after the 10-byte virtio header', () => {
    const p = packet('10.210.1.5', '10.210.2.7');
    assert.equal(packetSource(p), ip('10.210.1.5'));
    assert.equal(packetDestination(p), ip('10.210.2.7'));
    assert.equal(packetSource(packet('1.2.3.4', '5.6.7.8', 6)), undefined);
    assert.equal(packetDestination(new Uint8Array(VNET_HDR_LEN + 19)), undefined);
  });

  test('the longest prefix wins', () => {
    assert.equal(routes.lookup(ip('10.210.2.7')), 'b');
    assert.equal(routes.lookup(ip('10.210.9.63')), 'b');
    assert.equal(routes.lookup(ip('10.210.9.64')), 'c');
    assert.equal(routes.lookup(ip('10.1.2.3')), 'wide');
    assert.equal(routes.lookup(ip('192.168.1.1')), undefined);
  });

  test('a peer may send only from addresses it owns', () => {
    assert.equal(routes.acceptFrom('b', packet('10.210.2.7', '10.210.1.5')), true);
    assert.equal(routes.acceptFrom('b', packet('10.210.1.5', '10.210.1.6')), false, 'another block');
    assert.equal(routes.acceptFrom('wide', packet('10.210.2.7', '10.210.1.5')), false, 'a narrower block of another peer');
    assert.equal(routes.acceptFrom('nobody', packet('10.210.2.7', '10.210.1.5')), false, 'an unknown peer');
    assert.equal(routes.acceptFrom('b', packet('10.210.2.7', '10.210.1.5', 6)), false, 'not IPv4');
  });

  test('the same block for two peers is refused', () => {
    assert.throws(() => new PeerRoutes([{ id: 'x', blocks: [cidr('10.1.0.0/24')] }, { id: 'y', blocks: [cidr('10.1.0.0/24')] }]),
      (err: unknown) => err instanceof AtollError && err.code === 'ROUTE_BLOCK_CONFLICT' && /block 10\.1\.0\.0\/24 is claimed by both x and y/.test(err.message));
    assert.doesNotThrow(() => new PeerRoutes([{ id: 'x', blocks: [cidr('10.1.0.0/24'), cidr('10.1.0.0/24')] }]), 'one peer naming its block twice');
  });
});
