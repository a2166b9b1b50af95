/** Sysctls under /proc/sys, in the agent's namespace or a pod's. */
import { readFileSync, writeFileSync } from 'node:fs';
import { atollError } from '../core/errors.ts';
import { inNetns } from './netns.ts';

/** Writes `value` to /proc/sys/`key` (e.g. `net/ipv4/ip_forward`), in `netns` when given. Idempotent. */
export function writeSysctl(key: string, value: string, netns?: string): void {
  const path = `/proc/sys/${key}`;
  const write = () => writeFileSync(path, value);
  try {
    if (netns) inNetns(netns, write);
    else write();
  } catch (cause) {
    throw atollError('KERNEL_OP_FAILED', `cannot set sysctl ${key.replaceAll('/', '.')}=${value}${netns ? ` in ${netns}` : ''}`,
      'check that /proc/sys is writable (the agent needs CAP_NET_ADMIN and CAP_SYS_ADMIN)', cause);
  }
}

export function readSysctl(key: string): string {
  return readFileSync(`/proc/sys/${key}`, 'utf8').trim();
}
