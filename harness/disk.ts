/**
 * Disk faults without device mapper (issue #39, GUIDE 3.7): a throwaway tmpfs as an agent's data directory, filled
 * to ENOSPC or remounted read-only. Whoever mounts unmounts, also when a test fails ({@link unmount} in `after`).
 */
import { spawnSync } from 'node:child_process';
import { mkdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { RUN_PREFIX, sh } from './netns.ts';

/** A tmpfs at `dir`, `size` bytes; unmounted by {@link unmount}. */
export function mountTmpfs(dir: string, size: number): void {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  sh('mount', ['-t', 'tmpfs', '-o', `size=${size},mode=0700`, `${RUN_PREFIX}data`, dir]);
}

/** Unmounts `dir` if it is a mount point (lazily when something still holds it open). */
export function unmount(dir: string): void {
  if (!isMounted(dir)) return;
  const res = spawnSync('umount', [dir], { encoding: 'utf8' });
  if (res.status !== 0) spawnSync('umount', ['-l', dir]); // something still holds it open: detach it anyway
}

/**
 * Remounts `dir` read-only or read-write. `ip netns exec` gives the agent a copy of the mount table: a copy made
 * while the mount was read-only keeps that flag of its own, so read-write is restored in the agent's copy too.
 */
export function remount(dir: string, mode: 'ro' | 'rw', agentPid?: number): void {
  sh('mount', ['-o', `remount,${mode}`, dir]);
  if (mode === 'rw' && agentPid !== undefined) sh('nsenter', [`--mount=/proc/${agentPid}/ns/mnt`, 'mount', '-o', 'remount,rw', dir]);
}

export function isMounted(dir: string): boolean {
  return readFileSync('/proc/self/mounts', 'utf8').split('\n').some((l) => l.split(' ')[1] === dir);
}

/** Fills the file system holding `dir` until ENOSPC; returns the filler's path (remove it to give the space back). */
export function fill(dir: string): string {
  const path = join(dir, 'filler');
  const res = spawnSync('dd', ['if=/dev/zero', `of=${path}`, 'bs=4096'], { encoding: 'utf8' });
  if (!/No space left on device/.test(res.stderr)) throw new Error(`dd should stop at ENOSPC in ${dir}: ${res.stderr}`);
  return path;
}
