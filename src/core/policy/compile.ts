/**
 * NetworkPolicy compiled for one node: for each of the node's pods that some policy isolates, the rules that let
 * traffic in and out, with every peer turned into address ranges and every named port into a number. Pure; the
 * nftables rendering (./nft.ts) and `atoll trace` both read this plan, and {@link decide} evaluates it the way the
 * kernel will.
 *
 * Choices:
 * - a rule that cannot be expressed (a CIDR that does not parse) is reported and matches nothing: a policy we cannot
 *   read closes more, never opens more;
 * - a named ingress port is resolved on the selected pod; a named egress port on each destination pod the rule's peers
 *   match, so one egress rule becomes one compiled rule per (protocol, port) found; destinations are the pods this
 *   node knows, so an ipBlock peer with a named port matches only known pods inside the block (as upstream);
 * - peers are evaluated once per distinct (namespace, selectors) and shared by every pod and rule naming them.
 */
import { type Cidr, parseCidr, parseIpv4 } from '../net/ipv4.ts';
import { normalizeRanges, type Range, rangeOfCidr, rangesContain, subtractRanges } from '../net/ranges.ts';
import { keyOf, type LabelSelector, type NetworkPolicy, type PolicyNamespace, type PolicyPeer, type PolicyPod, type PolicyPort, type PolicyProtocol, type PolicyRule } from './model.ts';
import { describeSelector, matchesSelector, selectorKey } from './selector.ts';

export type L4 = 'tcp' | 'udp' | 'sctp';

/** A protocol, and ports `first`..`last` of it (every port when absent). */
export interface PortMatch {
  readonly protocol: L4;
  readonly first?: number;
  readonly last?: number;
}

export interface CompiledRule {
  /** `namespace/name` of the policy. */
  readonly policy: string;
  /** Index of the rule in the policy's ingress or egress list. */
  readonly rule: number;
  /** Remote addresses allowed (sources for ingress, destinations for egress), normalised; 'any' for every address. */
  readonly peers: readonly Range[] | 'any';
  /**
   * What the peers are, not what they hold now (the selectors or ipBlocks, and a named port's resolution): equal for
   * rules naming the same peers, and unchanged when only the pods they match change. The ruleset names its sets by it.
   */
  readonly peerKey: string;
  /**
   * Whether every peer is a pod (selectors, or the pods behind a named port; no ipBlock): then `peers` holds pod
   * addresses only, and the ruleset keeps them as single addresses in a hash set, which nft changes without reading it.
   */
  readonly podsOnly: boolean;
  readonly ports: readonly PortMatch[] | 'any';
  /** The rule in words, for `atoll trace`: `from pods role=web of x, TCP 80`. */
  readonly what: string;
}

export interface PodPolicy {
  /** `namespace/name`. */
  readonly pod: string;
  readonly ip: number;
  /** The policies that select the pod, sorted. */
  readonly policies: readonly string[];
  /** Of those, the ones that isolate it for ingress and for egress (their `policyTypes`), sorted. */
  readonly isolatedBy: { readonly ingress: readonly string[]; readonly egress: readonly string[] };
  /** Present when the pod is isolated for ingress: what may come in. */
  readonly ingress?: readonly CompiledRule[];
  /** Present when the pod is isolated for egress: what may go out. */
  readonly egress?: readonly CompiledRule[];
}

/** A part of a policy that could not be expressed; it matches nothing. */
export interface PolicyProblem {
  readonly policy: string;
  readonly message: string;
}

export interface PolicyPlan {
  /** The node's pods that at least one policy isolates, sorted by address. */
  readonly pods: readonly PodPolicy[];
  readonly problems: readonly PolicyProblem[];
}

