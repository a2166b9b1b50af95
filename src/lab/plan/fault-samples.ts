/**
 * What the sample pings of a lab fault (src/lab/plan/faults.ts) show, pure: loss, late replies and the longest gap of
 * each sample, its convergence, and which lost packets fall outside the windows in which the fault may cost packets.
 * Convergence is measured from the moment the fault was healed (the controller restarted, the agent answering
 * again, the uplink restored, the pod re-added) to the first reply after the last lost packet of the slowest sample.
 */
import type { LabPodPair } from './faults.ts';

/** One reply of a continuous ping: its sequence number and when it arrived (ms, the same clock as `healAtMs`). */
export interface PingReply {
  readonly seq: number;
  readonly atMs: number;
  /** Round trip ping measured, ms. */
  readonly rttMs?: number;
}

/** A reply slower than this counts as part of the outage (a TCP tunnel queues packets through a cut instead of losing them). */
export const LATE_REPLY_MS = 1000;

export interface SampleStats {
  readonly from: string;
  readonly to: string;
  readonly sent: number;
  readonly received: number;
  readonly lossPct: number;
  /** Replies that came back, but later than {@link LATE_REPLY_MS} (queued through the fault). */
  readonly late: number;
  /** Longest time between two replies arriving, ms: the outage as the pod sees it. */
  readonly maxGapMs: number;
  /** From the heal to the first reply after the last lost packet; 0 when nothing was lost; undefined when it never answered again. */
  readonly convergenceMs?: number;
  /** Faults with loss windows: packets lost outside all of them... */
  readonly lostOutsideWindows?: number;
  /** ...in these runs: from the reply before to the sending of the reply after (ms from the fault's start). */
  readonly outsideRuns?: readonly LossRun[];
  /** Faults that SIGKILL an agent: packets lost at that instant, in the killed agent's hands ({@link LossWindow.inHand}). */
  readonly lostInHand?: number;
}

/** A run of lost packets: between the reply before it and the sending of the reply after it. */
export interface LossRun {
  readonly fromMs: number;
  readonly toMs: number;
  readonly lost: number;
}

/** A stretch of time (ms, the clock of the replies) in which a fault may cost packets, e.g. an agent's restart and 1 s after it. */
export interface LossWindow {
  readonly fromMs: number;
  readonly toMs: number;
  readonly label: string;
  /** The nodes whose restart it is: it excuses only samples with an end on one of them (every sample when absent). */
  readonly nodes?: readonly string[];
  /**
   * The instant an agent was killed (SIGKILL): what it had read from its socket or TUN device and not yet passed on
   * dies with it (a process's memory cannot be handed over). Excuses those packets even on samples that may lose none
   * (the keeper held everything else); none on an idle node, a few when the agent waited for a CPU between reading
   * and writing.
   */
  readonly inHand?: boolean;
}

/** The windows that may excuse a sample between pods on `nodes`. */
export function windowsFor(windows: readonly LossWindow[], nodes: readonly string[]): LossWindow[] {
  return windows.filter((w) => w.nodes === undefined || w.nodes.some((n) => nodes.includes(n)));
}

/**
 * How many packets of a sample were lost outside every window. A run of lost packets is inside a window when the
 * reply before it came no earlier than the window's start less two ping intervals (the first lost one left up to an
 * interval after that reply, and may have left just before the window opened: a packet in a killed agent's queue,
 * the kill timed by another process), and the reply after it was sent (its arrival less its round trip) no later than
 * the window's end plus one interval. Packets before the first reply (the warm-up) do not count.
 */
export function lostOutsideWindows(replies: readonly PingReply[], windows: readonly LossWindow[], intervalMs: number): { lost: number; runs: LossRun[] } {
  const sorted = [...replies].sort((a, b) => a.seq - b.seq);
  const runs: LossRun[] = [];
  for (let i = 1; i < sorted.length; i++) {
    const prev = sorted[i - 1] as PingReply;
    const next = sorted[i] as PingReply;
    const run = next.seq - prev.seq - 1;
    if (run <= 0) continue;
    const sentAt = next.atMs - (next.rttMs ?? 0);
    if (!windows.some((w) => prev.atMs >= w.fromMs - 2 * intervalMs && sentAt <= w.toMs + intervalMs)) runs.push({ fromMs: prev.atMs, toMs: sentAt, lost: run });
  }
  return { lost: runs.reduce((n, r) => n + r.lost, 0), runs };
}

