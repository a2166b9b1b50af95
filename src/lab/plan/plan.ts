/**
 * The lab's topology as data: from a {@link LabSpec} to the namespaces, links, addresses, routes, NAT rulesets,
 * uplink qdiscs, the controller's and every agent's configuration, and the pods. Pure; ./setup.ts writes the NAT
 * rulesets and qdiscs and renders the plan as setup phases, which `src/lab/lab.ts` applies through the ip, tc and nft
 * adapters, and ./paths.ts reads the expected path of every pod pair from it.
 *
 * ```
 *                       wan (the internet, 198.51.100.0/24 on bridge inet0)
 *          198.51.100.2 /             | 198.51.100.11              \ 198.51.100.12 ...
 *        cloud-router (no NAT)     a-router (NAT)               b-router (NAT)
 *        lan0 192.0.2.1/24         lan0 172.16.1.1/24           lan0 172.16.2.1/24
 *         |      |      |            |        |                   |        |
 *        ctl  cloud-1  cloud-2      a-1      a-2                 b-1      b-2       (+ pods: <node>-p<i>)
 *       .2    .11      .12          .11      .12                 .11      .12
 * ```
 *
 * - Every namespace's name starts with the run's prefix `atl-lab-<runid>-`, so a run's leftovers can be found by name
 *   even without its state file. Namespace names are file names; interface names (at most 15 characters) are short
 *   and only unique inside their namespace: `eth0` in every node, `p-<peer>` for bridge ports, `up0` for uplinks.
 * - "Public" links use TEST-NET ranges: 198.51.100.0/24 between the routers, 192.0.2.0/24 in the cloud site. The
 *   relay runs beside the controller (192.0.2.2, port 8476). Edge LANs are 172.16.<n>.0/24; pod blocks come from the
 *   controller's 10.100.0.0/16. Nothing routes 10.100.0.0/16 between sites but the tunnel: cloud <-> edge pairs go
 *   through it (the edge dials out), edge <-> edge pairs of one community hole-punch or go through the relay.
 * - The wan has no route into the edge LANs: an edge is reachable only through its router's NAT, as on the internet.
 */
import { labPolicyLabels } from './policy.ts';
import { CLOUD_SITE, type LabSpec, labUsesUdp, type NatType, type UplinkConditions } from './spec.ts';
import { natRuleset, uplinkQdiscLines } from './setup.ts';

export const LAB_NETNS_PREFIX = 'atl-lab-';
/** A run id: 4 lowercase hex digits. */
export const LAB_RUN_ID = /^[0-9a-f]{4}$/;
export const LAB_CLUSTER_CIDR = '10.100.0.0/16';
export const LAB_BLOCK_BITS = 26;
export const LAB_CONTROLLER_PORT = 7443;
export const LAB_RELAY_PORT = 8476;
/** Kubernetes namespace of the lab's pods. */
export const LAB_POD_NAMESPACE = 'lab';
/** Names the agent uses inside each node namespace (its configuration defaults, the lab's underlay). */
export const NODE_DEVICES = Object.freeze({ underlay: 'eth0', bridge: 'atoll0', overlay: 'atoll.1', tunnel: 'atoll.tun' });

/**
 * The monitoring network: a bridge in the controller's namespace and a second interface on every node, so one
 * Prometheus there (`atoll lab run --prometheus`) reaches every agent's metrics listener, NAT or not. Nothing
 * routes through it: it carries scrapes only.
 */
export const LAB_MONITOR = Object.freeze({ bridge: 'mon0', prefix: '10.254', bits: 16, controllerAddress: '10.254.0.1', agentPort: 9470, controllerPort: 9471, relayPort: 9472 });
const WAN_NET = '198.51.100';
const CLOUD_NET = '192.0.2';
const NODE_HOST_BASE = 10;
const EDGE_ROUTER_BASE = 10;

export type LabNamespaceRole = 'wan' | 'router' | 'controller' | 'node' | 'pod' | 'delay';

