/** How a failed system call reads in an error message. */
// not an ESM import, whose facade loads far more (the rule in eslint.config.js says why)
const { getSystemErrorMessage, getSystemErrorName } = process.getBuiltinModule('node:util');

/** `ENOENT (no such file or directory)` for a positive errno; `errno N` when Node does not know it. */
export function errnoText(errno: number): string {
  try {
    return `${getSystemErrorName(-errno)} (${getSystemErrorMessage(-errno)})`;
  } catch {
    return `errno ${errno}`;
  }
}
