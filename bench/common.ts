/** Pieces every benchmark here shares: option parsing, report helpers, the exit, cleanup of this run's leftovers. */
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

/** The median of `xs` (the mean of the middle two for an even count); NaN when empty. */
export function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  if (s.length === 0) return NaN;
  const m = s.length >> 1;
  return s.length % 2 === 1 ? (s[m] as number) : ((s[m - 1] as number) + (s[m] as number)) / 2;
}

/** `x` with `digits` decimals, or `-` when it is not a finite number. */
export const fmt = (x: number, digits = 1): string => (Number.isFinite(x) ? x.toFixed(digits) : '-');

/** Rows as aligned columns: the first `leftColumns` left-aligned, the rest right-aligned. */
export function table(rows: readonly (readonly string[])[], leftColumns = 2): string {
  const widths = rows[0]?.map((_, c) => Math.max(...rows.map((r) => (r[c] ?? '').length))) ?? [];
  return rows.map((r) => r.map((cell, c) => (c < leftColumns ? cell.padEnd(widths[c] ?? 0) : cell.padStart(widths[c] ?? 0))).join('  ').trimEnd()).join('\n');
}

/** The exit status of a finished run: 1 when targets were missed and `--enforce` asks for it (said on stderr), else 0. */
export function exitStatus(missed: number, enforce: boolean): number {
  if (missed === 0 || !enforce) return 0;
  process.stderr.write(`bench: ${missed} target(s) missed (--enforce)\n`);
  return 1;
}

/** Runs a benchmark's `main` and exits with its status; an error is printed (with its cause) and exits 1. */
export function runBench(main: () => Promise<number>): void {
  main().then((code) => process.exit(code), (err: unknown) => {
    process.stderr.write(`bench: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    if (err instanceof Error && err.cause) process.stderr.write(`bench: cause: ${String(err.cause)}\n`);
    process.exit(1);
  });
}
