/** Stopping the lab's child processes and reading their logs: by PID, bounded, the same for every kind. */
import type { ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';

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
