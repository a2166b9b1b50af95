/**
 * The tunnel's datagram path, as data: the layout of one encrypted UDP datagram, its nonce, the inner MTU an underlay
 * MTU leaves, the replay window, when a key is due for rotation, and the split of a TCP superpacket into segments that
 * each fit one datagram. Pure: no I/O, no `node:` imports; src/adapters/datagram-path.ts sends and receives.
 *
 *   datagram = type (1) | 0 (3) | key id (4, big-endian) | counter (8, big-endian) | sealed payload | tag (16)
 *
 * The first 16 bytes are the AEAD's additional data; the payload is a packet as the TUN device holds it (its 10-byte
 * virtio-net header, then the IP packet), or for a keepalive one flag byte. The nonce is 4 zero bytes and the 8
 * counter bytes: each direction of each pair has its own key (the sender's, src/adapters/datagram-path.ts), and a
 * sender never reuses a counter under a key, so a (key, nonce) pair never repeats.
 */
import { fold, sum16 } from '../net/checksum.ts';
import { VNET_HDR_LEN } from './routing.ts';

export const DATAGRAM_TYPE = Object.freeze({ data: 1, keepalive: 2 });
export type DatagramType = (typeof DATAGRAM_TYPE)[keyof typeof DATAGRAM_TYPE];

/** Bytes before the sealed payload (also its additional data). */
export const DATAGRAM_HEADER = 16;
/** Bytes of the AEAD tag after it. */
export const DATAGRAM_TAG = 16;
/** Bytes of the nonce. */
export const NONCE_LEN = 12;
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

/** The largest inner IP packet one datagram carries on an underlay of `underlayMtu`, never fragmented. */
export function innerMtu(underlayMtu: number): number {
  return underlayMtu - DATAGRAM_OVERHEAD;
}

/** Writes the header of a datagram into `buf` at 0. */
export function writeDatagramHeader(buf: Uint8Array, type: DatagramType, keyId: number, counter: number): void {
  buf[0] = type;
  buf[1] = 0;
  buf[2] = 0;
  buf[3] = 0;
  writeU32(buf, 4, keyId);
  writeU32(buf, 8, Math.floor(counter / 2 ** 32));
  writeU32(buf, 12, counter >>> 0);
}

/** The nonce of `counter`, written into `nonce` (12 bytes). */
export function writeNonce(nonce: Uint8Array, counter: number): void {
  nonce.fill(0, 0, 4);
  writeU32(nonce, 4, Math.floor(counter / 2 ** 32));
  writeU32(nonce, 8, counter >>> 0);
}

/** Why a datagram was dropped before or without decryption; the counters `atoll peers` shows. */
export type DatagramDrop = 'truncated' | 'badType' | 'unknownKey' | 'replayed' | 'badTag' | 'unknownAddress' | 'badPayload';

export interface DatagramHeader {
  readonly type: DatagramType;
  readonly keyId: number;
  readonly counter: number;
}

/** The header of a received datagram, or why it is not one of ours (checked before any cryptography). */
export function parseDatagramHeader(buf: Uint8Array): DatagramHeader | DatagramDrop {
  if (buf.length < DATAGRAM_HEADER + DATAGRAM_TAG + 1) return 'truncated';
  const type = buf[0];
  if ((type !== DATAGRAM_TYPE.data && type !== DATAGRAM_TYPE.keepalive) || buf[1] !== 0 || buf[2] !== 0 || buf[3] !== 0) return 'badType';
  const hi = readU32(buf, 8);
  const counter = hi * 2 ** 32 + readU32(buf, 12);
  if (counter >= MAX_COUNTER) return 'badType';
  return { type: type as DatagramType, keyId: readU32(buf, 4), counter };
}

/**
 * Which counters of one key were seen: the highest, and a bitmap of the {@link ReplayWindow.SIZE} below it (RFC 6479's
 * idea, a sliding bitmap). Test a counter with {@link ok} before decrypting; {@link accept} it only once the datagram
 * proved authentic, so forged datagrams cannot move the window.
 */
export class ReplayWindow {
  static readonly SIZE = 2048;
  readonly #bits = new Uint32Array(ReplayWindow.SIZE / 32);
  /** The highest counter accepted, -1 before the first. */
  #top = -1;

