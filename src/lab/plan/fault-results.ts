/**
 * What a lab fault did (src/lab/plan/faults.ts plans it, src/lab/faults.ts runs it), pure: its result for the JSON
 * report (the matrices before and after, the samples, the TCP flows), the verdict with the notes that explain a
 * failure, and the fault table for the terminal.
 */
import type { LabFaultKind, LabFaultTarget, LabPodPair } from './faults.ts';
import type { DeniedSample, LossWindow, PolicyChangeSeen, SampleStats } from './fault-samples.ts';

/** policy-offline: pairs the deleted policy denied away from the site cut off must answer within this long of the deletion (the site stays cut off longer). */
export const POLICY_CHANGE_OPEN_MS = 5000;

export interface MatrixCount {
  readonly ok: boolean;
  readonly shouldWork: number;
  readonly working: number;
  /** The first cells that failed (`from -> to: what went wrong`), when some did. */
  readonly failed?: readonly string[];
}

/** A TCP connection held open through a fault: whether it survived, and the longest wait for an echo. */
export interface FlowResult extends LabPodPair {
  readonly survived: boolean;
  readonly sentBytes: number;
  readonly echoedBytes: number;
  readonly maxGapMs: number;
  /** Why it broke (the socket error), when it did. */
  readonly error?: string;
}

/** What a fault did, for the JSON report and the table. */
export interface LabFaultResult {
  readonly kind: LabFaultKind;
  readonly description: string;
  readonly skipped?: string;
  readonly ok: boolean;
  /** What the fault observed besides its verdict (e.g. who reached a pod while its site was cut); failures are `notes`. */
  readonly facts?: readonly string[];
  /**
   * The whole matrix right before the fault: measured for it, or the previous matrix (the main check or the previous
   * fault's after) when that ended just before (see beforeAgeMs).
   */
  readonly before?: MatrixCount;
  /** How long before the fault started its "before" matrix ended, ms. */
  readonly beforeAgeMs?: number;
  readonly after?: MatrixCount;
  /** How long the matrices before and after took, ms. */
  readonly matrixMs?: { readonly before: number; readonly after: number };
  /** Slowest sample's convergence; undefined when a sample never answered again. */
  readonly convergenceMs?: number;
  /** Loss over all sample pings while the fault lasted and until recovery. */
  readonly lossPct?: number;
  /** Longest time a sample went without a reply, ms. */
  readonly maxGapMs?: number;
  /** From the heal until every tunnel pair was on its expected path again (hole-punched pairs direct again), ms. */
  readonly pathsBackMs?: number;
  readonly samples?: readonly SampleStats[];
  /** The TCP flows held open through the fault. */
  readonly flows?: readonly FlowResult[];
  /** Wall time of the CNI ADDs this fault made (pod start latency). */
  readonly podStartMs?: readonly number[];
  /** How long the fault was held (ms). */
  readonly heldMs?: number;
  readonly durationMs?: number;
  readonly notes?: readonly string[];
  /** `--kubernetes`: the clients (every pod and node) that reached the lab's ClusterIP Service after the fault, of all. */
  readonly service?: { readonly answered: number; readonly of: number };
  /** Faults with loss windows: where the fault could cost packets (ms from its start). */
  readonly windows?: readonly LossWindow[];
  /** `--policy`: the pairs the lab's policies deny, pinged through the fault (none may answer). */
  readonly denied?: readonly DeniedSample[];
  /** policy-offline: what its samples saw of the policy's deletion. */
  readonly policyChange?: PolicyChangeSeen;
}

