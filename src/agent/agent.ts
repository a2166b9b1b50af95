/**
 * The node agent: wires preflight, the pod network, the CNI socket and the resync loop together.
 * Start-up errors are fatal; a failed resync step is logged and retried on the next tick.
 */
import { readdirSync } from 'node:fs';
import { join } from 'node:path';
import { AtollError, atollError } from '../core/errors.ts';
import type { NodeRecord } from '../core/cluster/model.ts';
import { type Cidr, formatCidr, formatIpv4, parseCidr } from '../core/net/ipv4.ts';
import { preflight } from '../core/plan/preflight.ts';
import type { Clock, Logger } from '../core/ports.ts';
import type { AgentConfig } from '../config/agent-config.ts';
import { buildConflist, installCni } from '../adapters/node/cni-install.ts';
import { FsIpamStore } from '../adapters/node/ipam-store-fs.ts';
import type { IpRoute2 } from '../adapters/kernel/iproute2.ts';
import { initNetns } from '../adapters/kernel/netns.ts';
import { installRoot } from '../adapters/install-root.ts';
import { type ClusterState, ClusterStateFile } from '../adapters/node/cluster-state-file.ts';
import { ENFORCES_ANNOTATION } from '../core/policy/reuse.ts';
import { loadOrCreateIdentity } from '../adapters/node/node-identity.ts';
import { type CniServer, startCniServer } from './cni-server.ts';
import { ControllerLink } from './controller-link.ts';
import { PolicyEnforcer } from './policy.ts';
import type { CriClient } from '../adapters/node/cri-runtime.ts';
import { writeSysctl } from '../adapters/kernel/sysctl.ts';
import { Overlay } from './overlay.ts';
import { flannelAnnotations } from '../core/overlay/flannel.ts';
import { vxlanMtu } from '../core/overlay/plan.ts';
import { BridgeFdb } from '../adapters/kernel/bridge-fdb.ts';
import { Nft } from '../adapters/kernel/nft.ts';
import { loadVtepMac, saveVtepMac, vtepMacOf } from '../adapters/node/vtep-state.ts';
import { StateWriter } from '../adapters/node/state-writer.ts';
import { PodNetwork } from './pod-network.ts';
import type { Server } from 'node:http';
import { Tunnel } from './tunnel.ts';
import { startStatusServer, statusSocketOf } from '../adapters/ops/status-socket.ts';
import { spkiPin } from '../adapters/pki.ts';
import { loadOrCreateTunnelCredentials, type TunnelCredentials } from '../adapters/tunnel/tunnel-credentials.ts';
import { keeperSocketOf } from '../adapters/tunnel/keeper.ts';
import { trimMalloc } from '../adapters/ops/malloc-trim.ts';
import { ROLE_ANNOTATION, roleOf, selectPeers, TUNNEL_PORT_ANNOTATION } from '../core/tunnel/plan.ts';
import type { AgentStatus, StatusNode } from '../core/ops/agent-status.ts';
import type { OpsServer, Readiness } from '../adapters/ops/ops-server.ts';
import type { CniObserver } from './cni-server.ts';

export interface AgentComponents {
  readonly ip: IpRoute2;
  readonly log: Logger;
  readonly clock: Clock;
  /** What reservations' ages are read on (see PodNetworkComponents.ageClock). */
  readonly ageClock?: Clock;
}

/** The agent's version, as it reports it in its node record (`agentVersion`). */
export const AGENT_VERSION = '0.1.0';

/** Deadline of one CRI call of the agent's (a sandbox's labels): a runtime slower than this leaves the pod to the view. */
const CRI_DEADLINE_MS = 2000;

/** The shim the set-up builds, used when the configuration names none. */
export const DEFAULT_PLUGIN_SOURCE = join(installRoot(), 'bin', 'atoll-cni');

