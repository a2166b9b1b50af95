/**
 * The directory of the embedded store (src/adapters/store/store-embedded.ts), as files: what they hold, how they are
 * written, and how the store is loaded back from them.
 *
 * - `wal.log`: one JSON line per committed transaction (`{"rev","ops","crc"}`), appended and fdatasynced before the
 *   transaction resolves. On open the log is replayed; a torn last line (a crash mid-append) is dropped and cut off,
 *   a damaged line before the end refuses the open (that is lost data, not a crash).
 * - `snapshot.json`: the whole map at one revision, written crash-safely (temporary file, fsync, rename, directory
 *   fsync) once the log outgrows `maxLogBytes` or `snapshotIntervalMs` has passed; the log then restarts empty.
 *   Log lines at or below the snapshot's revision (a crash between rename and truncation) are skipped on replay.
 * - `LOCK`: holds the pid of the process that has the directory open, so a second process (or a second open in
 *   this one) is refused instead of interleaving its writes.
 */
import { closeSync, fsyncSync, linkSync, openSync, readFileSync, unlinkSync, writeSync } from 'node:fs';
import { open, readFile, rename } from 'node:fs/promises';
import { join } from 'node:path';
import { crc32 } from 'node:zlib';
import type { KvEntry, TxnOp, WatchEvent } from '../../core/cluster/store.ts';
import { atollError } from '../../core/errors.ts';

export const LOG_FILE = 'wal.log';
const SNAPSHOT_FILE = 'snapshot.json';
export const SNAPSHOT_TMP = '.tmp-snapshot.json';
const LOCK_FILE = 'LOCK';
const SNAPSHOT_FORMAT = 1;

/** The store as its files hold it. */
export interface Loaded {
  readonly entries: Map<string, KvEntry>;
  readonly revision: number;
  /** Revision of the snapshot the state started from; history before it is gone. */
  readonly snapshotRevision: number;
  readonly history: WatchEvent[];
  readonly logBytes: number;
}

/** Applies `ops` at `rev` to `entries` (the store's map, or one being replayed), returning their watch events. */
export function applyOps(entries: Map<string, KvEntry>, rev: number, ops: readonly TxnOp[], onKeySet?: (key: string, added: boolean) => void): WatchEvent[] {
  const events: WatchEvent[] = [];
  for (const op of ops) {
    const cur = entries.get(op.key);
    if (op.type === 'put') {
      entries.set(op.key, { key: op.key, value: op.value, createRevision: cur?.createRevision ?? rev, modRevision: rev });
      if (cur === undefined) onKeySet?.(op.key, true);
      events.push({ type: 'put', key: op.key, value: op.value, modRevision: rev });
    } else if (cur !== undefined) {
      entries.delete(op.key);
      onKeySet?.(op.key, false);
      events.push({ type: 'delete', key: op.key, value: '', modRevision: rev });
    }
  }
  return events;
}

export function encodeLogLine(rev: number, ops: readonly TxnOp[]): string {
  return `${JSON.stringify({ rev, ops, crc: checksum(rev, ops) })}\n`;
}

function checksum(rev: number, ops: unknown): number {
  return crc32(JSON.stringify({ rev, ops }));
}

/** The log line's transaction, or why it is not one. */
function decodeLogLine(line: string): { rev: number; ops: TxnOp[] } | string {
  let rec: unknown;
  try {
    rec = JSON.parse(line);
  } catch {
    return 'not JSON';
  }
  if (typeof rec !== 'object' || rec === null) return 'not a JSON object';
  const { rev, ops, crc } = rec as { rev?: unknown; ops?: unknown; crc?: unknown };
  if (typeof rev !== 'number' || !Array.isArray(ops)) return 'no rev or ops';
  if (crc !== checksum(rev, ops)) return 'checksum mismatch';
  return { rev, ops: ops as TxnOp[] };
}

export async function load(dir: string): Promise<Loaded> {
  const entries = new Map<string, KvEntry>();
  let revision = 0;
  const snapPath = join(dir, SNAPSHOT_FILE);
  const snapText = await readFile(snapPath, 'utf8').catch(ignoreMissing);
  if (snapText !== undefined) {
    const snap = decodeSnapshot(snapText);
    if (typeof snap === 'string') {
      throw atollError('STORE_UNAVAILABLE', `the store snapshot ${snapPath} is damaged (${snap})`, `restore ${dir} from a backup; the snapshot was written atomically, so this is disk damage or an edit`);
    }
    for (const e of snap.entries) entries.set(e.key, e);
    revision = snap.revision;
  }
  const snapshotRevision = revision;
  const logPath = join(dir, LOG_FILE);
  const raw = await readFile(logPath).catch(ignoreMissing);
  const history: WatchEvent[] = [];
  if (raw === undefined) return { entries, revision, snapshotRevision, history, logBytes: 0 };

  const text = raw.toString('utf8');
  const lines = text.split('\n');
  // After the last newline: empty, or a line whose append a crash cut short.
  const tail = lines.pop()!;
  let goodBytes = 0;
  let torn = tail.length > 0;
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i]!;
    const rec = decodeLogLine(line);
    const last = i === lines.length - 1 && !torn;
    if (typeof rec === 'string') {
      if (last) {
        torn = true;
        break;
      }
      throw corruptLog(logPath, i + 1, rec);
    }
    if (rec.rev > revision) {
      if (rec.rev !== revision + 1) throw corruptLog(logPath, i + 1, `revision ${rec.rev} follows ${revision}`);
      history.push(...applyOps(entries, rec.rev, rec.ops));
      revision = rec.rev;
    }
    goodBytes += Buffer.byteLength(line) + 1;
  }
  if (torn) await cutLog(logPath, goodBytes);
  return { entries, revision, snapshotRevision, history, logBytes: goodBytes };
}

