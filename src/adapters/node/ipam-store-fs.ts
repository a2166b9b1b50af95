/**
 * IPAM records as files under `<dataDir>/<network>/` (format: src/core/ipam/record-codec.ts).
 *
 * Why files: operators can read them with `ls` and `cat`, as with host-local; and the node keeps them through
 * agent restarts, reboots and cloud outages. Each write is crash-safe: a temporary file is written and fsynced,
 * renamed into place, and the directory fsynced, so a record is either whole or absent after a crash.
 */
import { mkdirSync, readdirSync, readFileSync, unlinkSync } from 'node:fs';
import { unlink } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { atollError } from '../../core/errors.ts';
import type { IpamChange, IpamRecord } from '../../core/ipam/sticky-pool.ts';
import { decodeRecord, decodeRecordFileName, encodeRecord, recordFileName } from '../../core/ipam/record-codec.ts';
import { syncDirAsync, TMP_PREFIX, writeFileDurablyAsync } from '../durable-file.ts';

export interface LoadedRecords {
  readonly records: IpamRecord[];
  /**
   * Files that are not records, with the reason; left in place for an operator to look at. `held`: the file's name
   * is a record's (the address and pod are known) but its content is damaged.
   */
  readonly skipped: { file: string; reason: string; held?: Pick<IpamRecord, 'ip' | 'namespace' | 'name'> }[];
}

interface Waiter {
  readonly changes: readonly IpamChange[];
  readonly resolve: () => void;
  readonly reject: (err: unknown) => void;
}

export class FsIpamStore {
  readonly dir: string;
  /** Changes queued by {@link persistQueued}, not yet being written. */
  #queue: Waiter[] = [];
  #writing = false;
  /** The directory could not be made at load (a first start on a read-only or full disk): made before the next write. */
  #missing = false;

  constructor(dataDir: string, network: string) {
    this.dir = join(dataDir, network);
  }

  /**
   * Reads every record; removes leftover temporary files of an interrupted write (left in place when the file system
   * refuses: read-only; they are never read as records).
   * A directory that does not exist and cannot be made because the disk refuses (read-only, full: a first start on
   * such a disk) holds no records; the next write makes it.
   * @throws AtollError IPAM_STORE_FAILED when the directory cannot be read, or made for another reason.
   */
  load(): LoadedRecords {
    try {
      this.#missing = false;
      try {
        this.#makeDir();
      } catch (cause) {
        // no directory, and a disk that refuses one: no records to read; each write tries to make it (and says why not)
        const code = (cause as NodeJS.ErrnoException).code;
        if (code !== 'EROFS' && code !== 'ENOSPC' && code !== 'EDQUOT') throw cause;
        this.#missing = true;
        return { records: [], skipped: [] };
      }
      return this.#load();
    } catch (cause) {
      throw atollError('IPAM_STORE_FAILED', `cannot read the IPAM records in ${this.dir}`, 'check that the data directory exists and is readable', cause);
    }
  }

  /**
   * Makes the records' directory unless it exists. Its parent recursively, then itself alone: a recursive mkdir says
   * ENOENT, not EROFS, on a read-only file system (Node 24), which would hide why.
   */
  #makeDir(): void {
    mkdirSync(dirname(this.dir), { recursive: true, mode: 0o700 });
    try {
      mkdirSync(this.dir, { mode: 0o700 });
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
    }
  }

  #load(): LoadedRecords {
    const records: IpamRecord[] = [];
    const skipped: LoadedRecords['skipped'] = [];
    for (const file of readdirSync(this.dir)) {
      const path = join(this.dir, file);
      if (file.startsWith(TMP_PREFIX)) {
        try {
          unlinkSync(path);
        } catch {
          // a read-only file system: harmless, a temporary file is never a record
        }
        continue;
      }
      const rec = decodeRecord(file, readFileSync(path, 'utf8'));
      const key = decodeRecordFileName(file);
      if (typeof rec === 'string') skipped.push(typeof key === 'string' ? { file, reason: rec } : { file, reason: rec, held: key });
      else records.push(rec);
    }
    return { records, skipped };
  }

  /**
   * Persists changes durably off the main thread, with group commit: changes queued while a batch is being written
   * go to disk together in the next batch, each file once (its last change) and the directory fsynced once.
   * Batches are written one after another in queue order, so a record file's writes land in the order they were
   * queued. Within a batch, removals are made durable before new files are renamed into place: a crash can free
   * an address, never leave it recorded for two pods. Resolves when the changes are on disk.
   * @throws AtollError IPAM_STORE_FAILED naming the file (every change of the failed batch is rejected).
   */
  persistQueued(changes: readonly IpamChange[]): Promise<void> {
    if (changes.length === 0) return Promise.resolve();
    return new Promise((resolve, reject) => {
      this.#queue.push({ changes, resolve, reject });
      if (!this.#writing) void this.#drain();
    });
  }

  async #drain(): Promise<void> {
    this.#writing = true;
    while (this.#queue.length > 0) {
      const batch = this.#queue;
      this.#queue = [];
      try {
        await this.#writeBatch(batch.flatMap((w) => w.changes));
        for (const w of batch) w.resolve();
      } catch (err) {
        for (const w of batch) w.reject(err);
      }
    }
    this.#writing = false;
  }

  async #writeBatch(changes: readonly IpamChange[]): Promise<void> {
    if (this.#missing) {
      try {
        this.#makeDir();
        this.#missing = false;
      } catch (cause) {
        throw atollError('IPAM_STORE_FAILED', `cannot make the IPAM directory ${this.dir}`, 'check that the data directory is writable and the disk not full', cause);
      }
    }
    const last = new Map<string, IpamChange>();
    for (const c of changes) {
      const name = recordFileName(c.record);
      last.delete(name); // keep the order of last changes
      last.set(name, c);
    }
    const removes = [...last].filter(([, c]) => c.op === 'remove');
    const puts = [...last].filter(([, c]) => c.op === 'put');
    const step = async (name: string, op: 'write' | 'remove', fn: () => Promise<void>) => {
      try {
        await fn();
      } catch (cause) {
        throw atollError('IPAM_STORE_FAILED', `cannot ${op} IPAM record ${join(this.dir, name)}`, 'check that the data directory is writable and the disk not full', cause);
      }
    };
    const dirSync = async () => {
      try {
        await syncDirAsync(this.dir);
      } catch (cause) {
        throw atollError('IPAM_STORE_FAILED', `cannot fsync the IPAM directory ${this.dir}`, 'check that the data directory is writable and the disk not full', cause);
      }
    };
    if (removes.length > 0) {
      await settleAll(removes.map(([name]) => step(name, 'remove', () => unlinkIfPresentAsync(join(this.dir, name)))));
      if (puts.length > 0) await dirSync();
    }
    await settleAll(puts.map(([name, c]) => step(name, 'write', () => writeFileDurablyAsync(join(this.dir, name), encodeRecord(c.record)))));
    await dirSync();
  }
}

/** Waits for every step (none may still run when the next batch starts), then throws the first failure. */
async function settleAll(steps: readonly Promise<void>[]): Promise<void> {
  for (const r of await Promise.allSettled(steps)) if (r.status === 'rejected') throw r.reason;
}

async function unlinkIfPresentAsync(path: string): Promise<void> {
  try {
    await unlink(path);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
  }
}