export interface PolicyInput {
  readonly policies: readonly NetworkPolicy[];
  readonly namespaces: readonly PolicyNamespace[];
  /** Every pod the node knows (its own and the remote ones its policies may name). */
  readonly pods: readonly PolicyPod[];
  /** `namespace/name` of the pods on this node. */
  readonly local: ReadonlySet<string>;
  /**
   * Pods of this node closed until their labels are known (src/core/policy/local-pods.ts `closedPods`): isolated in
   * those directions with no rule, `isolatedBy` naming why.
   */
  readonly closed?: readonly { readonly pod: string; readonly ip: number; readonly ingress: boolean; readonly egress: boolean; readonly why: string }[];
}

const L4_OF: Record<PolicyProtocol, L4> = { TCP: 'tcp', UDP: 'udp', SCTP: 'sctp' };

/**
 * Pods by namespace, with the namespaces' labels, answering "which pods does this peer name" once per distinct
 * (policy namespace, selectors). Shared by the node's compiler and the controller's per-node scoping.
 */
export class PodIndex<P extends PolicyPod = PolicyPod> {
  readonly #byNamespace = new Map<string, { pod: P; ip: number }[]>();
  readonly #nsLabels: Map<string, Readonly<Record<string, string>>>;
  readonly #cache = new Map<string, { pod: P; ip: number }[]>();
  readonly #ranges = new Map<string, Range[]>();
  /** Pods by the names of their ports, made at the first ask. */
  #byPortName: Map<string, { pod: P; ip: number }[]> | undefined;
  /** Every pod with an IPv4 address, in input order. */
  readonly all: readonly { readonly pod: P; readonly ip: number }[];

  constructor(pods: Iterable<P>, namespaces: Iterable<PolicyNamespace>) {
    const all: { pod: P; ip: number }[] = [];
    for (const pod of pods) {
      const ip = parseIpv4(pod.ip);
      if (ip === undefined) continue;
      const entry = { pod, ip };
      all.push(entry);
      const list = this.#byNamespace.get(pod.namespace);
      if (list) list.push(entry);
      else this.#byNamespace.set(pod.namespace, [entry]);
    }
    this.all = all;
    this.#nsLabels = new Map([...namespaces].map((n) => [n.name, n.labels]));
  }

