/**
 * An `atoll agent` as a real child process, for the lab and the demo: started behind a launcher prefix (e.g.
 * `ip netns exec NS` or `nsenter ...`), ready once its socket answers a VERSION request, stopped by PID.
 */
import { existsSync, rmSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { join } from 'node:path';
import { encodeRequest } from '../core/cni-spec/shim-protocol.ts';
import { atollError } from '../core/errors.ts';
import { Child, logTail } from './io/child-process.ts';
import { installRoot } from '../adapters/install-root.ts';

export const REPO_ROOT = installRoot();
/** The `atoll` command as users run it (the bundle, rebuilt when the sources changed). */
export const ATOLL_BIN = join(REPO_ROOT, 'bin', 'atoll');
/** The lab's delay line for kernels without netem (native/atoll-delay.c, built by the set-up). */
export const DELAY_BIN = join(REPO_ROOT, 'bin', 'atoll-delay');
export const PROJECT_NODE = join(REPO_ROOT, 'node_modules', '.bin', 'node');

/** libfaketime as Debian installs it (package libfaketime), for the clock-jump fault; undefined when it is not installed. */
export const LIBFAKETIME = ['/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1', '/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1'].find((p) => existsSync(p));

/**
 * The launcher suffix that runs a process under libfaketime with its clocks (wall and monotonic) offset by what
 * `file` holds (`+0` to start with; `+8d` moves them 8 days ahead within a second: the cache is re-read every second).
 * Writes `file`. Empty without libfaketime.
 */
export function fakeClockLauncher(file: string): string[] {
  if (!LIBFAKETIME) return [];
  if (!existsSync(file)) writeFileSync(file, '+0\n');
  return ['env', `LD_PRELOAD=${LIBFAKETIME}`, `FAKETIME_TIMESTAMP_FILE=${file}`, 'FAKETIME_CACHE_DURATION=1'];
}

export interface AgentProcessInit {
  readonly configPath: string;
  readonly socketPath: string;
  readonly logPath: string;
  readonly logLevel?: 'debug' | 'info';
  /**
   * Run the agent in its own process group, not holding this process's event loop (the lab): Ctrl-C in the terminal
   * reaches only the lab, which then stops the agent itself, and `atoll lab up --detach` can return.
   */
  readonly detached?: boolean;
}

/** Resolves true when something on `socketPath` answers an atoll-cni VERSION request. */
export function agentAnswers(socketPath: string, timeoutMs = 1000): Promise<boolean> {
  return new Promise((resolve) => {
    const sock = connect(socketPath);
    const timer = setTimeout(() => done(false), timeoutMs);
    const done = (ok: boolean) => {
      clearTimeout(timer);
      sock.destroy();
      resolve(ok);
    };
    sock.on('error', () => done(false));
    sock.on('connect', () => sock.end(encodeRequest({ env: { CNI_COMMAND: 'VERSION' }, stdin: Buffer.alloc(0) })));
    sock.once('data', (d: Buffer) => done(d.length >= 4 && d.readUInt32BE(0) === 0));
  });
}

export class AgentProcess {
  readonly #init: AgentProcessInit;
  #proc: Child | undefined;

  constructor(init: AgentProcessInit) {
    this.#init = init;
  }

  get pid(): number | undefined {
    return this.#proc?.pid;
  }

  get running(): boolean {
    return this.#proc?.running ?? false;
  }

  /** Starts the agent behind `launcher` and waits (bounded) until it serves. @throws AtollError LAB_STEP_FAILED with the log tail. */
  async start(launcher: readonly string[], timeoutMs = 15_000): Promise<void> {
    const { configPath, socketPath, logPath } = this.#init;
    rmSync(socketPath, { force: true });
    const argv = [...launcher, ATOLL_BIN, 'agent', '--config', configPath, '--log-level', this.#init.logLevel ?? 'info'];
    const proc = new Child(argv, { output: { log: logPath }, detached: this.#init.detached ?? false });
    this.#proc = proc;
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      if (proc.exitCode !== null) throw atollError('LAB_STEP_FAILED', `the agent exited with status ${proc.exitCode}:\n${this.logTail()}`, `its log is ${logPath}`);
      if (await agentAnswers(socketPath, 500)) return;
      await new Promise((r) => setTimeout(r, 50));
    }
    throw atollError('LAB_STEP_FAILED', `the agent did not answer on ${socketPath} within ${timeoutMs} ms:\n${this.logTail()}`, `its log is ${logPath}`);
  }

  /** Stops the agent by PID: SIGTERM (graceful) or SIGKILL; escalates to SIGKILL after 5 s. */
  stop(signal: 'SIGTERM' | 'SIGKILL' = 'SIGTERM'): Promise<void> {
    return this.#proc?.stop(signal) ?? Promise.resolve();
  }

  logTail(lines = 40): string {
    return logTail(this.#init.logPath, lines);
  }
}
