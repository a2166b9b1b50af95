import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ECHO_EVERY, KEEPALIVE_ECHO_ODD, KEEPALIVE_ECHO_REPLY, KEEPALIVE_ECHO_REQUEST, KEEPALIVE_HEARS_YOU } from './datagram.ts';
import {
  answerHello, DEAD_AFTER_MS, FULL_KEEPALIVE_EVERY, HELLO_ANSWER_MIN_MS, HELLO_FAST_FOR_MS, HELLO_FAST_MS, HELLO_SLOW_MS, helloStep, keepaliveSent, LAST_RESORT_MS,
  lastResort, newPeerTimes, OFFER_TIMEOUT_MS, onHandshake, onKeepalive, onPacket, type PeerView, planTick, usable,
} from './datagram-peer.ts';

/** A peer with a key made at `keyAt` and an address, not heard yet. */
function peer(keyAt = 0, counter = 0): PeerView & { send: { createdAt: number; key: { counter: number } }; pending: { at: number } | undefined } {
  return { ...newPeerTimes(), send: { createdAt: keyAt, key: { counter } }, pending: undefined, endpoint: {} };
}

test('datagram peer: usable once we hear it and it hears us, with a key and an address; given up one dead interval after either stops', () => {
  const p = peer();
  assert.equal(usable(p, 0), false, 'not heard yet');
  assert.deepEqual(onKeepalive(p, 0, 1400, 1000), { revived: true, answer: undefined });
  assert.equal(usable(p, 1000), false, 'we hear it, it does not say it hears us');
  assert.equal(onKeepalive(p, KEEPALIVE_HEARS_YOU, 1, 1500).revived, true, 'it hears us now: the path may have turned usable');
  assert.equal(usable(p, 1500), true);
  assert.equal(usable(p, 1500 + DEAD_AFTER_MS - 1), true);
  assert.equal(usable(p, 1500 + DEAD_AFTER_MS), false, 'silent for a dead interval');
  assert.equal(usable({ ...p, endpoint: undefined }, 1500), false, 'no address');
  assert.equal(usable({ ...p, send: undefined }, 1500), false, 'no key');
  // a packet alone says nothing of whether the peer hears us
  const q = peer();
  assert.equal(onPacket(q, 100), true);
  assert.equal(onPacket(q, 200), false);
  assert.equal(usable(q, 200), false);
  // a handshake by hellos: both hear each other at once
  onHandshake(q, 300);
  assert.equal(usable(q, 300), true);
});

test('datagram peer: one-byte keepalives alone keep the path for FULL_KEEPALIVE_EVERY dead intervals after the last full-size one (the path\'s MTU may have shrunk)', () => {
  const p = peer();
  onKeepalive(p, KEEPALIVE_HEARS_YOU, 1400, 0);
  let t = 0;
  for (; t < DEAD_AFTER_MS * FULL_KEEPALIVE_EVERY; t += 1000) {
    onKeepalive(p, KEEPALIVE_HEARS_YOU, 1, t);
    assert.equal(usable(p, t), true, `at ${t} ms`);
  }
  onKeepalive(p, KEEPALIVE_HEARS_YOU, 1, t);
  assert.equal(usable(p, t), false, 'no full-size keepalive for too long');
  assert.equal(onKeepalive(p, KEEPALIVE_HEARS_YOU, 1400, t + 1).revived, true);
  assert.equal(usable(p, t + 1), true);
});

test('datagram peer: an echo request is answered at once; the answer to ours gives the round trip, a late answer to the one before does not', () => {
  const p = peer();
  const asked = onKeepalive(p, KEEPALIVE_HEARS_YOU | KEEPALIVE_ECHO_REQUEST | KEEPALIVE_ECHO_ODD, 1400, 0);
  assert.equal(asked.answer, KEEPALIVE_HEARS_YOU | KEEPALIVE_ECHO_REPLY | KEEPALIVE_ECHO_ODD, 'we hear it, and its odd bit back');
  // our echo request goes on the tick where (tick + tag) % ECHO_EVERY is half of ECHO_EVERY
  const tag = 3;
  const tick = (ECHO_EVERY >> 1) - tag + ECHO_EVERY;
  const plan = planTick(p, 1000, tick, tag);
  assert.ok(plan.keepalive?.echo);
  assert.equal((plan.keepalive.flags & KEEPALIVE_ECHO_ODD) !== 0, false, 'the first echo is even');
  keepaliveSent(p, plan.keepalive, 1000);
  onKeepalive(p, KEEPALIVE_ECHO_REPLY | KEEPALIVE_ECHO_ODD, 1, 1010);
  assert.equal(p.rttMs, undefined, 'an answer with the other bit is to an earlier request');
  onKeepalive(p, KEEPALIVE_ECHO_REPLY, 1, 1042);
  assert.equal(p.rttMs, 42);
  assert.equal((planTick(p, 2000, tick + ECHO_EVERY, tag).keepalive?.flags ?? 0) & KEEPALIVE_ECHO_ODD, KEEPALIVE_ECHO_ODD, 'the next one is odd');
  assert.equal(planTick(p, 2000, tick + 1, tag).keepalive?.echo, false, 'one tick in ECHO_EVERY');
});

