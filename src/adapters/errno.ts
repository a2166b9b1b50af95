/** How a failed system call reads in an error message. */

// Not `import ... from 'node:util'`: Node's ESM facade of util reads every export, and one lazy getter loads
// worker_threads (docs/architecture.md, "Memory").
const { getSystemErrorMessage, getSystemErrorName } = process.getBuiltinModule('node:util');

/** `ENOENT (no such file or directory)` for a positive errno; `errno N` when Node does not know it. */
export function errnoText(errno: number): string {
  try {
    return `${getSystemErrorName(-errno)} (${getSystemErrorMessage(-errno)})`;
  } catch {
    return `errno ${errno}`;
  }
}
