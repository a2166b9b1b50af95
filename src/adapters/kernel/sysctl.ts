/** Sysctls under /proc/sys, in the agent's namespace or a pod's. */
import { existsSync, writeFileSync } from 'node:fs';
import { atollError } from '../../core/errors.ts';
import { inNetns } from './netns.ts';

/**
 * Writes `value` to /proc/sys/`key` (e.g. `net/ipv4/ip_forward`), in `netns` when given. Idempotent. `ifPresent`: a
 * key the namespace does not have (its module not loaded) is skipped.
 */
export function writeSysctl(key: string, value: string, netns?: string, opts: { ifPresent?: boolean } = {}): void {
  const write = () => {
    if (!opts.ifPresent || existsSync(`/proc/sys/${key}`)) writeSysctlHere(key, value, netns);
  };
  if (netns) inNetns(netns, write);
  else write();
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
