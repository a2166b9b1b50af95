/**
 * The agent's metrics: what the CNI socket served, the addresses of this node, its tunnel peers, the link to the
 * controller and what NetworkPolicy dropped. Everything but the CNI histogram is read from the agent's own state at
 * scrape time (the policy drops from the kernel's counters, one `nft` run per scrape).
 */
import type { Metrics } from '../adapters/ops/metrics.ts';
import type { IpamUsage } from '../core/ipam/sticky-pool.ts';
import type { AllocationHow } from '../core/ipam/sticky-pool.ts';
import { countPeerPaths, type TunnelStatus } from '../core/tunnel/status.ts';
import type { LinkState } from './controller-link.ts';
import type { CniObserver } from './cni-server.ts';

/** What the agent's metrics read. Each callback is cheap and synchronous; undefined means "not running here". */
export interface AgentMetricSources {
  readonly clock: () => number;
  readonly ipam: () => { usage: IpamUsage; blocks: number; allocations: Readonly<Record<AllocationHow, number>> } | undefined;
  readonly tunnel: () => TunnelStatus | undefined;
  readonly link: () => { state: LinkState; offlineSince: number | undefined } | undefined;
  /** NetworkPolicy drops by `direction policies` (read from the kernel: asynchronous), or undefined without policy. */
  readonly policyDrops: () => Promise<ReadonlyMap<string, number>> | undefined;
}

const LINK_STATES: readonly LinkState[] = ['connecting', 'connected', 'offline'];

/** Registers the agent's metrics; returns the observer the CNI server reports each request to. */
export function registerAgentMetrics(m: Metrics, s: AgentMetricSources): CniObserver {
  const cni = m.histogram('atoll_cni_request_duration_seconds', 'CNI requests served on the agent socket, by verb and result (ok or the Atoll error code); _count is the number of requests', ['verb', 'result']);
  const tunnelSum = (f: (p: TunnelStatus['peers'][number]) => number) => () => (s.tunnel()?.peers ?? []).reduce((a, p) => a + f(p), 0);

  m.gauge('atoll_ipam_addresses', 'Pod addresses of this node by state: allocated (in use), reserved (kept for a deleted pod that may come back), free', () => {
    const u = s.ipam()?.usage;
    return u ? [[{ state: 'allocated' }, u.allocated], [{ state: 'reserved' }, u.reserved], [{ state: 'free' }, u.free]] : [];
  }, ['state']);
  m.gauge('atoll_ipam_blocks', 'Address blocks this node holds', () => s.ipam()?.blocks ?? 0);
  m.counter('atoll_ipam_allocations_total', 'Addresses handed out by ADD, by how: sticky (the address the same pod had), fresh, reclaimed (another pod\'s expired reservation), existing (a repeated ADD)',
    () => Object.entries(s.ipam()?.allocations ?? {}).map(([how, n]) => [{ how }, n] as const), ['how']);

  m.gauge('atoll_tunnel_peers', 'Tunnel peers by the path they take now: direct, hole-punched, relayed, down', () => {
    const st = s.tunnel();
    return st ? Object.entries(countPeerPaths(st.peers)).map(([path, n]) => [{ path }, n] as const) : [];
  }, ['path']);
  m.counter('atoll_tunnel_transmit_bytes_total', 'Bytes sent to the current tunnel peers', tunnelSum((p) => p.txBytes));
  m.counter('atoll_tunnel_receive_bytes_total', 'Bytes received from the current tunnel peers', tunnelSum((p) => p.rxBytes));
  m.counter('atoll_tunnel_transmit_packets_total', 'Packets sent to the current tunnel peers', tunnelSum((p) => p.txPackets));
  m.counter('atoll_tunnel_receive_packets_total', 'Packets received from the current tunnel peers', tunnelSum((p) => p.rxPackets));
  m.counter('atoll_tunnel_dropped_packets_total', 'Packets the tunnel dropped, by reason (noPeer, noPath, badSource: a spoofed source, tunWrite)',
    () => Object.entries(s.tunnel()?.dropped ?? {}).map(([reason, n]) => [{ reason }, n] as const), ['reason']);
  m.counter('atoll_tunnel_datagram_copies_total', 'Second copies on the datagram path: sent (retransmissions and SACK acknowledgements go twice), spared (a copy whose original came, set aside)',
    () => {
      const c = s.tunnel()?.udpCopies;
      return c ? [[{ kind: 'sent' }, c.sent], [{ kind: 'spared' }, c.spared]] as const : [];
    }, ['kind']);
  m.counter('atoll_tunnel_refused_connections_total', 'Tunnel connections refused (an unregistered key, a failed handshake)', () => s.tunnel()?.refusedConnections ?? 0);
  m.counter('atoll_tunnel_punch_attempts_total', 'Hole punching attempts to the current peers', tunnelSum((p) => p.punch?.attempts ?? 0));
  m.counter('atoll_tunnel_punch_failures_total', 'Hole punching attempts that did not get through', tunnelSum((p) => (p.punch ? p.punch.attempts - p.punch.successes : 0)));
  m.gauge('atoll_tunnel_relay_connected', '1 when this node has its stream to the relay (edge nodes with a relay only)', () => {
    const r = s.tunnel()?.relay;
    return r ? (r.connected ? 1 : 0) : [];
  });

  m.counter('atoll_policy_dropped_packets_total', 'Packets NetworkPolicy dropped on this node, by direction (ingress, egress) and the policies isolating the pod (namespace/name, comma-separated): one series per distinct set of isolating policies seen on this node',
    async () => [...(await s.policyDrops()) ?? []].map(([key, n]) => {
      const space = key.indexOf(' ');
      return [{ direction: key.slice(0, space), policies: key.slice(space + 1) }, n] as const;
    }), ['direction', 'policies']);

  m.gauge('atoll_controller_link_state', 'The agent\'s link to the controller: 1 for the state it is in (connecting, connected, offline)', () => {
    const l = s.link();
    return l ? LINK_STATES.map((state) => [{ state }, l.state === state ? 1 : 0] as const) : [];
  }, ['state']);
  m.gauge('atoll_controller_offline_seconds', 'Seconds since the agent last had a controller session (0 while connected)', () => {
    const l = s.link();
    if (!l) return [];
    return l.offlineSince === undefined ? 0 : Math.max(0, (s.clock() - l.offlineSince) / 1000);
  });

  return (verb, result, seconds) => cni.observe({ verb, result }, seconds);
}
