/**
 * The tunnel's state as `atoll peers` shows it: the shape the agent's status socket answers, and its rendering as
 * a table. Pure.
 */
import type { TunnelRole } from './plan.ts';

/** How packets to a peer travel: as UDP datagrams, on a direct TLS stream, through the relay, or not at all. */
export type PeerPath = 'udp' | 'direct' | 'relayed' | 'down';

export interface TunnelPeerStatus {
  readonly name: string;
  readonly role: TunnelRole;
  /** How the stream comes up: 'dial', 'accept' or 'punch'. */
  readonly mode: string;
  readonly path: PeerPath;
  /** Round trip over the current path, ms (relayed: end to end through the relay). */
  readonly rttMs?: number | undefined;
  readonly txBytes: number;
  readonly rxBytes: number;
  readonly txPackets: number;
  readonly rxPackets: number;
  /** Since when the path is what it is (ms since epoch; 0 when unknown). */
  readonly since: number;
  readonly punch?: { readonly attempts: number; readonly successes: number; readonly lastError: string };
  /**
   * The datagram path (with tunnel.udp): the peer's UDP address, whether datagrams flow both ways now, and since when
   * (ms since epoch) hellos are rebuilding it with no stream to help (the relay and the controller away).
   */
  readonly udp?: { readonly endpoint: string | undefined; readonly usable: boolean; readonly rebuildingSince?: number };
}

export interface TunnelStatus {
  readonly role: TunnelRole;
  readonly relay?: { readonly address: string; readonly connected: boolean; readonly rttMs?: number | undefined };
  readonly peers: readonly TunnelPeerStatus[];
  readonly skipped: readonly { readonly name: string; readonly reason: string }[];
  /** Packets the tunnel dropped, by reason (spoofed sources under `badSource`). */
  readonly dropped: Readonly<Record<string, number>>;
  /** Tunnel connections refused since the agent started (a key that is not a registered peer's, a failed handshake). */
  readonly refusedConnections?: number;
  /**
   * The datagram path's second copies since the agent started: sent (retransmissions and SACK acknowledgements of the
   * pods' TCP flows go twice, so one loss costs no stall) and spared (copies that came when their original had too,
   * set aside). Absent: no datagram path.
   */
  readonly udpCopies?: { readonly sent: number; readonly spared: number };
  /**
   * The keeper holding the datagram path's data plane across agent restarts: its pid, and whether this agent took the
   * data plane back from its last process (or made a new one). null: the datagram path runs without one (a restart
   * interrupts it); absent: no datagram path.
   */
  readonly keeper?: { readonly pid: number; readonly takenBack: boolean } | null;
}

/**
 * How a peer is reached now, as metrics, `atoll status` and `atoll trace` tell it: a direct stream is hole-punched
 * when punching made it; udp is the datagram path (tunnel.udp), which packets take first while it holds.
 */
export type PeerPathKind = 'udp' | 'direct' | 'hole-punched' | 'relayed' | 'down';

export const PEER_PATH_KINDS: readonly PeerPathKind[] = ['udp', 'direct', 'hole-punched', 'relayed', 'down'];

export function pathKindOf(p: Pick<TunnelPeerStatus, 'path' | 'mode'>): PeerPathKind {
  if (p.path === 'direct') return p.mode === 'punch' ? 'hole-punched' : 'direct';
  return p.path;
}

/** How many peers take each path kind (every kind present, zero or not). */
export function countPeerPaths(peers: readonly Pick<TunnelPeerStatus, 'path' | 'mode'>[]): Record<PeerPathKind, number> {
  const n: Record<PeerPathKind, number> = { udp: 0, direct: 0, 'hole-punched': 0, relayed: 0, down: 0 };
  for (const p of peers) n[pathKindOf(p)]++;
  return n;
}

function bytes(n: number): string {
  if (n < 1024) return `${n} B`;
  const units = ['KiB', 'MiB', 'GiB', 'TiB'];
  let v = n / 1024;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${v.toFixed(1)} ${units[i]}`;
}

function age(ms: number): string {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 120) return `${s}s`;
  if (s < 7200) return `${Math.round(s / 60)}m`;
  return `${Math.round(s / 3600)}h`;
}

/** `atoll peers` as a table, then the relay and the peers left out with why. `now` in ms since epoch. */
export function renderPeers(st: TunnelStatus, now: number): string[] {
  const rows = [['PEER', 'ROLE', 'PATH', 'RTT', 'SENT', 'RECEIVED', 'FOR', 'PUNCHED']];
  for (const p of st.peers) {
    rows.push([
      p.name, p.role, p.path === 'udp' ? `udp ${p.udp?.endpoint ?? ''}`.trimEnd() : p.path, p.rttMs === undefined ? '-' : `${p.rttMs.toFixed(1)} ms`, bytes(p.txBytes), bytes(p.rxBytes),
      p.since > 0 ? age(now - p.since) : '-', p.punch ? `${p.punch.successes}/${p.punch.attempts}` : '-',
    ]);
  }
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)));
  const out = rows.map((r) => r.map((c, i) => c.padEnd(widths[i]!)).join('  ').trimEnd());
  if (st.peers.length === 0) out.push('(no tunnel peers)');
  if (st.relay) out.push(`relay ${st.relay.address}: ${st.relay.connected ? `connected${st.relay.rttMs === undefined ? '' : `, rtt ${st.relay.rttMs.toFixed(1)} ms`}` : 'NOT connected'}`);
  for (const p of st.peers) {
    const rebuilding = p.udp?.rebuildingSince;
    if (rebuilding !== undefined) out.push(`${p.name}: rebuilding the path without the relay for ${age(now - rebuilding)}: hellos to ${p.udp?.endpoint ?? 'its last address'}`);
    else if (p.punch?.lastError && p.path !== 'direct' && p.path !== 'udp') out.push(`${p.name}: last hole punch failed: ${p.punch.lastError}`);
  }
  for (const s of st.skipped) out.push(`no path to ${s.name}: ${s.reason}`);
  const drops = Object.entries(st.dropped).filter(([, n]) => n > 0);
  if (drops.length > 0) out.push(`dropped packets: ${drops.map(([k, n]) => `${k} ${n}`).join(', ')}`);
  if (st.refusedConnections) out.push(`refused connections: ${st.refusedConnections}`);
  if (st.udpCopies && (st.udpCopies.sent > 0 || st.udpCopies.spared > 0)) {
    out.push(`datagram copies: ${st.udpCopies.sent} sent (retransmissions and SACKs go twice), ${st.udpCopies.spared} set aside (their original came)`);
  }
  if (st.keeper) out.push(`data plane held by keeper ${st.keeper.pid} (${st.keeper.takenBack ? 'taken back from the last agent' : 'new with this agent'}): an agent restart loses no datagram`);
  else if (st.keeper === null) out.push('no keeper: an agent restart interrupts the datagram path (tunnel.udp.keepMs, the chart\'s agent.keeper)');
  return out;
}
