/**
 * Leader election on a coordination.k8s.io/v1 Lease, as client-go's `leaderelection` does it, so a Kubernetes
 * install needs no etcd of its own (src/adapters/store/store-kube.ts holds the data).
 *
 * A replica takes the Lease when it is absent, has no holder, or has expired, and renews it every
 * `leaseDurationSeconds / 3`; every write is a compare-and-swap on the Lease's resourceVersion. Expiry is judged as
 * client-go judges it: not by comparing the holder's `renewTime` with this machine's wall clock (the clocks may
 * differ), but by this replica's own monotonic clock since it last saw the Lease record change. The leader stops
 * (`lost` aborts) when no renewal succeeded for {@link RENEW_DEADLINE_SHARE} of the duration, counted from when the
 * last successful one was sent, so it stops before any other replica can see the Lease expire.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import type { LeaderElection } from '../../core/cluster/store.ts';
import { AtollError, atollError } from '../../core/errors.ts';
import { type KubeClient, type KubeObject, kubeStatusOf } from '../kube/kube-client.ts';

/** The fields of a Lease's spec that the election reads and writes. */
export interface LeaseSpec {
  readonly holderIdentity?: string;
  readonly leaseDurationSeconds?: number;
  readonly acquireTime?: string;
  readonly renewTime?: string;
  readonly leaseTransitions?: number;
}

export interface KubeLease extends KubeObject {
  readonly spec?: LeaseSpec;
}

/** The share of the lease duration a leader may go without a successful renewal before it stops leading. */
export const RENEW_DEADLINE_SHARE = 0.8;

/** Time as the election sees it; injected so tests can drive it. */
export interface ElectionClock {
  /** Monotonic milliseconds (expiry and deadlines). */
  now(): number;
  /** Wall time, written into the Lease's acquireTime and renewTime for people to read. */
  wall(): Date;
  /** Resolves after `ms`, or rejects when `signal` aborts. */
  sleep(ms: number, signal: AbortSignal): Promise<void>;
}

const SYSTEM_CLOCK: ElectionClock = { now: () => performance.now(), wall: () => new Date(), sleep: (ms, signal) => sleep(ms, undefined, { signal }) };

export type LeaseVerdict = 'absent' | 'mine' | 'free' | 'expired' | 'held';

/**
 * Who may write the Lease: `absent` (create it), `mine` (renew), `free` (no holder) or `expired` (take it), or
 * `held` (wait). `observedAt` is when this replica last saw the record change, on `now`'s clock.
 */
export function leaseVerdict(spec: LeaseSpec | undefined, id: string, observedAt: number, now: number): LeaseVerdict {
  if (spec === undefined) return 'absent';
  if (!spec.holderIdentity) return 'free';
  if (spec.holderIdentity === id) return 'mine';
  return observedAt + (spec.leaseDurationSeconds ?? 0) * 1000 <= now ? 'expired' : 'held';
}

/** The spec this replica writes to take or renew the Lease, from what it read (undefined: none yet). */
export function nextLeaseSpec(spec: LeaseSpec | undefined, id: string, durationSeconds: number, wall: Date): LeaseSpec {
  const time = microTime(wall);
  const mine = spec?.holderIdentity === id;
  return {
    holderIdentity: id,
    leaseDurationSeconds: durationSeconds,
    acquireTime: mine ? spec?.acquireTime ?? time : time,
    renewTime: time,
    leaseTransitions: (spec?.leaseTransitions ?? 0) + (spec?.holderIdentity && !mine ? 1 : 0),
  };
}

/** A Kubernetes MicroTime: RFC 3339 with six fractional digits. */
export function microTime(d: Date): string {
  return d.toISOString().replace(/\.(\d{3})Z$/, '.$1000Z');
}

export interface KubeLeaseInit {
  readonly namespace: string;
  readonly name: string;
  /** This replica's identity, written as holderIdentity (its API URL). */
  readonly id: string;
  readonly leaseDurationSeconds: number;
}

interface Term {
  readonly lost: AbortController;
  readonly stop: AbortController;
  leading: boolean;
  deadline?: ReturnType<typeof setTimeout>;
}

export class KubeLeaseElection implements LeaderElection {
  readonly #kube: KubeClient;
  readonly #init: KubeLeaseInit;
  readonly #clock: ElectionClock;
  readonly #path: string;
  /** The record last seen (holder, times, transitions) and when, on the monotonic clock, it last changed. */
  #observed = '';
  #observedAt = 0;
  #term: Term | undefined;

  constructor(components: { readonly kube: KubeClient; readonly clock?: ElectionClock }, init: KubeLeaseInit) {
    this.#kube = components.kube;
    this.#clock = components.clock ?? SYSTEM_CLOCK;
    this.#init = init;
    this.#path = `/apis/coordination.k8s.io/v1/namespaces/${init.namespace}/leases/${init.name}`;
  }

