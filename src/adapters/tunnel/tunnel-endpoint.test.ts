/**
 * The endpoint's path choice and checks, with a stand-in TUN device and stand-in streams (plain event emitters with
 * the methods the endpoint calls): the kernel parts are tested in test/kernel/tunnel-datapath.test.ts and the lab.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { EventEmitter } from 'node:events';
import { parseCidr } from '../../core/net/ipv4.ts';
import { FRAME_HEADER } from '../../core/tunnel/frame.ts';
import { VNET_HDR_LEN } from '../../core/tunnel/routing.ts';
import type { TunDevice } from './tun.ts';
import type { TunnelStream } from './tunnel-stream.ts';
import { TunnelEndpoint } from './tunnel-endpoint.ts';

const cidr = (t: string) => parseCidr(t) ?? assert.fail(t);

/** A virtio header then a minimal IPv4 header from `src` to `dst`, with the headroom the TUN reader leaves. */
function packet(src: string, dst: string): Buffer {
  const p = Buffer.alloc(FRAME_HEADER + VNET_HDR_LEN + 20).subarray(FRAME_HEADER);
  p[VNET_HDR_LEN] = 0x45;
  p.set(src.split('.').map(Number), VNET_HDR_LEN + 12);
  p.set(dst.split('.').map(Number), VNET_HDR_LEN + 16);
  return p;
}

class FakeTun {
  onBatch: (b: Buffer[]) => void = () => {};
  readonly written: Uint8Array[] = [];
  readonly released: Uint8Array[] = [];
  start(onBatch: (b: Buffer[]) => void): void {
    this.onBatch = onBatch;
  }
  write(p: Uint8Array): boolean {
    this.written.push(p);
    return true;
  }
  release(p: Uint8Array): void {
    this.released.push(p);
  }
  pause(): void {}
  resume(): void {}
  close(): void {}
}

class FakeStream extends EventEmitter {
  readonly sent: number[] = [];
  /** The `sent` callbacks of queued batches, called by the test when the "write" completes. */
  readonly pending: (() => void)[] = [];
  alive = true;
  congested = false;
  sendAll(pkts: readonly Buffer[], sent: () => void): boolean {
    for (const p of pkts) this.sent.push(p[VNET_HDR_LEN + 19] as number);
    if (this.alive) this.pending.push(sent);
    return this.alive;
  }
  close(): void {
    this.alive = false;
    this.emit('close');
  }
}

test('tunnel endpoint: the direct stream first, else a circuit through the relay (the peer\'s first); all checked against the peer\'s blocks', () => {
  const tun = new FakeTun();
  const endpoint = new TunnelEndpoint(tun as unknown as TunDevice, [
    { id: 'cloud-1', blocks: [cidr('10.100.1.0/26')] },
    { id: 'b-1', blocks: [cidr('10.100.2.0/26')] },
  ]);
  endpoint.start();
  assert.equal(endpoint.pathOf('b-1'), 'down');
  const circuit = new FakeStream();
  endpoint.attach('b-1', circuit as unknown as TunnelStream, 'circuitIn');
  assert.equal(endpoint.pathOf('b-1'), 'relayed');
  assert.equal(endpoint.pathOf('cloud-1'), 'down');

  const first = [packet('10.100.0.2', '10.100.2.7'), packet('10.100.0.2', '10.100.1.8'), packet('10.100.0.2', '192.0.2.9'), packet('10.100.0.2', '10.100.2.8')];
  tun.onBatch(first);
  assert.deepEqual(circuit.sent, [7, 8]);
  assert.equal(circuit.pending.length, 1, 'a batch\'s packets for one stream go in one call');
  assert.deepEqual([endpoint.stats.droppedNoStream, endpoint.stats.droppedNoPeer], [1, 1]);
  assert.deepEqual(tun.released, [first[1], first[2]], 'dropped packets go back to the TUN device at once');
  circuit.pending.splice(0).forEach((sent) => sent());
  assert.deepEqual(tun.released, [first[1], first[2], first[0], first[3]], 'sent packets go back when their stream is done with them');

  const direct = new FakeStream();
  endpoint.attach('b-1', direct as unknown as TunnelStream);
  assert.equal(endpoint.pathOf('b-1'), 'direct');
  tun.onBatch([packet('10.100.0.2', '10.100.2.9')]);
  assert.deepEqual(direct.sent, [9], 'the direct stream wins once there is one');
  direct.close();
  assert.equal(endpoint.pathOf('b-1'), 'relayed', 'back to the circuit when it breaks');
  tun.onBatch([packet('10.100.0.2', '10.100.2.10')]);
  assert.deepEqual(circuit.sent, [7, 8, 10]);

  // from the circuit: only sources in b-1's blocks
  circuit.emit('frame', packet('10.100.2.5', '10.100.0.2'));
  circuit.emit('frame', packet('10.100.1.5', '10.100.0.2')); // cloud-1's address: spoofed
  assert.equal(tun.written.length, 1);
  assert.equal(endpoint.stats.droppedBadSource, 1);
  assert.deepEqual(endpoint.trafficOf('b-1'), { txPackets: 4, txBytes: 120, rxPackets: 1, rxBytes: 30 });

  const theirs = new FakeStream();
  endpoint.attach('b-1', theirs as unknown as TunnelStream, 'circuitOut');
  tun.onBatch([packet('10.100.0.2', '10.100.2.11')]);
  assert.deepEqual(theirs.sent, [11], 'the circuit the peer asked for carries what we send');
  const newer = new FakeStream();
  endpoint.attach('b-1', newer as unknown as TunnelStream, 'circuitIn');
  assert.equal(circuit.alive, false, 'a newer circuit of a kind replaces the older');
  assert.equal(theirs.alive, true);
  endpoint.setPeers([{ id: 'cloud-1', blocks: [cidr('10.100.1.0/26')] }]);
  assert.ok(!newer.alive && !theirs.alive, 'a peer that left loses its streams');
});