export interface LabNamespace {
  /** Full namespace name (the run prefix included). */
  readonly name: string;
  readonly role: LabNamespaceRole;
  /** Site it belongs to; '' for the wan. */
  readonly site: string;
}

export interface LabLinkEnd {
  readonly netns: string;
  readonly ifname: string;
  /** Address with prefix length, e.g. 192.0.2.11/24. */
  readonly address?: string;
  /** Bridge this end is a port of. */
  readonly master?: string;
}

/** A veth pair, created from `a`'s namespace with `b` born in its own. */
export interface LabVeth {
  readonly a: LabLinkEnd;
  readonly b: LabLinkEnd;
}

export interface LabBridge {
  readonly netns: string;
  readonly ifname: string;
  /** Its address with prefix length; none for a bridge that only joins ports (a delay line's). */
  readonly address?: string;
}

export interface LabRoute {
  readonly netns: string;
  readonly dst: string;
  readonly via: string;
}

export interface LabNat {
  readonly netns: string;
  readonly site: string;
  readonly type: NatType;
  /** The ruleset, one `nft -f -` transaction replacing the lab's table. */
  readonly ruleset: string;
}

export interface LabQdisc {
  readonly netns: string;
  readonly dev: string;
  readonly site: string;
  readonly direction: 'up' | 'down';
  readonly conditions: UplinkConditions;
  /** `tc -batch` lines. */
  readonly tc: readonly string[];
}

/** How the lab delays edge uplinks: tc netem, or (a kernel without netem) the lab's own delay line. */
export type LabDelayBy = 'netem' | 'delay-line';

/**
 * A delay line on one edge uplink (`delayBy: 'delay-line'`): a namespace spliced into the uplink whose two bridges
 * each join one side of the link with a TAP device; a process (`bin/atoll-delay`, native/atoll-delay.c) moves frames
 * between the two TAP devices, each `delayMs` late, both directions, as netem on both ends of the link would.
 */
export interface LabDelayLine {
  readonly netns: string;
  readonly site: string;
  readonly delayMs: number;
  /** The TAP device (made here, persistent, with vnet_hdr) the process attaches to and its bridge, one per side. */
  readonly ports: readonly [LabDelayPort, LabDelayPort];
  readonly logPath: string;
}

export interface LabDelayPort {
  readonly tap: string;
  readonly bridge: string;
}

/** A cloud service of the lab (the controller, the relay) run as its own process. */
export interface LabService {
  readonly netns: string;
  readonly address: string;
  readonly dir: string;
  readonly configPath: string;
  readonly logPath: string;
  /** Its configuration file, as JSON (the relay's without `controller.caCertHash`, which the controller prints). */
  readonly config: Readonly<Record<string, unknown>>;
}

export interface LabController extends LabService {
  readonly url: string;
}

export interface LabRelay extends LabService {
  readonly port: number;
}

export interface LabNode {
  readonly name: string;
  readonly site: string;
  readonly community: string;
  readonly netns: string;
  readonly underlay: string;
  /** The node's default gateway (its site router). */
  readonly gateway: string;
  readonly dir: string;
  readonly configPath: string;
  readonly socketPath: string;
  readonly logPath: string;
  readonly dataDir: string;
  readonly cniBinDir: string;
  readonly cniConfDir: string;
  /** The agent's configuration file without `controller.caCertHash`, which the controller prints at start. */
  readonly agentConfig: Readonly<Record<string, unknown>>;
  /** Its address on the monitoring network, where its metrics listener binds. */
  readonly monitorAddress: string;
}

export interface LabPod {
  readonly name: string;
  readonly node: string;
  readonly netns: string;
  readonly containerId: string;
  /** Its labels as a Pod (`--kubernetes`): its site and role, which the policy run's policies select by (./policy.ts). */
  readonly labels: Readonly<Record<string, string>>;
}

