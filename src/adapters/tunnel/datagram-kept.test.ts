import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { closeSync, fstatSync } from 'node:fs';
import { referenceOpen } from '../../../test/support/datagram-reference.ts';
import { DATAGRAM_TYPE } from '../../core/tunnel/datagram.ts';
import { KeptRegion, OpenKeyTable, SealKey } from './datagram-native.ts';

/** The counter a datagram carries (bytes 8 to 15, big-endian). */
const counterOf = (d: Uint8Array) => Number(Buffer.from(d).readBigUInt64BE(8));

describe('kept region (keys that outlive the agent\'s process)', () => {
  const fds: number[] = [];
  after(() => {
    KeptRegion.detach();
    for (const fd of fds) closeSync(fd);
  });

  test('a sending key taken back goes on from its counter: no nonce is used twice; a receiving key keeps its replay window', () => {
    const fd = KeptRegion.create(16, 4096);
    fds.push(fd);
    assert.equal(fstatSync(fd).size > 16 * 300, true);
    const sendBytes = randomBytes(32);
    const openBytes = randomBytes(32);
    const seal = new SealKey(sendBytes, 7);
    assert.equal(seal.slot >= 0, true, 'the key lives in a slot');
    const sent = [1, 2, 3].map((i) => seal.sealOne(DATAGRAM_TYPE.data, new Uint8Array([i])));
    const table = new OpenKeyTable();
    assert.equal(table.add(9, 1, openBytes), true);
    assert.equal(table.window(9, 5, true), 1, 'counter 5 recorded');
    const sendSlot = seal.slot;
    const openSlot = table.slot(9);
    KeptRegion.write(Buffer.from(JSON.stringify({ sendSlot, openSlot })));
    // the process dies: nothing freed, the memfd (held by the keeper) stays; a new process attaches it
    KeptRegion.detach();
    assert.equal(KeptRegion.attach(fd), true);
    const meta = JSON.parse(Buffer.from(KeptRegion.read(4096) as Uint8Array).toString()) as { sendSlot: number; openSlot: number };
    assert.deepEqual(meta, { sendSlot, openSlot });
    const back = SealKey.restore(meta.sendSlot);
    assert.ok(back);
    assert.equal(back.id, 7);
    assert.equal(back.counter, 3, 'the counter where the dead process left it');
    const next = back.sealOne(DATAGRAM_TYPE.data, new Uint8Array([4]));
    assert.equal(counterOf(next), 3);
    assert.deepEqual([...sent, next].map(counterOf), [0, 1, 2, 3]);
    // the same key: the reference opens what the restored key sealed
    assert.deepEqual([...(referenceOpen(sendBytes, next)?.plain ?? [])], [4]);
    const table2 = new OpenKeyTable();
    assert.equal(table2.restore(meta.openSlot, 1), true);
    assert.equal(table2.window(9, 5, false), 0, 'counter 5 is still seen: a replay across the restart is dropped');
    assert.equal(table2.window(9, 6, false), 1);
    assert.equal(table2.restore(meta.openSlot, 1), false, 'its id is taken now');
    assert.equal(SealKey.restore(meta.openSlot), undefined, 'a receiving slot is no sending key');
    assert.equal(SealKey.restore(1000), undefined, 'out of range');
    back.free();
    table2.free();
    assert.equal(KeptRegion.used(), 0, 'freeing cleanses the slots');
  });

  test('release leaves a slot for the next process; sweep frees the slots no description names', () => {
    const fd = KeptRegion.create(8, 1024);
    fds.push(fd);
    const a = new SealKey(randomBytes(32), 1);
    const b = new SealKey(randomBytes(32), 2);
    const table = new OpenKeyTable();
    table.add(3, 0, randomBytes(32));
    assert.equal(KeptRegion.used(), 3);
    const keep = a.slot;
    a.release();
    b.release();
    table.free(true);
    assert.equal(KeptRegion.used(), 3, 'released, not freed');
    assert.equal(KeptRegion.sweep([keep]), 2);
    assert.equal(KeptRegion.used(), 1);
    assert.equal(SealKey.restore(keep)?.id, 1);
  });

  test('a full region puts keys on the heap; the description is written whole or not at all', () => {
    const fd = KeptRegion.create(1, 16);
    fds.push(fd);
    const a = new SealKey(randomBytes(32), 1);
    const b = new SealKey(randomBytes(32), 2);
    assert.equal(a.slot, 0);
    assert.equal(b.slot, -1, 'no slot left: on the heap');
    assert.equal(b.sealOne(DATAGRAM_TYPE.data, new Uint8Array([1])).length, 16 + 1 + 16);
    a.free();
    b.free();
    KeptRegion.write(Buffer.from('first'));
    assert.throws(() => KeptRegion.write(new Uint8Array(17)), RangeError);
    assert.equal(Buffer.from(KeptRegion.read(16) as Uint8Array).toString(), 'first', 'the one before stays');
    KeptRegion.write(Buffer.from('second'));
    assert.equal(Buffer.from(KeptRegion.read(16) as Uint8Array).toString(), 'second');
    KeptRegion.detach();
    assert.equal(KeptRegion.read(16), undefined, 'no region attached');
    assert.equal(KeptRegion.attach(fds[0] as number), true);
  });
});
