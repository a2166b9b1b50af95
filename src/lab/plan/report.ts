/**
 * The lab's connectivity matrix as data and as text: one cell per ordered pod pair with the path it should take,
 * the route the source node's kernel chose, ping and TCP results, and a verdict; a summary per path; the terminal
 * rendering. Pure.
 */
import { expectationOf, type LabExpectation, type LabPath, type ObservedRoute, routeFor } from './paths.ts';

export interface PingResult {
  readonly ok: boolean;
  readonly sent: number;
  readonly received: number;
  /** Average round trip of the replies, in milliseconds. */
  readonly rttMs?: number;
  readonly error?: string;
}

export interface TcpResult {
  readonly ok: boolean;
  /** Time of the three-way handshake (about one round trip), in milliseconds. */
  readonly connectMs?: number;
  /** Time from sending a line to reading it back from the target's echo, in milliseconds. */
  readonly echoMs?: number;
  readonly error?: string;
}

export type CellVerdict = 'ok' | 'FAIL' | 'blocked as expected';

export interface LabCell {
  readonly from: string;
  readonly to: string;
  readonly fromNode: string;
  readonly toNode: string;
  readonly fromIp: string;
  readonly toIp: string;
  readonly path: LabPath;
  readonly expect: LabExpectation;
  readonly route: ObservedRoute;
  readonly ping: PingResult;
  readonly tcp: TcpResult;
  readonly verdict: CellVerdict;
  /** The lab's NetworkPolicy that denies the pair (`--policy`): expected blocked although its path exists. */
  readonly deniedBy?: string;
  /** What went wrong, for FAIL and unexpected cells. */
  readonly note?: string;
}

/** What a cell expects: its path's expectation, or blocked when a NetworkPolicy of the lab denies the pair. */
export function cellExpectation(path: LabPath, deniedBy: string | undefined): LabExpectation {
  return deniedBy === undefined ? expectationOf(path) : 'blocked';
}

/**
 * Judges one cell: what should work must work over its path; what is not allowed (by the communities, or by the
 * NetworkPolicy `deniedBy`) must not work.
 */
export function judgeCell(path: LabPath, route: ObservedRoute, ping: PingResult, tcp: TcpResult, deniedBy?: string): { verdict: CellVerdict; note?: string } {
  const expect = cellExpectation(path, deniedBy);
  const works = ping.ok || tcp.ok;
  if (deniedBy !== undefined) {
    return works ? { verdict: 'FAIL', note: `reachable (${[ping.ok ? 'ping' : '', tcp.ok ? 'tcp' : ''].filter(Boolean).join(', ')}) although NetworkPolicy ${deniedBy} denies it` } : { verdict: 'blocked as expected' };
  }
  if (expect === 'reachable') {
    const problems: string[] = [];
    if (!ping.ok) problems.push(`ping: ${ping.error ?? `${ping.received}/${ping.sent} replies`}`);
    if (!tcp.ok) problems.push(`tcp: ${tcp.error ?? 'failed'}`);
    if (route !== routeFor(path)) problems.push(`the node routes it by ${route}, expected ${routeFor(path)}`);
    return problems.length === 0 ? { verdict: 'ok' } : { verdict: 'FAIL', note: problems.join('; ') };
  }
  return works ? { verdict: 'FAIL', note: `reachable (${route}) although the communities do not allow it` } : { verdict: 'blocked as expected' };
}

export interface PathSummary {
  readonly path: LabPath;
  readonly expect: LabExpectation;
  readonly cells: number;
  readonly pingOk: number;
  readonly tcpOk: number;
  readonly failed: number;
  readonly medianPingMs?: number;
  readonly medianTcpConnectMs?: number;
}

export interface LabVerdict {
  /** True when every allowed cell works over its expected path and no forbidden cell works. */
  readonly ok: boolean;
  /** Cells that must work (every pair but those the communities or the lab's NetworkPolicies forbid). */
  readonly shouldWork: number;
  readonly working: number;
  /** Cells the communities (edges of different or no communities) or the lab's NetworkPolicies forbid, all of which must fail. */
  readonly blocked: number;
  readonly failures: readonly LabCell[];
}

/** Every path, in the order reports list them. */
export const PATH_ORDER: readonly LabPath[] = ['same node', 'vxlan', 'direct route', 'tunnel direct', 'tunnel hole-punched', 'tunnel relayed', 'not allowed'];

/** The median of `values`; undefined when empty. */
export function median(values: readonly number[]): number | undefined {
  if (values.length === 0) return undefined;
  const s = [...values].sort((a, b) => a - b);
  const mid = Math.floor(s.length / 2);
  return s.length % 2 === 1 ? (s[mid] as number) : ((s[mid - 1] as number) + (s[mid] as number)) / 2;
}

