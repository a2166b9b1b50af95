/**
 * The controller on Kubernetes: NetworkPolicies, Namespaces and Pods, followed by list + watch
 * (src/adapters/kube/reflector.ts), turned into the policy model once (src/core/kube/policy-objects.ts), and served to
 * each node as its own part of it (src/core/policy/scope.ts): a snapshot when it connects, then only the lines that
 * change its part. Changes arriving together are handled in one pass; a pass also runs every 30 s, so a node that
 * moves site or community (which changes the remote pods it can reach) gets its new part within that.
 *
 * Every replica serves the stream (reads only). A policy part that cannot be read (POLICY_UNSUPPORTED: what the
 * conversion meets, and what the compiler would, checked here once per policy from the policy alone) is enforced more
 * strictly than written, logged once per distinct problem, and reported on the policy's namespace as a Kubernetes
 * Event once per policy generation (src/core/kube/policy-event.ts: the Event's name makes a second post from another
 * replica or a restart an AlreadyExists that changes nothing).
 */
import { asAtollError, type AtollError, atollError } from '../core/errors.ts';
import type { Logger } from '../core/ports.ts';
import { keepNamespace, keepPod, namespaceFromKube, podFromKube, policyFromKube } from '../core/kube/policy-objects.ts';
import { keyOf, type NetworkPolicy, type PolicyNamespace } from '../core/policy/model.ts';
import { policyProblems } from '../core/policy/compile.ts';
import { policyGenerationKey, type PolicyRef, policyUnsupportedEvent } from '../core/kube/policy-event.ts';
import { diffPolicyView, type NodePolicyView, type PolicyLine, PolicyPeers, type PolicyWorld, type ViewPod } from '../core/policy/scope.ts';
import { PeerHoldings, type ReleasedAddress, reusableAddresses } from '../core/policy/reuse.ts';
import { type KubeClient, type KubeObject, kubeStatusOf } from '../adapters/kube/kube-client.ts';
import { randomBytes } from 'node:crypto';
import { Reflector } from '../adapters/kube/reflector.ts';

export const NETWORK_POLICIES_PATH = '/apis/networking.k8s.io/v1/networkpolicies';
const NAMESPACES_PATH = '/api/v1/namespaces';
const PODS_PATH = '/api/v1/pods';
const COALESCE_MS = 100;
const RESYNC_MS = 30_000;

export interface KubePolicyComponents {
  readonly kube: KubeClient;
  readonly log: Logger;
  /** Whether node `viewer` can reach pods on node `other` at all (its registry view). */
  readonly reachable: (viewer: string, other: string) => boolean;
  /** The registered nodes that may hold pods of node `owner` (it is in their view), and whether each enforces policy. */
  readonly peersOf: (owner: string) => Iterable<{ readonly name: string; readonly enforces: boolean }>;
  /**
   * Whether this replica is the only one (the embedded store), so it knows what every node applied. With a store that
   * several replicas share, a node's acknowledgements reach only the replica it streams from, and which replica a cut-off
   * node last followed is known to none: no replica can judge reuse, so every address is answered reusable, as before
   * guarded reuse (the TTL and pressure rules).
   */
  readonly soleReplica: boolean;
  readonly clock: () => number;
  /** This controller replica, as the Events it posts name their reporter (`reportingInstance`). */
  readonly instance: string;
}

interface Watcher {
  readonly node: string;
  /** This stream's name in its `mark` lines, and the last mark sent on it. */
  readonly stream: string;
  seq: number;
  sent: NodePolicyView;
  readonly send: (lines: readonly PolicyLine[]) => void;
}

export class KubePolicy {
  readonly #c: KubePolicyComponents;
  readonly #abort = new AbortController();
  readonly #policies: Reflector<KubeObject>;
  readonly #namespaces: Reflector<KubeObject>;
  readonly #pods: Reflector<KubeObject>;
  readonly #watchers = new Set<Watcher>();
  #peers = new PolicyPeers({ policies: new Map(), namespaces: new Map(), pods: new Map() });
  #policyCount = 0;
  /** The addresses of the world's pods. */
  #addresses: ReadonlySet<string> = new Set();
  /** What each node may hold, for when an address may go to another pod (src/core/policy/reuse.ts). */
  readonly #holdings = new PeerHoldings();
  #reported = new Set<string>();
  /** Policy generations whose Event is posted or being posted (see {@link policyGenerationKey}). */
  #evented = new Set<string>();
  /** Policy generations whose Event failed to post, logged once each. */
  #eventFailed = new Set<string>();
  #timer: NodeJS.Timeout | undefined;
  #resync: NodeJS.Timeout | undefined;