export interface LabPlan {
  readonly runId: string;
  readonly prefix: string;
  /** Directory of the run's files (configurations, data, sockets, logs). */
  readonly dir: string;
  readonly spec: LabSpec;
  readonly namespaces: readonly LabNamespace[];
  readonly bridges: readonly LabBridge[];
  readonly veths: readonly LabVeth[];
  readonly routes: readonly LabRoute[];
  /** Namespaces that forward packets (the wan and the routers; agents turn it on in their nodes). */
  readonly forwarding: readonly string[];
  readonly nat: readonly LabNat[];
  readonly qdiscs: readonly LabQdisc[];
  /** How uplink delays are made, and the delay lines when by the lab's own. */
  readonly delayBy: LabDelayBy;
  readonly delayLines: readonly LabDelayLine[];
  readonly controller: LabController;
  readonly relay: LabRelay;
  readonly nodes: readonly LabNode[];
  readonly pods: readonly LabPod[];
}

export interface LabPlanInput {
  readonly spec: LabSpec;
  readonly runId: string;
  /** Absolute directory for the run's files. */
  readonly dir: string;
  readonly bootstrapToken: string;
  readonly adminToken: string;
  readonly relayToken: string;
  /** How to delay uplinks (`--delay`): netem where the kernel has it (the default), else the lab's delay line. */
  readonly delayBy?: LabDelayBy;
  /**
   * `--kubernetes`: Atoll is installed through its chart, so each node's agent paths are the manifest's hostPaths
   * as that node sees them: its own directories under `<node dir>/host` ({@link nodeHostDirs}).
   */
  readonly kubernetes?: boolean;
}

/**
 * The machine paths the manifest's hostPath volumes name (deploy/helm/atoll: atoll-cni and the conflist, the agent's
 * state and sockets, the pods' network namespaces, the container runtime's socket). On a real node each is that node's own; in the lab every node
 * has its own directory for each, bind-mounted over the path in the node's mount namespace.
 */
export const NODE_HOST_PATHS: readonly string[] = Object.freeze(['/opt/cni/bin', '/etc/cni/net.d', '/var/lib/atoll', '/run/atoll', '/var/run/netns', '/run/containerd']);

/**
 * Machine paths every kubelet uses whatever its `--root-dir`: its device-plugin and pod-resources sockets under
 * `/var/lib/kubelet` (two kubelets on one machine race for `device-plugins/kubelet.sock`: "bind: address already in
 * use"), and the container log symlinks in `/var/log/containers`.
 */
export const NODE_KUBELET_PATHS: readonly string[] = Object.freeze(['/var/lib/kubelet', '/var/log/containers']);

/** A node's own directory for each of {@link NODE_HOST_PATHS} and {@link NODE_KUBELET_PATHS}: `<node dir>/host<path>`. */
export function nodeHostDirs(node: Pick<LabNode, 'dir'>): { source: string; target: string }[] {
  return [...NODE_HOST_PATHS, ...NODE_KUBELET_PATHS].map((target) => ({ source: `${node.dir}/host${target}`, target }));
}

/** Where a node's containerd serves (`--kubernetes`): its own `/run/containerd`, as the chart's `criSocket` expects. */
export function nodeContainerdSocket(node: Pick<LabNode, 'dir'>): string {
  return `${node.dir}/host/run/containerd/containerd.sock`;
}

/** The namespace prefix of a run: `atl-lab-<runid>-`. */
export function labPrefix(runId: string): string {
  return `${LAB_NETNS_PREFIX}${runId}-`;
}

/** The run id in a lab namespace's name, or undefined for other namespaces. */
export function runIdOfNetns(name: string): string | undefined {
  const m = /^atl-lab-([0-9a-f]{4})-/.exec(name);
  return m?.[1];
}

/** Whether the site of `node` blocks UDP at its router (`--block-udp`): its tunnels then keep to their TCP streams. */
export function udpBlockedAt(plan: LabPlan, node: string): boolean {
  const site = plan.nodes.find((n) => n.name === node)?.site;
  return plan.spec.edges.find((e) => e.name === site)?.udpBlocked === true;
}

/**
 * The whole lab for `input.spec`. Deterministic: the same input gives the same plan.
 * Precondition: `labSpecProblems(input.spec)` is empty and `input.runId` matches {@link LAB_RUN_ID}.
 */
