/**
 * Pairs of TCP sockets joined in the kernel (native/atoll-splice.c, built by the set-up into bin/libatoll-dp.so and
 * called through koffi): the relay's circuits (src/relay/circuits.ts). The library's worker threads (one per CPU, at
 * most 8, shared by every join) splice(2) each direction through a pipe as epoll says its sockets are ready, so the
 * relay neither copies the bytes into its process nor runs any JavaScript per chunk, and its thread count does not
 * grow with its circuits.
 *
 * Why: joined in JavaScript (a `data` event per chunk, a fresh Buffer each, written to the other socket), the relay
 * took 40 to 50 % of a core for one relayed flow of 4 Gbit/s and held 147 MiB at its peak (bench/README.md), on a
 * machine where the two agents and the pods share the same cores.
 *
 * A join takes over both sockets: what Node had read from them already goes on first, the library works on
 * duplicates of their descriptors, and the sockets themselves are destroyed (closing Node's descriptors, not the
 * connections). When either end closes or fails, both are closed; the library then writes a byte to the joins'
 * notify pipe, read here, and `onDone` gets the join.
 */
import { Socket } from 'node:net';
import koffi from 'koffi';
import { atollError } from '../../core/errors.ts';
import { errnoText } from '../kernel/errno.ts';
import { openNativeLibrary } from './native-library.ts';

type Ptr = unknown;
interface Lib {
  join: (a: number, b: number, notify: number, earlyA: Uint8Array | null, lenA: number, earlyB: Uint8Array | null, lenB: number) => Ptr;
  bytes: (j: Ptr) => number;
  done: (j: Ptr) => number;
  free: (j: Ptr) => number;
  notifier: (out: Int32Array) => number;
  close: (fd: number) => void;
}

let lib: Lib | undefined;

function load(): Lib {
  if (lib) return lib;
  const l = openNativeLibrary('the relay\'s circuits', 'run the set-up (make setup builds it) and the project\'s Node');
  lib = {
    join: l.func('void *atoll_splice_join(int a, int b, int notify, const uint8_t *earlyA, uint32_t lenA, const uint8_t *earlyB, uint32_t lenB)') as Lib['join'],
    bytes: l.func('double atoll_splice_bytes(void *j)') as Lib['bytes'],
    done: l.func('int atoll_splice_done(void *j)') as Lib['done'],
    free: l.func('double atoll_splice_free(void *j)') as Lib['free'],
    notifier: l.func('int atoll_splice_notifier(_Out_ int *fds)') as Lib['notifier'],
    close: l.func('void atoll_splice_close(int fd)') as Lib['close'],
  };
  return lib;
}

/** One joined pair. */
export class SpliceJoin {
  readonly label: string;
  readonly #lib: Lib;
  #handle: Ptr | null;
  #freedBytes = 0;

  constructor(lib: Lib, handle: Ptr, label: string) {
    this.#lib = lib;
    this.#handle = handle;
    this.label = label;
  }

  /** Bytes carried so far, both directions. */
  get bytes(): number {
    return this.#handle === null ? this.#freedBytes : this.#lib.bytes(this.#handle);
  }

  get done(): boolean {
    return this.#handle === null || this.#lib.done(this.#handle) === 1;
  }

  /** Ends the join if it still runs and frees it (once its worker dropped it; its descriptors closed); idempotent. */
  free(): void {
    if (this.#handle === null) return;
    this.#freedBytes = this.#lib.free(this.#handle);
    this.#handle = null;
  }
}

/** A descriptor of a connected net.Socket (Node keeps it on the socket's handle). */
function fdOf(socket: Socket): number {
  const fd = (socket as unknown as { _handle?: { fd?: number } })._handle?.fd;
  // cannot happen: the relay joins only connected TCP sockets, after checking that neither end was destroyed (src/relay/circuits.ts)
  if (fd === undefined || fd < 0) throw new Error('the socket has no descriptor (closed, or not a TCP socket)');
  return fd;
}

/** What Node read from `socket` and nobody consumed yet (the socket is paused), or null. */
function buffered(socket: Socket): Buffer | null {
  const chunk = socket.read() as Buffer | null;
  return chunk === null || chunk.length === 0 ? null : chunk;
}

/** The joins of one owner, and the pipe that tells when one is done. */
export class SpliceJoins {
  readonly #lib: Lib;
  readonly #notifyWrite: number;
  readonly #reader: Socket;
  readonly #joins = new Set<SpliceJoin>();
  #closed = false;

  /** `onDone` is called once per join whose ends closed, after it was freed. */
  constructor(onDone: (j: SpliceJoin) => void) {
    this.#lib = load();
    const fds = new Int32Array(2);
    const rc = this.#lib.notifier(fds);
    if (rc < 0) throw atollError('KERNEL_OP_FAILED', `a pipe for the relay's circuits failed: errno ${-rc}`, 'check the relay\'s limits (ulimit -n)');
    this.#notifyWrite = fds[1]!;
    this.#reader = new Socket({ fd: fds[0]!, readable: true, writable: false });
    this.#reader.on('data', () => {
      for (const j of this.#joins) {
        if (!j.done) continue;
        this.#joins.delete(j);
        j.free();
        onDone(j);
      }
    });
    this.#reader.unref();
  }

  /**
   * Joins `a` and `b` (connected TCP sockets, paused) and destroys both sockets: from now on the library carries
   * their connections. @throws AtollError KERNEL_OP_FAILED when the library could not start the join (the sockets are
   * destroyed too).
   */
  join(a: Socket, b: Socket, label: string): SpliceJoin {
    try {
      // cannot happen: the relay's circuits drop every waiting offer before they close the joins, so no pair comes after
      if (this.#closed) throw new Error('the joins were closed');
      const ea = buffered(a);
      const eb = buffered(b);
      const handle = this.#lib.join(fdOf(a), fdOf(b), this.#notifyWrite, ea, ea?.length ?? 0, eb, eb?.length ?? 0);
      if (handle === null) throw atollError('KERNEL_OP_FAILED', `joining circuit ${label} failed: ${errnoText(koffi.errno())}`, 'check the relay\'s limits (ulimit -n, memory); the two nodes ask for another circuit');
      const j = new SpliceJoin(this.#lib, handle, label);
      this.#joins.add(j);
      return j;
    } finally {
      a.destroy();
      b.destroy();
    }
  }

  /** Bytes carried by the joins still open. */
  get openBytes(): number {
    let n = 0;
    for (const j of this.#joins) n += j.bytes;
    return n;
  }

  get size(): number {
    return this.#joins.size;
  }

  /** Ends and frees every join, then the pipe; idempotent. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    for (const j of this.#joins) j.free();
    this.#joins.clear();
    this.#reader.destroy();
    this.#lib.close(this.#notifyWrite);
  }
}
