import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createCipheriv, randomBytes } from 'node:crypto';
import { DATAGRAM_HEADER, DATAGRAM_TAG, DATAGRAM_TYPE, writeDatagramHeader, writeNonce } from '../core/tunnel/datagram.ts';
import { DatagramKey } from './aead.ts';

describe('DatagramKey (AES-256-GCM through libcrypto)', () => {
  const key = randomBytes(32);
  const nonce = new Uint8Array(12);
  const plain = randomBytes(1400);

  const sealed = (counter: number) => {
    const out = new Uint8Array(DATAGRAM_HEADER + plain.length + DATAGRAM_TAG);
    writeDatagramHeader(out, DATAGRAM_TYPE.data, 7, counter);
    writeNonce(nonce, counter);
    return out.subarray(0, new DatagramKey(key, 'seal').seal(nonce, out, plain));
  };

  test('seals exactly as node:crypto does (header as additional data), and opens its own output', () => {
    const d = sealed(42);
    const ref = createCipheriv('aes-256-gcm', key, nonce);
    ref.setAAD(d.subarray(0, DATAGRAM_HEADER));
    const ct = Buffer.concat([ref.update(plain), ref.final(), ref.getAuthTag()]);
    assert.deepEqual(Buffer.from(d.subarray(DATAGRAM_HEADER)), ct);
    const out = new Uint8Array(2000);
    assert.equal(new DatagramKey(key, 'open').open(nonce, d, out), plain.length);
    assert.deepEqual(Buffer.from(out.subarray(0, plain.length)), plain);
  });

  test('a changed header, body or tag, another key or another nonce does not open', () => {
    const d = sealed(43);
    const opener = new DatagramKey(key, 'open');
    const out = new Uint8Array(2000);
    for (const at of [5, DATAGRAM_HEADER + 3, d.length - 1]) {
      const bad = d.slice();
      bad[at]! ^= 1;
      assert.equal(opener.open(nonce, bad, out), -1, `byte ${at} flipped`);
    }
    assert.equal(new DatagramKey(randomBytes(32), 'open').open(nonce, d, out), -1);
    const other = new Uint8Array(12);
    writeNonce(other, 44);
    assert.equal(opener.open(other, d, out), -1);
    assert.equal(opener.open(nonce, d, out), plain.length, 'the context recovers after failures');
    opener.free();
  });
});
