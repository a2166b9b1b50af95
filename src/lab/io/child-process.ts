/**
 * The processes the lab and the demo start and hold: agents, the controller, the relay, the delay line, each pod's
 * probe, the fault samples' pings and TCP flows. Argument arrays only, never a shell; usually behind a launcher
 * prefix (`ip netns exec NS`, `nsenter ...`) that leads into a namespace. Stopped by PID, every wait bounded.
 *
 * Why an adapter: only src/adapters starts processes (eslint.config.js); src/lab holds {@link Child} handles.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { closeSync, openSync, readFileSync } from 'node:fs';
import type { Readable, Writable } from 'node:stream';

export interface ChildOptions {
  /**
   * Where stdout and stderr go: appended to a log file, piped to this process ({@link Child.stdout},
   * {@link Child.stderr}), only stdout piped (`'stdout'`), or nowhere. Default `'pipe'`.
   */
  readonly output?: { readonly log: string } | 'pipe' | 'stdout' | 'ignore';
  /** Pipe stdin ({@link Child.stdin}); else the child reads nothing. */
  readonly stdin?: boolean;
  /**
   * In its own process group and not holding this process's event loop: Ctrl-C in the terminal reaches only us,
   * and the child outlives nothing it should not.
   */
  readonly detached?: boolean;
}

/** A started child process. */
export class Child {
  readonly #proc: ChildProcess;
  readonly #exited: Promise<number | null>;
  readonly #closed: Promise<void>;

  /** Starts `argv` (command and arguments). @throws Error when `argv` is empty. */
  constructor(argv: readonly string[], opts: ChildOptions = {}) {
    const [cmd, ...args] = argv;
    // cannot happen: every caller spells out its command (a launcher prefix, then the binary)
    if (cmd === undefined) throw new Error('no command to start');
    const output = opts.output ?? 'pipe';
    const stdin = opts.stdin ? 'pipe' : 'ignore';
    const detached = opts.detached ?? false;
    if (typeof output === 'object') {
      const log = openSync(output.log, 'a');
      this.#proc = spawn(cmd, args, { stdio: [stdin, log, log], detached });
      closeSync(log);
    } else {
      this.#proc = spawn(cmd, args, { stdio: [stdin, output === 'stdout' ? 'pipe' : output, output === 'stdout' ? 'ignore' : output], detached });
    }
    if (detached) this.#proc.unref();
    this.#exited = new Promise((resolve) => this.#proc.once('exit', (code) => resolve(code)));
    this.#closed = new Promise((resolve) => this.#proc.once('close', () => resolve()));
  }

  get pid(): number | undefined {
    return this.#proc.pid;
  }

  /** Its exit status once it exited by itself, else null. */
  get exitCode(): number | null {
    return this.#proc.exitCode;
  }

  /** The signal that ended it, else null. */
  get signalCode(): NodeJS.Signals | null {
    return this.#proc.signalCode;
  }

  get running(): boolean {
    return isRunning(this.#proc);
  }

  get stdin(): Writable | null {
    return this.#proc.stdin;
  }

  get stdout(): Readable | null {
    return this.#proc.stdout;
  }

  get stderr(): Readable | null {
    return this.#proc.stderr;
  }

  /** Resolves with its exit status (null when a signal ended it) once it exited. */
  exited(): Promise<number | null> {
    return this.#exited;
  }

  /** Resolves once it exited and its output streams are closed (everything it printed was read). */
  closed(): Promise<void> {
    return this.#closed;
  }

  /** Sends `signal` by PID (nothing when it is gone). */
  kill(signal: NodeJS.Signals): void {
    this.#proc.kill(signal);
  }

  /** Sends `signal` (by PID) and waits until it exits; escalates to SIGKILL after 5 s. */
  stop(signal: 'SIGTERM' | 'SIGKILL' = 'SIGTERM'): Promise<void> {
    return stopChild(this.#proc, signal);
  }
}

export function isRunning(p: ChildProcess | undefined): p is ChildProcess {
  return p !== undefined && p.exitCode === null && p.signalCode === null;
}

/** Sends `signal` to the child (by PID) and waits until it exits; escalates to SIGKILL after 5 s. */
export async function stopChild(p: ChildProcess | undefined, signal: 'SIGTERM' | 'SIGKILL' = 'SIGTERM'): Promise<void> {
  if (!isRunning(p)) return;
  const exited = new Promise<void>((r) => p.once('exit', () => r()));
  p.kill(signal);
  const timer = setTimeout(() => p.kill('SIGKILL'), 5000);
  await exited;
  clearTimeout(timer);
}

/** The last `lines` lines of a log file, or "(no log)". */
export function logTail(path: string, lines: number): string {
  try {
    return readFileSync(path, 'utf8').trimEnd().split('\n').slice(-lines).join('\n');
  } catch {
    return '(no log)';
  }
}
