/**
 * `atoll lab run --prometheus`: a real Prometheus in the controller's namespace scrapes every agent, the controller
 * and the relay over the lab's monitoring network (src/lab/plan/plan.ts `LAB_MONITOR`), and the lab checks its PromQL
 * answers against what the plan knows. Pure: the Prometheus configuration, the queries and what each should answer.
 */
import { CLOUD_SITE, labUsesUdp } from './spec.ts';
import { LAB_MONITOR, type LabPlan, udpBlockedAt } from './plan.ts';
import { expectedPath } from './paths.ts';
import { PEER_PATH_KINDS, type PeerPathKind } from '../../core/tunnel/status.ts';

/** Where the lab's Prometheus listens, inside the controller's namespace (loopback only). */
export const LAB_PROMETHEUS_LISTEN = '127.0.0.1:9090';
/** Scrape often: the lab is small and its checks wait on it. */
const SCRAPE_INTERVAL = '1s';

/** prometheus.yml for `plan`: one job per component, each agent target labelled with its node. */
export function prometheusConfig(plan: LabPlan): string {
  const ctl = LAB_MONITOR.controllerAddress;
  const lines = [
    'global:',
    `  scrape_interval: ${SCRAPE_INTERVAL}`,
    `  evaluation_interval: ${SCRAPE_INTERVAL}`,
    'scrape_configs:',
    '  - job_name: atoll-controller',
    '    static_configs:',
    `      - targets: ['${ctl}:${LAB_MONITOR.controllerPort}']`,
    '  - job_name: atoll-relay',
    '    static_configs:',
    `      - targets: ['${ctl}:${LAB_MONITOR.relayPort}']`,
    '  - job_name: atoll-agent',
    '    static_configs:',
  ];
  for (const n of plan.nodes) {
    lines.push(`      - targets: ['${n.monitorAddress}:${LAB_MONITOR.agentPort}']`, `        labels: {node: '${n.name}', site: '${n.site}'}`);
  }
  return `${lines.join('\n')}\n`;
}

/** The tunnel path kind a node should report for a peer, by the plan; undefined when the pair has no tunnel. */
function tunnelKind(plan: LabPlan, from: string, to: string): PeerPathKind | undefined {
  switch (expectedPath(plan, from, to)) {
    case 'tunnel direct':
      return 'direct';
    case 'tunnel hole-punched':
      return 'hole-punched';
    case 'tunnel relayed':
      return 'relayed';
    default:
      return undefined;
  }
}

/** Tunnel peers per path kind summed over every agent, as the plan has them once every path is up. */
export function expectedPeerPaths(plan: LabPlan): Record<PeerPathKind, number> {
  const n: Record<PeerPathKind, number> = { udp: 0, direct: 0, 'hole-punched': 0, relayed: 0, down: 0 };
  for (const a of plan.nodes) {
    for (const b of plan.nodes) {
      const k = a.name === b.name ? undefined : tunnelKind(plan, a.name, b.name);
      // with the datagram path on, direct pairs report udp unless a site on the way blocks it
      if (k && k !== 'relayed' && labUsesUdp(plan.spec) && !udpBlockedAt(plan, a.name) && !udpBlockedAt(plan, b.name)) n.udp++;
      else if (k) n[k]++;
    }
  }
  return n;
}

/** One PromQL check: the query and the value it should answer (a single number). */
export interface PromCheck {
  readonly what: string;
  readonly query: string;
  readonly expect: number;
}

/** The checks of a healthy lab: every target up, the controller's census, and every agent's peers on their expected paths. */
export function healthyChecks(plan: LabPlan): PromCheck[] {
  const paths = expectedPeerPaths(plan);
  return [
    { what: 'targets up (agents, controller, relay)', query: 'sum(up)', expect: plan.nodes.length + 2 },
    { what: 'agents connected to the controller', query: 'sum(atoll_controller_link_state{state="connected"})', expect: plan.nodes.length },
    { what: 'registered nodes (controller)', query: 'max(atoll_controller_registered_nodes)', expect: plan.nodes.length },
    { what: 'blocks leased (controller) = blocks held (agents)', query: 'max(atoll_controller_blocks{state="leased"}) - sum(atoll_ipam_blocks)', expect: 0 },
    { what: 'a leader', query: 'sum(atoll_controller_leader)', expect: 1 },
    { what: 'edge nodes on the relay', query: 'max(atoll_relay_connected_nodes)', expect: plan.nodes.filter((n) => n.site !== CLOUD_SITE).length },
    ...PEER_PATH_KINDS.map((k) => ({ what: `tunnel peers ${k}`, query: `sum(atoll_tunnel_peers{path="${k}"})`, expect: paths[k] })),
  ];
}

/** The checks while the relay is down: its target down, relayed peers none (they went down), hole-punched and datagram ones unchanged. */
export function relayDownChecks(plan: LabPlan): PromCheck[] {
  const paths = expectedPeerPaths(plan);
  return [
    { what: 'relay target down', query: 'sum(up{job="atoll-relay"})', expect: 0 },
    { what: 'relayed peers while the relay is down', query: 'sum(atoll_tunnel_peers{path="relayed"})', expect: 0 },
    { what: 'peers down while the relay is down (the relayed ones)', query: 'sum(atoll_tunnel_peers{path="down"})', expect: paths.relayed },
    { what: 'hole-punched peers keep their streams', query: 'sum(atoll_tunnel_peers{path="hole-punched"})', expect: paths['hole-punched'] },
    { what: 'peers on the datagram path keep it', query: 'sum(atoll_tunnel_peers{path="udp"})', expect: paths.udp },
  ];
}

/**
 * The metric names a PromQL expression refers to: identifiers that start with `atoll_` (the dashboard's own
 * metrics), with a histogram's `_bucket`, `_sum` and `_count` kept as they are scraped.
 */
export function metricNamesIn(expr: string): string[] {
  return [...new Set([...expr.matchAll(/\batoll_[a-z0-9_]+/g)].map((m) => m[0]))];
}
