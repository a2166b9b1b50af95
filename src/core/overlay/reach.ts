/**
 * Whether a peer's underlay is reachable directly (the same site without labels to say so), from the overlay's
 * probes over time. Pure: the probe's answer and the time come in.
 *
 * The far agent answers the probes itself, so a probe sent while it restarts goes unanswered. Taken at its word,
 * that moved a same-site pair into the tunnel for a whole probe period: the Kubernetes lab's `offline-restart` (a-1's
 * agent killed and back after 20 s) cut a-2's pods from a-1's for 2 minutes, as edge pairs outside a community have
 * no tunnel path. So a direct path survives failed probes for {@link DIRECT_LOSS_GRACE_MS}, the time an agent may be
 * away with its keeper holding its data plane, and is probed again every {@link PROBE_RETRY_MS} meanwhile.
 */

/** How often a peer is probed again while its answer is settled. */
export const PROBE_TTL_MS = 60_000;
/** How often a peer with a direct path that failed a probe is probed again. */
export const PROBE_RETRY_MS = 5_000;
/** How long a direct path is kept through failed probes (the agent's `tunnel.udp.keepMs` default). */
export const DIRECT_LOSS_GRACE_MS = 60_000;

export interface Reach {
  readonly reachable: boolean;
  /** When it was last probed (ms). */
  readonly at: number;
  /** Since when a direct path has failed its probes (ms), while it is kept. */
  readonly failingSince?: number;
}

/** Whether the peer is due for a probe at `now`. */
export function probeDue(reach: Reach | undefined, now: number): boolean {
  return reach === undefined || now - reach.at > (reach.failingSince === undefined ? PROBE_TTL_MS : PROBE_RETRY_MS);
}

/** What a probe answered (`answered`) or not at `now` makes of `reach`. */
export function afterProbe(reach: Reach | undefined, answered: boolean, now: number): Reach {
  if (answered) return { reachable: true, at: now };
  if (!reach?.reachable) return { reachable: false, at: now };
  const failingSince = reach.failingSince ?? now;
  return now - failingSince >= DIRECT_LOSS_GRACE_MS ? { reachable: false, at: now } : { reachable: true, at: now, failingSince };
}