/** A row per path and expectation (a path's pairs a NetworkPolicy denies get a row of their own). */
export function summarize(cells: readonly LabCell[]): PathSummary[] {
  const out: PathSummary[] = [];
  for (const [path, expect] of PATH_ORDER.flatMap((p) => [[p, expectationOf(p)], ...(expectationOf(p) === 'reachable' ? [[p, 'blocked']] : [])] as [LabPath, LabExpectation][])) {
    const of = cells.filter((c) => c.path === path && c.expect === expect);
    if (of.length === 0) continue;
    const pings = of.flatMap((c) => (c.ping.ok && c.ping.rttMs !== undefined ? [c.ping.rttMs] : []));
    const tcps = of.flatMap((c) => (c.tcp.ok && c.tcp.connectMs !== undefined ? [c.tcp.connectMs] : []));
    out.push({
      path, expect, cells: of.length, pingOk: of.filter((c) => c.ping.ok).length, tcpOk: of.filter((c) => c.tcp.ok).length,
      failed: of.filter((c) => c.verdict === 'FAIL').length, medianPingMs: median(pings), medianTcpConnectMs: median(tcps),
    });
  }
  return out;
}

export function verdictOf(cells: readonly LabCell[]): LabVerdict {
  const should = cells.filter((c) => c.expect === 'reachable');
  return {
    ok: cells.every((c) => c.verdict !== 'FAIL'),
    shouldWork: should.length,
    working: should.filter((c) => c.verdict === 'ok').length,
    blocked: cells.filter((c) => c.verdict === 'blocked as expected').length,
    failures: cells.filter((c) => c.verdict === 'FAIL'),
  };
}

/** Milliseconds in at most 5 characters. */
export function formatMs(ms: number | undefined): string {
  if (ms === undefined) return '-';
  if (ms < 10) return ms.toFixed(2);
  if (ms < 100) return ms.toFixed(1);
  return String(Math.round(ms));
}

const LETTER: Record<LabPath, string> = { 'same node': 'N', vxlan: 'V', 'direct route': 'D', 'tunnel direct': 'T', 'tunnel hole-punched': 'H', 'tunnel relayed': 'R', 'not allowed': 'X' };

function cellText(c: LabCell): string {
  const letter = LETTER[c.path];
  switch (c.verdict) {
    case 'ok':
      return `${letter} ${formatMs(c.ping.rttMs)}`;
    case 'FAIL':
      return `${letter} FAIL`;
    default:
      return `${letter}   --`;
  }
}

/** The matrix, one row per source pod; a cell is the path's letter and the ping RTT in ms. */
export function renderMatrix(pods: readonly string[], cells: readonly LabCell[]): string[] {
  const width = 7;
  const nameWidth = Math.max(...pods.map((p) => p.length), 4);
  const index = (i: number) => String(i + 1).padStart(3);
  const byPair = new Map(cells.map((c) => [`${c.from}>${c.to}`, c]));
  const lines = [`${' '.repeat(nameWidth + 4)}${pods.map((_, i) => index(i).padStart(width)).join('')}`];
  pods.forEach((from, i) => {
    const row = pods.map((to) => {
      const cell = byPair.get(`${from}>${to}`);
      return (from === to ? '' : cell ? cellText(cell) : '?').padStart(width);
    }).join('');
    lines.push(`${index(i)} ${from.padEnd(nameWidth)}${row}`.trimEnd());
  });
  lines.push('', 'N same node, V vxlan, D direct route, T tunnel direct, H tunnel hole-punched, R tunnel relayed, X not allowed;',
    'a number is the ping RTT in ms (ping and TCP both worked); -- blocked as expected;',
    'FAIL should work and does not (or is not allowed and does); ? not checked.');
  return lines;
}

/** The per-path summary table. */
export function renderSummary(summary: readonly PathSummary[]): string[] {
  const rows = [['path', 'expected', 'pairs', 'ping ok', 'tcp ok', 'failed', 'ping RTT (median)', 'tcp connect (median)']];
  for (const s of summary) {
    rows.push([s.path, s.expect, String(s.cells), String(s.pingOk), String(s.tcpOk), String(s.failed),
      s.medianPingMs === undefined ? '-' : `${formatMs(s.medianPingMs)} ms`, s.medianTcpConnectMs === undefined ? '-' : `${formatMs(s.medianTcpConnectMs)} ms`]);
  }
  const widths = (rows[0] as string[]).map((_, i) => Math.max(...rows.map((r) => (r[i] as string).length)));
  return rows.map((r) => r.map((v, i) => (i <= 1 ? v.padEnd(widths[i] as number) : v.padStart(widths[i] as number))).join('  ').trimEnd());
}

/** One line per failed cell. */
export function renderFailures(cells: readonly LabCell[]): string[] {
  return cells.filter((c) => c.verdict === 'FAIL').map((c) => `${c.from} (${c.fromIp}) -> ${c.to} (${c.toIp}), ${c.path}: ${c.note ?? 'failed'}`);
}
