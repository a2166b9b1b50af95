import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import {
  DATAGRAM_OVERHEAD, echoReplyFlags, innerMtu, KEEPALIVE_ECHO_ODD, KEEPALIVE_ECHO_REPLY, KEEPALIVE_ECHO_REQUEST, KEEPALIVE_HEARS_YOU, rekeyDue,
} from './datagram.ts';

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

  test('an echo\'s answer: reply with the request\'s parity and our own hears-you, never a request (no ping-pong)', () => {
    assert.equal(echoReplyFlags(KEEPALIVE_ECHO_REQUEST | KEEPALIVE_ECHO_ODD, true), KEEPALIVE_HEARS_YOU | KEEPALIVE_ECHO_REPLY | KEEPALIVE_ECHO_ODD);
    assert.equal(echoReplyFlags(KEEPALIVE_ECHO_REQUEST | KEEPALIVE_HEARS_YOU, false), KEEPALIVE_ECHO_REPLY, 'the request\'s hears-you is its sender\'s, not ours');
    for (let flags = 0; flags < 256; flags++) assert.equal(echoReplyFlags(flags, true) & KEEPALIVE_ECHO_REQUEST, 0);
    // an agent from before reads only bit 0: the echo bits leave what it learns from a keepalive as it was
    for (const f of [KEEPALIVE_ECHO_REQUEST, KEEPALIVE_ECHO_REPLY, KEEPALIVE_ECHO_ODD]) assert.equal(f & KEEPALIVE_HEARS_YOU, 0);
  });
});
