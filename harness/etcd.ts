/**
 * Throwaway etcd clusters for tests: real `etcd` processes on 127.0.0.1 with free ports and their own data
 * directories, stopped by pid and removed by {@link EtcdCluster.stop}.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdirSync, openSync, closeSync, readFileSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';

const START_DEADLINE_MS = 20_000;
const START_TRIES = 3;

export interface EtcdMember {
  readonly name: string;
  readonly pid: number;
  readonly clientUrl: string;
}

export interface EtcdCluster {
  /** Client URLs, in member order. */
  readonly endpoints: string[];
  readonly members: EtcdMember[];
  /** Sends `signal` to member `memberIndex` and waits until it has exited. */
  kill(memberIndex: number, signal: NodeJS.Signals): Promise<void>;
  /** Kills every member still running (by pid) and removes the data directories. */
  stop(): Promise<void>;
}

/** Why etcd tests skip here, or false when they can run. */
export function etcdSkipReason(): string | false {
  return spawnSync('etcd', ['--version']).status === 0 ? false : 'needs the etcd binary on PATH (Debian: apt-get install etcd-server)';
}

/**
 * Starts `members` etcd processes as one cluster under `dir` and waits until each answers `/health`.
 * Fast raft timing (heartbeat 50 ms, election 500 ms) keeps failover tests short. Retries with new ports when a
 * port picked turns out taken.
 */
export async function startEtcdCluster(opts: { members: 1 | 3; dir: string; netns?: string }): Promise<EtcdCluster> {
  let lastError: unknown;
  for (let attempt = 0; attempt < START_TRIES; attempt++) {
    try {
      return await startOnce(opts.members, join(opts.dir, `etcd-${randomBytes(3).toString('hex')}`), opts.netns);
    } catch (err) {
      lastError = err;
    }
  }
  throw lastError;
}

interface Running {
  readonly member: EtcdMember;
  readonly child: ChildProcess;
  readonly logFile: string;
  exited: Promise<void>;
  alive: boolean;
}

/** Starts the members; with `netns`, inside that namespace (on its loopback), health-checked with etcdctl there. */
async function startOnce(count: number, clusterDir: string, netns?: string): Promise<EtcdCluster> {
  mkdirSync(clusterDir, { recursive: true });
  const token = `atoll-test-${randomBytes(4).toString('hex')}`;
  const ports = await freePorts(count * 2);
  const names = Array.from({ length: count }, (_, i) => `m${i}`);
  const peerUrl = (i: number) => `http://127.0.0.1:${ports[2 * i + 1]}`;
  const clientUrl = (i: number) => `http://127.0.0.1:${ports[2 * i]}`;
  const initialCluster = names.map((n, i) => `${n}=${peerUrl(i)}`).join(',');
  const running: Running[] = names.map((name, i) => {
    const dataDir = join(clusterDir, name);
    const logFile = join(clusterDir, `${name}.log`);
    const out = openSync(logFile, 'w');
    const launcher = netns ? ['ip', 'netns', 'exec', netns, 'etcd'] : ['etcd'];
    const child = spawn(launcher[0] as string, [...launcher.slice(1),
      '--name', name, '--data-dir', dataDir,
      '--listen-client-urls', clientUrl(i), '--advertise-client-urls', clientUrl(i),
      '--listen-peer-urls', peerUrl(i), '--initial-advertise-peer-urls', peerUrl(i),
      '--initial-cluster', initialCluster, '--initial-cluster-state', 'new', '--initial-cluster-token', token,
      '--heartbeat-interval', '50', '--election-timeout', '500', '--logger', 'zap', '--log-outputs', 'stderr',
    ], { stdio: ['ignore', out, out] });
    closeSync(out);
    if (child.pid === undefined) throw new Error(`etcd ${name} did not start (is it on PATH?)`);
    const r: Running = { member: { name, pid: child.pid, clientUrl: clientUrl(i) }, child, logFile, alive: true, exited: Promise.resolve() };
    r.exited = new Promise((resolve) => child.once('exit', () => {
      r.alive = false;
      resolve();
    }));
    return r;
  });

  const cluster: EtcdCluster = {
    endpoints: running.map((r) => r.member.clientUrl),
    members: running.map((r) => r.member),
    async kill(memberIndex, signal) {
      const r = running[memberIndex];
      if (r === undefined) throw new Error(`no etcd member ${memberIndex} (the cluster has ${running.length})`);
      if (r.alive) process.kill(r.member.pid, signal);
      await r.exited;
    },
    async stop() {
      for (const r of running) if (r.alive) process.kill(r.member.pid, 'SIGKILL');
      await Promise.all(running.map((r) => r.exited));
      rmSync(clusterDir, { recursive: true, force: true });
    },
  };

  try {
    await Promise.all(running.map((r) => waitHealthy(r, netns)));
  } catch (err) {
    await cluster.stop();
    throw err;
  }
  return cluster;
}

async function waitHealthy(r: Running, netns?: string): Promise<void> {
  const deadline = Date.now() + START_DEADLINE_MS;
  let last = 'no answer yet';
  while (Date.now() < deadline) {
    if (!r.alive) throw new Error(`etcd ${r.member.name} exited while starting:\n${tail(r.logFile)}`);
    if (netns) {
      const res = spawnSync('ip', ['netns', 'exec', netns, 'etcdctl', '--endpoints', r.member.clientUrl, '--command-timeout=1s', 'endpoint', 'health'], { encoding: 'utf8' });
      if (res.status === 0) return;
      last = res.stderr.trim();
      await new Promise((resolve) => setTimeout(resolve, 100));
      continue;
    }
    try {
      const res = await fetch(`${r.member.clientUrl}/health`, { signal: AbortSignal.timeout(1000) });
      const body = (await res.json()) as { health?: string };
      if (body.health === 'true') return;
      last = JSON.stringify(body);
    } catch (err) {
      last = String(err);
    }
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  throw new Error(`etcd ${r.member.name} at ${r.member.clientUrl} not healthy within ${START_DEADLINE_MS} ms (${last}):\n${tail(r.logFile)}`);
}

function tail(file: string): string {
  try {
    return readFileSync(file, 'utf8').split('\n').slice(-15).join('\n');
  } catch {
    return '(no log)';
  }
}

/** Ports the kernel hands out for port 0 on 127.0.0.1, all held at once so they differ. */
async function freePorts(n: number): Promise<number[]> {
  const servers = await Promise.all(Array.from({ length: n }, () => new Promise<ReturnType<typeof createServer>>((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => resolve(s));
  })));
  const ports = servers.map((s) => (s.address() as { port: number }).port);
  await Promise.all(servers.map((s) => new Promise((resolve) => s.close(resolve))));
  return ports;
}
