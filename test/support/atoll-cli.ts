/** `bin/atoll` as a user runs it, from the end-to-end tests. */
import { spawn } from 'node:child_process';
import { ATOLL_BIN } from '../../src/lab/agent-process.ts';

/**
 * Runs `bin/atoll args`, collecting stdout and stderr together; after `timeoutMs` it is sent SIGTERM (the lab then
 * removes itself before it exits).
 */
export function runAtoll(args: readonly string[], timeoutMs: number): Promise<{ code: number | null; out: string }> {
  return runCommand([ATOLL_BIN, ...args], timeoutMs);
}

/** Runs `argv` (in `cwd`, default here) as {@link runAtoll} runs `bin/atoll`. */
export function runCommand(argv: readonly string[], timeoutMs: number, cwd?: string): Promise<{ code: number | null; out: string }> {
  return new Promise((resolve) => {
    const child = spawn(argv[0] as string, argv.slice(1), { stdio: ['ignore', 'pipe', 'pipe'], ...(cwd ? { cwd } : {}) });
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