test('datagram peer: a tick offers a key when there is none, when one is stuck or due, not while a fresh offer waits; keepalives padded while unusable, one in FULL_KEEPALIVE_EVERY after', () => {
  const none = { ...newPeerTimes(), send: undefined, pending: undefined, endpoint: {} };
  assert.deepEqual(planTick(none, 0, 0, 0), { offer: true, keepalive: undefined });
  assert.equal(planTick({ ...none, pending: { at: 0 } }, OFFER_TIMEOUT_MS, 0, 0).offer, false, 'an offer waits for its answer');
  assert.equal(planTick({ ...none, pending: { at: 0 } }, OFFER_TIMEOUT_MS + 1, 0, 0).offer, true, 'unanswered: offered again');
  const p = peer(0);
  assert.equal(planTick(p, OFFER_TIMEOUT_MS, 0, 0).offer, false, 'a new key gets an offer\'s time to work');
  assert.equal(planTick(p, OFFER_TIMEOUT_MS + 1, 0, 0).offer, true, 'unusable under a key older than that: the ends may not share it');
  onKeepalive(p, KEEPALIVE_HEARS_YOU, 1400, OFFER_TIMEOUT_MS);
  assert.equal(planTick(p, OFFER_TIMEOUT_MS + 1, 0, 0).offer, false, 'usable: the key works');
  assert.equal(planTick(p, 999, 0, 0, { rekey: { packets: 10, ms: 1000 } }).offer, false);
  assert.equal(planTick(p, 1000 + OFFER_TIMEOUT_MS, 0, 0, { rekey: { packets: 10, ms: 1000 } }).offer, true, 'due by age');
  assert.equal(planTick(peer(OFFER_TIMEOUT_MS, 10), OFFER_TIMEOUT_MS + 1, 0, 0, { rekey: { packets: 10, ms: 1e9 } }).offer, true, 'due by datagrams sealed');
  // keepalives: the usable path pads one tick in FULL_KEEPALIVE_EVERY (staggered by tag), every tick while unusable
  const now = OFFER_TIMEOUT_MS + 1;
  const padded = Array.from({ length: FULL_KEEPALIVE_EVERY * 2 }, (_, tick) => planTick(p, now, tick, 7).keepalive?.full);
  assert.deepEqual(padded.flatMap((f, tick) => (f ? [tick] : [])), [3, 13]);
  assert.ok(planTick(p, now, 0, 7).keepalive!.flags & KEEPALIVE_HEARS_YOU);
  const later = now + DEAD_AFTER_MS;
  assert.equal(planTick(p, later, 0, 7).keepalive?.full, true, 'unusable: every keepalive full-size');
  assert.equal(planTick(p, later, 0, 7).keepalive!.flags & KEEPALIVE_HEARS_YOU, 0, 'and it says we do not hear the peer');
  assert.equal(planTick({ ...p, endpoint: undefined }, now, 0, 0).keepalive, undefined, 'no address: no keepalive');
});

test('datagram peer: hellos rebuild a path only with no stream the peer answers on; fast for HELLO_FAST_FOR_MS, then every HELLO_SLOW_MS; over once usable', () => {
  const p = peer(0);
  assert.deepEqual(helloStep(p, 0, 5000, 10), { rebuilding: false, started: false, send: false }, 'a stream the peer answers on brings keys');
  const sent: number[] = [];
  let started = 0;
  for (let now = 0; now <= HELLO_FAST_FOR_MS + 3000; now += 50) {
    const step = helloStep(p, now, 1_700_000_000_000 + now, DEAD_AFTER_MS);
    assert.equal(step.rebuilding, true);
    if (step.started) started++;
    if (step.send) sent.push(now);
  }
  assert.equal(started, 1);
  assert.equal(p.rebuildingSince, 1_700_000_000_000, 'since when, in wall time for `atoll peers`');
  const gaps = sent.slice(1).map((t, i) => t - (sent[i] as number));
  assert.deepEqual([...new Set(gaps)], [HELLO_FAST_MS, HELLO_SLOW_MS]);
  assert.equal(sent.filter((t) => t < HELLO_FAST_FOR_MS).length, HELLO_FAST_FOR_MS / HELLO_FAST_MS);
  // the keys agreed: usable, no more hellos, and the next rebuild starts afresh
  onHandshake(p, 9000);
  assert.deepEqual(helloStep(p, 9000, 0, undefined), { rebuilding: false, started: false, send: false });
  assert.equal(p.rebuildingSince, undefined);
  assert.equal(helloStep(p, 9000 + DEAD_AFTER_MS, 0, undefined).started, true);
  assert.equal(helloStep({ ...peer(0), endpoint: undefined }, 0, 0, undefined).rebuilding, false, 'no address to send them to');
});

test('datagram peer: a peer\'s hellos are answered at most once per HELLO_ANSWER_MIN_MS', () => {
  const p = peer();
  const answered = [0, 10, 99, 100, 150, 250].filter((t) => answerHello(p, t));
  assert.deepEqual(answered, [0, 100, 250]);
  assert.ok(HELLO_ANSWER_MIN_MS === 100);
});

test('datagram peer: the last resort sends to a peer nothing else reaches for LAST_RESORT_MS after its last authentic datagram, never past a live stream', () => {
  const p = peer();
  onPacket(p, 0);
  assert.equal(lastResort(p, DEAD_AFTER_MS, undefined), true, 'no stream');
  assert.equal(lastResort(p, DEAD_AFTER_MS, DEAD_AFTER_MS), true, 'a stream silent for a dead interval');
  assert.equal(lastResort(p, DEAD_AFTER_MS, DEAD_AFTER_MS - 1), false, 'a stream the peer answers on takes it');
  assert.equal(lastResort(p, LAST_RESORT_MS - 1, undefined), true);
  assert.equal(lastResort(p, LAST_RESORT_MS, undefined), false, 'gone too long: it may have moved or gone');
  assert.equal(lastResort(p, 10, undefined, { lastResortMs: 10 }), false);
  assert.equal(lastResort({ ...p, send: undefined }, 1, undefined), false, 'no key');
});