export class Agent {
  readonly #c: AgentComponents;
  readonly #cfg: AgentConfig;
  #pods: PodNetwork | undefined;
  #server: CniServer | undefined;
  #status: Server | undefined;
  #timer: NodeJS.Timeout | undefined;
  #link: ControllerLink | undefined;
  #policy: PolicyEnforcer | undefined;
  /** The node's container runtime, for NetworkPolicy (closed at stop). */
  #cri: CriClient | undefined;
  #overlay: Overlay | undefined;
  #tunnel: Tunnel | undefined;
  #tunnelCredentials: TunnelCredentials | undefined;
  /** vtep.json when a node without one could not write it: retried at each resync. */
  #vtepFile: StateWriter<string> | undefined;
  /** Peers from local state, for an agent without a controller link. */
  #peersOffline: readonly NodeRecord[] = [];
  #ops: OpsServer | undefined;
  #observeCni: CniObserver | undefined;
  /** Start-up is done and the CNI socket serves. */
  #ready = false;
  readonly #startedAt: number;

  constructor(components: AgentComponents, config: AgentConfig) {
    this.#c = components;
    this.#cfg = config;
    this.#startedAt = components.clock();
  }

  get pods(): PodNetwork | undefined {
    return this.#pods;
  }

  /**
   * Starts the metrics and health listener (when configured: it answers /healthz at once, /readyz 503 until the end),
   * checks the node, then builds what is missing and starts serving. @throws AtollError on any start-up problem.
   */
  async start(): Promise<void> {
    const cfg = this.#cfg;
    this.#c.log.info('atoll agent starting', { config: { ...cfg, controller: cfg.controller && { ...cfg.controller, token: '(redacted)' } } });
    if (cfg.metrics) {
      // loaded only when configured: prom-client stays out of the memory of a component without metrics
      const [{ Metrics }, { startOpsServer }, { registerAgentMetrics }] = await Promise.all([import('../adapters/ops/metrics.ts'), import('../adapters/ops/ops-server.ts'), import('./agent-metrics.ts')]);
      const metrics = new Metrics();
      this.#observeCni = registerAgentMetrics(metrics, {
        clock: this.#c.clock,
        ipam: () => this.#pods && { usage: this.#pods.ipam.usage(), blocks: this.#pods.ipam.blocks.length, allocations: this.#pods.allocations },
        tunnel: () => this.#tunnel?.status(),
        link: () => this.#link?.status,
        policyDrops: () => this.#policy?.droppedPackets(),
      });
      this.#ops = await startOpsServer({ listen: cfg.metrics.listen, registry: metrics.registry, readiness: () => this.readiness() });
    }
    try {
      await this.#startServing();
    } catch (err) {
      await this.#ops?.close();
      throw err;
    }
    this.#ready = true;
    this.#c.log.info('atoll agent ready', { socket: cfg.socketPath, usage: this.#pods?.ipam.usage(), metrics: cfg.metrics && { listen: cfg.metrics.listen, port: this.#ops?.port } });
  }

  /** Ready: start-up finished and the CNI socket serves (/readyz). */
  readiness(): Readiness {
    if (this.#ready && this.#server) return { ready: true, reasons: [] };
    return { ready: false, reasons: [this.#server ? 'stopping' : 'starting: the CNI socket does not serve yet'] };
  }

  /** What `atoll status` and `atoll trace` read from the status socket. */
  status(): AgentStatus {
    const cfg = this.#cfg;
    const ipam = this.#pods?.ipam;
    const peers = this.#link?.peers ?? this.#peersOffline;
    const nodes = peers.map(statusNodeOf);
    const own = selectPeers({ name: cfg.nodeName, site: cfg.site, community: cfg.community }, peers, []);
    const blocks = (ipam?.blocks ?? []).map(formatCidr);
    const plan = this.#overlay?.plan;
    const link = this.#link?.status;
    return {
      version: AGENT_VERSION, startedAt: this.#startedAt, now: this.#c.clock(), ready: this.#ready,
      node: { name: cfg.nodeName, site: own.site, community: own.community, role: cfg.tunnel?.role ?? '', addresses: cfg.underlayAddresses, blocks, agentVersion: AGENT_VERSION },
      ...(link ? { controller: link } : {}),
      ipam: {
        blocks, usage: ipam?.usage() ?? { capacity: 0, allocated: 0, reserved: 0, free: 0 }, allocations: { ...(this.#pods?.allocations ?? { existing: 0, sticky: 0, fresh: 0, reclaimed: 0 }) },
        pods: (ipam?.records() ?? []).map((r) => ({ ip: formatIpv4(r.ip), namespace: r.namespace, name: r.name, ...(r.releasedAt === undefined ? {} : { releasedAt: r.releasedAt }), ...(r.reusable ? { reusable: r.reusable } : {}) })),
      },
      ...(plan ? { overlay: { vtepAddress: plan.vtepAddress, sitePeers: plan.sitePeers, remotePeers: plan.remotePeers } } : {}),
      tunnel: this.#tunnel?.status() ?? null,
      ...(this.#policy ? { policy: this.#policy.status() } : {}),
      nodes,
    };
  }

  /** The port of the metrics and health listener, when it runs. */
  get opsPort(): number | undefined {
    return this.#ops?.port;
  }

  async #startServing(): Promise<void> {
    const cfg = this.#cfg;
    const log = this.#c.log;
    const stateFile = new ClusterStateFile(join(cfg.dataDir, 'cluster-state.json'));
    const saved = stateFile.load();
    const blocks = this.#blocksWith(saved.blocks);
    await this.#preflight(blocks);
    const underlay = cfg.overlay ? await this.#underlay() : undefined;
    const mtu = cfg.mtu ?? (underlay ? vxlanMtu(underlay.mtu) : 1500);
    if (underlay && mtu > vxlanMtu(underlay.mtu)) {
      throw atollError('CONFIG_FILE_INVALID', `mtu ${mtu} does not fit VXLAN over ${underlay.device} (MTU ${underlay.mtu}): at most ${vxlanMtu(underlay.mtu)}`,
        'remove mtu from the configuration to derive it from the underlay');
    }
    initNetns();
    this.#pods = new PodNetwork(
      { ip: this.#c.ip, store: new FsIpamStore(cfg.dataDir, cfg.network), log: log.child('pods'), clock: this.#c.clock, ageClock: this.#c.ageClock,
        onRecordsChanged: () => this.#policy?.poke() },
      { nodeName: cfg.nodeName, network: cfg.network, bridge: cfg.bridge, mtu, blocks, reservationTtlMs: cfg.reservationTtl, guardReuse: cfg.networkPolicy },
    );
    await this.#pods.start();
    const vtepMac = cfg.overlay ? this.#vtepMac(join(cfg.dataDir, 'vtep.json')) : '';
    if (cfg.overlay && underlay) {
      this.#overlay = new Overlay(
        { ip: this.#c.ip, fdb: new BridgeFdb(), nft: new Nft(), log: log.child('overlay') },
        { nodeName: cfg.nodeName, site: cfg.site, ...cfg.overlay, vtepMac, underlay: underlay.address, underlayDevice: underlay.device,
          underlayNet: underlay.net, mtu: vxlanMtu(underlay.mtu), clusterCidrs: cfg.clusterCidrs.map((c) => parseCidr(c) as Cidr) },
      );
      await this.#overlay.start();
    }
    if (cfg.tunnel) {
      this.#tunnelCredentials = loadOrCreateTunnelCredentials(cfg.dataDir, cfg.nodeName);
      this.#tunnel = new Tunnel(
        { ip: this.#c.ip, log: log.child('tunnel') },
        {
          nodeName: cfg.nodeName, role: cfg.tunnel.role, port: cfg.tunnel.port, device: cfg.tunnel.device,
          listenHost: cfg.underlayAddresses[0] ?? '0.0.0.0', mtu, credentials: this.#tunnelCredentials, relay: relayOf(cfg.tunnel.relay),
          ...(cfg.tunnel.udp ? {
            udp: {
              ...cfg.tunnel.udp, statePath: join(cfg.dataDir, 'tunnel-udp.json'),
              ...(cfg.tunnel.udp.keepMs > 0 ? { keeper: { socketPath: keeperSocketOf(cfg.dataDir), graceMs: cfg.tunnel.udp.keepMs } } : {}),
            },
          } : {}),
        },
      );
      await this.#tunnel.start();
    }
    this.#peersOffline = saved.peers;
    await this.#syncPeers(saved.peers); // from local state: works with the controller unreachable
    if (cfg.networkPolicy) {
      const pods = this.#pods;
      writeSysctl('net/bridge/bridge-nf-call-iptables', '1'); // pod-to-pod traffic over the bridge crosses the forward hook
      // loaded only here: the gRPC client costs memory every other agent need not pay
      this.#cri = cfg.criSocket === undefined ? undefined : (await import('../adapters/node/cri-runtime.ts')).connectCri({ socket: cfg.criSocket, deadlineMs: CRI_DEADLINE_MS });
      this.#policy = new PolicyEnforcer({
        nft: new Nft(), log: log.child('policy'), pods: () => ({ records: pods.ipam.records(), blocks: pods.ipam.blocks }), ...(this.#cri ? { runtime: this.#cri } : {}),
        awaitingReuse: () => pods.ipam.awaitingReuse(), markReusable: (cleared) => pods.markReusable(cleared),
      },
        { nodeName: cfg.nodeName, statePath: join(cfg.dataDir, 'policy-view.json') });
      await this.#policy.start(); // the kept view, in force before any ADD is served
    }
    if (cfg.controller) this.#startLink(cfg.controller, stateFile, saved, vtepMac);
    this.#server = await startCniServer(cfg.socketPath, this.#pods, log.child('cni'), this.#observeCni);
    const policy = this.#policy;
    this.#status = await startStatusServer(statusSocketOf(cfg.socketPath), {
      tunnel: () => this.#tunnel?.status(), status: () => this.status(), ...(policy ? { policyTrace: (q) => policy.trace(q) } : {}),
    });
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
  }

  /**
   * The saved VTEP MAC, or (no file yet) the one derived from the node name, written now; a disk that refuses it
   * leaves the agent running with that MAC, which every start derives again, and the write is retried each resync.
   */
  #vtepMac(path: string): string {
    const saved = loadVtepMac(path);
    if (saved) return saved;
    const mac = vtepMacOf(this.#cfg.nodeName);
    this.#vtepFile = new StateWriter({ log: this.#c.log.child('overlay'), write: (m) => saveVtepMac(path, m) },
      { what: 'the VTEP MAC', path, meanwhile: `the overlay uses ${mac}, derived from the node name (every start derives it again)` });
    this.#vtepFile.save(mac);
    return mac;
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

  /** The underlay: the interface holding the first underlayAddresses entry, its prefix and MTU. */
  async #underlay(): Promise<{ address: string; device: string; net: Cidr; mtu: number }> {
    const address = this.#cfg.underlayAddresses[0];
    if (!address) {
      throw atollError('CONFIG_FILE_INVALID', 'the overlay needs underlayAddresses: this node\'s address on the network between nodes', 'add underlayAddresses to the agent configuration');
    }
    const addrs = await this.#c.ip.addrs();
    for (const a of addrs) {
      for (const i of a.addr_info) {
        if (i.family === 'inet' && i.local === address) {
          const link = await this.#c.ip.link(a.ifname);
          return { address, device: a.ifname, net: parseCidr(`${address}/${i.prefixlen}`, false) as Cidr, mtu: link?.mtu ?? 1500 };
        }
      }
    }
    throw atollError('CONFIG_FILE_INVALID', `underlay address ${address} is not on any interface of this node`, 'fix underlayAddresses');
  }

  /** Runs the overlay for our current blocks and `peers`; failures are logged and retried by the resync. */
  async #syncOverlay(peers: readonly NodeRecord[]): Promise<void> {
    if (!this.#overlay || !this.#pods) return;
    try {
      await this.#overlay.sync(this.#pods.ipam.blocks, peers);
    } catch (err) {
      this.#c.log.error('overlay sync failed; retrying at the next resync', { err });
    }
  }

  /** The overlay, then the tunnel for the peers outside our site ({@link selectPeers}). */
  async #syncPeers(peers: readonly NodeRecord[]): Promise<void> {
    await this.#syncOverlay(peers);
    if (!this.#tunnel) return;
    const { nodeName: name, site, community } = this.#cfg;
    try {
      await this.#tunnel.sync(peers, selectPeers({ name, site, community }, peers, this.#overlay?.plan?.remotePeers ?? []));
    } catch (err) {
      this.#c.log.error('tunnel sync failed; retrying at the next resync', { err });
    }
  }

  #startLink(controller: NonNullable<AgentConfig['controller']>, stateFile: ClusterStateFile, saved: ClusterState, vtepMac: string): void {
    const cfg = this.#cfg;
    const pods = this.#pods as PodNetwork;
    this.#link = new ControllerLink(
      {
        log: this.#c.log.child('controller-link'),
        clock: this.#c.clock,
        identity: () => loadOrCreateIdentity(join(cfg.dataDir, 'node.key')),
        stateFile,
        saved,
        onBlocks: async (leased) => {
          await pods.setBlocks(this.#blocksWith(leased));
          this.#policy?.poke();
          await this.#syncPeers(this.#link?.peers ?? []);
        },
        usage: () => pods.ipam.usage(),
        onPeers: (peers) => void this.#syncPeers(peers),
        ...(this.#policy ? { followPolicy: (client, signal) => (this.#policy as PolicyEnforcer).follow(client, signal) } : {}),
      },
      {
        urls: controller.urls,
        token: controller.token,
        caCertHash: controller.caCertHash,
        caPath: join(cfg.dataDir, 'controller-ca.pem'),
        nodeName: cfg.nodeName,
        fields: {
          site: cfg.site, community: cfg.community, addresses: cfg.underlayAddresses, vtepMac, agentVersion: AGENT_VERSION,
          tunnelKey: this.#tunnelCredentials ? spkiPin(this.#tunnelCredentials.certPem) : '',
          annotations: {
            ...(cfg.overlay && vtepMac ? flannelAnnotations(cfg.overlay.vni, vtepMac, cfg.underlayAddresses[0] ?? '') : {}),
            ...(cfg.tunnel ? { [ROLE_ANNOTATION]: cfg.tunnel.role, [TUNNEL_PORT_ANNOTATION]: String(cfg.tunnel.port) } : {}),
            ...(cfg.networkPolicy ? { [ENFORCES_ANNOTATION]: 'true' } : {}),
          },
        },
        usagePeriodMs: controller.usagePeriod,
      },
    );
    this.#link.start();
  }

  async stop(): Promise<void> {
    this.#ready = false;
    await this.#link?.stop();
    await this.#policy?.stop();
    this.#cri?.close();
    this.#overlay?.stop();
    await this.#tunnel?.stop();
    if (this.#timer) clearInterval(this.#timer);
    this.#pods?.stop();
    await this.#server?.close();
    this.#status?.close();
    await this.#ops?.close();
    this.#c.log.info('atoll agent stopped');
  }

  async #resync(): Promise<void> {
    // files the disk refused earlier (never throw)
    this.#link?.flush();
    this.#vtepFile?.flush();
    try {
      await this.#pods?.ensureBridge();
      await this.#pods?.reconcile();
      await this.#syncPeers(this.#link?.peers ?? this.#peersOffline);
      await this.#policy?.resync();
    } catch (err) {
      this.#c.log.error('resync failed; retrying next period', { err });
    }
    trimMalloc();
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
      ownDevices: [...(cfg.overlay ? [cfg.overlay.device] : []), ...(cfg.tunnel ? [cfg.tunnel.device] : [])],
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

/** The relay's address and pin from the configuration (`host:port`, validated there). */
function relayOf(r: { address: string; pin: string } | undefined): { host: string; port: number; pin: string } | undefined {
  if (!r) return undefined;
  const colon = r.address.lastIndexOf(':');
  return { host: r.address.slice(0, colon), port: Number(r.address.slice(colon + 1)), pin: r.pin };
}

function statusNodeOf(n: NodeRecord): StatusNode {
  return { name: n.name, site: n.site, community: n.community, role: roleOf(n) ?? '', addresses: n.addresses, blocks: n.blocks, agentVersion: n.agentVersion };
}
