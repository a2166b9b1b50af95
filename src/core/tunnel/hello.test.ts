import { test } from 'node:test';
import assert from 'node:assert/strict';
import { equalBytes, HELLO_LEN, HELLO_SIGNED_LEN, helloKeyLabels, type HelloMemory, judgeHello, parseHello, writeHello } from './hello.ts';

const spki = new Uint8Array(44).fill(7);
const key = (n: number) => new Uint8Array(32).fill(n);

test('a hello round-trips through its layout; anything else is malformed', () => {
  const h = writeHello(42, spki, key(1), key(2), true);
  assert.equal(h.length, HELLO_LEN);
  const p = parseHello(h);
  assert.ok(typeof p !== 'string');
  assert.equal(p.generation, 42);
  assert.equal(p.derived, true);
  assert.ok(equalBytes(p.eph, key(1)) && equalBytes(p.echo, key(2)) && equalBytes(p.spki, spki));
  assert.equal(p.signed.length, HELLO_SIGNED_LEN);
  const none = parseHello(writeHello(0, spki, key(1), undefined, false));
  assert.ok(typeof none !== 'string' && equalBytes(none.echo, new Uint8Array(32)) && !none.derived);
  assert.equal(parseHello(h.subarray(0, HELLO_LEN - 1)), 'helloMalformed');
  for (const [at, v] of [[0, 2], [1, 2], [2, 1], [3, 1]] as const) {
    const bad = h.slice();
    bad[at] = v;
    assert.equal(parseHello(bad), 'helloMalformed', `byte ${at} = ${v}`);
  }
});

/** One node's side of the handshake with one peer, as the datagram path keeps it (the cryptography left out). */
class Side {
  mem: { seenGeneration: number; theirEph?: Uint8Array; myEph?: Uint8Array; myEphUsedWith?: Uint8Array } = { seenGeneration: -1 };
  readonly name: string;
  generation: number;
  derivedPair: string | undefined;
  #next: number;

  constructor(name: string, generation: number, firstKey: number) {
    this.name = name;
    this.generation = generation;
    this.#next = firstKey;
  }

  renew(): void {
    this.mem.myEph = key(this.#next++);
    this.mem.myEphUsedWith = undefined;
    this.generation++;
  }

  hello(): Msg {
    if (!this.mem.myEph) this.renew();
    const derived = this.mem.myEphUsedWith !== undefined && this.mem.theirEph !== undefined && equalBytes(this.mem.myEphUsedWith, this.mem.theirEph);
    return { from: this.name, generation: this.generation, eph: this.mem.myEph as Uint8Array, echo: this.mem.theirEph ?? new Uint8Array(32), derived };
  }

  /** @returns the answer, if any, or 'replayed' */
  receive(m: Msg): Msg | undefined | 'replayed' {
    const v = judgeHello(this.mem as HelloMemory, m);
    if (v.replayed) return 'replayed';
    if (v.newHandshake) {
      this.mem.seenGeneration = m.generation;
      this.mem.theirEph = m.eph;
    }
    if (v.renewMyEph) this.renew();
    if (v.derive) {
      this.mem.myEphUsedWith = m.eph;
      this.derivedPair = pair(this.mem.myEph as Uint8Array, m.eph);
    }
    return v.answer ? this.hello() : undefined;
  }
}

interface Msg {
  readonly from: string;
  readonly generation: number;
  readonly eph: Uint8Array;
  readonly echo: Uint8Array;
  readonly derived: boolean;
}

const pair = (a: Uint8Array, b: Uint8Array) => [a[0], b[0]].sort().join('+');

/** Delivers messages (dropping those `lose` picks) until none is left; @returns how many went. */
function run(a: Side, b: Side, first: Msg[], lose: (n: number) => boolean = () => false): number {
  const queue = [...first];
  let n = 0;
  while (queue.length > 0 && n < 50) {
    const m = queue.shift() as Msg;
    n++;
    if (lose(n)) continue;
    const to = m.from === a.name ? b : a;
    const answer = to.receive(m);
    if (answer && answer !== 'replayed') queue.push(answer);
  }
  return n;
}

test('a restarted node and a peer that kept its old keys agree in three hellos', () => {
  const a = new Side('a', 10, 1);
  const b = new Side('b', 20, 100);
  // their previous handshake
  run(a, b, [a.hello()]);
  assert.equal(a.derivedPair, b.derivedPair);
  const old = b.derivedPair;
  // a restarts: its memory is gone but its generation (kept on disk) and its memory of b's generation
  const a2 = new Side('a', a.generation, 50);
  a2.mem.seenGeneration = a.mem.seenGeneration;
  const sent = run(a2, b, [a2.hello()]);
  assert.equal(sent, 3);
  assert.ok(a2.derivedPair !== undefined && a2.derivedPair === b.derivedPair && a2.derivedPair !== old);
});

test('both sides starting at once converge on one pair and then stop', () => {
  const a = new Side('a', 0, 1);
  const b = new Side('b', 0, 100);
  const sent = run(a, b, [a.hello(), b.hello()]);
  assert.ok(a.derivedPair !== undefined && a.derivedPair === b.derivedPair);
  assert.ok(sent <= 6, `${sent} hellos`);
});

test('a lost hello costs a resend, never a disagreement', () => {
  for (let lost = 1; lost <= 3; lost++) {
    const a = new Side('a', 0, 1);
    const b = new Side('b', 0, 100);
    run(a, b, [a.hello()], (n) => n === lost);
    // the side still rebuilding sends its hello again (its schedule), and the exchange finishes
    const resend = a.derivedPair === undefined || b.derivedPair === undefined ? (b.derivedPair === undefined ? b : a) : undefined;
    if (resend) run(a, b, [resend.hello()]);
    assert.ok(a.derivedPair !== undefined && a.derivedPair === b.derivedPair, `hello ${lost} lost`);
  }
});

test('a replayed hello is refused: an older generation, or the same one with another key', () => {
  const a = new Side('a', 5, 1);
  const b = new Side('b', 0, 100);
  const first = a.hello();
  run(a, b, [first]);
  a.renew();
  run(a, b, [a.hello()]);
  assert.equal(b.receive(first), 'replayed');
  assert.equal(b.receive({ ...a.hello(), eph: key(99) }), 'replayed');
  // the current one again is no replay (a resend): answered only if a has not derived
  assert.notEqual(b.receive(a.hello()), 'replayed');
});

test('the two directions get distinct key labels, the same on both sides', () => {
  const x = helloKeyLabels('sha256:aa', 'sha256:bb');
  const y = helloKeyLabels('sha256:bb', 'sha256:aa');
  assert.equal(x.send, y.recv);
  assert.equal(x.recv, y.send);
  assert.notEqual(x.send, x.recv);
});
