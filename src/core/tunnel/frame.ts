/**
 * Framing of tunnel packets on a byte stream: a 4-byte big-endian length, then the packet (its 10-byte virtio-net
 * header and the IP packet, as read from the TUN device). Pure: no I/O, no `node:` imports.
 *
 * Why 4 bytes: with GSO offloads a TUN read returns superpackets of up to 64 KB (GUIDE 3.1), which 2 bytes cannot
 * length.
 */

/** Bytes of the length prefix. */
export const FRAME_HEADER = 4;
/** The largest payload a frame may carry: a 64 KB IP packet plus its virtio-net header. */
export const MAX_FRAME_PAYLOAD = 65_535 + 10;

/** Writes the length prefix for a payload of `length` bytes into `buf` at `offset`. */
export function writeFrameHeader(buf: Uint8Array, offset: number, length: number): void {
  if (!Number.isInteger(length) || length < 1 || length > MAX_FRAME_PAYLOAD) throw new RangeError(`frame payload of ${length} bytes is outside 1..${MAX_FRAME_PAYLOAD}`);
  buf[offset] = length >>> 24;
  buf[offset + 1] = (length >>> 16) & 255;
  buf[offset + 2] = (length >>> 8) & 255;
  buf[offset + 3] = length & 255;
}

/** One frame (prefix and payload) in a new array. */
export function encodeFrame(payload: Uint8Array): Uint8Array {
  const out = new Uint8Array(FRAME_HEADER + payload.length);
  writeFrameHeader(out, 0, payload.length);
  out.set(payload, FRAME_HEADER);
  return out;
}

/** A stream that breaks the framing: the peer is broken or hostile, and its stream must be closed. */
export class FrameError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'FrameError';
  }
}

/**
 * Incremental decoder: feed it the stream's chunks in order; it calls `onFrame` once per whole payload, in order.
 * A payload lying wholly inside one chunk is handed out as a view of that chunk (no copy), so `onFrame` must be done
 * with it before the chunk's memory is reused; a payload split across chunks is assembled in a fresh array.
 * @throws FrameError on a zero or oversized length; the decoder is then unusable.
 */
export class FrameDecoder {
  private readonly header = new Uint8Array(FRAME_HEADER);
  private headerHave = 0;
  private partial: Uint8Array | undefined;
  private partialHave = 0;
  private broken = false;

  /** Bytes received but not yet handed out as a frame. */
  get pending(): number {
    return this.headerHave + this.partialHave + (this.partial ? FRAME_HEADER : 0);
  }

  push(chunk: Uint8Array, onFrame: (payload: Uint8Array) => void): void {
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
          onFrame(done);
        }
        continue;
      }
      let length: number;
      if (this.headerHave === 0 && end - pos >= FRAME_HEADER) {
        length = ((chunk[pos]! << 24) >>> 0) + (chunk[pos + 1]! << 16) + (chunk[pos + 2]! << 8) + chunk[pos + 3]!;
        pos += FRAME_HEADER;
      } else {
        while (this.headerHave < FRAME_HEADER && pos < end) this.header[this.headerHave++] = chunk[pos++]!;
        if (this.headerHave < FRAME_HEADER) return;
        const h = this.header;
        length = ((h[0]! << 24) >>> 0) + (h[1]! << 16) + (h[2]! << 8) + h[3]!;
        this.headerHave = 0;
      }
      if (length < 1 || length > MAX_FRAME_PAYLOAD) {
        this.broken = true;
        throw new FrameError(`frame length ${length} is outside 1..${MAX_FRAME_PAYLOAD}`);
      }
      if (end - pos >= length) {
        onFrame(chunk.subarray(pos, pos + length));
        pos += length;
      } else {
        this.partial = new Uint8Array(length);
        this.partialHave = 0;
      }
    }
  }
}