export function planLab(input: LabPlanInput): LabPlan {
  const { spec, runId, dir } = input;
  const prefix = labPrefix(runId);
  const ns = (name: string) => `${prefix}${name}`;
  const namespaces: LabNamespace[] = [];
  const bridges: LabBridge[] = [];
  const veths: LabVeth[] = [];
  const routes: LabRoute[] = [];
  const forwarding: string[] = [];
  const nat: LabNat[] = [];
  const qdiscs: LabQdisc[] = [];
  const delayBy = input.delayBy ?? 'netem';
  const delayLines: LabDelayLine[] = [];
  const nodes: LabNode[] = [];
  const pods: LabPod[] = [];

  const wan = ns('wan');
  namespaces.push({ name: wan, role: 'wan', site: '' });
  bridges.push({ netns: wan, ifname: 'inet0', address: `${WAN_NET}.1/24` });
  forwarding.push(wan);

  const cloudRouter = ns(`${CLOUD_SITE}-router`);
  namespaces.push({ name: cloudRouter, role: 'router', site: CLOUD_SITE });
  veths.push({ a: { netns: wan, ifname: `p-${CLOUD_SITE}`, master: 'inet0' }, b: { netns: cloudRouter, ifname: 'up0', address: `${WAN_NET}.2/24` } });
  bridges.push({ netns: cloudRouter, ifname: 'lan0', address: `${CLOUD_NET}.1/24` });
  routes.push({ netns: cloudRouter, dst: 'default', via: `${WAN_NET}.1` });
  routes.push({ netns: wan, dst: `${CLOUD_NET}.0/24`, via: `${WAN_NET}.2` });
  forwarding.push(cloudRouter);

  const ctl = ns('ctl');
  const ctlAddress = `${CLOUD_NET}.2`;
  const url = `https://${ctlAddress}:${LAB_CONTROLLER_PORT}`;
  namespaces.push({ name: ctl, role: 'controller', site: CLOUD_SITE });
  veths.push({ a: { netns: cloudRouter, ifname: 'p-ctl', master: 'lan0' }, b: { netns: ctl, ifname: 'eth0', address: `${ctlAddress}/24` } });
  routes.push({ netns: ctl, dst: 'default', via: `${CLOUD_NET}.1` });
  const controller: LabController = {
    netns: ctl,
    address: ctlAddress,
    url,
    dir: `${dir}/controller`,
    configPath: `${dir}/controller/controller.json`,
    logPath: `${dir}/controller/controller.log`,
    config: {
      listenHost: ctlAddress, listenPort: LAB_CONTROLLER_PORT, advertiseUrl: url, clusterCidrs: [LAB_CLUSTER_CIDR],
      blockBits: LAB_BLOCK_BITS, maxBlocksPerNode: 8, refillBelow: 8, dataDir: `${dir}/controller/data`,
      bootstrapTokens: [input.bootstrapToken], adminToken: input.adminToken, relayTokens: [input.relayToken], store: { type: 'embedded' },
    },
  };
  bridges.push({ netns: ctl, ifname: LAB_MONITOR.bridge, address: `${LAB_MONITOR.controllerAddress}/${LAB_MONITOR.bits}` });
  // spec.metrics false: no listeners (what the metrics cost is measured against); the monitoring network stays
  const withMetrics = spec.metrics !== false;
  if (withMetrics) (controller.config as Record<string, unknown>).metrics = { listen: `${LAB_MONITOR.controllerAddress}:${LAB_MONITOR.controllerPort}` };
  const relay: LabRelay = {
    netns: ctl,
    address: ctlAddress,
    port: LAB_RELAY_PORT,
    dir: `${dir}/relay`,
    configPath: `${dir}/relay/relay.json`,
    logPath: `${dir}/relay/relay.log`,
    config: {
      listenHost: ctlAddress, listenPort: LAB_RELAY_PORT, dataDir: `${dir}/relay/data`, controller: { urls: [url], token: input.relayToken },
      ...(withMetrics ? { metrics: { listen: `${LAB_MONITOR.controllerAddress}:${LAB_MONITOR.relayPort}` } } : {}),
    },
  };

  const addNode = (site: string, community: string, index: number, router: string, lanNet: string) => {
    const name = `${site}-${index}`;
    const netns = ns(name);
    const underlay = `${lanNet}.${NODE_HOST_BASE + index}`;
    const gateway = `${lanNet}.1`;
    namespaces.push({ name: netns, role: 'node', site });
    veths.push({ a: { netns: router, ifname: `p-${name}`, master: 'lan0' }, b: { netns, ifname: NODE_DEVICES.underlay, address: `${underlay}/24` } });
    routes.push({ netns, dst: 'default', via: gateway });
    // 10.254.0.1 is the controller's; nodes from .0.2 on, 250 a /24 (no .0 or .255 last octets)
    const monitorAddress = `${LAB_MONITOR.prefix}.${Math.floor(nodes.length / 250)}.${(nodes.length % 250) + 2}`;
    veths.push({ a: { netns: ctl, ifname: `m-${name}`, master: LAB_MONITOR.bridge }, b: { netns, ifname: LAB_MONITOR.bridge, address: `${monitorAddress}/${LAB_MONITOR.bits}` } });
    const nodeDir = `${dir}/${name}`;
    // installed through the chart, the agent uses its defaults, which are the manifest's hostPaths
    const host = `${nodeDir}/host`;
    const paths = input.kubernetes ? {
      dir: nodeDir, configPath: `${nodeDir}/agent.json`, socketPath: `${host}/run/atoll/atoll.sock`, logPath: `${nodeDir}/agent.log`,
      dataDir: `${host}/var/lib/atoll`, cniBinDir: `${host}/opt/cni/bin`, cniConfDir: `${host}/etc/cni/net.d`,
    } : {
      dir: nodeDir, configPath: `${nodeDir}/agent.json`, socketPath: `${nodeDir}/agent.sock`, logPath: `${nodeDir}/agent.log`,
      dataDir: `${nodeDir}/data`, cniBinDir: `${nodeDir}/cni-bin`, cniConfDir: `${nodeDir}/cni-conf`,
    };
    nodes.push({
      name, site, community, netns, underlay, gateway, monitorAddress, ...paths,
      agentConfig: {
        nodeName: name, podCidrs: [], cniBinDir: paths.cniBinDir, cniConfDir: paths.cniConfDir, dataDir: paths.dataDir,
        socketPath: paths.socketPath, bridge: NODE_DEVICES.bridge, resyncPeriod: 5, site, community, underlayAddresses: [underlay],
        overlay: { device: NODE_DEVICES.overlay, directRouting: spec.sameSite === 'direct' ? 'auto' : 'never' }, clusterCidrs: [LAB_CLUSTER_CIDR],
        tunnel: { device: NODE_DEVICES.tunnel, role: site === CLOUD_SITE ? 'cloud' : 'edge', ...(labUsesUdp(spec) ? {} : { udp: false }) },
        controller: { urls: [url], token: input.bootstrapToken, usagePeriod: 5 },
        ...(withMetrics ? { metrics: { listen: `${monitorAddress}:${LAB_MONITOR.agentPort}` } } : {}),
      },
    });
    for (let p = 1; p <= spec.podsPerNode; p++) {
      const pod = `${name}-p${p}`;
      namespaces.push({ name: ns(pod), role: 'pod', site });
      pods.push({ name: pod, node: name, netns: ns(pod), containerId: `atoll-lab-${runId}-${pod}`, labels: labPolicyLabels(site, p) });
    }
  };

  for (let i = 1; i <= spec.cloudNodes; i++) addNode(CLOUD_SITE, '', i, cloudRouter, CLOUD_NET);

  spec.edges.forEach((e, idx) => {
    const router = ns(`${e.name}-router`);
    const lanNet = `172.16.${idx + 1}`;
    const publicAddress = `${WAN_NET}.${EDGE_ROUTER_BASE + idx + 1}`;
    namespaces.push({ name: router, role: 'router', site: e.name });
    const upAddress = `${publicAddress}/24`;
    const delayLine = delayBy === 'delay-line' && e.uplink.delayMs !== undefined;
    if (delayLine) {
      // wan p-<site> | brw: wan0 + tapw | delay process | brr: rtr0 + tapr | up0 router
      const dly = ns(`${e.name}-dly`);
      namespaces.push({ name: dly, role: 'delay', site: e.name });
      bridges.push({ netns: dly, ifname: 'brw' }, { netns: dly, ifname: 'brr' });
      veths.push({ a: { netns: wan, ifname: `p-${e.name}`, master: 'inet0' }, b: { netns: dly, ifname: 'wan0', master: 'brw' } });
      veths.push({ a: { netns: dly, ifname: 'rtr0', master: 'brr' }, b: { netns: router, ifname: 'up0', address: upAddress } });
      delayLines.push({
        netns: dly, site: e.name, delayMs: e.uplink.delayMs as number, ports: [{ tap: 'tapr', bridge: 'brr' }, { tap: 'tapw', bridge: 'brw' }],
        logPath: `${dir}/${e.name}-dly.log`,
      });
    } else {
      veths.push({ a: { netns: wan, ifname: `p-${e.name}`, master: 'inet0' }, b: { netns: router, ifname: 'up0', address: upAddress } });
    }
    bridges.push({ netns: router, ifname: 'lan0', address: `${lanNet}.1/24` });
    routes.push({ netns: router, dst: 'default', via: `${WAN_NET}.1` });
    forwarding.push(router);
    nat.push({ netns: router, site: e.name, type: e.nat, ruleset: natRuleset({ site: e.name, type: e.nat, lan: `${lanNet}.0/24`, uplink: 'up0', lanDev: 'lan0', udpBlocked: e.udpBlocked === true }) });
    const byQdisc: UplinkConditions = delayLine ? { rateMbit: e.uplink.rateMbit } : e.uplink; // the delay line does the rest
    const up = uplinkQdiscLines('up0', byQdisc);
    if (up.length > 0) {
      qdiscs.push({ netns: router, dev: 'up0', site: e.name, direction: 'up', conditions: byQdisc, tc: up });
      qdiscs.push({ netns: wan, dev: `p-${e.name}`, site: e.name, direction: 'down', conditions: byQdisc, tc: uplinkQdiscLines(`p-${e.name}`, byQdisc) });
    }
    for (let i = 1; i <= e.nodes; i++) addNode(e.name, e.community, i, router, lanNet);
  });

  return { runId, prefix, dir, spec, namespaces, bridges, veths, routes, forwarding, nat, qdiscs, delayBy, delayLines, controller, relay, nodes, pods };
}

