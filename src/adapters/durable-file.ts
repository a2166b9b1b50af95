/**
 * Crash-safe file writes: a temporary file beside the target is written and fsynced, renamed over the target, and
 * the directory fsynced. After a crash the target holds either the old or the new content, never a mix.
 */
import { close, closeSync, fsync, fsyncSync, open, openSync, rename, renameSync, unlink, unlinkSync, write, writeSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';

export const TMP_PREFIX = '.tmp-';

/**
 * Writes `content` to `path` durably (see above); `syncDir` false lets a caller batch the directory fsync. When a
 * step fails (a full disk, an fsync error) the temporary file is removed, so a failed write leaves the target as it
 * was and takes no space, then the error is thrown.
 */
export function writeFileDurably(path: string, content: string | Buffer, opts: { mode?: number; syncDir?: boolean } = {}): void {
  const tmp = join(dirname(path), `${TMP_PREFIX}${basename(path)}`);
  const fd = openSync(tmp, 'w', opts.mode ?? 0o600);
  try {
    try {
      writeSync(fd, typeof content === 'string' ? Buffer.from(content) : content);
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    renameSync(tmp, path);
  } catch (err) {
    try {
      unlinkSync(tmp);
    } catch {
      // already gone, or the file system refuses even that (read-only): the next load removes it
    }
    throw err;
  }
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

/**
 * {@link writeFileDurably} on libuv's thread pool: the main thread only queues the steps (about 1 to 3 ms of
 * fsync here, more under load, that would otherwise stall every other request). The directory is not fsynced:
 * call {@link syncDirAsync} once for a batch. A failed step removes the temporary file, as the synchronous one does. Chained callbacks rather than `fs/promises`: half the main-thread
 * CPU per write (no FileHandle objects, one promise).
 */
export function writeFileDurablyAsync(path: string, content: string | Buffer, opts: { mode?: number } = {}): Promise<void> {
  const tmp = join(dirname(path), `${TMP_PREFIX}${basename(path)}`);
  return new Promise((resolve, reject) => {
    open(tmp, 'w', opts.mode ?? 0o600, (err, fd) => {
      if (err) return reject(err);
      const data = typeof content === 'string' ? Buffer.from(content) : content;
      write(fd, data, (werr, n) => {
        // a failed step removes the temporary file (a full disk gets its space back), then reports the first error
        const fail = (e: Error) => unlink(tmp, () => reject(e));
        const done = (e: Error | null) => close(fd, (cerr) => {
          const first = e ?? cerr;
          if (first) return fail(first);
          rename(tmp, path, (rerr) => (rerr ? fail(rerr) : resolve()));
        });
        if (werr) return done(werr);
        // only a cause, as fs's own errors here: the caller names the record (ipam-store-fs: IPAM_STORE_FAILED)
        if (n !== data.length) return done(new Error(`short write to ${tmp}: ${n} of ${data.length} bytes`));
        fsync(fd, done);
      });
    });
  });
}

/** {@link syncDir} on libuv's thread pool. */
export function syncDirAsync(dir: string): Promise<void> {
  return new Promise((resolve, reject) => {
    open(dir, 'r', (err, fd) => {
      if (err) return reject(err);
      fsync(fd, (serr) => close(fd, (cerr) => (serr ?? cerr ? reject(serr ?? cerr) : resolve())));
    });
  });
}
