/**
 * TCP between pods, through l4-probe.ts run with the project's Node inside a pod's network namespace (a path:
 * `/var/run/netns/<name>`, or `/proc/<sandbox pid>/ns/net` for a pod a container runtime made).
 */
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { until } from '../../harness/wait.ts';
import { PROJECT_NODE } from '../../src/lab/agent-process.ts';

const PROBE = fileURLToPath(new URL('l4-probe.ts', import.meta.url));

/** Starts a prober serving TCP (and UDP) `port` in `netns` and waits until it listens; kill it by its PID when done. */
export async function servePod(netns: string, port: number, what: string): Promise<ChildProcess> {
  const server = spawn('nsenter', [`--net=${netns}`, PROJECT_NODE, PROBE, 'serve', String(port)], { stdio: 'ignore' });
  await until(`the prober serving in ${what}`, () => spawnSync('nsenter', [`--net=${netns}`, 'ss', '-Hltn', 'sport', '=', `:${port}`], { encoding: 'utf8' }).stdout.trim() !== '', 10_000, 20);
  return server;
}

/** Whether `ip` answers TCP `port` from inside `netns` (within the prober's 800 ms). */
export function answersTcp(netns: string, ip: string, port: number): boolean {
  const res = spawnSync('nsenter', [`--net=${netns}`, PROJECT_NODE, PROBE, 'try', JSON.stringify([{ ip, proto: 'tcp', port }])], { encoding: 'utf8', timeout: 15_000 });
  return res.stdout === '[true]';
}
