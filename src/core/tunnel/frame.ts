/**
 * Framing of tunnel traffic on a byte stream. Pure: no I/O, no `node:` imports.
 *
 *   frame = kind (1 byte) | length (3 bytes, big-endian) | payload (length bytes)
 *
 * Kinds: a packet (its 10-byte virtio-net header and the IP packet, as read from the TUN device); a control message
 * (JSON: keepalive pings, the relay's observed address and circuit offers); and, on a stream to the relay, a relayed
 * control message (hole punching), whose payload starts with the 32-byte id (sha256 of the public key, the pin's
 * digest) of the other end: the destination when a node sends it, the origin when the relay delivers it. Kind 2 was
 * a packet relayed inside the stream to the relay; packets now cross the relay in circuits (src/relay/circuits.ts),
 * end to end, and kind 2 is refused.
 *
 * Why 3 length bytes: with GSO offloads a TUN read returns superpackets of up to 64 KB (src/adapters/tunnel/tun.ts), which
 * 2 bytes cannot length, and 24 bits hold any frame.
 */
import { AtollError, atollError } from '../errors.ts';

export const FRAME_KIND = Object.freeze({ packet: 0, control: 1, relayedControl: 3 });
export type FrameKind = (typeof FRAME_KIND)[keyof typeof FRAME_KIND];

/** Bytes of the kind and length prefix. */
export const FRAME_HEADER = 4;
/** Bytes of a peer id (sha256 digest of its public key) at the front of a relayed frame's payload. */
export const PEER_ID_LEN = 32;
/** The largest payload a frame may carry: a 64 KB IP packet plus its virtio-net header. */
export const MAX_FRAME_PAYLOAD = 65_535 + 10;

/** Writes the prefix for a `kind` frame of `length` payload bytes into `buf` at `offset`. */
export function writeFrameHeader(buf: Uint8Array, offset: number, length: number, kind: FrameKind = FRAME_KIND.packet): void {
  // cannot happen: frames hold an IPv4 packet from the TUN device (at least a header, its total length a 16-bit field),
  // a control message Atoll wrote itself, or the payload of a frame the decoder already checked against these bounds
  if (!Number.isInteger(length) || length < 1 || length > MAX_FRAME_PAYLOAD) throw new RangeError(`frame payload of ${length} bytes is outside 1..${MAX_FRAME_PAYLOAD}`);
  buf[offset] = kind;
  buf[offset + 1] = (length >>> 16) & 255;
  buf[offset + 2] = (length >>> 8) & 255;
  buf[offset + 3] = length & 255;
}

/** One frame (prefix and payload) in a new array. */
export function encodeFrame(payload: Uint8Array, kind: FrameKind = FRAME_KIND.packet): Uint8Array {
  const out = new Uint8Array(FRAME_HEADER + payload.length);
  writeFrameHeader(out, 0, payload.length, kind);
  out.set(payload, FRAME_HEADER);
  return out;
}

/**
 * The peer id (32 bytes) of a pin `sha256:<64 hex>`.
 * @throws AtollError TUNNEL_PIN_INVALID on anything else (a peer's pin is a node record's tunnelKey, which the
 *   controller refuses in any other form, but a Kubernetes store's node annotations can be edited by hand).
 */
export function peerIdOfPin(pin: string): Uint8Array {
  const m = /^sha256:([0-9a-f]{64})$/.exec(pin);
  if (!m) {
    throw atollError('TUNNEL_PIN_INVALID', `"${pin.slice(0, 80)}" is not a key pin (sha256:<64 hex digits>)`,
      "the node record with this tunnelKey was not written by an Atoll agent of this version: restart that node's agent, or deregister the node and join it again");
  }
  const hex = m[1] as string;
  const out = new Uint8Array(PEER_ID_LEN);
  for (let i = 0; i < PEER_ID_LEN; i++) out[i] = Number.parseInt(hex.slice(2 * i, 2 * i + 2), 16);
  return out;
}

/** The pin (`sha256:<hex>`) of a peer id. */
export function pinOfPeerId(id: Uint8Array): string {
  // on the relayed packet path (the relay and the receiver look peers up by pin): a table, no per-byte formatting
  let pin = 'sha256:';
  for (let i = 0; i < PEER_ID_LEN; i++) pin += HEX[id[i] as number];
  return pin;
}

const HEX: readonly string[] = Array.from({ length: 256 }, (_, b) => b.toString(16).padStart(2, '0'));

/**
 * A stream that breaks the framing: the peer is broken or hostile, and its stream must be closed. Code
 * TUNNEL_FRAME_INVALID; the message names the kind and length read.
 */