  /** The pods a pod peer (selectors, not an ipBlock) of a policy in `policyNs` names. */
  podsOf(policyNs: string, peer: { readonly podSelector?: LabelSelector; readonly namespaceSelector?: LabelSelector }): readonly { readonly pod: P; readonly ip: number }[] {
    const key = peerKey(policyNs, peer);
    const hit = this.#cache.get(key);
    if (hit) return hit;
    const namespaces = peer.namespaceSelector === undefined ? [policyNs] : [...this.#byNamespace.keys()].filter((ns) => matchesSelector(peer.namespaceSelector ?? {}, this.#nsLabels.get(ns) ?? {}));
    const out: { pod: P; ip: number }[] = [];
    for (const ns of namespaces) {
      for (const p of this.#byNamespace.get(ns) ?? []) {
        if (peer.podSelector === undefined || matchesSelector(peer.podSelector, p.pod.labels)) out.push(p);
      }
    }
    this.#cache.set(key, out);
    return out;
  }

  /** The pods with a port named `name` (of any protocol), in input order. */
  withPortName(name: string): readonly { readonly pod: P; readonly ip: number }[] {
    if (!this.#byPortName) {
      this.#byPortName = new Map();
      for (const entry of this.all as { pod: P; ip: number }[]) {
        for (const n of new Set(entry.pod.ports.map((x) => x.name))) {
          const list = this.#byPortName.get(n);
          if (list) list.push(entry);
          else this.#byPortName.set(n, [entry]);
        }
      }
    }
    return this.#byPortName.get(name) ?? [];
  }

  /** The addresses of {@link podsOf}, normalised, computed once per distinct peer. */
  rangesOf(policyNs: string, peer: { readonly podSelector?: LabelSelector; readonly namespaceSelector?: LabelSelector }): readonly Range[] {
    const key = peerKey(policyNs, peer);
    let ranges = this.#ranges.get(key);
    if (!ranges) this.#ranges.set(key, (ranges = normalizeRanges(this.podsOf(policyNs, peer).map((p) => ({ first: p.ip, last: p.ip })))));
    return ranges;
  }
}

function peerKey(policyNs: string, peer: { readonly podSelector?: LabelSelector; readonly namespaceSelector?: LabelSelector }): string {
  return `${peer.namespaceSelector === undefined ? policyNs : ''}|${selectorKey(peer.podSelector)}|${selectorKey(peer.namespaceSelector)}`;
}

/** Compiles the policies for the node's pods. */
export function compilePolicies(input: PolicyInput): PolicyPlan {
  const problems: PolicyProblem[] = [];
  const index = new PodIndex(input.pods, input.namespaces);
  const pods = index.all;

  /** A peer as address ranges; none (matches nothing) when it cannot be read. */
  const rangesOfPeer = (policy: NetworkPolicy, peer: PolicyPeer): readonly Range[] => {
    if (!('ipBlock' in peer)) return index.rangesOf(policy.namespace, peer);
    const block = rangesOfBlock(peer.ipBlock);
    if (typeof block === 'string') {
      problems.push({ policy: keyOf(policy), message: block });
      return [];
    }
    return block;
  };

  /** The addresses of a rule's peers, 'any' when it has none. */
  const keyOfRulePeers = (policy: NetworkPolicy, rule: PolicyRule): string => rule.peers.map((peer) => ('ipBlock' in peer ? `ip:${peer.ipBlock.cidr}!${peer.ipBlock.except.join(',')}` : peerKey(policy.namespace, peer))).join('+');
  const peersOfRule = (policy: NetworkPolicy, rule: PolicyRule): readonly Range[] | 'any' => {
    if (rule.peers.length === 0) return 'any';
    if (rule.peers.length === 1) return rangesOfPeer(policy, rule.peers[0] as PolicyPeer);
    return normalizeRanges(rule.peers.flatMap((peer) => rangesOfPeer(policy, peer)));
  };

  const ingressPeers = new Map<string, readonly Range[] | 'any'>();
  const compileIngress = (policy: NetworkPolicy, target: PolicyPod): CompiledRule[] => {
    const out: CompiledRule[] = [];
    policy.ingress.forEach((rule, index) => {
      const ports = rule.ports.length === 0 ? 'any' : rule.ports.flatMap((p) => resolvePort(p, target));
      if (ports !== 'any' && ports.length === 0) return;
      const cacheKey = `${keyOf(policy)}#${index}`;
      let peers = ingressPeers.get(cacheKey);
      if (peers === undefined) ingressPeers.set(cacheKey, (peers = peersOfRule(policy, rule)));
      if (peers !== 'any' && peers.length === 0) return;
      out.push({ policy: keyOf(policy), rule: index, peers, peerKey: keyOfRulePeers(policy, rule), podsOnly: podsOnly(rule), ports, what: `from ${describePeers(policy, rule)}, ${describePorts(ports)}` });
    });
    return out;
  };

  const withPortName = (name: string) => index.withPortName(name);
  const compileEgress = (policy: NetworkPolicy): CompiledRule[] => {
    const out: CompiledRule[] = [];
    policy.egress.forEach((rule, index) => {
      const peers = peersOfRule(policy, rule);
      if (peers !== 'any' && peers.length === 0) return;
      const key = keyOfRulePeers(policy, rule);
      const to = `to ${describePeers(policy, rule)}`;
      if (rule.ports.length === 0) {
        out.push({ policy: keyOf(policy), rule: index, peers, peerKey: key, podsOnly: podsOnly(rule), ports: 'any', what: `${to}, every port` });
        return;
      }
      const numeric = rule.ports.filter((p) => typeof p.port !== 'string').flatMap((p) => resolvePort(p, undefined));
      if (numeric.length > 0) out.push({ policy: keyOf(policy), rule: index, peers, peerKey: key, podsOnly: podsOnly(rule), ports: numeric, what: `${to}, ${describePorts(numeric)}` });
      const named = rule.ports.filter((p) => typeof p.port === 'string');
      if (named.length === 0) return;
      // a named port is the destination pod's: group the known pods inside the peers by what the name resolves to
      // (only pods with a port of that name can resolve it)
      const groups = new Map<string, { port: PortMatch; ips: Range[] }>();
      for (const p of named) {
        for (const dest of withPortName(p.port as string)) {
          if (peers !== 'any' && !rangesContain(peers, dest.ip)) continue;
          for (const port of resolvePort(p, dest.pod)) {
            const key = `${port.protocol}/${port.first}`;
            const g = groups.get(key) ?? { port, ips: [] };
            g.ips.push({ first: dest.ip, last: dest.ip });
            groups.set(key, g);
          }
        }
      }
      for (const key of [...groups.keys()].sort()) {
        const g = groups.get(key) as { port: PortMatch; ips: Range[] };
        out.push({ policy: keyOf(policy), rule: index, peers: normalizeRanges(g.ips), peerKey: `${key}/${g.port.protocol}/${g.port.first}`, podsOnly: true, ports: [g.port], what: `${to} (the pods there with that named port), ${describePorts([g.port])}` });
      }
    });
    return out;
  };

  const egressCache = new Map<string, CompiledRule[]>();
  const policiesByNs = new Map<string, NetworkPolicy[]>();
  for (const pol of [...input.policies].sort((a, b) => (keyOf(a) < keyOf(b) ? -1 : 1))) {
    const list = policiesByNs.get(pol.namespace);
    if (list) list.push(pol);
    else policiesByNs.set(pol.namespace, [pol]);
  }
  const out: PodPolicy[] = [];
  for (const p of pods) {
    const key = keyOf(p.pod);
    if (!input.local.has(key)) continue;
    const selecting = (policiesByNs.get(p.pod.namespace) ?? []).filter((pol) => matchesSelector(pol.podSelector, p.pod.labels));
    if (selecting.length === 0) continue;
    const ingressPolicies = selecting.filter((pol) => pol.policyTypes.includes('Ingress'));
    const egressPolicies = selecting.filter((pol) => pol.policyTypes.includes('Egress'));
    const entry: { -readonly [K in keyof PodPolicy]: PodPolicy[K] } = { pod: key, ip: p.ip, policies: selecting.map(keyOf), isolatedBy: { ingress: ingressPolicies.map(keyOf), egress: egressPolicies.map(keyOf) } };
    if (ingressPolicies.length > 0) entry.ingress = ingressPolicies.flatMap((pol) => compileIngress(pol, p.pod));
    if (egressPolicies.length > 0) {
      entry.egress = egressPolicies.flatMap((pol) => {
        const k = keyOf(pol);
        let rules = egressCache.get(k);
        if (!rules) egressCache.set(k, (rules = compileEgress(pol)));
        return rules;
      });
    }
    out.push(entry);
  }
  for (const c of input.closed ?? []) {
    if (!c.ingress && !c.egress) continue;
    out.push({
      pod: c.pod, ip: c.ip, policies: [], isolatedBy: { ingress: c.ingress ? [c.why] : [], egress: c.egress ? [c.why] : [] },
      ...(c.ingress ? { ingress: [] } : {}), ...(c.egress ? { egress: [] } : {}),
    });
  }
  out.sort((a, b) => a.ip - b.ip);
  return { pods: out, problems: dedupe(problems) };
}

/**
 * The parts of a policy the compiler cannot express (each matches nothing), found from the policy alone: what the
 * controller reports on the policy (once per policy, not per node or pod) and each agent's compile meets again.
 */
export function policyProblems(policy: NetworkPolicy): PolicyProblem[] {
  const out: PolicyProblem[] = [];
  for (const rule of [...policy.ingress, ...policy.egress]) {
    for (const peer of rule.peers) {
      if (!('ipBlock' in peer)) continue;
      const block = rangesOfBlock(peer.ipBlock);
      if (typeof block === 'string') out.push({ policy: keyOf(policy), message: block });
    }
  }
  return dedupe(out);
}

/** An ipBlock as IPv4 address ranges (none for an IPv6 one), or why it cannot be read. */
function rangesOfBlock(block: { readonly cidr: string; readonly except: readonly string[] }): Range[] | string {
  const cidr = parseBlock(block.cidr);
  if (cidr === 'v6') return [];
  if (!cidr) return `ipBlock cidr ${JSON.stringify(block.cidr)} is not an IPv4 or IPv6 prefix; the peer matches nothing`;
  const except: Range[] = [];
  for (const text of block.except) {
    const e = parseBlock(text);
    if (e === 'v6') continue;
    if (!e) return `ipBlock except ${JSON.stringify(text)} is not a prefix; the peer matches nothing`;
    except.push(rangeOfCidr(e));
  }
  return subtractRanges([rangeOfCidr(cidr)], except);
}

/** A rule's peers in words: `pods role=web of x`, `pods app=pg in namespaces team=db`, `10.0.0.0/8 except 10.0.1.0/24`. */
function describePeers(policy: NetworkPolicy, rule: PolicyRule): string {
  if (rule.peers.length === 0) return 'anywhere';
  return rule.peers.map((peer) => {
    if ('ipBlock' in peer) return peer.ipBlock.except.length === 0 ? peer.ipBlock.cidr : `${peer.ipBlock.cidr} except ${peer.ipBlock.except.join(', ')}`;
    const pods = peer.podSelector === undefined || describeSelector(peer.podSelector) === '' ? 'every pod' : `pods ${describeSelector(peer.podSelector)}`;
    if (peer.namespaceSelector === undefined) return `${pods} of ${policy.namespace}`;
    const ns = describeSelector(peer.namespaceSelector);
    return `${pods} in ${ns === '' ? 'every namespace' : `namespaces ${ns}`}`;
  }).join(' or ');
}

/** Port matches in words: `TCP 80`, `TCP 8000-8080, UDP every port`, `every port`. */
export function describePorts(ports: readonly PortMatch[] | 'any'): string {
  if (ports === 'any') return 'every port';
  return ports.map((m) => `${m.protocol.toUpperCase()} ${m.first === undefined ? 'every port' : m.first === m.last ? m.first : `${m.first}-${m.last}`}`).join(', ');
}

/** An ipBlock prefix; 'v6' for an IPv6 one (it can match no IPv4 packet); undefined when it is neither. */
function parseBlock(text: string): Cidr | 'v6' | undefined {
  if (text.includes(':')) return /^[0-9a-fA-F:.]+\/\d{1,3}$/.test(text) ? 'v6' : undefined;
  return parseCidr(text, false);
}

/** A policy port as port matches; a named port resolved on `pod` (none when the pod has no such port). */
function resolvePort(p: PolicyPort, pod: PolicyPod | undefined): PortMatch[] {
  const protocol = L4_OF[p.protocol];
  if (p.port === undefined) return [{ protocol }];
  if (typeof p.port === 'number') return [{ protocol, first: p.port, last: p.endPort ?? p.port }];
  const named = pod?.ports.find((n) => n.name === p.port && n.protocol === p.protocol);
  return named ? [{ protocol, first: named.port, last: named.port }] : [];
}

/** Whether a rule names pods only (no ipBlock peer); a rule with no peers names every address, not pods. */
function podsOnly(rule: PolicyRule): boolean {
  return rule.peers.length > 0 && rule.peers.every((peer) => !('ipBlock' in peer));
}

function dedupe(problems: PolicyProblem[]): PolicyProblem[] {
  const seen = new Set<string>();
  return problems.filter((p) => {
    const k = `${p.policy}\n${p.message}`;
    if (seen.has(k)) return false;
    seen.add(k);
    return true;
  });
}

/** One new connection's first packet. */
export interface Packet {
  readonly src: number;
  readonly dst: number;
  readonly protocol: L4;
  readonly port: number;
}

/** Why a packet passes or not: the rule that let it through each isolated side, or the side that refused it. */
export interface Decision {
  readonly allowed: boolean;
  /** `egress of ns/pod` or `ingress of ns/pod` when refused. */
  readonly deniedAt?: string;
  readonly egressBy?: { readonly policy: string; readonly rule: number };
  readonly ingressBy?: { readonly policy: string; readonly rule: number };
}

/** A new connection for {@link explain}: its addresses, and its protocol and port when known. */
export interface Flow {
  readonly src: number;
  readonly dst: number;
  readonly l4?: { readonly protocol: L4; readonly port: number };
}

/** One side of a flow that a policy isolates on this node: the source pod's egress, or the destination pod's ingress. */
export interface PolicySide {
  readonly direction: 'egress' | 'ingress';
  /** `namespace/name` of the isolated pod. */
  readonly pod: string;
  /** The policies isolating it in this direction, sorted. */
  readonly isolatedBy: readonly string[];
  /**
   * The rules that let the flow through this side, in the order the kernel tries them (the first one is the one it
   * takes): with a protocol and port, the rules matching the remote address and that port; without, every rule
   * matching the remote address (its `ports` say what it allows). None: this side drops the flow.
   */
  readonly allowedBy: readonly CompiledRule[];
}

function peersHold(rule: CompiledRule, remote: number): boolean {
  return rule.peers === 'any' || rangesContain(rule.peers, remote);
}

function portsHold(rule: CompiledRule, l4: { readonly protocol: L4; readonly port: number }): boolean {
  return rule.ports === 'any' || rule.ports.some((m) => m.protocol === l4.protocol && (m.first === undefined || (l4.port >= m.first && l4.port <= (m.last as number))));
}

/**
 * The sides of `flow` this node's plan judges, in the kernel's order: the source's egress when the source is one of
 * its isolated pods, then the destination's ingress when the destination is; each with the rules that let the flow
 * through. An empty list: no policy on this node isolates either end. {@link decide} and `atoll trace` both read it.
 */
export function explain(plan: PolicyPlan, flow: Flow): PolicySide[] {
  const sides: PolicySide[] = [];
  const side = (direction: 'egress' | 'ingress', pod: PodPolicy | undefined, remote: number) => {
    const rules = pod?.[direction];
    if (!pod || !rules) return;
    const allowedBy = rules.filter((r) => peersHold(r, remote) && (flow.l4 === undefined || portsHold(r, flow.l4)));
    sides.push({ direction, pod: pod.pod, isolatedBy: pod.isolatedBy[direction], allowedBy });
  };
  side('egress', plan.pods.find((p) => p.ip === flow.src), flow.dst);
  side('ingress', plan.pods.find((p) => p.ip === flow.dst), flow.src);
  return sides;
}

/**
 * What the node does with a new connection, as its ruleset will (see {@link explain}): refused at the first side no
 * rule lets it through. Traffic from or to the node itself never reaches these rules (it does not cross the forward
 * hook).
 */
export function decide(plan: PolicyPlan, pkt: Packet): Decision {
  const by: { egressBy?: Decision['egressBy']; ingressBy?: Decision['ingressBy'] } = {};
  for (const s of explain(plan, { src: pkt.src, dst: pkt.dst, l4: { protocol: pkt.protocol, port: pkt.port } })) {
    const rule = s.allowedBy[0];
    if (!rule) return { allowed: false, deniedAt: `${s.direction} of ${s.pod}`, ...by };
    by[s.direction === 'egress' ? 'egressBy' : 'ingressBy'] = { policy: rule.policy, rule: rule.rule };
  }
  return { allowed: true, ...by };
}