/**
 * Loss and convergence of one continuous ping. `transmitted` is what ping reported sending (the last packet may be
 * in flight when it is stopped, so packets after the last reply count as lost only when there is more than one).
 */
export function sampleStats(pair: LabPodPair, replies: readonly PingReply[], transmitted: number, healAtMs: number): SampleStats {
  const seqs = new Set(replies.map((r) => r.seq));
  const maxSeq = Math.max(0, ...seqs);
  const sent = Math.max(maxSeq, transmitted - 1, 0);
  const received = seqs.size;
  const lossPct = sent === 0 ? 100 : Math.round(((sent - received) / sent) * 1000) / 10;
  const isLate = (r: PingReply) => r.rttMs !== undefined && r.rttMs > LATE_REPLY_MS;
  const late = replies.filter(isLate).length;
  const arrivals = replies.map((r) => r.atMs).sort((a, b) => a - b);
  const maxGapMs = Math.round(arrivals.reduce((g, t, i) => (i === 0 ? g : Math.max(g, t - (arrivals[i - 1] as number))), 0));
  const base = { ...pair, sent, received, lossPct, late, maxGapMs };
  // the last bad packet: lost (a gap in the sequence numbers) or answered late
  let lastBad = 0;
  for (let s = maxSeq; s >= 1; s--) {
    if (!seqs.has(s)) {
      lastBad = s;
      break;
    }
  }
  for (const r of replies) if (isLate(r) && r.seq > lastBad) lastBad = r.seq;
  const tailLost = sent - maxSeq > 0;
  if (received === 0 || tailLost) return base;
  if (lastBad === 0) return { ...base, convergenceMs: 0 };
  const first = replies.filter((r) => r.seq > lastBad).sort((a, b) => a.seq - b.seq)[0];
  return { ...base, ...(first ? { convergenceMs: Math.max(0, Math.round(first.atMs - healAtMs)) } : {}) };
}

/** A pair the lab's NetworkPolicies deny, pinged through a fault: what it sent and what came back (nothing may). */
export interface DeniedSample extends LabPodPair {
  readonly sent: number;
  readonly received: number;
  /** When the first reply came, ms from the fault's start. */
  readonly firstReplyMs?: number;
}

/** The replies of one continuous ping and the pair it pinged. */
export interface PairReplies {
  readonly pair: LabPodPair;
  readonly replies: readonly PingReply[];
}

/** What the samples of the policy-offline fault saw of a policy deleted while a site was cut off. */
export interface PolicyChangeSeen {
  readonly policy: string;
  /** Pairs into the site cut off: replies before the heal (none may come) and the first one after it, ms from the heal. */
  readonly held: readonly (LabPodPair & { readonly repliesBeforeHeal: number; readonly openedAfterHealMs?: number })[];
  /** Pairs elsewhere: replies before the deletion (none may come) and the first one after it, ms from the deletion. */
  readonly opened: readonly (LabPodPair & { readonly repliesBeforeChange: number; readonly openedAfterChangeMs?: number })[];
}

/** {@link PolicyChangeSeen} from the samples' replies, the deletion's instant and the heal's (the replies' clock). */
export function policyChangeSeen(policy: string, held: readonly PairReplies[], opened: readonly PairReplies[], changedAtMs: number, healAtMs: number): PolicyChangeSeen {
  const firstAfter = (replies: readonly PingReply[], t: number): { ms?: number } => {
    const first = Math.min(...replies.filter((r) => r.atMs >= t).map((r) => r.atMs));
    return Number.isFinite(first) ? { ms: Math.round(first - t) } : {};
  };
  const before = (replies: readonly PingReply[], t: number) => replies.filter((r) => r.atMs < t).length;
  return {
    policy,
    held: held.map(({ pair, replies }) => {
      const { ms } = firstAfter(replies, healAtMs);
      return { ...pair, repliesBeforeHeal: before(replies, healAtMs), ...(ms !== undefined ? { openedAfterHealMs: ms } : {}) };
    }),
    opened: opened.map(({ pair, replies }) => {
      const { ms } = firstAfter(replies, changedAtMs);
      return { ...pair, repliesBeforeChange: before(replies, changedAtMs), ...(ms !== undefined ? { openedAfterChangeMs: ms } : {}) };
    }),
  };
}