  constructor(c: KubePolicyComponents) {
    this.#c = c;
    const r = (path: string, what: string, keep?: (o: KubeObject) => KubeObject) => new Reflector<KubeObject>({ kube: c.kube, log: c.log }, { path, what, ...(keep ? { keep } : {}) });
    this.#policies = r(NETWORK_POLICIES_PATH, 'NetworkPolicies');
    this.#namespaces = r(NAMESPACES_PATH, 'Namespaces', keepNamespace);
    this.#pods = r(PODS_PATH, 'Pods', keepPod);
  }

  /** Starts following; resolves once all three caches hold their first list. */
  async start(): Promise<void> {
    const signal = this.#abort.signal;
    for (const r of [this.#policies, this.#namespaces, this.#pods]) {
      r.onChange(() => this.#poke());
      r.start(signal);
    }
    await Promise.all([this.#policies.synced(signal), this.#namespaces.synced(signal), this.#pods.synced(signal)]);
    this.#rebuild();
    this.#resync = setInterval(() => this.#poke(), RESYNC_MS);
  }

  get synced(): boolean {
    return this.#policies.hasSynced && this.#namespaces.hasSynced && this.#pods.hasSynced;
  }

  /** How many NetworkPolicies the controller follows. */
  get policyCount(): number {
    return this.#policyCount;
  }

  /**
   * Node `node`'s part now, as a snapshot line and its mark, and a subscription: `send` gets the lines of every change
   * to it, each batch ending with a mark, until `unwatch` is called. The node answers a mark once it applied what
   * came before it ({@link applied}).
   */
  watch(node: string, send: (lines: readonly PolicyLine[]) => void): { first: readonly PolicyLine[]; unwatch: () => void } {
    const view = this.#viewOf(node);
    const w: Watcher = { node, stream: randomBytes(9).toString('base64url'), seq: 0, sent: view, send };
    this.#watchers.add(w);
    // only a replica that judges reuse needs what each node may hold
    if (this.#c.soleReplica) this.#holdings.sent(node, w.stream, 0, view);
    return { first: [{ type: 'snapshot', ...view }, { type: 'mark', stream: w.stream, seq: 0 }], unwatch: () => this.#watchers.delete(w) };
  }

  /** Node `node` applied what came before mark `seq` of stream `stream`; false when this replica did not send it. */
  applied(node: string, stream: string, seq: number): boolean {
    return this.#holdings.applied(node, stream, seq);
  }

  /**
   * Which of the addresses node `owner` released another pod may take now (src/core/policy/reuse.ts): none before
   * the caches are read; every one when this replica is not the only one ({@link KubePolicyComponents.soleReplica}).
   */
  reusable(owner: string, released: readonly ReleasedAddress[]): string[] {
    if (!this.#c.soleReplica) return released.map((r) => r.ip);
    if (!this.synced) return [];
    const peers = [...this.#c.peersOf(owner)].filter((p) => p.name !== owner).map((p) => ({ ...p, holds: this.#holdings.holds(p.name) }));
    return reusableAddresses(released, (ip) => this.#addresses.has(ip), peers);
  }

  async stop(): Promise<void> {
    this.#abort.abort();
    clearTimeout(this.#timer);
    clearInterval(this.#resync);
    await Promise.all([this.#policies.stopped(), this.#namespaces.stopped(), this.#pods.stopped()]);
  }

  #viewOf(node: string): NodePolicyView {
    return this.#peers.viewOf(node, (other) => this.#c.reachable(node, other));
  }

  #poke(): void {
    if (this.#timer || this.#abort.signal.aborted || !this.synced) return;
    this.#timer = setTimeout(() => {
      this.#timer = undefined;
      try {
        this.#rebuild();
        for (const w of this.#watchers) {
          const next = this.#viewOf(w.node);
          const lines = diffPolicyView(w.sent, next);
          w.sent = next;
          if (lines.length === 0) continue;
          w.seq++;
          if (this.#c.soleReplica) this.#holdings.sent(w.node, w.stream, w.seq, next);
          w.send([...lines, { type: 'mark', stream: w.stream, seq: w.seq }]);
        }
      } catch (err) {
        this.#c.log.error('serving policy changes failed; the next change or resync tries again', { err: asAtollError(err).message });
      }
    }, COALESCE_MS);
  }

  /** The world from the three caches, converted once, and the peers index over it. */
  #rebuild(): void {
    const policies = new Map<string, NetworkPolicy>();
    const problems: AtollError[] = [];
    const generations = new Set<string>();
    for (const obj of this.#policies.list()) {
      const got = policyFromKube(obj);
      if (!got) continue;
      policies.set(keyOf(got.policy), got.policy);
      const found = [...got.problems, ...policyProblems(got.policy).map((p) => atollError('POLICY_UNSUPPORTED', `NetworkPolicy ${p.policy}: ${p.message}`,
        'fix the policy (kubectl get networkpolicy -o yaml); until then Atoll enforces it more strictly than written', undefined, { policy: p.policy }))];
      problems.push(...found);
      const meta = obj.metadata as KubeObject['metadata'] & { generation?: number };
      if (meta.uid === undefined || found.length === 0) continue;
      const ref: PolicyRef = { namespace: got.policy.namespace, name: got.policy.name, uid: meta.uid, generation: meta.generation ?? 0, ...(meta.resourceVersion ? { resourceVersion: meta.resourceVersion } : {}) };
      generations.add(policyGenerationKey(ref));
      this.#postEvent(ref, found.map((p) => p.message));
    }
    // what is remembered of Events stays bounded: only the generations of policies that still have problems
    for (const k of this.#evented) if (!generations.has(k)) this.#evented.delete(k);
    for (const k of this.#eventFailed) if (!generations.has(k)) this.#eventFailed.delete(k);
    const namespaces = new Map<string, PolicyNamespace>();
    for (const obj of this.#namespaces.list()) {
      const ns = namespaceFromKube(obj);
      if (ns) namespaces.set(ns.name, ns);
    }
    const pods = new Map<string, ViewPod>();
    for (const obj of this.#pods.list()) {
      const got = podFromKube(obj);
      if (got) pods.set(keyOf(got.pod), { ...got.pod, node: got.node });
    }
    const world: PolicyWorld = { policies, namespaces, pods };
    this.#peers = new PolicyPeers(world);
    this.#addresses = new Set([...pods.values()].map((p) => p.ip));
    this.#policyCount = policies.size;
    const now = new Set<string>();
    for (const p of problems) {
      now.add(p.message);
      if (!this.#reported.has(p.message)) this.#c.log.warn('a NetworkPolicy is enforced more strictly than written', { code: p.code, err: p.message, fix: p.fix });
    }
    this.#reported = now;
  }

  /** Posts the Event for a policy generation with problems, once; a failed post is logged once and tried again next pass. */
  #postEvent(ref: PolicyRef, problems: readonly string[]): void {
    const key = policyGenerationKey(ref);
    if (this.#evented.has(key)) return;
    this.#evented.add(key);
    const event = policyUnsupportedEvent(ref, problems, this.#c.instance, this.#c.clock());
    this.#c.kube.create(`/apis/events.k8s.io/v1/namespaces/${encodeURIComponent(ref.namespace)}/events`, event, this.#abort.signal).then(
      () => this.#c.log.info('reported a NetworkPolicy enforced more strictly than written as an Event', { policy: `${ref.namespace}/${ref.name}`, generation: ref.generation, event: event.metadata.name }),
      (err: unknown) => {
        if (kubeStatusOf(err)?.status === 409) return; // posted already: by another replica, or before a restart
        this.#evented.delete(key);
        if (this.#abort.signal.aborted || this.#eventFailed.has(key)) return;
        this.#eventFailed.add(key);
        const e = asAtollError(err);
        this.#c.log.warn('cannot post the Event for a NetworkPolicy enforced more strictly than written; trying again at the next pass', { code: e.code, err: e.message, policy: `${ref.namespace}/${ref.name}` });
      },
    );
  }
}
