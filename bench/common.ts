/** Pieces every benchmark here shares: option parsing, cleanup of this run's leftovers. */
import { readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs, type ParseArgsOptionsConfig } from 'node:util';
import { RUN_PREFIX } from '../test/support/netns.ts';

/** The flags every benchmark has: --smoke, --json FILE, --timeout SECONDS, --help. */
const COMMON_FLAGS = {
  smoke: { type: 'boolean', default: false },
  json: { type: 'string' },
  timeout: { type: 'string' },
  help: { type: 'boolean', short: 'h', default: false },
} as const satisfies ParseArgsOptionsConfig;

/**
 * Parses a benchmark's flags (`own` and the common ones, strictly); `--help` prints `usage` and exits.
 * @throws Error naming an unknown flag or a flag without its value.
 */
export function parseBenchArgs<O extends ParseArgsOptionsConfig>(argv: readonly string[], usage: string, own: O) {
  const { values } = parseArgs({ args: [...argv], strict: true, options: { ...COMMON_FLAGS, ...own } });
  if ((values as { help?: boolean }).help) {
    process.stdout.write(usage + '\n');
    process.exit(0);
  }
  return values;
}

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
