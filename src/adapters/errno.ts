/** How a failed system call reads in an error message. */
import { getSystemErrorMessage, getSystemErrorName } from 'node:util';

/** `ENOENT (no such file or directory)` for a positive errno; `errno N` when Node does not know it. */
export function errnoText(errno: number): string {
  try {
    return `${getSystemErrorName(-errno)} (${getSystemErrorMessage(-errno)})`;
  } catch {
    return `errno ${errno}`;
  }
}
