/**
 * The commands and processes of the containerd test bed (containerd.ts beside it), each bounded: a command run by
 * argument array (no shell), a poll until a check holds, a child stopped by its PID (SIGTERM, then SIGKILL), and
 * teardown steps that all run whatever fails, their failures gathered into one error.
 */
import { execFile, type ChildProcess } from 'node:child_process';
import { atollError } from '../../../core/errors.ts';
import { pollUntil } from '../../../core/retry.ts';
import { sleep, wallClock } from '../../../adapters/timers.ts';

/** Output of a command that exited with status 0. */
export interface ExecResult {
  stdout: string;
  stderr: string;
}

/** Runs a command (argument array, no shell) and returns its output; errors (LAB_STEP_FAILED) name `what` and carry stderr. */
export function run(file: string, args: readonly string[], what: string, timeoutMs = 30_000): Promise<ExecResult> {
  return new Promise((resolve, reject) => {
    execFile(file, args, { timeout: timeoutMs, maxBuffer: 16 * 1024 * 1024 }, (err, stdout, stderr) => {
      if (err) {
        const detail = stderr.trim() || err.message;
        reject(atollError('LAB_STEP_FAILED', `${what} failed: ${file} ${args.join(' ')}: ${detail}`, `the quoted output of ${file} says why`, err));
      } else {
        resolve({ stdout, stderr });
      }
    });
  });
}

/** Waits until `check` returns true, polling every `intervalMs`; rejects (LAB_STEP_FAILED) with `what` after `timeoutMs`. */
export async function waitFor(check: () => Promise<boolean>, timeoutMs: number, what: string, intervalMs = 50): Promise<void> {
  if (!(await pollUntil(check, { intervalMs, timeoutMs }, { clock: wallClock, sleep }))) throw atollError('LAB_STEP_FAILED', `timed out after ${timeoutMs} ms waiting for ${what}`);
}

/** Resolves once `child` has exited (immediately if it already has), or after `timeoutMs` with false. */
function exited(child: ChildProcess, timeoutMs: number): Promise<boolean> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve(true);
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(false), timeoutMs);
    child.once('exit', () => {
      clearTimeout(timer);
      resolve(true);
    });
  });
}

/** SIGTERM, then SIGKILL after `timeoutMs`; only this child, by its PID. Throws if it survives SIGKILL. */
export async function terminate(child: ChildProcess, what: string, timeoutMs: number): Promise<void> {
  if (await exited(child, 0)) return;
  child.kill('SIGTERM');
  if (await exited(child, timeoutMs)) return;
  child.kill('SIGKILL');
  if (!(await exited(child, 5_000))) throw atollError('LAB_STEP_FAILED', `${what} (pid ${child.pid}) survived SIGKILL; inspect it with ps`);
}

/** Runs each teardown step even if earlier ones fail, then throws one LAB_STEP_FAILED naming every failure (an AggregateError its cause). */
export async function runAll(steps: readonly [string, () => Promise<unknown>][], what: string): Promise<void> {
  const failures: Error[] = [];
  for (const [name, step] of steps) {
    try {
      await step();
    } catch (err) {
      // only a cause: gathered into the LAB_STEP_FAILED below
      failures.push(new Error(`${name}: ${(err as Error).message}`, { cause: err }));
    }
  }
  if (failures.length > 0) {
    const list = failures.map((f) => f.message).join('; ');
    const message = `${what}: ${failures.length} teardown step(s) failed: ${list}`;
    throw atollError('LAB_STEP_FAILED', message, 'look for what is left with ps, mount and the cgroup tree (`atoll lab down --all` removes a lab\'s leftovers)', new AggregateError(failures, message));
  }
}
