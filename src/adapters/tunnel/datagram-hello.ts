/**
 * The cryptography of the datagram path's hello (src/core/tunnel/hello.ts): the node's Ed25519 tunnel key signs,
 * peers' keys verify (found by their pin), X25519 ephemeral keys agree, HKDF-SHA256 derives the pair's two keys and
 * their ids. Node's crypto (OpenSSL) does all of it.
 */
import { createHash, createPrivateKey, createPublicKey, diffieHellman, generateKeyPairSync, hkdfSync, type KeyObject, sign, verify } from 'node:crypto';
import { HELLO_KEY_LEN, HELLO_SIGNATURE_LABEL, HELLO_SIGNED_LEN, helloKeyLabels, writeHello } from '../../core/tunnel/hello.ts';

/** The DER prefix of an X25519 SubjectPublicKeyInfo: the raw 32-byte key follows. */
const X25519_SPKI_PREFIX = Buffer.from('302a300506032b656e032100', 'hex');

export interface Ephemeral {
  readonly pub: Uint8Array;
  readonly priv: KeyObject;
}

/** One direction's key of a pair: 32 bytes of AES-256-GCM key and the id its datagrams carry. */
export interface DirectionKey {
  readonly id: number;
  readonly key: Uint8Array;
}

export class HelloCrypto {
  /** Our tunnel public key, SPKI DER (what hellos carry), and its pin. */
  readonly spki: Uint8Array;
  readonly pin: string;
  readonly #key: KeyObject;
  readonly #pinBytes: Buffer;
  /** Peers' public keys by their SPKI bytes (hex), parsed once. */
  readonly #peerKeys = new Map<string, KeyObject>();

  /** @throws when `identityKeyPem` is not a private key (the tunnel credentials were checked at load). */
  constructor(identityKeyPem: string) {
    this.#key = createPrivateKey(identityKeyPem);
    this.spki = new Uint8Array(createPublicKey(this.#key).export({ type: 'spki', format: 'der' }));
    this.#pinBytes = createHash('sha256').update(this.spki).digest();
    this.pin = `sha256:${this.#pinBytes.toString('hex')}`;
  }

  newEphemeral(): Ephemeral {
    const { publicKey, privateKey } = generateKeyPairSync('x25519');
    const der = publicKey.export({ type: 'spki', format: 'der' });
    return { pub: new Uint8Array(der.subarray(der.length - HELLO_KEY_LEN)), priv: privateKey };
  }

  /** A signed hello for the peer with `peerPin`. */
  hello(peerPin: string, generation: number, eph: Uint8Array, echo: Uint8Array | undefined, derived: boolean): Uint8Array {
    const out = writeHello(generation, this.spki, eph, echo, derived);
    out.set(sign(null, signedBytes(pinBytes(peerPin), out.subarray(0, HELLO_SIGNED_LEN)), this.#key), HELLO_SIGNED_LEN);
    return out;
  }

  /** Whether `signature` is the key `spki`'s over `signed` for us. Never throws. */
  verify(spki: Uint8Array, signed: Uint8Array, signature: Uint8Array): boolean {
    const hex = Buffer.from(spki).toString('hex');
    let key = this.#peerKeys.get(hex);
    try {
      if (!key) {
        key = createPublicKey({ key: Buffer.from(spki), format: 'der', type: 'spki' });
        if (key.asymmetricKeyType !== 'ed25519') return false;
        if (this.#peerKeys.size > 1024) this.#peerKeys.clear();
        this.#peerKeys.set(hex, key);
      }
      return verify(null, signedBytes(this.#pinBytes, signed), key, signature);
    } catch {
      return false;
    }
  }

  /**
   * The pair's keys from our ephemeral key and the peer's: X25519, then HKDF-SHA256 with both ephemeral keys (the
   * lower pin's first) as salt and one label per direction. @returns undefined when the peer's key is unusable (a
   * low-order point: the shared secret would be zero).
   */
  derive(mine: Ephemeral, theirs: Uint8Array, peerPin: string): { readonly send: DirectionKey; readonly recv: DirectionKey } | undefined {
    let shared: Buffer;
    try {
      shared = diffieHellman({ privateKey: mine.priv, publicKey: createPublicKey({ key: Buffer.concat([X25519_SPKI_PREFIX, theirs]), format: 'der', type: 'spki' }) });
    } catch {
      return undefined;
    }
    if (shared.every((b) => b === 0)) return undefined;
    const salt = this.pin < peerPin ? Buffer.concat([mine.pub, theirs]) : Buffer.concat([theirs, mine.pub]);
    const labels = helloKeyLabels(this.pin, peerPin);
    const one = (info: string): DirectionKey => {
      const okm = new Uint8Array(hkdfSync('sha256', shared, salt, info, 36));
      return { key: okm.slice(0, 32), id: new DataView(okm.buffer).getUint32(32) };
    };
    return { send: one(labels.send), recv: one(labels.recv) };
  }
}

function pinBytes(pin: string): Buffer {
  return Buffer.from(pin.replace(/^sha256:/, ''), 'hex');
}

function signedBytes(receiverPin: Buffer, signed: Uint8Array): Buffer {
  return Buffer.concat([Buffer.from(HELLO_SIGNATURE_LABEL), receiverPin, signed]);
}
