/** Pieces every benchmark here shares: option parsing, report helpers, the exit, cleanup of this run's leftovers. */
import { type ChildProcess, spawn } from 'node:child_process';
import { readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs, type ParseArgsOptionsConfig } from 'node:util';
import { addNetns, delNetns, leftoverNetns, RUN_PREFIX } from '../harness/netns.ts';

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

/** The nearest-rank percentile p (0 < p <= 100) of xs: the smallest sample whose rank covers p percent; NaN for none. */
export function nearestRank(xs: readonly number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? NaN : (s[Math.max(0, Math.ceil((p / 100) * s.length) - 1)] as number);
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
/**
 * Cleans up `fx` and exits on SIGINT (130), SIGTERM (143) or when `timeoutS` runs out (2). Returns the watchdog timer:
 * clear it once the run has finished on its own.
 */
export function cleanUpOnExit(fx: { cleanup(): Promise<unknown> }, timeoutS: number): NodeJS.Timeout {
  const abort = (why: string, code: number) => {
    process.stderr.write(`bench: ${why}; cleaning up\n`);
    void fx.cleanup().finally(() => process.exit(code));
  };
  process.once('SIGINT', () => abort('interrupted', 130));
  process.once('SIGTERM', () => abort('terminated', 143));
  return setTimeout(() => abort(`still running after ${timeoutS} s (--timeout)`, 2), timeoutS * 1000);
}

export function runBench(main: () => Promise<number>): void {
  main().then((code) => process.exit(code), (err: unknown) => {
    process.stderr.write(`bench: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    if (err instanceof Error && err.cause) process.stderr.write(`bench: cause: ${String(err.cause)}\n`);
    process.exit(1);
  });
}

/** How a bounded child process ended: its exit code (128 when killed by a signal) and its output. */
export interface Spawned {
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
}

export interface SpawnOptions {
  /** Stop it with SIGTERM at the limit (SIGKILL 15 s later), for a process that cleans up after itself. */
  readonly gentle?: boolean;
  /** Called with all its output so far whenever it writes to stdout. */
  readonly onStdout?: (text: string) => void;
  /** Written to its stdin, which is then closed (else stdin is /dev/null). */
  readonly input?: string;
}

/**
 * Starts argv, killed by PID after `timeoutMs` (SIGKILL, or SIGTERM then SIGKILL for a gentle one); `done` settles
 * when it exits (rejects only when it could not start).
 */
export function spawnBounded(argv: readonly string[], timeoutMs: number, o: SpawnOptions = {}): { child: ChildProcess; done: Promise<Spawned> } {
  const [cmd, ...args] = argv as [string, ...string[]];
  const child = spawn(cmd, args, { stdio: [o.input === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'] });
  child.stdin?.end(o.input);
  const done = new Promise<Spawned>((resolve, reject) => {
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    let hard: NodeJS.Timeout | undefined;
    const timer = setTimeout(() => {
      child.kill(o.gentle ? 'SIGTERM' : 'SIGKILL');
      if (o.gentle) hard = setTimeout(() => child.kill('SIGKILL'), 15_000);
    }, timeoutMs);
    child.stdout?.on('data', (d: Buffer) => {
      out.push(d);
      o.onStdout?.(Buffer.concat(out).toString('utf8'));
    });
    child.stderr?.on('data', (d: Buffer) => err.push(d));
    child.on('error', (e) => {
      clearTimeout(timer);
      clearTimeout(hard);
      reject(e);
    });
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      clearTimeout(hard);
      const stderr = Buffer.concat(err).toString('utf8') + (signal ? `\n(killed by ${signal}; limit ${timeoutMs} ms)` : '');
      resolve({ code: code ?? 128, stdout: Buffer.concat(out).toString('utf8'), stderr });
    });
  });
  return { child, done };
}

/**
 * What a bench that builds namespaces and starts processes must remove however it ends: its namespaces (with this
 * process's unique prefix) and its processes (killed by PID). {@link cleanup} is idempotent; a bench with more to
 * remove (agents, a cloud, a directory) extends {@link cleanupMore}, which runs after the processes die and before
 * the namespaces go.
 */
export class NetnsFixture {
  readonly namespaces = new Set<string>();
  readonly live = new Set<ChildProcess>();
  #stopping = false;
  #cleaned: Promise<void> | undefined;

  get stopping(): boolean {
    return this.#stopping;
  }

  /** A namespace with the run prefix and loopback up, removed at cleanup; returns its full name. */
  addNetns(name: string): string {
    if (this.#stopping) throw new Error('the benchmark is stopping');
    const full = addNetns(name);
    this.namespaces.add(full);
    return full;
  }

  delNetns(full: string): void {
    delNetns(full);
    this.namespaces.delete(full);
  }

  /** Starts argv, killed (SIGKILL, by PID) after `timeoutMs`; the process is tracked for cleanup meanwhile. */
  start(argv: readonly string[], timeoutMs: number): { child: ChildProcess; done: Promise<Spawned> } {
    if (this.#stopping) throw new Error('the benchmark is stopping');
    const started = spawnBounded(argv, timeoutMs);
    this.live.add(started.child);
    started.done.finally(() => this.live.delete(started.child)).catch(() => undefined);
    return started;
  }

  cleanup(): Promise<void> {
    this.#cleaned ??= this.#cleanup();
    return this.#cleaned;
  }

  protected async cleanupMore(): Promise<void> {
    // nothing more by default
  }

  async #cleanup(): Promise<void> {
    this.#stopping = true;
    for (const c of this.live) c.kill('SIGKILL');
    await this.cleanupMore();
    for (const ns of this.namespaces) delNetns(ns);
    for (const ns of leftoverNetns()) delNetns(ns); // only names with this process's unique prefix
    removeRunTempDirs();
  }
}
