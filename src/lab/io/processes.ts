/**
 * Processes by PID, never by name: is a PID still the process we started (its command line carries a tag, such as
 * the lab run's directory, so a reused PID is never signalled), stop it with a bounded grace period, and find the
 * processes living in given network namespaces (as `ip netns pids` does: the namespace file's inode against each
 * process's /proc/<pid>/ns/net).
 */
import { readdirSync, readFileSync, readlinkSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { pollUntil } from '../../core/retry.ts';
import { sleep, wallClock } from '../../adapters/timers.ts';

/** Where `ip netns add` keeps named network namespaces. */
export const NETNS_DIR = '/var/run/netns';

/** True while `pid` exists and is not a zombie. */
export function isAlive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3) !== 'Z';
  } catch {
    return false;
  }
}

/** The command line of `pid`, arguments joined by spaces, or undefined when it is gone. */
export function commandLine(pid: number): string | undefined {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').join(' ').trim();
  } catch {
    return undefined;
  }
}

export type StopOutcome = 'gone' | 'not ours' | 'stopped' | 'killed' | 'survived';

/**
 * Stops `pid`: SIGTERM, then SIGKILL after `graceMs`; waits (bounded) until it is gone. When `tag` is given the
 * process is signalled only if its command line contains it (otherwise the PID was reused: 'not ours').
 */
export async function stopPid(pid: number, opts: { tag?: string; graceMs?: number } = {}): Promise<StopOutcome> {
  if (!isAlive(pid)) return 'gone';
  if (opts.tag !== undefined && !(commandLine(pid) ?? '').includes(opts.tag)) return 'not ours';
  const signal = (s: NodeJS.Signals) => {
    try {
      process.kill(pid, s);
    } catch {
      // gone meanwhile
    }
  };
  signal('SIGTERM');
  const until = (ms: number) => pollUntil(() => !isAlive(pid), { intervalMs: 25, timeoutMs: ms }, { clock: wallClock, sleep });
  if (await until(opts.graceMs ?? 3000)) return 'stopped';
  signal('SIGKILL');
  return (await until(2000)) ? 'killed' : 'survived';
}

/** Names of the network namespaces under /var/run/netns. */
export function listNetns(dir = NETNS_DIR): string[] {
  try {
    return readdirSync(dir);
  } catch {
    return [];
  }
}

/** The PIDs of processes in each of the named namespaces (namespaces that do not exist are left out). */
export function pidsInNetns(names: readonly string[], dir = NETNS_DIR): Map<string, number[]> {
  const byInode = new Map<string, string>();
  for (const name of names) {
    try {
      byInode.set(`net:[${statSync(join(dir, name)).ino}]`, name);
    } catch {
      // not there
    }
  }
  const out = new Map<string, number[]>();
  if (byInode.size === 0) return out;
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    let link: string;
    try {
      link = readlinkSync(`/proc/${entry}/ns/net`);
    } catch {
      continue;
    }
    const name = byInode.get(link);
    if (name) out.set(name, [...(out.get(name) ?? []), Number(entry)]);
  }
  return out;
}
