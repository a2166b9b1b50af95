/**
 * The node agent: wires preflight, the pod network, the CNI socket and the resync loop together.
 * Start-up errors are fatal; a failed resync step is logged and retried on the next tick.
 */
import { readdirSync } from 'node:fs';
import { join } from 'node:path';
import { AtollError } from '../core/errors.ts';
import { type Cidr, formatCidr, parseCidr } from '../core/net/ipv4.ts';
import { preflight } from '../core/plan/preflight.ts';
import type { Clock, Logger } from '../core/ports.ts';
import type { AgentConfig } from '../config/agent-config.ts';
import { buildConflist, installCni } from '../adapters/cni-install.ts';
import { FsIpamStore } from '../adapters/ipam-store-fs.ts';
import type { IpRoute2 } from '../adapters/iproute2.ts';
import { initNetns } from '../adapters/netns.ts';
import { installRoot } from '../adapters/install-root.ts';
import { ClusterStateFile } from '../adapters/cluster-state-file.ts';
import { loadOrCreateIdentity } from '../adapters/node-identity.ts';
import { type CniServer, startCniServer } from './cni-server.ts';
import { ControllerLink } from './controller-link.ts';
import { PodNetwork } from './pod-network.ts';

export interface AgentComponents {
  readonly ip: IpRoute2;
  readonly log: Logger;
  readonly clock: Clock;
}

/** The shim the set-up builds, used when the configuration names none. */
export const AGENT_VERSION = '0.1.0';

export const DEFAULT_PLUGIN_SOURCE = join(installRoot(), 'bin', 'atoll-cni');

export class Agent {
  readonly #c: AgentComponents;
  readonly #cfg: AgentConfig;
  #pods: PodNetwork | undefined;
  #server: CniServer | undefined;
  #timer: NodeJS.Timeout | undefined;
  #link: ControllerLink | undefined;

  constructor(components: AgentComponents, config: AgentConfig) {
    this.#c = components;
    this.#cfg = config;
  }

  get pods(): PodNetwork | undefined {
    return this.#pods;
  }

  /** Checks the node, then builds what is missing and starts serving. @throws AtollError on any start-up problem. */
  async start(): Promise<void> {
    const cfg = this.#cfg;
    const log = this.#c.log;
    log.info('atoll agent starting', { config: { ...cfg, controller: cfg.controller && { ...cfg.controller, token: '(redacted)' } } });
    const stateFile = new ClusterStateFile(join(cfg.dataDir, 'cluster-state.json'));
    const saved = stateFile.load();
    const blocks = this.#blocksWith(saved.blocks);
    await this.#preflight(blocks);
    initNetns();
    this.#pods = new PodNetwork(
      { ip: this.#c.ip, store: new FsIpamStore(cfg.dataDir, cfg.network), log: log.child('pods'), clock: this.#c.clock },
      { nodeName: cfg.nodeName, network: cfg.network, bridge: cfg.bridge, mtu: cfg.mtu, blocks, reservationTtlMs: cfg.reservationTtl },
    );
    await this.#pods.start();
    if (cfg.controller) this.#startLink(cfg.controller, stateFile);
    this.#server = await startCniServer(cfg.socketPath, this.#pods, log.child('cni'));
    const changed = installCni({
      binDir: cfg.cniBinDir,
      confDir: cfg.cniConfDir,
      confName: cfg.cniConfName,
      pluginSource: cfg.cniPluginSource ?? DEFAULT_PLUGIN_SOURCE,
      conflist: buildConflist({ network: cfg.network, cniVersion: cfg.cniVersion, socketPath: cfg.socketPath, chained: cfg.chainedPlugins }),
    });
    if (changed.length > 0) log.info('installed the CNI plugin', { files: changed });
    this.#timer = setInterval(() => void this.#resync(), cfg.resyncPeriod);
    this.#timer.unref();
    log.info('atoll agent ready', { socket: cfg.socketPath, usage: this.#pods.ipam.usage() });
  }

  get link(): ControllerLink | undefined {
    return this.#link;
  }

  /** The configured podCidrs plus the blocks leased by the controller, without duplicates. */
  #blocksWith(leased: readonly string[]): Cidr[] {
    const all = new Map<string, Cidr>();
    for (const b of this.#cfg.podBlocks) all.set(formatCidr(b), b);
    for (const text of leased) {
      const b = parseCidr(text);
      if (b) all.set(formatCidr(b), b);
    }
    return [...all.values()];
  }

  #startLink(controller: NonNullable<AgentConfig['controller']>, stateFile: ClusterStateFile): void {
    const cfg = this.#cfg;
    const pods = this.#pods as PodNetwork;
    this.#link = new ControllerLink(
      {
        log: this.#c.log.child('controller-link'),
        clock: this.#c.clock,
        identity: loadOrCreateIdentity(join(cfg.dataDir, 'node.key')),
        stateFile,
        onBlocks: (leased) => pods.setBlocks(this.#blocksWith(leased)),
        usage: () => pods.ipam.usage(),
      },
      {
        urls: controller.urls,
        token: controller.token,
        caCertHash: controller.caCertHash,
        caPath: join(cfg.dataDir, 'controller-ca.pem'),
        nodeName: cfg.nodeName,
        fields: { site: cfg.site, community: cfg.community, addresses: cfg.underlayAddresses, vtepMac: '', tunnelKey: '', agentVersion: AGENT_VERSION },
        usagePeriodMs: controller.usagePeriod,
      },
    );
    this.#link.start();
  }

  async stop(): Promise<void> {
    await this.#link?.stop();
    if (this.#timer) clearInterval(this.#timer);
    this.#pods?.stop();
    await this.#server?.close();
    this.#c.log.info('atoll agent stopped');
  }

  async #resync(): Promise<void> {
    try {
      await this.#pods?.ensureBridge();
      await this.#pods?.reconcile();
    } catch (err) {
      this.#c.log.error('resync failed; retrying next period', { err });
    }
  }

  async #preflight(blocks: readonly Cidr[]): Promise<void> {
    const cfg = this.#cfg;
    let confFiles: string[] = [];
    try {
      confFiles = readdirSync(cfg.cniConfDir);
    } catch {
      // no conf dir yet: nothing sorts before ours
    }
    const [addrs, routes, bridge] = await Promise.all([this.#c.ip.addrs(), this.#c.ip.routes(), this.#c.ip.link(cfg.bridge)]);
    const problems = preflight({
      confFiles,
      confDir: cfg.cniConfDir,
      ourConf: cfg.cniConfName,
      podBlocks: blocks,
      bridgeName: cfg.bridge,
      bridge: bridge && {
        kind: bridge.linkinfo?.info_kind,
        addresses: (addrs.find((a) => a.ifname === cfg.bridge)?.addr_info ?? []).filter((i) => i.family === 'inet').map((i) => `${i.local}/${i.prefixlen}`),
      },
      hostAddresses: addrs.flatMap((a) => a.addr_info.filter((i) => i.family === 'inet').map((i) => ({ ifname: a.ifname, cidr: `${i.local}/${i.prefixlen}` }))),
      hostRoutes: routes,
    });
    if (problems.length > 0) {
      for (const p of problems) this.#c.log.error('preflight refused to start', { code: p.code, err: p.message, fix: p.fix });
      throw problems[0] as AtollError;
    }
  }
}
