/**
 * IPAM records as files under `<dataDir>/<network>/` (format: src/core/ipam/record-codec.ts).
 *
 * Why files: operators can read them with `ls` and `cat`, as with host-local; and the node keeps them through
 * agent restarts, reboots and cloud outages. Each write is crash-safe: a temporary file is written and fsynced,
 * renamed into place, and the directory fsynced, so a record is either whole or absent after a crash.
 */
import { mkdirSync, readdirSync, readFileSync, unlinkSync } from 'node:fs';
import { join } from 'node:path';
import { atollError } from '../core/errors.ts';
import type { IpamChange, IpamRecord } from '../core/ipam/sticky-pool.ts';
import { decodeRecord, encodeRecord, recordFileName } from '../core/ipam/record-codec.ts';
import { syncDir, TMP_PREFIX, writeFileDurably } from './durable-file.ts';

export interface LoadedRecords {
  readonly records: IpamRecord[];
  /** Files that are not records, with the reason; left in place for an operator to look at. */
  readonly skipped: { file: string; reason: string }[];
}

export class FsIpamStore {
  readonly dir: string;

  constructor(dataDir: string, network: string) {
    this.dir = join(dataDir, network);
  }

  /** Reads every record; removes leftover temporary files of an interrupted write. */
  load(): LoadedRecords {
    mkdirSync(this.dir, { recursive: true, mode: 0o700 });
    const records: IpamRecord[] = [];
    const skipped: { file: string; reason: string }[] = [];
    for (const file of readdirSync(this.dir)) {
      const path = join(this.dir, file);
      if (file.startsWith(TMP_PREFIX)) {
        unlinkSync(path);
        continue;
      }
      const rec = decodeRecord(file, readFileSync(path, 'utf8'));
      if (typeof rec === 'string') skipped.push({ file, reason: rec });
      else records.push(rec);
    }
    return { records, skipped };
  }

  /**
   * Persists changes in order, each durably.
   * @throws AtollError IPAM_STORE_FAILED naming the file.
   */
  persist(changes: readonly IpamChange[]): void {
    if (changes.length === 0) return;
    for (const c of changes) {
      const name = recordFileName(c.record);
      try {
        if (c.op === 'put') writeFileDurably(join(this.dir, name), encodeRecord(c.record), { syncDir: false });
        else unlinkIfPresent(join(this.dir, name));
      } catch (cause) {
        throw atollError('IPAM_STORE_FAILED', `cannot ${c.op === 'put' ? 'write' : 'remove'} IPAM record ${join(this.dir, name)}`,
          'check that the data directory is writable and the disk not full', cause);
      }
    }
    syncDir(this.dir);
  }
}

function unlinkIfPresent(path: string): void {
  try {
    unlinkSync(path);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
  }
}
