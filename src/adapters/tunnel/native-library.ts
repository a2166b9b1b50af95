/**
 * bin/libatoll-dp.so, Atoll's C library: the datagram path's per-datagram work (native/atoll-dp.c,
 * src/adapters/tunnel/datagram-native.ts) and the relay's circuits (native/atoll-splice.c, src/adapters/tunnel/splice-native.ts),
 * built by the set-up and opened with koffi by whichever part needs it.
 */
import { join } from 'node:path';
import koffi from 'koffi';
import { atollError } from '../../core/errors.ts';
import { installRoot } from '../install-root.ts';

/** Where the set-up puts the library, under the install root (the checkout, or /opt/atoll in the image). */
export const NATIVE_LIBRARY = 'bin/libatoll-dp.so';

/**
 * The library, opened for `needs` (what needs it, named in the error with `detail` after the path).
 * @throws AtollError KERNEL_OP_FAILED when it does not load, with `remedy` as what to do.
 */
export function openNativeLibrary(needs: string, remedy: string, detail = ''): ReturnType<typeof koffi.load> {
  const path = join(installRoot(), NATIVE_LIBRARY);
  try {
    return koffi.load(path);
  } catch (cause) {
    throw atollError('KERNEL_OP_FAILED', `${needs} needs ${path}, which did not load${detail}`, remedy, cause);
  }
}
