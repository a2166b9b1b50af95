/**
 * The receiving half of the datagram path's segmentation (native/atoll-dp.c `atoll_dp_send`): consecutive TCP/IPv4
 * segments of one flow merged back into one superpacket for the TUN device (virtio GSO TCPV4), as the kernel's GRO
 * does. One superpacket write instead of dozens of segment writes: the kernel then forwards and delivers a 64 KB
 * packet at the cost of one. Pure: no I/O, no `node:` imports.
 *
 * Segments merge while they continue the flow exactly: same addresses, ports, TTL and TOS, same TCP header (options
 * included, byte for byte), same acknowledgement, window and flags but PSH, the next sequence number, and a payload of
 * the first segment's size (the last may be shorter; it, or one with PSH, ends the superpacket). Anything else (SYN,
 * FIN, RST, URG, fragments, IP options, another flow) flushes what was merged and passes on as it came.
 */
import { fold, sum16 } from '../net/checksum.ts';
import { VNET_HDR_LEN } from './routing.ts';

/** The largest superpacket built: an IP packet's limit. */
const MAX_IP = 65_535;
const TCP_PSH = 0x08;
/** Flags that never merge: FIN, SYN, RST, URG, ECE, CWR. */
const TCP_NO_MERGE = 0x01 | 0x02 | 0x04 | 0x20 | 0x40 | 0x80;
const IPV4_HEADER = 20;

export class TcpCoalescer {
  readonly #buf: Uint8Array;
  readonly #emit: (pkt: Uint8Array) => void;
  /** Bytes in #buf (virtio header included); 0 when nothing is held. */
  #len = 0;
  #segments = 0;
  #mss = 0;
  #thl = 0;
  #nextSeq = 0;
  /** Whether the held packet may take more segments (its last was full-sized and had no PSH). */
  #open = false;

  /** `emit` gets every packet to write to the TUN device, a view valid during the call. */
  constructor(emit: (pkt: Uint8Array) => void) {
    this.#buf = new Uint8Array(VNET_HDR_LEN + MAX_IP);
    this.#emit = emit;
  }

