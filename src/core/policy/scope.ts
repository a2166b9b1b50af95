/**
 * What one node is sent of the cluster's NetworkPolicy state, and the lines that carry it. Pure.
 *
 * A node gets:
 * - its own pods (it enforces on them), with their labels and named ports;
 * - every policy of a namespace it has a pod in: the ones selecting its pods now, and the ones that would select a pod
 *   whose labels change or that the kubelet restarts while the cloud is away;
 * - the remote pods those policies name (through selectors, or an ipBlock when an egress rule names a port by name,
 *   which resolves on the destination pod), when they run on a node it can reach (its view: src/core/cluster/view.ts);
 * - every namespace, with its labels (few, and a namespace selector needs them all).
 * Then only what changed: a put for an object whose content changed, a delete for one that left the node's view.
 */
import { PodIndex } from './compile.ts';
import { keyOf, type NetworkPolicy, type PolicyNamespace, type PolicyPod } from './model.ts';
import { cidrContains, parseCidr } from '../net/ipv4.ts';
import { fnv1a, hex } from '../fnv.ts';

/** A pod and the node it runs on. */
export interface ViewPod extends PolicyPod {
  readonly node: string;
}

/** What one node holds; each list sorted by key. */
export interface NodePolicyView {
  readonly policies: readonly NetworkPolicy[];
  readonly namespaces: readonly PolicyNamespace[];
  readonly pods: readonly ViewPod[];
}

export const EMPTY_POLICY_VIEW: NodePolicyView = { policies: [], namespaces: [], pods: [] };

/** A line of the policy stream (`GET /v1/policy`, NDJSON). */
export type PolicyLine =
  | ({ readonly type: 'snapshot' } & NodePolicyView)
  | { readonly type: 'put'; readonly policy?: NetworkPolicy; readonly namespace?: PolicyNamespace; readonly pod?: ViewPod }
  | { readonly type: 'delete'; readonly policy?: string; readonly namespace?: string; readonly pod?: string }
  /** After the lines of one change: the node answers it (`POST /v1/policy/applied`) once it applied them. */
  | { readonly type: 'mark'; readonly stream: string; readonly seq: number }
  | { readonly type: 'ping' };

/** The cluster's policy state as the controller holds it. */
export interface PolicyWorld {
  readonly policies: ReadonlyMap<string, NetworkPolicy>;
  readonly namespaces: ReadonlyMap<string, PolicyNamespace>;
  readonly pods: ReadonlyMap<string, ViewPod>;
}

const byKey = <T extends { namespace: string; name: string }>(a: T, b: T) => (keyOf(a) < keyOf(b) ? -1 : keyOf(a) > keyOf(b) ? 1 : 0);

/**
 * The pods each policy names, evaluated once per policy for a given world and shared by every node's view. Build a
 * new one when the world changes.
 */
export class PolicyPeers {
  readonly #world: PolicyWorld;
  readonly #index: PodIndex<ViewPod>;
  readonly #memo = new Map<string, readonly ViewPod[]>();
  readonly #podsByNode = new Map<string, ViewPod[]>();
  readonly #policiesByNs = new Map<string, NetworkPolicy[]>();

  constructor(world: PolicyWorld) {
    this.#world = world;
    this.#index = new PodIndex(world.pods.values(), world.namespaces.values());
    for (const pod of world.pods.values()) {
      const list = this.#podsByNode.get(pod.node);
      if (list) list.push(pod);
      else this.#podsByNode.set(pod.node, [pod]);
    }
    for (const pol of world.policies.values()) {
      const list = this.#policiesByNs.get(pol.namespace);
      if (list) list.push(pol);
      else this.#policiesByNs.set(pol.namespace, [pol]);
    }
  }

