/** Sysctls under /proc/sys, in the agent's namespace or a pod's. */
import { writeFileSync } from 'node:fs';
import { atollError } from '../core/errors.ts';
import { inNetns } from './netns.ts';

/** Writes `value` to /proc/sys/`key` (e.g. `net/ipv4/ip_forward`), in `netns` when given. Idempotent. */
export function writeSysctl(key: string, value: string, netns?: string): void {
  if (netns) inNetns(netns, () => writeSysctlHere(key, value, netns));
  else writeSysctlHere(key, value);
}

/**
 * Writes /proc/sys/`key` in the namespace the calling thread is in now (for use inside `inNetns`, which does not
 * nest); `where` names that namespace in errors.
 */
export function writeSysctlHere(key: string, value: string, where?: string): void {
  try {
    writeFileSync(`/proc/sys/${key}`, value);
  } catch (cause) {
    throw atollError('KERNEL_OP_FAILED', `cannot set sysctl ${key.replaceAll('/', '.')}=${value}${where ? ` in ${where}` : ''}`,
      'check that /proc/sys is writable (the agent needs CAP_NET_ADMIN and CAP_SYS_ADMIN)', cause);
  }
}
