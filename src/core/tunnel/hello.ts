/**
 * The datagram path's own handshake, `hello`: how two nodes agree on datagram keys with no stream between them, so an
 * edge-to-edge path comes back while the relay and the controller are unreachable (an agent restarted, a NAT that
 * rebooted, keys that must rotate during a long outage). Pure: the layout, and what to do with a hello given what a
 * node remembers of its peer; src/adapters/tunnel/datagram-hello.ts does the cryptography, src/adapters/tunnel/datagram-hello-exchange.ts
 * the sending.
 *
 *   hello = type 3 (1) | flags (1) | 0 (2) | generation (8, big-endian) | sender's public key, SPKI DER (44) |
 *           ephemeral X25519 public key (32) | echo (32) | signature (64)
 *
 * Signed-Diffie-Hellman with the identities nodes already pin (SIGMA's shape, as IKE and TLS 1.3 do it): the sender's
 * Ed25519 tunnel key signs the receiver's pin and every byte before the signature, so a hello is good for one
 * receiver only, and the receiver finds the sender by the pin of the key it carries (a key no peer of the plan has
 * is dropped before any signature check). `echo` is the receiver's current ephemeral key as the sender last saw it
 * (zeros for none): a hello that echoes our current one proves the peer is alive now, so both sides derive the keys
 * of the pair from X25519 of the two ephemeral keys once each has seen its own echoed (three hellos: A, B echoing A,
 * A echoing B; both sides starting at once converge the same way). The flag {@link HELLO_DERIVED} says the sender
 * derived the keys of the pair its hello echoes: a hello without it is answered, so a lost hello costs one more
 * round, and two nodes that both derived stop talking hellos. Nothing lasting is needed but the pins: a node
 * that lost everything rebuilds from its peers' last addresses.
 *
 * Replays: `generation` is a counter every node keeps on disk and raises for each new ephemeral key. A hello below
 * the highest generation seen from its sender, or of that generation with another ephemeral key, is a replay and
 * dropped unanswered; the highest generation seen is kept on disk too, so a restart does not reopen old hellos. Only
 * a hello of a new generation moves the peer's address to its source: a replayed current hello makes the node answer
 * its peer's known address, never the replayer's.
 */

export const HELLO_TYPE = 3;
/** Flag: the sender derived the pair's keys from its and the echoed ephemeral key. */
export const HELLO_DERIVED = 1;
/** Bytes of an Ed25519 public key as SubjectPublicKeyInfo DER. */
export const HELLO_SPKI_LEN = 44;
export const HELLO_KEY_LEN = 32;
export const HELLO_SIGNATURE_LEN = 64;
const GEN_AT = 4;
const SPKI_AT = GEN_AT + 8;
const EPH_AT = SPKI_AT + HELLO_SPKI_LEN;
const ECHO_AT = EPH_AT + HELLO_KEY_LEN;
/** Bytes before the signature (all of them signed). */
export const HELLO_SIGNED_LEN = ECHO_AT + HELLO_KEY_LEN;
export const HELLO_LEN = HELLO_SIGNED_LEN + HELLO_SIGNATURE_LEN;
/** What the signature covers before the hello's bytes: this label, then the receiver's pin (32 bytes). */
export const HELLO_SIGNATURE_LABEL = 'atoll datagram hello v1';
/** Generations are below this (exact in a JavaScript number). */
export const MAX_GENERATION = 2 ** 53;

export interface Hello {
  readonly generation: number;
  /** The sender derived the keys of the pair (its ephemeral key and the echoed one). */
  readonly derived: boolean;
  /** The sender's Ed25519 public key, SPKI DER. */
  readonly spki: Uint8Array;
  readonly eph: Uint8Array;
  /** The receiver's ephemeral key as the sender last saw it; all zeros for none. */
  readonly echo: Uint8Array;
  /** The bytes the signature covers (after the label and receiver's pin) and the signature. */
  readonly signed: Uint8Array;
  readonly signature: Uint8Array;
}

/** Why a hello was dropped before it could be used. */
/** Why a hello was dropped; `helloUnsaved`: taking or answering it needed a generation on disk the disk refused. */
export type HelloDrop = 'helloMalformed' | 'helloUnknownPeer' | 'helloBadSignature' | 'helloReplayed' | 'helloLimited' | 'helloUnsaved';

