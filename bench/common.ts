/** Pieces every benchmark here shares: option parsing, cleanup of this run's leftovers. */
import { readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { RUN_PREFIX } from '../test/support/netns.ts';

/** An integer option parser that names the flag and prints the usage on a bad value. */
export function intOption(usage: string): (name: string, raw: string | undefined, dflt: number, min: number, max?: number) => number {
  return (name, raw, dflt, min, max = Number.MAX_SAFE_INTEGER) => {
    if (raw === undefined) return dflt;
    const n = Number(raw);
    if (!Number.isInteger(n) || n < min || n > max) {
      throw new Error(`--${name} must be an integer from ${min}${max < Number.MAX_SAFE_INTEGER ? ` to ${max}` : ' up'}, got "${raw}"\n${usage}`);
    }
    return n;
  };
}

/** Removes this process's temporary directories (named with its unique run prefix). */
export function removeRunTempDirs(): void {
  for (const f of readdirSync(tmpdir())) if (f.startsWith(RUN_PREFIX)) rmSync(join(tmpdir(), f), { recursive: true, force: true });
}
