/**
 * A small cloud for controller tests: a "cloud" namespace with an underlay bridge (192.0.2.0/24), controller
 * processes in it, and node namespaces (the TestAgents') wired to the bridge with veth pairs.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ATOLL_BIN, PROJECT_NODE } from '../src/lab/agent-process.ts';
import { stopChild } from '../src/lab/io/child-process.ts';
import { addNetns, delNetns, RUN_PREFIX, sh } from './netns.ts';

export const BOOTSTRAP_TOKEN = 'atoll-test-bootstrap-0123456789';
export const ADMIN_TOKEN = 'atoll-test-admin-0123456789abcdef';

export interface ControllerProc {
  readonly url: string;
  readonly dir: string;
  readonly configPath: string;
  caCertHash: string;
  proc: ChildProcess | undefined;
}

export class TestCloud {
  readonly netns: string;
  readonly dir: string;
  readonly bridge = 'atlcbr0';
  #next = 10;
  #controllers: ControllerProc[] = [];

  constructor() {
    this.netns = addNetns('cloud');
    this.dir = mkdtempSync(join(tmpdir(), `${RUN_PREFIX}cloud-`));
    sh('ip', ['-n', this.netns, 'link', 'add', this.bridge, 'type', 'bridge']);
    sh('ip', ['-n', this.netns, 'addr', 'add', '192.0.2.1/24', 'dev', this.bridge]);
    sh('ip', ['-n', this.netns, 'link', 'set', this.bridge, 'up']);
  }

  /** Wires a node namespace to the underlay; returns the node's underlay address. */
  connect(nodeNetns: string): string {
    const n = this.#next++;
    const ip = `192.0.2.${n}`;
    const cloudEnd = `atlu${n}`;
    sh('ip', ['-n', this.netns, 'link', 'add', cloudEnd, 'type', 'veth', 'peer', 'name', 'uplink0', 'netns', nodeNetns]);
    sh('ip', ['-n', this.netns, 'link', 'set', cloudEnd, 'master', this.bridge, 'up']);
    sh('ip', ['-n', nodeNetns, 'addr', 'add', `${ip}/24`, 'dev', 'uplink0']);
    sh('ip', ['-n', nodeNetns, 'link', 'set', 'uplink0', 'up']);
    return ip;
  }

  /** Writes a controller configuration (embedded store unless `store` says otherwise) and starts it. */
  async startController(name: string, opts: { port: number; store?: Record<string, unknown>; extra?: Record<string, unknown> }): Promise<ControllerProc> {
    const dir = join(this.dir, name);
    const url = `https://192.0.2.1:${opts.port}`;
    const configPath = join(this.dir, `${name}.json`);
    writeFileSync(configPath, JSON.stringify({
      listenHost: '192.0.2.1', listenPort: opts.port, advertiseUrl: url, clusterCidrs: ['10.100.0.0/16'], blockBits: 27,
      maxBlocksPerNode: 4, refillBelow: 8, dataDir: dir, bootstrapTokens: [BOOTSTRAP_TOKEN], adminToken: ADMIN_TOKEN,
      store: opts.store ?? { type: 'embedded' }, ...opts.extra,
    }, null, 2));
    const c: ControllerProc = { url, dir, configPath, caCertHash: '', proc: undefined };
    this.#controllers.push(c);
    await this.restartController(c);
    return c;
  }

  /** (Re)starts a controller process and waits for its "ready" line. */
  async restartController(c: ControllerProc, timeoutMs = 20_000): Promise<void> {
    const log = join(this.dir, `${c.url.split(':').pop()}.log`);
    const out = openSync(log, 'a');
    const proc = spawn('ip', ['netns', 'exec', this.netns, ATOLL_BIN, 'controller', '--config', c.configPath], { stdio: ['ignore', 'pipe', out] });
    c.proc = proc;
    c.caCertHash = await new Promise<string>((resolve, reject) => {
      let text = '';
      const timer = setTimeout(() => reject(new Error(`controller ${c.url} not ready in ${timeoutMs} ms:\n${readFileSync(log, 'utf8')}`)), timeoutMs);
      proc.stdout?.on('data', (d: Buffer) => {
        text += d.toString();
        const m = /caCertHash (sha256:[0-9a-f]{64})/.exec(text);
        if (m) {
          clearTimeout(timer);
          resolve(m[1] as string);
        }
      });
      proc.on('exit', (code) => {
        clearTimeout(timer);
        reject(new Error(`controller ${c.url} exited with ${code}:\n${readFileSync(log, 'utf8')}`));
      });
    });
  }

  stopController(c: ControllerProc, signal: 'SIGTERM' | 'SIGKILL' = 'SIGTERM'): Promise<void> {
    return stopChild(c.proc, signal);
  }

  /** The agent configuration keys that point at the controllers. */
  controllerConfig(controllers: readonly ControllerProc[]): Record<string, unknown> {
    return { urls: controllers.map((c) => c.url), token: BOOTSTRAP_TOKEN, caCertHash: controllers[0]?.caCertHash, usagePeriod: 1 };
  }

  /** Runs `atoll <args>` in the cloud namespace (for the admin commands). */
  cli(args: readonly string[]): { code: number; out: string } {
    try {
      return { code: 0, out: sh('ip', ['netns', 'exec', this.netns, ATOLL_BIN, ...args]) };
    } catch (e) {
      const err = e as { status?: number; stdout?: string; stderr?: string };
      return { code: err.status ?? -1, out: `${err.stdout ?? ''}${err.stderr ?? ''}` };
    }
  }

  /** GET /v1/health of a controller, from inside the cloud namespace (its CA from its PKI directory). */
  health(c: ControllerProc): { leader: boolean; leaderUrl?: string } | undefined {
    const cfg = JSON.parse(readFileSync(c.configPath, 'utf8')) as { pkiDir?: string };
    const ca = join(cfg.pkiDir ?? join(c.dir, 'pki'), 'ca.crt');
    try {
      const out = sh('ip', ['netns', 'exec', this.netns, PROJECT_NODE, '-e',
        `fetch(${JSON.stringify(`${c.url}/v1/health`)}).then(r => r.text()).then(t => process.stdout.write(t), () => process.exit(1))`], undefined, { NODE_EXTRA_CA_CERTS: ca });
      return JSON.parse(out) as { leader: boolean };
    } catch {
      return undefined;
    }
  }

  async cleanup(): Promise<void> {
    for (const c of this.#controllers) await this.stopController(c, 'SIGKILL');
    delNetns(this.netns);
    rmSync(this.dir, { recursive: true, force: true });
  }
}
