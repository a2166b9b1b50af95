/** `bin/atoll` as a user runs it, from the end-to-end tests. */
import { spawn } from 'node:child_process';
import { ATOLL_BIN } from '../../src/lab/agent-process.ts';

/**
 * Runs `bin/atoll args`, collecting stdout and stderr together; after `timeoutMs` it is sent SIGTERM (the lab then
 * removes itself before it exits).
 */
export function runAtoll(args: readonly string[], timeoutMs: number): Promise<{ code: number | null; out: string }> {
  return new Promise((resolve) => {
    const child = spawn(ATOLL_BIN, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (out += d.toString()));
    const timer = setTimeout(() => child.kill('SIGTERM'), timeoutMs);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, out });
    });
  });
}