/** The bytes of a hello before its signature, into a new buffer of {@link HELLO_LEN} (the caller signs and appends). */
export function writeHello(generation: number, spki: Uint8Array, eph: Uint8Array, echo: Uint8Array | undefined, derived: boolean): Uint8Array {
  // cannot happen: the keys are Node's own exports of an Ed25519 and an X25519 key, and the echo a peer's ephemeral key
  // as parseHello cut it (src/adapters/tunnel/datagram-hello.ts)
  if (spki.length !== HELLO_SPKI_LEN || eph.length !== HELLO_KEY_LEN || (echo && echo.length !== HELLO_KEY_LEN)) throw new RangeError('hello keys of the wrong size');
  // cannot happen: generations start from the state file, whose load() takes them only below 2^52, and rise by one per
  // new ephemeral key (src/adapters/tunnel/datagram-state-file.ts)
  if (!Number.isSafeInteger(generation) || generation < 0) throw new RangeError(`bad hello generation ${generation}`);
  const out = new Uint8Array(HELLO_LEN);
  out[0] = HELLO_TYPE;
  out[1] = derived ? HELLO_DERIVED : 0;
  new DataView(out.buffer).setBigUint64(GEN_AT, BigInt(generation));
  out.set(spki, SPKI_AT);
  out.set(eph, EPH_AT);
  if (echo) out.set(echo, ECHO_AT);
  return out;
}

/** A received hello's fields (views into `buf`), or why it is none. */
export function parseHello(buf: Uint8Array): Hello | 'helloMalformed' {
  if (buf.length !== HELLO_LEN || buf[0] !== HELLO_TYPE || (buf[1]! & ~HELLO_DERIVED) !== 0 || buf[2] !== 0 || buf[3] !== 0) return 'helloMalformed';
  const generation = Number(new DataView(buf.buffer, buf.byteOffset, buf.length).getBigUint64(GEN_AT));
  if (generation >= MAX_GENERATION) return 'helloMalformed';
  return {
    generation, derived: (buf[1]! & HELLO_DERIVED) !== 0, spki: buf.subarray(SPKI_AT, EPH_AT), eph: buf.subarray(EPH_AT, ECHO_AT), echo: buf.subarray(ECHO_AT, HELLO_SIGNED_LEN),
    signed: buf.subarray(0, HELLO_SIGNED_LEN), signature: buf.subarray(HELLO_SIGNED_LEN),
  };
}

/** What a node remembers of one peer's hellos and its own ephemeral key for that peer. */
export interface HelloMemory {
  /** The highest generation seen from the peer (-1: none). */
  readonly seenGeneration: number;
  /** The peer's ephemeral key of that generation. */
  readonly theirEph: Uint8Array | undefined;
  /** Our current ephemeral key for the peer, and the peer key it was used with to derive keys (undefined: not yet). */
  readonly myEph: Uint8Array | undefined;
  readonly myEphUsedWith: Uint8Array | undefined;
}

export type HelloVerdict =
  | { readonly replayed: true }
  | {
    readonly replayed: false;
    /** A new generation: the peer started a handshake (its source becomes its address). */
    readonly newHandshake: boolean;
    /** Our ephemeral key must be a new one before we answer or derive (ours was used with another key of the peer). */
    readonly renewMyEph: boolean;
    /** It echoes our current ephemeral key: derive the pair's keys now. */
    readonly derive: boolean;
    /** The peer has not seen our current ephemeral key, or has not derived the keys yet: send it a hello. */
    readonly answer: boolean;
  };

/** What to do with an authentic hello (signature checked) given what we remember of its sender. */
export function judgeHello(mem: HelloMemory, hello: Pick<Hello, 'generation' | 'eph' | 'echo' | 'derived'>): HelloVerdict {
  if (hello.generation < mem.seenGeneration) return { replayed: true };
  const newHandshake = hello.generation > mem.seenGeneration || mem.theirEph === undefined;
  if (!newHandshake && !equalBytes(hello.eph, mem.theirEph as Uint8Array)) return { replayed: true };
  const renewMyEph = mem.myEph === undefined || (mem.myEphUsedWith !== undefined && !equalBytes(mem.myEphUsedWith, hello.eph));
  const derive = !renewMyEph && equalBytes(hello.echo, mem.myEph as Uint8Array);
  return { replayed: false, newHandshake, renewMyEph, derive, answer: newHandshake || !derive || !hello.derived };
}

/** The two directions' key ids and the HKDF info of each: the lower pin's sending direction first. */
export function helloKeyLabels(myPin: string, peerPin: string): { readonly send: string; readonly recv: string } {
  const lowFirst = myPin < peerPin;
  const up = 'atoll datagram hello key low->high';
  const down = 'atoll datagram hello key high->low';
  return lowFirst ? { send: up, recv: down } : { send: down, recv: up };
}

export function equalBytes(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  let d = 0;
  for (let i = 0; i < a.length; i++) d |= a[i]! ^ b[i]!;
  return d === 0;
}
