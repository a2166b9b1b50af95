/**
 * Gives the C heap's free pages back to the kernel: glibc's `malloc_trim(0)`. `free` returns memory only from the top
 * of a heap; what a process frees below it (OpenSSL's buffers, libuv's requests, koffi's calls) stays resident until
 * a trim. The agent trims after each resync (docs/architecture.md, "Memory").
 */
import koffi from 'koffi';

let trim: ((pad: number) => number) | undefined | null;

/** Trims the C heap; a libc without `malloc_trim` (not glibc) makes this do nothing. */
export function trimMalloc(): void {
  if (trim === undefined) {
    try {
      trim = koffi.load('libc.so.6').func('int malloc_trim(size_t pad)') as (pad: number) => number;
    } catch {
      trim = null;
    }
  }
  trim?.(0);
}
