import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { AtollError } from '../errors.ts';
import { encodeFrame, FRAME_HEADER, FRAME_KIND, FrameDecoder, FrameError, MAX_FRAME_PAYLOAD, PEER_ID_LEN, peerIdOfPin, pinOfPeerId, writeFrameHeader } from './frame.ts';

function payload(n: number, seed: number): Uint8Array {
  const p = new Uint8Array(n);
  for (let i = 0; i < n; i++) p[i] = (i * 7 + seed) & 255;
  return p;
}

function decodeAll(chunks: Uint8Array[], reuse = false): Uint8Array[] {
  const out: Uint8Array[] = [];
  const d = new FrameDecoder({ reuse });
  for (const c of chunks) d.push(c, (f) => out.push(f.slice()));
  assert.equal(d.pending, 0);
  return out;
}

function concat(parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let o = 0;
  for (const p of parts) { out.set(p, o); o += p.length; }
  return out;
}

describe('tunnel framing', () => {
  const frames = [payload(1, 1), payload(60, 2), payload(1510, 3), payload(MAX_FRAME_PAYLOAD, 4), payload(300, 5)];
  const stream = concat(frames.map((f) => encodeFrame(f)));

  test('kinds come out with their payloads; a relayed frame too short for its peer id or an unknown kind is refused', () => {
    const parts = [encodeFrame(payload(5, 1), FRAME_KIND.control), encodeFrame(payload(PEER_ID_LEN + 1, 2), FRAME_KIND.relayedControl), encodeFrame(payload(9, 3))];
    const got: [number, number][] = [];
    new FrameDecoder().push(concat(parts), (p, kind) => got.push([kind, p.length]));
    assert.deepEqual(got, [[FRAME_KIND.control, 5], [FRAME_KIND.relayedControl, PEER_ID_LEN + 1], [FRAME_KIND.packet, 9]]);
    assert.throws(() => new FrameDecoder().push(encodeFrame(payload(PEER_ID_LEN, 0), FRAME_KIND.relayedControl), () => undefined), FrameError);
    assert.throws(() => new FrameDecoder().push(new Uint8Array([4, 0, 0, 1, 0]), () => undefined), /kind 4/);
    assert.throws(() => new FrameDecoder().push(new Uint8Array([2, 0, 0, 40, ...new Uint8Array(40)]), () => undefined), /kind 2/, 'the retired relayed packet');
  });

  test('a peer id is the pin\'s digest, and back', () => {
    const pin = `sha256:${'0f'.repeat(31)}a1`;
    const id = peerIdOfPin(pin);
    assert.equal(id.length, PEER_ID_LEN);
    assert.equal(id[0], 0x0f);
    assert.equal(id[31], 0xa1);
    assert.equal(pinOfPeerId(id), pin);
    for (const bad of ['sha256:abc', `sha256:${'0F'.repeat(32)}`, `${'0f'.repeat(32)}`, '']) {
      assert.throws(() => peerIdOfPin(bad), (err: unknown) => err instanceof AtollError && err.code === 'TUNNEL_PIN_INVALID' && /not a key pin/.test(err.message), bad);
    }
  });

  test('kind byte, 3-byte big-endian length, then the payload', () => {
    assert.deepEqual([...encodeFrame(new Uint8Array([9, 8]))], [0, 0, 0, 2, 9, 8]);
    assert.deepEqual([...encodeFrame(new Uint8Array([7]), FRAME_KIND.control)], [1, 0, 0, 1, 7]);
    const b = new Uint8Array(4);
    writeFrameHeader(b, 0, 65_545);
    assert.deepEqual([...b], [0, 1, 0, 9]);
  });

  test('frames in one chunk come out whole and in order', () => {
    assert.deepEqual(decodeAll([stream]), frames);
  });

  test('every split point, including inside the length prefix; also with the assembly buffer reused', () => {
    for (const cut of [1, 2, 3, 4, 5, 7, 64, 65, 1500, 1579, 70_000, stream.length - 1]) {
      assert.deepEqual(decodeAll([stream.subarray(0, cut), stream.subarray(cut)]), frames, `cut at ${cut}`);
      assert.deepEqual(decodeAll([stream.subarray(0, cut), stream.subarray(cut)], true), frames, `cut at ${cut}, reused`);
    }
    const chunks: Uint8Array[] = [];
    for (let i = 0; i < stream.length; i += 997) chunks.push(stream.subarray(i, i + 997));
    assert.deepEqual(decodeAll(chunks, true), frames, 'every frame split, one assembly buffer');
  });

  test('every payload, whole in a chunk or assembled across chunks, has its own frame prefix right in front of it', () => {
    for (const cut of [2, 70_000, stream.length - 1]) {
      const d = new FrameDecoder();
      const prefixes: number[][] = [];
      for (const c of [stream.subarray(0, cut), stream.subarray(cut)]) {
        d.push(c, (p, kind) => prefixes.push([...new Uint8Array(p.buffer, p.byteOffset - FRAME_HEADER, FRAME_HEADER)].concat(kind)));
      }
      assert.deepEqual(prefixes, frames.map((f) => [...encodeFrame(f).subarray(0, FRAME_HEADER), FRAME_KIND.packet]), `cut at ${cut}`);
    }
  });

  test('byte by byte and in odd-sized chunks', () => {
    const small = concat(frames.slice(0, 3).map((f) => encodeFrame(f)));
    assert.deepEqual(decodeAll([...small].map((b) => new Uint8Array([b]))), frames.slice(0, 3));
    const chunks: Uint8Array[] = [];
    for (let i = 0; i < stream.length; i += 997) chunks.push(stream.subarray(i, i + 997));
    assert.deepEqual(decodeAll(chunks), frames);
  });

  test('a zero or oversized length is a framing error, and the decoder stays broken', () => {
    for (const len of [0, MAX_FRAME_PAYLOAD + 1, 0x00ffffff]) {
      const d = new FrameDecoder();
      const h = new Uint8Array([len >>> 24, (len >>> 16) & 255, (len >>> 8) & 255, len & 255]);
      assert.throws(() => d.push(h, () => assert.fail('no frame')), (err: unknown) => err instanceof FrameError && err instanceof AtollError && err.code === 'TUNNEL_FRAME_INVALID');
      assert.throws(() => d.push(encodeFrame(payload(3, 0)), () => undefined), FrameError);
    }
    assert.throws(() => writeFrameHeader(new Uint8Array(FRAME_HEADER), 0, 0), RangeError);
    assert.throws(() => writeFrameHeader(new Uint8Array(FRAME_HEADER), 0, MAX_FRAME_PAYLOAD + 1), RangeError);
  });
});