/** The result of a fault from its parts: ok when the matrix after works, every sample recovered and nothing else broke. */
export function judgeFault(target: LabFaultTarget, parts: {
  before: MatrixCount; after: MatrixCount; matrixMs?: { before: number; after: number }; samples: readonly SampleStats[]; flows?: readonly FlowResult[]; podStartMs?: readonly number[];
  heldMs: number; pathsBackMs?: number; beforeAgeMs?: number; durationMs: number; notes: readonly string[];
  /** Where the fault could cost packets (ms from its start). */
  windows?: readonly LossWindow[];
  denied?: readonly DeniedSample[];
  policyChange?: PolicyChangeSeen;
}): LabFaultResult {
  const sent = parts.samples.reduce((n, s) => n + s.sent, 0);
  const received = parts.samples.reduce((n, s) => n + s.received, 0);
  const lossPct = sent === 0 ? undefined : Math.round(((sent - received) / sent) * 1000) / 10;
  const unrecovered = parts.samples.filter((s) => s.convergenceMs === undefined);
  const notes = [...parts.notes];
  if (!parts.before.ok) notes.push(`${parts.before.shouldWork - parts.before.working} of ${parts.before.shouldWork} cells that should work failed already before the fault`);
  if (unrecovered.length > 0) notes.push(`no reply again from ${unrecovered.map((s) => `${s.from} -> ${s.to}`).join(', ')}`);
  if (!parts.after.ok) notes.push(`${parts.after.shouldWork - parts.after.working} of ${parts.after.shouldWork} cells that should work fail after the fault${parts.after.failed?.length ? ` (${parts.after.failed.join('; ')})` : ''}`);
  if (target.lossless && lossPct !== undefined && lossPct > 5) notes.push(`${lossPct}% loss although the data plane should not notice this fault`);
  for (const f of parts.flows ?? []) if (!f.survived) notes.push(`the TCP flow ${f.from} -> ${f.to} broke (${f.error ?? 'no echo'})`);
  if (target.strict) {
    for (const s of parts.samples) {
      const free = target.strict.lossFree.some((p) => p.from === s.from && p.to === s.to);
      const lost = s.sent - s.received - (s.lostInHand ?? 0);
      if (free && lost > 0) notes.push(`${s.from} -> ${s.to} lost ${lost} packets; it should lose none${s.lostInHand ? ` but the ${s.lostInHand} the killed agent held` : ''}`);
      else if (!free && (s.lostOutsideWindows ?? 0) > 0) {
        const runs = (s.outsideRuns ?? []).map((r) => `${r.lost} from +${(r.fromMs / 1000).toFixed(1)} s to +${(r.toMs / 1000).toFixed(1)} s`).join(', ');
        const allowed = (parts.windows ?? []).map((w) => `${w.label} +${(w.fromMs / 1000).toFixed(1)} to +${(w.toMs / 1000).toFixed(1)} s`).join(', ');
        notes.push(`${s.from} -> ${s.to} lost ${s.lostOutsideWindows} packets outside the fault's allowed windows (${runs}; allowed: ${allowed || 'none'})`);
      }
    }
  }
  for (const d of parts.denied ?? []) {
    if (d.sent === 0) notes.push(`the denied pair ${d.from} -> ${d.to} was not pinged`);
    else if (d.received > 0) notes.push(`${d.from} -> ${d.to}, which the policies deny, got ${d.received} of ${d.sent} pings answered during the fault${d.firstReplyMs === undefined ? '' : ` (the first at +${(d.firstReplyMs / 1000).toFixed(1)} s)`}`);
  }
  const change = parts.policyChange;
  for (const h of change?.held ?? []) {
    if (h.repliesBeforeHeal > 0) notes.push(`${h.from} -> ${h.to} answered ${h.repliesBeforeHeal} pings while its site was cut off: the site should have kept ${change?.policy} until the heal`);
    if (h.openedAfterHealMs === undefined) notes.push(`${h.from} -> ${h.to} did not open after the heal: ${change?.policy}'s deletion did not reach its site`);
  }
  for (const o of change?.opened ?? []) {
    if (o.repliesBeforeChange > 0) notes.push(`${o.from} -> ${o.to} answered ${o.repliesBeforeChange} pings before ${change?.policy} was deleted, which denied it`);
    if (o.openedAfterChangeMs === undefined || o.openedAfterChangeMs > POLICY_CHANGE_OPEN_MS) {
      notes.push(`${o.from} -> ${o.to} did not open within ${POLICY_CHANGE_OPEN_MS / 1000} s of ${change?.policy}'s deletion${o.openedAfterChangeMs === undefined ? '' : ` (${o.openedAfterChangeMs} ms)`}`);
    }
  }
  const maxGapMs = parts.samples.length === 0 ? undefined : Math.max(...parts.samples.map((s) => s.maxGapMs));
  const convergenceMs = unrecovered.length > 0 || parts.samples.length === 0 ? undefined : Math.max(...parts.samples.map((s) => s.convergenceMs ?? 0));
  return {
    kind: target.kind, description: target.description, ok: notes.length === 0, before: parts.before, after: parts.after, ...(parts.matrixMs ? { matrixMs: parts.matrixMs } : {}),
    ...(convergenceMs !== undefined ? { convergenceMs } : {}), ...(lossPct !== undefined ? { lossPct } : {}), ...(maxGapMs !== undefined ? { maxGapMs } : {}), samples: parts.samples,
    ...(parts.flows ? { flows: parts.flows } : {}), ...(parts.podStartMs ? { podStartMs: parts.podStartMs } : {}), heldMs: parts.heldMs,
    ...(parts.pathsBackMs !== undefined ? { pathsBackMs: parts.pathsBackMs } : {}), ...(parts.beforeAgeMs !== undefined ? { beforeAgeMs: parts.beforeAgeMs } : {}),
    durationMs: parts.durationMs, notes, ...(parts.windows && parts.windows.length > 0 ? { windows: parts.windows } : {}),
    ...(parts.denied && parts.denied.length > 0 ? { denied: parts.denied } : {}), ...(change ? { policyChange: change } : {}),
  };
}

/** The fault table for the terminal. */
export function renderFaults(results: readonly LabFaultResult[]): string[] {
  const count = (m: MatrixCount | undefined) => (m ? `${m.working}/${m.shouldWork}` : '-');
  const rows = [['fault', 'result', 'before', 'after', 'held', 'convergence', 'loss', 'longest gap', 'pod start', 'notes']];
  for (const r of results) {
    rows.push([
      r.kind, r.skipped ? 'skipped' : r.ok ? 'ok' : 'FAIL', count(r.before), count(r.after), r.heldMs === undefined ? '-' : `${r.heldMs} ms`,
      r.skipped ? '-' : r.convergenceMs === undefined ? 'never' : `${r.convergenceMs} ms`, r.lossPct === undefined ? '-' : `${r.lossPct}%`, r.maxGapMs === undefined ? '-' : `${r.maxGapMs} ms`,
      r.podStartMs && r.podStartMs.length > 0 ? `${Math.max(...r.podStartMs)} ms` : '-', r.skipped ?? [...(r.service ? [`Service ${r.service.answered}/${r.service.of}`] : []), ...(r.notes ?? [])].join('; '),
    ]);
  }
  const widths = rows.reduce<number[]>((w, r) => r.map((v, i) => Math.max(w[i] ?? 0, v.length)), []);
  return rows.map((r) => r.map((v, i) => (i === 0 || i === 1 || i === r.length - 1 ? v.padEnd(widths[i] ?? 0) : v.padStart(widths[i] ?? 0))).join('  ').trimEnd());
}
