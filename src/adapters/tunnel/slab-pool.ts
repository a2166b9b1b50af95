/**
 * Buffers for the tunnel's data path carved out of 1 MiB slabs that are reused once every piece handed out of them
 * was given back: no allocation per packet or frame.
 *
 * Why: the data path moves hundreds of MB a second; a fresh buffer per packet (or per assembled frame) kept V8's full
 * mark-compact collector running several times a second and cost a third of a core in GC threads (docs/architecture.md,
 * "The data path"). A piece is handed out by {@link SlabPool.region} + {@link SlabPool.commit} (read into the region,
 * then claim what was read), and given back with {@link SlabPool.release} once nothing
 * refers to it any more (its stream wrote it, or it was dropped). A piece never given back only keeps its slab from
 * being reused; at most `keep` slabs are pooled, further ones are left to the garbage collector.
 */

/** A slab and how many pieces of it are out (handed out and not released). */
interface Slab {
  readonly buf: Buffer;
  out: number;
  /** Full, and waiting for its last pieces to come back before it is reused. */
  retired: boolean;
}

export class SlabPool {
  readonly #slabSize: number;
  readonly #keep: number;
  /** Pooled slabs by their memory, to find a released piece's slab. */
  readonly #slabs = new Map<ArrayBufferLike, Slab>();
  /** Pooled slabs with nothing out, ready for reuse. */
  readonly #free: Slab[] = [];
  #slab: Slab;
  #used = 0;

  constructor(opts: { readonly slabSize?: number; readonly keep?: number } = {}) {
    this.#slabSize = opts.slabSize ?? 1024 * 1024;
    this.#keep = opts.keep ?? 32;
    this.#slab = this.#newSlab();
  }

  /**
   * Room for up to `size` bytes with `headroom` free bytes in front of them (in the same buffer), in the current slab
   * or the next one. Nothing is claimed until {@link commit}. @throws RangeError when it cannot fit in a slab.
   */
  region(headroom: number, size: number): Buffer {
    if (headroom + size > this.#slabSize) throw new RangeError(`${headroom} + ${size} bytes do not fit in a ${this.#slabSize}-byte slab`);
    if (this.#used + headroom + size > this.#slabSize) {
      if (this.#slab.out > 0) {
        this.#slab.retired = true;
        this.#slab = this.#free.pop() ?? this.#newSlab();
      }
      this.#used = 0;
    }
    const start = this.#used + headroom;
    return this.#slab.buf.subarray(start, start + size);
  }

  /** Claims the first `n` bytes of `region`, the last one {@link region} returned; the piece to give back later. */
  commit(region: Buffer, n: number): Buffer {
    this.#used = region.byteOffset - this.#slab.buf.byteOffset + n;
    this.#slab.out++;
    return region.subarray(0, n);
  }

  /** Gives back a piece this pool handed out (anything else is ignored): its bytes may be reused from now on. */
  release(piece: Uint8Array): void {
    const slab = this.#slabs.get(piece.buffer);
    if (slab === undefined || --slab.out > 0 || !slab.retired) return;
    slab.retired = false;
    this.#free.push(slab);
  }

  /** Pieces handed out and not given back (for tests and metrics). */
  get out(): number {
    let n = 0;
    for (const slab of this.#slabs.values()) n += slab.out;
    return n;
  }

  #newSlab(): Slab {
    // allocUnsafeSlow: a slab of its own memory (allocUnsafe may hand out a view of a shared pool)
    const slab: Slab = { buf: Buffer.allocUnsafeSlow(this.#slabSize), out: 0, retired: false };
    if (this.#slabs.size < this.#keep) this.#slabs.set(slab.buf.buffer, slab);
    return slab;
  }
}