  /** The pods a policy's rules name. */
  named(policy: NetworkPolicy): readonly ViewPod[] {
    const key = keyOf(policy);
    const hit = this.#memo.get(key);
    if (hit) return hit;
    const out = new Set<ViewPod>();
    for (const [dir, rules] of [['ingress', policy.ingress], ['egress', policy.egress]] as const) {
      for (const rule of rules) {
        // a port named in an egress rule resolves on the destination: the pods in its peers that have such a port
        const names = dir === 'egress' ? rule.ports.flatMap((p) => (typeof p.port === 'string' ? [p.port] : [])) : [];
        const hasName = (p: ViewPod) => p.ports.some((n) => names.includes(n.name));
        if (rule.peers.length === 0 && names.length > 0) for (const p of this.#index.all) if (hasName(p.pod)) out.add(p.pod);
        for (const peer of rule.peers) {
          if (!('ipBlock' in peer)) {
            for (const p of this.#index.podsOf(policy.namespace, peer)) out.add(p.pod);
          } else if (names.length > 0) {
            const cidr = parseCidr(peer.ipBlock.cidr, false);
            if (cidr) for (const p of this.#index.all) if (cidrContains(cidr, p.ip) && hasName(p.pod)) out.add(p.pod);
          }
        }
      }
    }
    const list = [...out];
    this.#memo.set(key, list);
    return list;
  }

  /** What node `node` is sent; `reachable` says whether a pod on another node can be reached from it at all. */
  viewOf(node: string, reachable: (other: string) => boolean): NodePolicyView {
    const local = this.#podsByNode.get(node) ?? [];
    const namespaces = new Set(local.map((p) => p.namespace));
    const policies = [...namespaces].flatMap((ns) => this.#policiesByNs.get(ns) ?? []).sort(byKey);
    const pods = new Set<ViewPod>(local);
    for (const pol of policies) {
      for (const p of this.named(pol)) if (p.node === node || reachable(p.node)) pods.add(p);
    }
    return {
      policies,
      namespaces: [...this.#world.namespaces.values()].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0)),
      pods: [...pods].sort(byKey),
    };
  }
}

/** The lines that turn `before` into `after`: puts for new or changed objects, deletes for the ones gone. */
export function diffPolicyView(before: NodePolicyView, after: NodePolicyView): PolicyLine[] {
  const lines: PolicyLine[] = [];
  const kinds = [
    ['policy', before.policies, after.policies, keyOf],
    ['namespace', before.namespaces, after.namespaces, (n: PolicyNamespace) => n.name],
    ['pod', before.pods, after.pods, keyOf],
  ] as const;
  for (const [kind, was, now, key] of kinds) {
    const old = new Map<string, string>((was as readonly { namespace: string; name: string }[]).map((o) => [(key as (o: unknown) => string)(o), JSON.stringify(o)]));
    const seen = new Set<string>();
    for (const o of now as readonly object[]) {
      const k = (key as (o: unknown) => string)(o);
      seen.add(k);
      if (old.get(k) !== JSON.stringify(o)) lines.push({ type: 'put', [kind]: o } as PolicyLine);
    }
    for (const k of old.keys()) if (!seen.has(k)) lines.push({ type: 'delete', [kind]: k } as PolicyLine);
  }
  return lines;
}

/** JSON with every object's keys sorted: equal text for equal content, however the objects were built. */
function canonical(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonical).join(',')}]`;
  if (v && typeof v === 'object') return `{${Object.keys(v).sort().map((k) => `${JSON.stringify(k)}:${canonical((v as Record<string, unknown>)[k])}`).join(',')}}`;
  return JSON.stringify(v) ?? 'null';
}

/**
 * The revision of a set of policies: 12 hex digits of their content (sorted by key, canonical JSON), equal wherever
 * the same policies are held (the controller's part for a node, the node's view, its kept file), different when any
 * of them changes. The stream carries none: anyone holding the policies computes it, so the lines and the kept view
 * file stay as they were.
 */
export function policyRevision(policies: readonly NetworkPolicy[]): string {
  const text = canonical([...policies].sort(byKey));
  return `${hex(fnv1a(text), 8)}${hex(fnv1a(text, 0x12345678), 4)}`;
}

/** A node's view as it receives it: a snapshot, then puts and deletes, each applied in O(1). */
export class HeldPolicyView {
  readonly #policies = new Map<string, NetworkPolicy>();
  readonly #namespaces = new Map<string, PolicyNamespace>();
  readonly #pods = new Map<string, ViewPod>();

  constructor(view: NodePolicyView = EMPTY_POLICY_VIEW) {
    this.apply({ type: 'snapshot', ...view });
  }

  /** Applies one line: a snapshot replaces everything, a mark or a ping changes nothing. */
  apply(line: PolicyLine): void {
    switch (line.type) {
      case 'mark':
      case 'ping':
        return;
      case 'snapshot':
        this.#policies.clear();
        this.#namespaces.clear();
        this.#pods.clear();
        for (const p of line.policies) this.#policies.set(keyOf(p), p);
        for (const n of line.namespaces) this.#namespaces.set(n.name, n);
        for (const p of line.pods) this.#pods.set(keyOf(p), p);
        return;
      case 'put':
        if (line.policy) this.#policies.set(keyOf(line.policy), line.policy);
        if (line.namespace) this.#namespaces.set(line.namespace.name, line.namespace);
        if (line.pod) this.#pods.set(keyOf(line.pod), line.pod);
        return;
      case 'delete':
        if (line.policy !== undefined) this.#policies.delete(line.policy);
        if (line.namespace !== undefined) this.#namespaces.delete(line.namespace);
        if (line.pod !== undefined) this.#pods.delete(line.pod);
        return;
    }
  }

  /** The view held, each list sorted by key. */
  view(): NodePolicyView {
    const sorted = <T>(m: Map<string, T>) => [...m.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)).map(([, v]) => v);
    return { policies: sorted(this.#policies), namespaces: sorted(this.#namespaces), pods: sorted(this.#pods) };
  }
}