  /**
   * Resolves once this replica holds the Lease (at once if it already leads), trying every duration/3.
   * @throws the signal's reason when `signal` aborts first; AtollError STORE_UNAVAILABLE when the API server cannot
   *   be reached or refuses (e.g. the namespace does not exist, or RBAC forbids leases).
   */
  async campaign(signal: AbortSignal): Promise<{ readonly lost: AbortSignal }> {
    signal.throwIfAborted();
    const current = this.#term;
    if (current !== undefined && !current.lost.signal.aborted) {
      if (current.leading) return { lost: current.lost.signal };
      throw atollError('INTERNAL', `${this.#init.id} is already campaigning for Lease ${this.#init.namespace}/${this.#init.name}`, 'await the running campaign');
    }
    const term: Term = { lost: new AbortController(), stop: new AbortController(), leading: false };
    this.#term = term;
    try {
      for (;;) {
        const sentAt = this.#clock.now();
        if (await this.#tryAcquireOrRenew()) {
          term.leading = true;
          this.#arm(term, sentAt);
          void this.#renewLoop(term);
          return { lost: term.lost.signal };
        }
        await this.#clock.sleep(this.#retryMs, signal);
      }
    } catch (err) {
      this.#lose(term, 'the campaign ended');
      if (this.#term === term) this.#term = undefined;
      throw signal.aborted ? signal.reason : storeError(err, `campaign for Lease ${this.#init.namespace}/${this.#init.name}`);
    }
  }

  /** The Lease's holderIdentity, if any. */
  async leader(): Promise<string | undefined> {
    try {
      const lease = await this.#kube.get<KubeLease>(this.#path);
      return lease?.spec?.holderIdentity || undefined;
    } catch (err) {
      throw storeError(err, `read Lease ${this.#init.namespace}/${this.#init.name}`);
    }
  }

  /** Stops leading (aborting `lost`) and clears holderIdentity, so another replica takes over at its next try. */
  async resign(): Promise<void> {
    const term = this.#term;
    if (term === undefined) return;
    this.#term = undefined;
    const wasLeading = term.leading;
    this.#lose(term, 'it resigned');
    if (!wasLeading) return;
    for (let attempt = 0; attempt < 5; attempt++) {
      const lease = await this.#kube.get<KubeLease>(this.#path);
      if (lease?.spec?.holderIdentity !== this.#init.id) return;
      const { holderIdentity: _, ...rest } = lease.spec;
      try {
        await this.#kube.replace(this.#path, { ...lease, spec: { ...rest, renewTime: microTime(this.#clock.wall()) } });
        return;
      } catch (err) {
        if (kubeStatusOf(err)?.status !== 409) throw storeError(err, `release Lease ${this.#init.namespace}/${this.#init.name}`);
      }
    }
  }

  get #retryMs(): number {
    return Math.max(1, Math.round((this.#init.leaseDurationSeconds * 1000) / 3));
  }

  /** One try: true when this replica holds the Lease after it (created, taken over or renewed). */
  async #tryAcquireOrRenew(): Promise<boolean> {
    const now = this.#clock.now();
    const lease = await this.#kube.get<KubeLease>(this.#path);
    if (lease !== undefined) this.#observe(lease.spec, now);
    const verdict = leaseVerdict(lease?.spec, this.#init.id, this.#observedAt, now);
    if (verdict === 'held') return false;
    const spec = nextLeaseSpec(lease?.spec, this.#init.id, this.#init.leaseDurationSeconds, this.#clock.wall());
    try {
      if (lease === undefined) {
        await this.#kube.create(this.#path.replace(/\/[^/]+$/, ''), { apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata: { name: this.#init.name, namespace: this.#init.namespace }, spec });
      } else {
        await this.#kube.replace(this.#path, { ...lease, spec });
      }
    } catch (err) {
      if (kubeStatusOf(err)?.status === 409) return false; // another replica wrote it first
      throw err;
    }
    this.#observe(spec, now);
    return true;
  }

  #observe(spec: LeaseSpec | undefined, now: number): void {
    const record = JSON.stringify([spec?.holderIdentity, spec?.renewTime, spec?.acquireTime, spec?.leaseDurationSeconds, spec?.leaseTransitions]);
    if (record !== this.#observed) {
      this.#observed = record;
      this.#observedAt = now;
    }
  }

  async #renewLoop(term: Term): Promise<void> {
    while (!term.stop.signal.aborted) {
      try {
        await this.#clock.sleep(this.#retryMs, term.stop.signal);
      } catch {
        return;
      }
      const sentAt = this.#clock.now();
      try {
        if (!(await this.#tryAcquireOrRenew())) return this.#lose(term, 'another replica holds the Lease');
      } catch (err) {
        if (err instanceof AtollError && err.code.startsWith('KUBE_API_')) continue; // the deadline ends the term if this goes on
        return this.#lose(term, `its renewal failed: ${String(err)}`);
      }
      if (term.stop.signal.aborted) return;
      this.#arm(term, sentAt);
    }
  }

  /** (Re)sets the deadline: RENEW_DEADLINE_SHARE of the duration after `renewedAt`, the last successful send. */
  #arm(term: Term, renewedAt: number): void {
    clearTimeout(term.deadline);
    const left = renewedAt + this.#init.leaseDurationSeconds * 1000 * RENEW_DEADLINE_SHARE - this.#clock.now();
    term.deadline = setTimeout(() => this.#lose(term, `the Lease was not renewed for ${this.#init.leaseDurationSeconds * RENEW_DEADLINE_SHARE} s`), left);
  }

  #lose(term: Term, why: string): void {
    term.stop.abort();
    clearTimeout(term.deadline);
    term.lost.abort(atollError('STORE_UNAVAILABLE', `${this.#init.id} no longer leads Lease ${this.#init.namespace}/${this.#init.name}: ${why}`, 'stop acting as leader and campaign again'));
  }
}

/** A Kubernetes API failure as the store port's STORE_UNAVAILABLE (anything else unchanged). */
export function storeError(err: unknown, what: string): unknown {
  if (!(err instanceof AtollError) || !err.code.startsWith('KUBE_API_')) return err;
  const status = kubeStatusOf(err);
  const hint = status?.status === 404 ? 'install the CRDs (kubectl apply --server-side -f deploy/helm/atoll/crds/) and create the lease namespace'
    : status?.status === 403 ? "grant the controller's service account the atoll.dev resources and leases (deploy/atoll.yaml)"
      : 'check that the Kubernetes API server is reachable; the controller retries';
  return atollError('STORE_UNAVAILABLE', `Kubernetes store: cannot ${what}: ${err.message}`, hint, err);
}
