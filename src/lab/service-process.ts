/**
 * A service of the lab, `atoll controller`, `atoll relay` or a delay line (`bin/atoll-delay`), as a real child process: started
 * behind a launcher (`ip netns exec NS`) in its own process group with its output in a log file (so it outlives
 * nothing but is never tied to a terminal), ready once it prints its ready line (the controller's CA pin, the relay's
 * key pin, the delay line's settings).
 */
import { existsSync, readFileSync, statSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { atollError } from '../core/errors.ts';
import { Child, logTail } from './io/child-process.ts';
import { ATOLL_BIN } from './agent-process.ts';

export type ServiceKind = 'controller' | 'relay' | 'delay-line';

/** `atoll <kind> --config <configPath>`, or the delay line's own command (it takes arguments). */
export type ServiceProcessInit =
  | { readonly kind: 'controller' | 'relay'; readonly configPath: string; readonly logPath: string }
  | { readonly kind: 'delay-line'; readonly argv: readonly string[]; readonly logPath: string };

const READY: Record<ServiceKind, RegExp> = { controller: /caCertHash (sha256:[0-9a-f]{64})/, relay: /relayPin (sha256:[0-9a-f]{64})/, 'delay-line': /delay line ready: (.*)/ };

export class ServiceProcess {
  readonly #init: ServiceProcessInit;
  #proc: Child | undefined;

  constructor(init: ServiceProcessInit) {
    this.#init = init;
  }

  get pid(): number | undefined {
    return this.#proc?.pid;
  }

  /**
   * Starts the service and waits (bounded) for its ready line.
   * @returns what its ready line says: the pin (`sha256:<hex>`) for the controller and the relay.
   * @throws AtollError LAB_STEP_FAILED with the log tail when it exits or stays silent.
   */
  async start(launcher: readonly string[], timeoutMs = 30_000): Promise<string> {
    // a restart appends to the same log: only a ready line printed after this point counts
    const from = existsSync(this.#init.logPath) ? statSync(this.#init.logPath).size : 0;
    const { kind } = this.#init;
    const init = this.#init;
    const argv = [...launcher, ...(init.kind === 'delay-line' ? init.argv : [ATOLL_BIN, init.kind, '--config', init.configPath])];
    const proc = new Child(argv, { output: { log: init.logPath }, detached: true });
    this.#proc = proc;
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      const m = READY[kind].exec(this.#logSince(from));
      if (m) return m[1] as string;
      if (proc.exitCode !== null || proc.signalCode !== null) throw atollError('LAB_STEP_FAILED', `the ${kind} exited (${proc.exitCode ?? proc.signalCode}):\n${this.logTail()}`, `its log is ${init.logPath}`);
      await sleep(50);
    }
    throw atollError('LAB_STEP_FAILED', `the ${kind} did not print its ready line within ${timeoutMs} ms:\n${this.logTail()}`, `its log is ${init.logPath}`);
  }

  get running(): boolean {
    return this.#proc?.running ?? false;
  }

  /** Stops the service by PID (SIGKILL for the lab's kill faults); escalates to SIGKILL after 5 s. */
  stop(signal: 'SIGTERM' | 'SIGKILL' = 'SIGTERM'): Promise<void> {
    return this.#proc?.stop(signal) ?? Promise.resolve();
  }

  #logSince(offset: number): string {
    try {
      return readFileSync(this.#init.logPath).subarray(offset).toString('utf8');
    } catch {
      return '';
    }
  }

  logTail(lines = 30): string {
    return logTail(this.#init.logPath, lines);
  }
}