  /** Whether `counter` is new: above the top, or inside the window and not seen. */
  ok(counter: number): boolean {
    if (counter > this.#top) return true;
    if (this.#top - counter >= ReplayWindow.SIZE) return false;
    const bit = counter % ReplayWindow.SIZE;
    return (this.#bits[bit >>> 5]! & (1 << (bit & 31))) === 0;
  }

  /** Records `counter` as seen (it passed {@link ok} and was authentic); @returns false when it had been seen already. */
  accept(counter: number): boolean {
    if (!this.ok(counter)) return false;
    if (counter > this.#top) {
      // clear the bits of the counters the window slides over (all of them after a jump of a window or more)
      const from = this.#top + 1;
      if (counter - from >= ReplayWindow.SIZE) this.#bits.fill(0);
      else for (let c = from; c <= counter; c++) this.#bits[(c % ReplayWindow.SIZE) >>> 5]! &= ~(1 << (c % ReplayWindow.SIZE & 31));
      this.#top = counter;
    }
    const bit = counter % ReplayWindow.SIZE;
    this.#bits[bit >>> 5]! |= 1 << (bit & 31);
    return true;
  }
}

/** When a sending key is due for replacement: after this many datagrams or this long, whichever comes first. */
export const REKEY_AFTER_PACKETS = 2 ** 40;
export const REKEY_AFTER_MS = 120_000;
/** A receiving key stays valid this long after its successor arrived (datagrams in flight under the old one). */
export const OLD_KEY_GRACE_MS = 10_000;

/** Whether a sending key used for `packets` datagrams, created `ageMs` ago, is due for rotation. */
export function rekeyDue(packets: number, ageMs: number, limits = { packets: REKEY_AFTER_PACKETS, ms: REKEY_AFTER_MS }): boolean {
  return packets >= limits.packets || ageMs >= limits.ms;
}

const VIRTIO_NET_HDR_F_NEEDS_CSUM = 1;
const VIRTIO_NET_HDR_GSO_NONE = 0;
const VIRTIO_NET_HDR_GSO_TCPV4 = 1;
const TCP_FIN = 0x01;
const TCP_PSH = 0x08;
const TCP_CWR = 0x80;

/**
 * Calls `emit` with each packet (virtio header first) that carries `pkt` in pieces of at most `maxIp` bytes of IP
 * packet: `pkt` itself when it fits, else, for a TCP/IPv4 superpacket (GSO TCPV4), its segments of at most its
 * gso_size, each with its own IPv4 header (length, id + i, checksum), TCP sequence number, flags (FIN and PSH on the
 * last only, CWR on the first only) and a virtio header asking for the TCP checksum to be completed (NEEDS_CSUM, the
 * pseudo-header sum in the checksum field), as the kernel's own segmentation does. `scratch` must hold the largest
 * segment; each emitted segment is a view of it, valid during the call.
 * @returns false when `pkt` is too big and cannot be split (not a TCP/IPv4 superpacket, or segments above maxIp).
 */
export function forEachSegment(pkt: Uint8Array, maxIp: number, scratch: Uint8Array, emit: (seg: Uint8Array) => void): boolean {
  if (pkt.length - VNET_HDR_LEN <= maxIp) {
    emit(pkt);
    return true;
  }
  if (pkt.length < VNET_HDR_LEN + 40 || (pkt[1]! & 0x7f) !== VIRTIO_NET_HDR_GSO_TCPV4) return false;
  const gsoSize = pkt[4]! | (pkt[5]! << 8);
  const ip = VNET_HDR_LEN;
  if (pkt[ip]! >> 4 !== 4 || pkt[ip + 9] !== 6) return false;
  const ihl = (pkt[ip]! & 15) * 4;
  const tcp = ip + ihl;
  if (pkt.length < tcp + 20) return false;
  const thl = (pkt[tcp + 12]! >> 4) * 4;
  const payload = tcp + thl;
  const headers = ihl + thl;
  if (gsoSize < 1 || headers + gsoSize > maxIp || payload > pkt.length || scratch.length < VNET_HDR_LEN + headers + gsoSize) return false;
  const id0 = (pkt[ip + 4]! << 8) | pkt[ip + 5]!;
  const seq0 = readU32(pkt, tcp + 4);
  const flags = pkt[tcp + 13]!;
  const src = [readU16(pkt, ip + 12), readU16(pkt, ip + 14), readU16(pkt, ip + 16), readU16(pkt, ip + 18)];
  let i = 0;
  for (let off = payload; off < pkt.length; off += gsoSize, i++) {
    const n = Math.min(gsoSize, pkt.length - off);
    const last = off + n >= pkt.length;
    const seg = scratch.subarray(0, VNET_HDR_LEN + headers + n);
    seg.set(pkt.subarray(ip, payload), VNET_HDR_LEN);
    seg.set(pkt.subarray(off, off + n), VNET_HDR_LEN + headers);
    // virtio header: complete the TCP checksum, no GSO
    seg.fill(0, 0, VNET_HDR_LEN);
    seg[0] = VIRTIO_NET_HDR_F_NEEDS_CSUM;
    seg[1] = VIRTIO_NET_HDR_GSO_NONE;
    seg[6] = ihl & 255; // csum_start (LE): from the IP header's start
    seg[8] = 16; // csum_offset: TCP's checksum field
    const sip = VNET_HDR_LEN;
    const total = headers + n;
    writeU16(seg, sip + 2, total);
    writeU16(seg, sip + 4, (id0 + i) & 0xffff);
    writeU16(seg, sip + 10, 0);
    writeU16(seg, sip + 10, ~fold(sum16(seg, sip, ihl)) & 0xffff);
    const st = sip + ihl;
    writeU32(seg, st + 4, (seq0 + i * gsoSize) >>> 0);
    let f = flags;
    if (!last) f &= ~(TCP_FIN | TCP_PSH);
    if (i > 0) f &= ~TCP_CWR;
    seg[st + 13] = f;
    // the pseudo-header sum, not complemented, as CHECKSUM_PARTIAL wants it
    writeU16(seg, st + 16, fold(src[0]! + src[1]! + src[2]! + src[3]! + 6 + thl + n));
    emit(seg);
  }
  return true;
}

function readU16(b: Uint8Array, o: number): number {
  return (b[o]! << 8) | b[o + 1]!;
}

function writeU16(b: Uint8Array, o: number, v: number): void {
  b[o] = (v >>> 8) & 255;
  b[o + 1] = v & 255;
}

function readU32(b: Uint8Array, o: number): number {
  return ((b[o]! << 24) >>> 0) + (b[o + 1]! << 16) + (b[o + 2]! << 8) + b[o + 3]!;
}

function writeU32(b: Uint8Array, o: number, v: number): void {
  b[o] = (v >>> 24) & 255;
  b[o + 1] = (v >>> 16) & 255;
  b[o + 2] = (v >>> 8) & 255;
  b[o + 3] = v & 255;
}
