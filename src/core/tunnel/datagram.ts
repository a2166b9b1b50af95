/**
 * The tunnel's datagram path, as data: the layout of one encrypted UDP datagram, its nonce, the inner MTU an underlay
 * MTU leaves, and when a key is due for rotation. Pure: no I/O, no `node:` imports; src/adapters/tunnel/datagram-path.ts
 * sends and receives. The per-datagram work on this layout (header, sealing and opening, the replay window, the split of
 * a TCP superpacket into segments that each fit one datagram) is native/atoll-dp.c's, one implementation, tested
 * through src/adapters/tunnel/datagram-native.ts against an independent one (test/support/datagram-reference.ts).
 *
 *   datagram = type (1) | flags (1) | 0 (2) | key id (4, big-endian) | counter (8, big-endian) | sealed payload | tag (16)
 *
 * The first 16 bytes are the AEAD's additional data; the payload is a packet as the TUN device holds it (its 10-byte
 * virtio-net header, then the IP packet), or for a keepalive one flag byte. The nonce is 4 zero bytes and the 8
 * counter bytes: each direction of each pair has its own key (the sender's, src/adapters/tunnel/datagram-keys.ts), and a
 * sender never reuses a counter under a key, so a (key, nonce) pair never repeats.
 */
import { VNET_HDR_LEN } from './routing.ts';

export const DATAGRAM_TYPE = Object.freeze({ data: 1, keepalive: 2 });
export type DatagramType = (typeof DATAGRAM_TYPE)[keyof typeof DATAGRAM_TYPE];

/** Bytes before the sealed payload (also its additional data). */
export const DATAGRAM_HEADER = 16;
/** Bytes of the AEAD tag after it. */
export const DATAGRAM_TAG = 16;
/** IPv4 and UDP headers in front of every datagram on the underlay. */
export const UNDERLAY_IP_UDP = 28;
/**
 * Bytes a datagram adds to an inner IP packet on the underlay: IPv4 + UDP headers, ours, the virtio-net header the
 * packet carries, the tag.
 */
export const DATAGRAM_OVERHEAD = UNDERLAY_IP_UDP + DATAGRAM_HEADER + VNET_HDR_LEN + DATAGRAM_TAG;
/** The largest counter a sender may use: well below 2^53 (exact in a JavaScript number); a key is rotated long before. */
export const MAX_COUNTER = 2 ** 48;

/** Keepalive flag: the sender has heard an authentic datagram from us lately (our datagrams reach it). */
export const KEEPALIVE_HEARS_YOU = 1;
/**
 * Keepalive flags for the path's round trip (`atoll peers`): a keepalive with ECHO_REQUEST asks the peer to answer at
 * once with a one-byte keepalive carrying ECHO_REPLY, and ECHO_ODD as the request had it (so a late answer to the
 * request before is not taken for this one's). Agents from before these flags read only {@link KEEPALIVE_HEARS_YOU}
 * and never answer: their peers show no round trip, and nothing else changes. The flags are in the sealed payload: only
 * the pair's key holders set or see them, and the replay window keeps a request from being answered twice.
 */
export const KEEPALIVE_ECHO_REQUEST = 2;
export const KEEPALIVE_ECHO_REPLY = 4;
export const KEEPALIVE_ECHO_ODD = 8;
/** One keepalive in this many per peer asks for an echo (as one stream ping in ten asks for a pong). */
export const ECHO_EVERY = 10;

/** The flag byte of the keepalive that answers one whose flag byte was `request`. */
export function echoReplyFlags(request: number, hearsYou: boolean): number {
  return (hearsYou ? KEEPALIVE_HEARS_YOU : 0) | KEEPALIVE_ECHO_REPLY | (request & KEEPALIVE_ECHO_ODD);
}

/** The largest inner IP packet one datagram carries on an underlay of `underlayMtu`, never fragmented. */
export function innerMtu(underlayMtu: number): number {
  return underlayMtu - DATAGRAM_OVERHEAD;
}

/** Why a datagram was dropped before or without decryption; the counters `atoll peers` shows. */
export type DatagramDrop = 'truncated' | 'badType' | 'unknownKey' | 'replayed' | 'badTag' | 'unknownAddress' | 'badPayload';

/** When a sending key is due for replacement: after this many datagrams or this long, whichever comes first. */
export const REKEY_AFTER_PACKETS = 2 ** 40;
export const REKEY_AFTER_MS = 120_000;
/** A receiving key stays valid this long after its successor arrived (datagrams in flight under the old one). */
export const OLD_KEY_GRACE_MS = 10_000;

/** Whether a sending key used for `packets` datagrams, created `ageMs` ago, is due for rotation. */
export function rekeyDue(packets: number, ageMs: number, limits = { packets: REKEY_AFTER_PACKETS, ms: REKEY_AFTER_MS }): boolean {
  return packets >= limits.packets || ageMs >= limits.ms;
}
