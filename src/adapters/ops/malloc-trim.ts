/**
 * Gives the C heap's free pages back to the kernel: glibc's `malloc_trim(0)`. `free` returns memory only from the top
 * of a heap; what a process frees below it (OpenSSL's buffers, libuv's requests, koffi's calls) stays resident until
 * a trim. The agent trims after each resync (docs/architecture.md, "Memory").
 */
import { mallocTrimCall } from '../kernel/libc.ts';

let trim: ((pad: number) => number) | undefined | null;

/** Trims the C heap; a libc without `malloc_trim` (not glibc) makes this do nothing. */
export function trimMalloc(): void {
  if (trim === undefined) {
    try {
      trim = mallocTrimCall();
    } catch {
      trim = null;
    }
  }
  trim?.(0);
}
