/**
 * A bounded CPU hog for tests of guarantees that must hold on a busy node (a zero-loss restart, a deadline): one
 * spinning process per core, each ending by itself after `maxMs` even if the test dies, stopped by PID.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { availableParallelism } from 'node:os';
import { PROJECT_NODE } from '../../src/lab/agent-process.ts';

export interface CpuHog {
  /** The spinners' PIDs. */
  readonly pids: readonly number[];
  /** Stops every spinner (SIGKILL by PID); idempotent. */
  stop(): Promise<void>;
}

/**
 * Starts `spinners` processes (default: one per core) that spin at 100 % of a core for at most `maxMs`.
 * @returns once every spinner runs.
 */
export async function startCpuHog(maxMs: number, spinners = availableParallelism()): Promise<CpuHog> {
  const children: ChildProcess[] = [];
  const started: Promise<void>[] = [];
  for (let i = 0; i < spinners; i++) {
    const child = spawn(PROJECT_NODE, ['-e', `process.stdout.write('up');const end=Date.now()+${maxMs};while(Date.now()<end){}`], { stdio: ['ignore', 'pipe', 'ignore'] });
    children.push(child);
    started.push(new Promise((resolve, reject) => {
      child.stdout?.once('data', () => resolve());
      child.once('error', reject);
      child.once('exit', () => resolve());
    }));
  }
  await Promise.all(started);
  return {
    pids: children.map((c) => c.pid as number),
    async stop() {
      await Promise.all(children.map((c) => new Promise<void>((resolve) => {
        if (c.exitCode !== null || c.signalCode !== null) return resolve();
        c.once('exit', () => resolve());
        c.kill('SIGKILL');
      })));
    },
  };
}
