/**
 * The datagram wire format (src/core/tunnel/datagram.ts) written independently of the native code that seals and opens
 * it in the agent (native/atoll-dp.c), with node:crypto: for checking the two agree and for forging input in tests.
 *   datagram = type (1) | flags (1) | 0 (2) | key id (4, BE) | counter (8, BE) | AES-256-GCM(payload), the 16 header bytes as AAD | tag (16)
 */
import { createCipheriv, createDecipheriv } from 'node:crypto';
import { DATAGRAM_HEADER, DATAGRAM_TAG } from '../../src/core/tunnel/datagram.ts';

/** The nonce of `counter`: 4 zero bytes and the counter (8 bytes, big-endian). */
export function referenceNonce(counter: number): Buffer {
  const nonce = Buffer.alloc(12);
  nonce.writeUInt32BE(Math.floor(counter / 2 ** 32), 4);
  nonce.writeUInt32BE(counter >>> 0, 8);
  return nonce;
}

/** A datagram of `type` (header byte 1: `flags`) under `key` (32 bytes) with id `keyId`, counter `counter`, holding `plain`. */
export function referenceSeal(key: Uint8Array, type: number, keyId: number, counter: number, plain: Uint8Array, flags = 0): Buffer {
  const header = Buffer.alloc(DATAGRAM_HEADER);
  header[0] = type;
  header[1] = flags;
  header.writeUInt32BE(keyId >>> 0, 4);
  header.writeUInt32BE(Math.floor(counter / 2 ** 32), 8);
  header.writeUInt32BE(counter >>> 0, 12);
  const c = createCipheriv('aes-256-gcm', key, referenceNonce(counter));
  c.setAAD(header);
  return Buffer.concat([header, c.update(plain), c.final(), c.getAuthTag()]);
}

/** The header and plaintext of datagram `d` under `key`, or undefined when its tag does not verify. */
export function referenceOpen(key: Uint8Array, d: Uint8Array): { type: number; keyId: number; counter: number; plain: Uint8Array } | undefined {
  const b = Buffer.from(d);
  const counter = b.readUInt32BE(8) * 2 ** 32 + b.readUInt32BE(12);
  const dc = createDecipheriv('aes-256-gcm', key, referenceNonce(counter));
  dc.setAAD(b.subarray(0, DATAGRAM_HEADER));
  dc.setAuthTag(b.subarray(b.length - DATAGRAM_TAG));
  try {
    const plain = Buffer.concat([dc.update(b.subarray(DATAGRAM_HEADER, b.length - DATAGRAM_TAG)), dc.final()]);
    return { type: b[0]!, keyId: b.readUInt32BE(4), counter, plain };
  } catch {
    return undefined;
  }
}
