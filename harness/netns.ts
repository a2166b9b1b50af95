/**
 * Throwaway network namespaces for root tests: unique names per run, always removed.
 */
import { execFileSync, spawnSync, type SpawnSyncReturns } from 'node:child_process';
import { randomBytes } from 'node:crypto';

/** A prefix unique to this test process, e.g. `atlt-1a2b3c-`. */
export const RUN_PREFIX = `atlt-${randomBytes(3).toString('hex')}-`;

export function isRoot(): boolean {
  return process.getuid?.() === 0;
}

/** Why root tests skip here, or false when they can run. */
export function rootSkipReason(): string | false {
  return isRoot() ? false : 'needs root: builds network namespaces, links and a private agent';
}

export function sh(cmd: string, args: readonly string[], input?: string, env?: Record<string, string>): string {
  return execFileSync(cmd, args, { encoding: 'utf8', input, stdio: ['pipe', 'pipe', 'pipe'], env: env ? { ...process.env, ...env } : undefined });
}

/** Creates a namespace named RUN_PREFIX + `name`, with loopback up; returns its name. */
export function addNetns(name: string): string {
  const full = RUN_PREFIX + name;
  sh('ip', ['netns', 'add', full]);
  sh('ip', ['-n', full, 'link', 'set', 'lo', 'up']);
  return full;
}

export function delNetns(full: string): void {
  try {
    sh('ip', ['netns', 'del', full]);
  } catch {
    // already gone
  }
}

/** Every namespace of this run still present. */
export function leftoverNetns(): string[] {
  return sh('ip', ['netns', 'list']).split('\n').map((l) => l.split(' ')[0] ?? '').filter((n) => n.startsWith(RUN_PREFIX));
}

/** What to print when a kernel test fails: links, routes and rules of a namespace. */
export function dumpNetns(full: string): string {
  const run = (args: string[]) => {
    try {
      return sh('ip', ['-n', full, ...args]);
    } catch (e) {
      return String(e);
    }
  };
  // the links' packet and drop counters, and the UDP counters (a full socket queue drops silently: RcvbufErrors)
  const udp = inNetns(full, 'cat', ['/proc/net/snmp']).stdout?.split('\n').filter((l) => l.startsWith('Udp:')).join('\n') ?? '';
  return [`# ${full}`, run(['-s', '-d', 'link']), run(['addr']), run(['route']), udp].join('\n');
}

/** Runs `cmd` in namespace `ns` (ip netns exec), bounded by `timeoutMs`; never throws. */
export function inNetns(ns: string, cmd: string, args: readonly string[], timeoutMs = 20_000): SpawnSyncReturns<string> {
  return spawnSync('ip', ['netns', 'exec', ns, cmd, ...args], { encoding: 'utf8', timeout: timeoutMs });
}
