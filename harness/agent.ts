/**
 * A real `atoll agent` process in a throwaway host namespace, with its own data, CNI and socket directories, and a
 * way to call the real `atoll-cni` binary against it.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { keeperSocketOf, stopKeeper } from '../src/adapters/tunnel/keeper.ts';
import { AgentProcess, REPO_ROOT } from '../src/lab/agent-process.ts';
import { addNetns, delNetns, dumpNetns, RUN_PREFIX } from './netns.ts';

export const REPO = REPO_ROOT;

export interface CniCall {
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
  readonly json: Record<string, unknown> | undefined;
}

export interface TestAgentInit {
  /** Short name, used in namespace and bridge names. */
  readonly name: string;
  readonly podCidrs?: readonly string[];
  /** Extra configuration keys. */
  readonly config?: Record<string, unknown>;
}

export class TestAgent {
  readonly dir: string;
  readonly netns: string;
  readonly socket: string;
  readonly binDir: string;
  readonly confDir: string;
  readonly dataDir: string;
  readonly configPath: string;
  readonly bridge: string;
  readonly #proc: AgentProcess;
  #podNetns: string[] = [];
  #launcher: readonly string[];

  constructor(init: TestAgentInit) {
    this.dir = mkdtempSync(join(tmpdir(), `${RUN_PREFIX}${init.name}-`));
    this.netns = addNetns(`${init.name}-host`);
    this.socket = join(this.dir, 'agent.sock');
    this.binDir = join(this.dir, 'bin');
    this.confDir = join(this.dir, 'conf');
    this.dataDir = join(this.dir, 'data');
    this.configPath = join(this.dir, 'agent.json');
    this.#launcher = ['ip', 'netns', 'exec', this.netns];
    this.bridge = `atb${RUN_PREFIX.slice(5, 11)}${init.name}`.slice(0, 15);
    const cfg = {
      nodeName: init.name,
      podCidrs: init.podCidrs ?? ['10.77.0.0/24'],
      cniBinDir: this.binDir,
      cniConfDir: this.confDir,
      dataDir: this.dataDir,
      socketPath: this.socket,
      bridge: this.bridge,
      resyncPeriod: 2,
      ...init.config,
    };
    writeFileSync(this.configPath, JSON.stringify(cfg, null, 2));
    this.#proc = new AgentProcess({ configPath: this.configPath, socketPath: this.socket, logPath: this.logPath, logLevel: 'debug' });
  }

  /** Merges `keys` into the agent's configuration file (takes effect at the next start). */
  rewriteConfig(keys: Record<string, unknown>): void {
    const cfg = JSON.parse(readFileSync(this.configPath, 'utf8')) as Record<string, unknown>;
    writeFileSync(this.configPath, JSON.stringify({ ...cfg, ...keys }, null, 2));
  }

  get pid(): number | undefined {
    return this.#proc.pid;
  }

  /** Whether the agent process is alive (false once it exited, e.g. on an uncaught exception). */
  get running(): boolean {
    return this.#proc.running;
  }

  get logPath(): string {
    return join(this.dir, 'agent.log');
  }

  /**
   * Starts the agent and waits until its socket answers (bounded). By default it runs in its own namespace via
   * `ip netns exec`; `launcher` replaces that prefix (e.g. nsenter into a private containerd's mount namespace).
   */
  async start(timeoutMs = 15_000, launcher?: readonly string[]): Promise<void> {
    this.#launcher = launcher ?? this.#launcher;
    await this.#proc.start(this.#launcher, timeoutMs);
  }

  /** Stops the agent: SIGTERM (graceful) or SIGKILL. */
  stop(signal: 'SIGTERM' | 'SIGKILL' = 'SIGTERM'): Promise<void> {
    return this.#proc.stop(signal);
  }

  /** Calls the installed `atoll-cni` binary synchronously. */
  cni(env: Record<string, string>, stdin: string | Buffer): CniCall {
    const bin = existsSync(join(this.binDir, 'atoll-cni')) ? join(this.binDir, 'atoll-cni') : join(REPO, 'bin/atoll-cni');
    const res = spawnSync(bin, [], { env: { ATOLL_AGENT_SOCKET: this.socket, ...env }, input: stdin, encoding: 'utf8', maxBuffer: 8 << 20 });
    let json: Record<string, unknown> | undefined;
    try {
      json = res.stdout.trim() ? (JSON.parse(res.stdout) as Record<string, unknown>) : undefined;
    } catch {
      json = undefined;
    }
    return { code: res.status ?? -1, stdout: res.stdout, stderr: res.stderr, json };
  }

  /** The network configuration the runtime would pass to our plugin. */
  netconf(version = '1.0.0', extra: Record<string, unknown> = {}): string {
    return JSON.stringify({ cniVersion: version, name: 'atoll', type: 'atoll-cni', agentSocket: this.socket, ...extra });
  }

  /** A pod namespace (removed on cleanup); returns its path. */
  podNetns(name: string): string {
    const full = addNetns(`${name}-pod`);
    this.#podNetns.push(full);
    return `/var/run/netns/${full}`;
  }

  /** Environment of a Kubernetes-style call. */
  env(verb: string, containerId: string, netns: string, pod?: { namespace: string; name: string }): Record<string, string> {
    const args = pod ? `IgnoreUnknown=1;K8S_POD_NAMESPACE=${pod.namespace};K8S_POD_NAME=${pod.name};K8S_POD_INFRA_CONTAINER_ID=${containerId}` : '';
    return { CNI_COMMAND: verb, CNI_CONTAINERID: containerId, CNI_NETNS: netns, CNI_IFNAME: 'eth0', CNI_PATH: '/usr/lib/cni', CNI_ARGS: args };
  }

  /** What the agent saved from the controller (cluster-state.json), or empty values before it first connected. */
  clusterState(): { blocks: string[]; peers: { name: string; blocks: string[]; vtepMac: string; tunnelKey: string; addresses: string[]; annotations: Record<string, string> }[] } {
    const path = join(this.dataDir, 'cluster-state.json');
    return existsSync(path) ? JSON.parse(readFileSync(path, 'utf8')) : { blocks: [], peers: [] };
  }

  /** ADDs a Kubernetes-style pod `default/<name>` in a new namespace; returns its IPv4 address. Throws on failure. */
  addPod(name: string): string {
    const res = this.cni(this.env('ADD', `c-${name}`, this.podNetns(name), { namespace: 'default', name }), this.netconf());
    const ip = (res.json?.ips as { address: string }[] | undefined)?.[0]?.address;
    if (res.code !== 0 || !ip) throw new Error(`ADD of pod ${name} failed: ${res.stdout}\n${this.dump()}`);
    return ip.split('/')[0] as string;
  }

  /** Runs a command inside a namespace path. */
  execIn(nsPath: string, cmd: string, args: readonly string[]): { code: number; out: string } {
    const res = spawnSync('nsenter', [`--net=${nsPath}`, cmd, ...args], { encoding: 'utf8', timeout: 20_000 });
    return { code: res.status ?? -1, out: res.stdout + res.stderr };
  }

  dump(): string {
    return `${dumpNetns(this.netns)}\n# agent log (tail)\n${this.#proc.logTail()}`;
  }

  /** Stops the agent and its tunnel's keeper, and removes every namespace and file of this agent. */
  async cleanup(): Promise<void> {
    await this.stop('SIGKILL');
    await stopKeeper(keeperSocketOf(this.dataDir));
    for (const ns of this.#podNetns) delNetns(ns);
    delNetns(this.netns);
    rmSync(this.dir, { recursive: true, force: true });
  }
}