export class FrameError extends AtollError {
  constructor(message: string) {
    super('TUNNEL_FRAME_INVALID', { message, fix: 'the far end speaks another tunnel protocol or is broken: run the same Atoll version on agents and relay' });
    this.name = 'FrameError';
  }
}

/**
 * Incremental decoder: feed it the stream's chunks in order; it calls `onFrame` once per whole frame, in order,
 * with its kind and payload.
 * A payload lying wholly inside one chunk is handed out as a view of that chunk (no copy), so `onFrame` must be done
 * with it before the chunk's memory is reused; a payload split across chunks is assembled in a buffer the decoder
 * reuses, or a fresh array. Either
 * way the frame's own prefix lies right in front of the payload in the same buffer, so a whole frame can be passed
 * on without a copy (a relay does).
 * @throws FrameError on an unknown kind or a zero or oversized length; the decoder is then unusable.
 */
export class FrameDecoder {
  private readonly header = new Uint8Array(FRAME_HEADER);
  private headerHave = 0;
  private partial: Uint8Array | undefined;
  private partialHave = 0;
  private partialKind: FrameKind = FRAME_KIND.packet;
  private broken = false;
  /** With `reuse`, the one buffer assembled payloads are built in (they are then only valid during `onFrame`). */
  private readonly assembly: Uint8Array | undefined;

  /**
   * @param opts.reuse assemble split payloads in one buffer kept for the decoder's life instead of a fresh one each:
   *   no allocation per frame, for a consumer that is done with every payload when `onFrame` returns (an agent
   *   writes it to its TUN device at once; a relay, which queues it, must not set this).
   */
  constructor(opts: { readonly reuse?: boolean } = {}) {
    this.assembly = opts.reuse ? new Uint8Array(FRAME_HEADER + MAX_FRAME_PAYLOAD) : undefined;
  }

  /** Bytes received but not yet handed out as a frame. */
  get pending(): number {
    return this.headerHave + this.partialHave + (this.partial ? FRAME_HEADER : 0);
  }

  push(chunk: Uint8Array, onFrame: (payload: Uint8Array, kind: FrameKind) => void): void {
    if (this.broken) throw new FrameError('frame decoder used after a framing error');
    let pos = 0;
    const end = chunk.length;
    while (pos < end) {
      if (this.partial) {
        const take = Math.min(this.partial.length - this.partialHave, end - pos);
        this.partial.set(chunk.subarray(pos, pos + take), this.partialHave);
        this.partialHave += take;
        pos += take;
        if (this.partialHave === this.partial.length) {
          const done = this.partial;
          this.partial = undefined;
          this.partialHave = 0;
          onFrame(done, this.partialKind);
        }
        continue;
      }
      let length: number;
      let kind: number;
      if (this.headerHave === 0 && end - pos >= FRAME_HEADER) {
        kind = chunk[pos]!;
        length = (chunk[pos + 1]! << 16) + (chunk[pos + 2]! << 8) + chunk[pos + 3]!;
        pos += FRAME_HEADER;
      } else {
        while (this.headerHave < FRAME_HEADER && pos < end) this.header[this.headerHave++] = chunk[pos++]!;
        if (this.headerHave < FRAME_HEADER) return;
        const h = this.header;
        kind = h[0]!;
        length = (h[1]! << 16) + (h[2]! << 8) + h[3]!;
        this.headerHave = 0;
      }
      if (length < 1 || length > MAX_FRAME_PAYLOAD) {
        this.broken = true;
        throw new FrameError(`frame length ${length} is outside 1..${MAX_FRAME_PAYLOAD}`);
      }
      if ((kind !== FRAME_KIND.packet && kind !== FRAME_KIND.control && kind !== FRAME_KIND.relayedControl) || (kind === FRAME_KIND.relayedControl && length <= PEER_ID_LEN)) {
        this.broken = true;
        throw new FrameError(`frame kind ${kind} of ${length} bytes is not one this decoder knows`);
      }
      if (end - pos >= length) {
        onFrame(chunk.subarray(pos, pos + length), kind as FrameKind);
        pos += length;
      } else {
        const whole = this.assembly ? this.assembly.subarray(0, FRAME_HEADER + length) : new Uint8Array(FRAME_HEADER + length);
        writeFrameHeader(whole, 0, length, kind as FrameKind);
        this.partial = whole.subarray(FRAME_HEADER);
        this.partialHave = 0;
        this.partialKind = kind as FrameKind;
      }
    }
  }
}
