/**
 * Running external tools: argument arrays only, never a shell. Optionally inside a pod network namespace.
 */
import { spawn } from 'node:child_process';
import { inNetns } from './kernel/netns.ts';

export interface ExecResult {
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
}

export interface ExecOptions {
  /** Written to the child's stdin, which is then closed. */
  readonly input?: string;
  /** Path of a network namespace to run the child in. */
  readonly netns?: string;
}

/** Runs a command and resolves with its exit code and output; rejects only when it cannot be started. */
export type Exec = (cmd: string, args: readonly string[], opts?: ExecOptions) => Promise<ExecResult>;

export const exec: Exec = (cmd, args, opts = {}) => {
  const start = () => spawn(cmd, args, { stdio: ['pipe', 'pipe', 'pipe'] });
  const child = opts.netns ? inNetns(opts.netns, start) : start();
  return new Promise((resolve, reject) => {
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout.on('data', (d: Buffer) => out.push(d));
    child.stderr.on('data', (d: Buffer) => err.push(d));
    child.on('error', reject);
    child.on('close', (code, signal) => {
      resolve({
        code: code ?? (signal ? 128 : 1),
        stdout: Buffer.concat(out).toString('utf8'),
        stderr: Buffer.concat(err).toString('utf8'),
      });
    });
    child.stdin.on('error', () => {});
    child.stdin.end(opts.input ?? '');
  });
};