/** The relay's configuration, pinned to the controller's CA. */
export function relayConfigFor(relay: LabRelay, caCertHash: string): Record<string, unknown> {
  return { ...relay.config, controller: { ...(relay.config.controller as Record<string, unknown>), caCertHash } };
}

/** The agent configuration of `node`, pinned to the controller's CA; edge nodes also to the relay's key. */
export function agentConfigFor(node: LabNode, caCertHash: string, relay: { plan: LabRelay; pin: string }): Record<string, unknown> {
  const controller = node.agentConfig.controller as Record<string, unknown>;
  const tunnel = node.agentConfig.tunnel as Record<string, unknown>;
  const relayRef = tunnel.role === 'edge' ? { relay: { address: `${relay.plan.address}:${relay.plan.port}`, pin: relay.pin } } : {};
  return { ...node.agentConfig, controller: { ...controller, caCertHash }, tunnel: { ...tunnel, ...relayRef } };
}

/** Every interface name the plan creates (each at most 15 characters: the kernel's IFNAMSIZ - 1). */
export function interfaceNames(plan: LabPlan): string[] {
  return [...plan.bridges.map((b) => b.ifname), ...plan.veths.flatMap((v) => [v.a.ifname, v.b.ifname]), ...Object.values(NODE_DEVICES)];
}
