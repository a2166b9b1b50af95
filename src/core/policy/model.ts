/**
 * Kubernetes NetworkPolicy (networking.k8s.io/v1) as the core sees it: plain data, already validated and defaulted by
 * the adapter that read it (the core never sees a Kubernetes object). Pure: no I/O, no `node:` imports.
 *
 * Semantics followed (the API reference, "NetworkPolicy v1 networking.k8s.io", and the upstream e2e suite
 * test/e2e/network/netpol, whose truth tables the unit tests restate):
 * - a policy selects the pods of its own namespace that match `podSelector` (an empty selector selects all of them);
 * - a pod selected by any policy with `Ingress` in its types is isolated for ingress: only what some rule of some such
 *   policy allows gets in (policies add up, never subtract); the same for `Egress`;
 * - a rule with no peers allows every peer, a rule with no ports every port; an empty rule list allows nothing;
 * - a peer is pods (podSelector and/or namespaceSelector; a podSelector alone means the policy's own namespace) or an
 *   ipBlock (a CIDR minus its `except` prefixes);
 * - a port is a protocol (TCP when unset) and a number, a number range (`endPort`), a name (resolved on the pod the
 *   traffic is for: the selected pod for ingress, the destination pod for egress), or no port (the whole protocol).
 */

/** One label selector requirement (`matchExpressions`). */
export interface LabelRequirement {
  readonly key: string;
  readonly operator: 'In' | 'NotIn' | 'Exists' | 'DoesNotExist';
  readonly values: readonly string[];
}

/** A Kubernetes label selector; `{}` (no labels, no expressions) selects everything. */
export interface LabelSelector {
  readonly matchLabels?: Readonly<Record<string, string>>;
  readonly matchExpressions?: readonly LabelRequirement[];
}

export type PolicyProtocol = 'TCP' | 'UDP' | 'SCTP';

export interface PolicyPort {
  readonly protocol: PolicyProtocol;
  /** A number (1-65535), a container port name, or undefined for every port of the protocol. */
  readonly port?: number | string;
  /** With a numeric `port`: the last port of the range (inclusive). */
  readonly endPort?: number;
}

/** A peer of a rule: pods chosen by selectors, or addresses. */
export type PolicyPeer =
  | { readonly podSelector?: LabelSelector; readonly namespaceSelector?: LabelSelector }
  | { readonly ipBlock: { readonly cidr: string; readonly except: readonly string[] } };

export interface PolicyRule {
  /** Sources (ingress) or destinations (egress); empty means every peer. */
  readonly peers: readonly PolicyPeer[];
  /** Empty means every port and protocol. */
  readonly ports: readonly PolicyPort[];
}

export interface NetworkPolicy {
  readonly namespace: string;
  readonly name: string;
  readonly podSelector: LabelSelector;
  /** Defaulted by the adapter as the API does: Ingress always, Egress when the policy has egress rules. */
  readonly policyTypes: readonly ('Ingress' | 'Egress')[];
  readonly ingress: readonly PolicyRule[];
  readonly egress: readonly PolicyRule[];
}

export interface PolicyNamespace {
  readonly name: string;
  readonly labels: Readonly<Record<string, string>>;
}

/** A named container port of a pod, for ports named in policies. */
export interface NamedPort {
  readonly name: string;
  readonly protocol: PolicyProtocol;
  readonly port: number;
}

/** A pod that holds a cluster address (not host network, not finished). */
export interface PolicyPod {
  readonly namespace: string;
  readonly name: string;
  /** The pod's IPv4 address, dotted. */
  readonly ip: string;
  readonly labels: Readonly<Record<string, string>>;
  readonly ports: readonly NamedPort[];
}

/** `namespace/name`, how policies and pods are named in plans, logs and `atoll trace`. */
export function keyOf(o: { readonly namespace: string; readonly name: string }): string {
  return `${o.namespace}/${o.name}`;
}
