/**
 * Crash-safe file writes: a temporary file beside the target is written and fsynced, renamed over the target, and
 * the directory fsynced. After a crash the target holds either the old or the new content, never a mix.
 */
import { closeSync, fsyncSync, openSync, renameSync, writeSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';

export const TMP_PREFIX = '.tmp-';

/** Writes `content` to `path` durably (see above); `syncDir` false lets a caller batch the directory fsync. */
export function writeFileDurably(path: string, content: string | Buffer, opts: { mode?: number; syncDir?: boolean } = {}): void {
  const tmp = join(dirname(path), `${TMP_PREFIX}${basename(path)}`);
  const fd = openSync(tmp, 'w', opts.mode ?? 0o600);
  try {
    writeSync(fd, typeof content === 'string' ? Buffer.from(content) : content);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
  renameSync(tmp, path);
  if (opts.syncDir !== false) syncDir(dirname(path));
}

/** fsyncs a directory, making renames and unlinks in it durable. */
export function syncDir(dir: string): void {
  const fd = openSync(dir, 'r');
  try {
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}