function corruptLog(path: string, line: number, why: string): Error {
  return atollError('STORE_UNAVAILABLE', `the store log ${path} is damaged at line ${line} (${why}), before its end`,
    `restore the directory from a backup, or move ${path} aside to start from the last snapshot (losing the transactions after it)`);
}

/** Cuts the torn last line off, so the next append starts on a line of its own. */
async function cutLog(path: string, bytes: number): Promise<void> {
  const fh = await open(path, 'r+');
  try {
    await fh.truncate(bytes);
    await fh.datasync();
  } finally {
    await fh.close();
  }
}

function decodeSnapshot(text: string): { revision: number; entries: KvEntry[] } | string {
  let snap: unknown;
  try {
    snap = JSON.parse(text);
  } catch {
    return 'not JSON';
  }
  const { format, revision, entries } = (snap ?? {}) as { format?: unknown; revision?: unknown; entries?: unknown };
  if (format !== SNAPSHOT_FORMAT) return `format ${String(format)}, expected ${SNAPSHOT_FORMAT}`;
  if (typeof revision !== 'number' || !Array.isArray(entries)) return 'no revision or entries';
  const out: KvEntry[] = [];
  for (const e of entries) {
    if (!Array.isArray(e) || e.length !== 4) return 'an entry is not [key, value, createRevision, modRevision]';
    const [key, value, createRevision, modRevision] = e as unknown[];
    if (typeof key !== 'string' || typeof value !== 'string' || typeof createRevision !== 'number' || typeof modRevision !== 'number') return `entry ${String(key)} is malformed`;
    out.push({ key, value, createRevision, modRevision });
  }
  return { revision, entries: out };
}

export async function writeSnapshot(dir: string, revision: number, entries: readonly KvEntry[]): Promise<void> {
  const tmp = join(dir, SNAPSHOT_TMP);
  const body = JSON.stringify({ format: SNAPSHOT_FORMAT, revision, entries: entries.map((e) => [e.key, e.value, e.createRevision, e.modRevision]) });
  const fh = await open(tmp, 'w', 0o600);
  try {
    await fh.writeFile(body);
    await fh.sync();
  } finally {
    await fh.close();
  }
  await rename(tmp, join(dir, SNAPSHOT_FILE));
  const d = await open(dir, 'r');
  try {
    await d.sync();
  } finally {
    await d.close();
  }
}

/**
 * Creates `dir/LOCK` holding our pid, atomically (written aside, then hard-linked into place, so the lock is never
 * seen empty). A lock whose pid is dead is stale and replaced.
 */
export function acquireLock(dir: string): void {
  const lock = join(dir, LOCK_FILE);
  const aside = join(dir, `.tmp-lock-${process.pid}`);
  try {
    const fd = openSync(aside, 'w', 0o600);
    try {
      writeSync(fd, `${process.pid}\n`);
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
  } catch (cause) {
    throw lockError(dir, lock, cause);
  }
  try {
    for (let attempt = 0; ; attempt++) {
      try {
        linkSync(aside, lock);
        return;
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== 'EEXIST' || attempt > 0) throw lockError(dir, lock, e);
      }
      const holder = Number.parseInt(readFileSync(lock, 'utf8'), 10);
      if (Number.isInteger(holder) && holder > 0 && pidAlive(holder)) {
        throw atollError('STORE_UNAVAILABLE', `the store in ${dir} is open in process ${holder}${holder === process.pid ? ' (this one)' : ''}`,
          `stop that process (or close the store) first; if pid ${holder} is not a controller, remove ${lock}`);
      }
      unlinkSync(lock);
    }
  } finally {
    unlinkSync(aside);
  }
}

function lockError(dir: string, lock: string, cause: unknown): Error {
  return atollError('STORE_UNAVAILABLE', `cannot take the lock ${lock} of the store in ${dir}`, 'check that the directory is writable', cause);
}

/** Removes the lock if it is still ours. */
export function releaseLock(dir: string): void {
  const lock = join(dir, LOCK_FILE);
  try {
    if (Number.parseInt(readFileSync(lock, 'utf8'), 10) === process.pid) unlinkSync(lock);
  } catch {
    // already gone: nothing to release
  }
}

function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === 'EPERM';
  }
}

export function ignoreMissing(e: unknown): undefined {
  if ((e as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
  throw e;
}
