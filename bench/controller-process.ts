/**
 * A real controller process for the benchmarks: `bin/atoll controller` (the bundle users run) on 127.0.0.1, a free
 * port, a fresh data directory, a /8 of /26 blocks (262,144 of them: enough for any node count a benchmark asks for),
 * and the benchmarks' bootstrap and admin tokens. bench/controller.ts and bench/watch-view.ts start theirs here.
 * Nothing needs root. The caller owns the process: it is added to `owner.procs`, so a cleanup kills it by PID.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { openSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { ATOLL_BIN } from '../src/lab/agent-process.ts';
import { freePort } from '../harness/ports.ts';

export const BOOTSTRAP_TOKEN = 'atoll-bench-bootstrap-0123456789';
export const ADMIN_TOKEN = 'atoll-bench-admin-0123456789abcdef';

/** Where a benchmark keeps its files and the processes it must kill on the way out. */
export interface ProcessOwner {
  readonly dir: string;
  readonly procs: Set<ChildProcess>;
}

export interface Controller {
  readonly proc: ChildProcess;
  readonly pid: number;
  readonly url: string;
  readonly caPem: string;
  readonly log: string;
}

/**
 * Starts `bin/atoll controller` with a fresh data directory `owner.dir/name` and the configuration `sections` over
 * the defaults (the store's, relay tokens...); resolves once it serves (its `caCertHash` line). `bin` is this
 * checkout's `bin/atoll` unless another is given (another commit's, to compare controllers).
 * @throws Error with the end of its log when it exits or does not serve within 60 s.
 */
export async function startController(owner: ProcessOwner, name: string, sections: Record<string, unknown>, bin = ATOLL_BIN): Promise<Controller> {
  const port = await freePort();
  const dataDir = join(owner.dir, name);
  const url = `https://127.0.0.1:${port}`;
  const configPath = join(owner.dir, `${name}.json`);
  writeFileSync(configPath, JSON.stringify({
    listenHost: '127.0.0.1', listenPort: port, advertiseUrl: url, clusterCidrs: ['10.0.0.0/8'], blockBits: 26, maxBlocksPerNode: 4, refillBelow: 8,
    dataDir, bootstrapTokens: [BOOTSTRAP_TOKEN], adminToken: ADMIN_TOKEN, ...sections,
  }));
  const log = join(owner.dir, `${name}.log`);
  const proc = spawn(bin, ['controller', '--config', configPath], { stdio: ['ignore', 'pipe', openSync(log, 'w')] });
  owner.procs.add(proc);
  await new Promise<void>((resolve, reject) => {
    let text = '';
    const timer = setTimeout(() => reject(new Error(`controller ${name} not serving within 60 s:\n${readFileSync(log, 'utf8').slice(-2000)}`)), 60_000);
    proc.stdout?.on('data', (d: Buffer) => {
      text += d.toString();
      if (/caCertHash sha256:/.test(text)) {
        clearTimeout(timer);
        resolve();
      }
    });
    proc.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`controller ${name} exited with ${code}:\n${readFileSync(log, 'utf8').slice(-2000)}`));
    });
  });
  return { proc, pid: proc.pid as number, url, caPem: readFileSync(join(dataDir, 'pki', 'ca.crt'), 'utf8'), log };
}

/** Stops it by PID (SIGTERM, SIGKILL after 5 s) and forgets it; idempotent. */
export async function stopController(owner: ProcessOwner, c: Controller): Promise<void> {
  if (c.proc.exitCode === null && c.proc.signalCode === null) {
    const exited = new Promise((r) => c.proc.once('exit', r));
    c.proc.kill('SIGTERM');
    const t = setTimeout(() => c.proc.kill('SIGKILL'), 5000);
    await exited;
    clearTimeout(t);
  }
  owner.procs.delete(c.proc);
}