  /** One packet (virtio header first), merged into the held superpacket, held to merge, or passed on. */
  push(pkt: Uint8Array): void {
    const info = mergeable(pkt);
    if (info === undefined) {
      this.flush();
      this.#emit(pkt);
      return;
    }
    if (this.#len > 0 && this.#continues(pkt, info)) {
      this.#buf.set(pkt.subarray(VNET_HDR_LEN + IPV4_HEADER + info.thl), this.#len);
      this.#len += info.payload;
      this.#segments++;
      this.#nextSeq = (this.#nextSeq + info.payload) >>> 0;
      this.#buf[VNET_HDR_LEN + IPV4_HEADER + 13]! |= pkt[VNET_HDR_LEN + IPV4_HEADER + 13]! & TCP_PSH;
      this.#open = info.payload === this.#mss && (info.flags & TCP_PSH) === 0;
      if (!this.#open) this.flush();
      return;
    }
    this.flush();
    this.#buf.set(pkt);
    this.#len = pkt.length;
    this.#segments = 1;
    this.#mss = info.payload;
    this.#thl = info.thl;
    this.#nextSeq = (info.seq + info.payload) >>> 0;
    this.#open = (info.flags & TCP_PSH) === 0;
    if (!this.#open) this.flush();
  }

  #continues(pkt: Uint8Array, info: Segment): boolean {
    if (!this.#open || info.thl !== this.#thl || info.seq !== this.#nextSeq || info.payload > this.#mss || this.#len + info.payload > VNET_HDR_LEN + MAX_IP) return false;
    const b = this.#buf;
    const ip = VNET_HDR_LEN;
    // version/IHL and TOS; flags/fragment offset, TTL, protocol; addresses
    if (pkt[ip] !== b[ip] || pkt[ip + 1] !== b[ip + 1]) return false;
    for (let i = 6; i < 10; i++) if (pkt[ip + i] !== b[ip + i]) return false;
    for (let i = 12; i < 20; i++) if (pkt[ip + i] !== b[ip + i]) return false;
    const t = ip + IPV4_HEADER;
    // ports; acknowledgement; data offset, flags but PSH, window; options
    for (let i = 0; i < 4; i++) if (pkt[t + i] !== b[t + i]) return false;
    for (let i = 8; i < 13; i++) if (pkt[t + i] !== b[t + i]) return false;
    if ((pkt[t + 13]! & ~TCP_PSH) !== (b[t + 13]! & ~TCP_PSH) || pkt[t + 14] !== b[t + 14] || pkt[t + 15] !== b[t + 15]) return false;
    for (let i = 20; i < info.thl; i++) if (pkt[t + i] !== b[t + i]) return false;
    return true;
  }

  /** Writes out the held packet, a superpacket when segments were merged. */
  flush(): void {
    if (this.#len === 0) return;
    const b = this.#buf;
    const pkt = b.subarray(0, this.#len);
    if (this.#segments > 1) {
      const ip = VNET_HDR_LEN;
      const total = this.#len - VNET_HDR_LEN;
      const thl = this.#thl;
      b.fill(0, 0, VNET_HDR_LEN);
      b[0] = 1; // NEEDS_CSUM
      b[1] = 1; // GSO TCPV4
      b[2] = IPV4_HEADER + thl; // hdr_len (LE)
      b[4] = this.#mss & 255; // gso_size (LE)
      b[5] = this.#mss >> 8;
      b[6] = IPV4_HEADER; // csum_start (LE), from the IP header
      b[8] = 16; // csum_offset
      b[ip + 2] = total >> 8;
      b[ip + 3] = total & 255;
      b[ip + 10] = 0;
      b[ip + 11] = 0;
      const ipSum = ~fold(sum16(b, ip, IPV4_HEADER)) & 0xffff;
      b[ip + 10] = ipSum >> 8;
      b[ip + 11] = ipSum & 255;
      const tcpLen = total - IPV4_HEADER;
      const pseudo = fold(sum16(b, ip + 12, 8) + 6 + tcpLen);
      b[ip + IPV4_HEADER + 16] = pseudo >> 8;
      b[ip + IPV4_HEADER + 17] = pseudo & 255;
    }
    this.#len = 0;
    this.#segments = 0;
    this.#open = false;
    this.#emit(pkt);
  }
}

interface Segment {
  readonly thl: number;
  readonly seq: number;
  readonly payload: number;
  readonly flags: number;
}

/** The TCP facts of a packet that may merge: IPv4 without options or fragments, TCP with payload and mergeable flags. */
function mergeable(pkt: Uint8Array): Segment | undefined {
  const ip = VNET_HDR_LEN;
  if (pkt.length < ip + IPV4_HEADER + 20 || pkt[ip] !== 0x45 || pkt[ip + 9] !== 6 || pkt[1] !== 0) return undefined;
  if ((pkt[ip + 6]! & 0x3f) !== 0 || pkt[ip + 7] !== 0) return undefined; // MF or a fragment offset
  const total = (pkt[ip + 2]! << 8) | pkt[ip + 3]!;
  if (total !== pkt.length - ip) return undefined;
  const t = ip + IPV4_HEADER;
  const thl = (pkt[t + 12]! >> 4) * 4;
  const flags = pkt[t + 13]!;
  const payload = total - IPV4_HEADER - thl;
  if (thl < 20 || payload <= 0 || (flags & TCP_NO_MERGE) !== 0) return undefined;
  const seq = ((pkt[t + 4]! << 24) >>> 0) + (pkt[t + 5]! << 16) + (pkt[t + 6]! << 8) + pkt[t + 7]!;
  return { thl, seq, payload, flags };
}
