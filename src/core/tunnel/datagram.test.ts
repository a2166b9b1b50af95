import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { DATAGRAM_OVERHEAD, innerMtu, rekeyDue } from './datagram.ts';

describe('datagram layout and key rotation', () => {
  test('the inner MTU leaves room for IP, UDP, our header, the virtio header and the tag', () => {
    assert.equal(DATAGRAM_OVERHEAD, 20 + 8 + 16 + 10 + 16);
    assert.equal(innerMtu(1500), 1430);
  });

  test('rekey after the packet or time limit, whichever first', () => {
    const limits = { packets: 100, ms: 1000 };
    assert.equal(rekeyDue(99, 999, limits), false);
    assert.equal(rekeyDue(100, 0, limits), true);
    assert.equal(rekeyDue(0, 1000, limits), true);
  });
});
