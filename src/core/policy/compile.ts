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
import { matchesSelector, selectorKey } from './selector.ts';

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
  readonly ports: readonly PortMatch[] | 'any';
}

export interface PodPolicy {
  /** `namespace/name`. */
  readonly pod: string;
  readonly ip: number;
  /** The policies that select the pod, sorted. */
  readonly policies: readonly string[];
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

  /** A peer as address ranges; undefined (matches nothing) when it cannot be read. */
  const rangesOfPeer = (policy: NetworkPolicy, peer: PolicyPeer): readonly Range[] => {
    if ('ipBlock' in peer) {
      const cidr = parseBlock(peer.ipBlock.cidr);
      if (cidr === 'v6') return [];
      if (!cidr) {
        problems.push({ policy: keyOf(policy), message: `ipBlock cidr ${JSON.stringify(peer.ipBlock.cidr)} is not an IPv4 or IPv6 prefix; the peer matches nothing` });
        return [];
      }
      const except: Range[] = [];
      for (const text of peer.ipBlock.except) {
        const e = parseBlock(text);
        if (e === 'v6') continue;
        if (!e) {
          problems.push({ policy: keyOf(policy), message: `ipBlock except ${JSON.stringify(text)} is not a prefix; the peer matches nothing` });
          return [];
        }
        except.push(rangeOfCidr(e));
      }
      return subtractRanges([rangeOfCidr(cidr)], except);
    }
    return index.rangesOf(policy.namespace, peer);
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
      out.push({ policy: keyOf(policy), rule: index, peers, peerKey: keyOfRulePeers(policy, rule), ports });
    });
    return out;
  };

  const compileEgress = (policy: NetworkPolicy): CompiledRule[] => {
    const out: CompiledRule[] = [];
    policy.egress.forEach((rule, index) => {
      const peers = peersOfRule(policy, rule);
      if (peers !== 'any' && peers.length === 0) return;
      const key = keyOfRulePeers(policy, rule);
      if (rule.ports.length === 0) {
        out.push({ policy: keyOf(policy), rule: index, peers, peerKey: key, ports: 'any' });
        return;
      }
      const numeric = rule.ports.filter((p) => typeof p.port !== 'string').flatMap((p) => resolvePort(p, undefined));
      if (numeric.length > 0) out.push({ policy: keyOf(policy), rule: index, peers, peerKey: key, ports: numeric });
      const named = rule.ports.filter((p) => typeof p.port === 'string');
      if (named.length === 0) return;
      // a named port is the destination pod's: group the known pods inside the peers by what the name resolves to
      const groups = new Map<string, { port: PortMatch; ips: Range[] }>();
      for (const dest of pods) {
        if (peers !== 'any' && !rangesContain(peers, dest.ip)) continue;
        for (const p of named) {
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
        out.push({ policy: keyOf(policy), rule: index, peers: normalizeRanges(g.ips), peerKey: `${key}/${g.port.protocol}/${g.port.first}`, ports: [g.port] });
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
    const entry: { -readonly [K in keyof PodPolicy]: PodPolicy[K] } = { pod: key, ip: p.ip, policies: selecting.map(keyOf) };
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
  out.sort((a, b) => a.ip - b.ip);
  return { pods: out, problems: dedupe(problems) };
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

function ruleAllows(rule: CompiledRule, remote: number, pkt: Packet): boolean {
  if (rule.peers !== 'any' && !rangesContain(rule.peers, remote)) return false;
  if (rule.ports === 'any') return true;
  return rule.ports.some((m) => m.protocol === pkt.protocol && (m.first === undefined || (pkt.port >= m.first && pkt.port <= (m.last as number))));
}

/**
 * What the node does with a new connection, as its ruleset will: the source's egress rules when the source is one of
 * its isolated pods, then the destination's ingress rules when the destination is. Traffic from or to the node itself
 * never reaches these rules (it does not cross the forward hook).
 */
export function decide(plan: PolicyPlan, pkt: Packet): Decision {
  const src = plan.pods.find((p) => p.ip === pkt.src);
  const dst = plan.pods.find((p) => p.ip === pkt.dst);
  let egressBy: Decision['egressBy'];
  if (src?.egress) {
    const rule = src.egress.find((r) => ruleAllows(r, pkt.dst, pkt));
    if (!rule) return { allowed: false, deniedAt: `egress of ${src.pod}` };
    egressBy = { policy: rule.policy, rule: rule.rule };
  }
  let ingressBy: Decision['ingressBy'];
  if (dst?.ingress) {
    const rule = dst.ingress.find((r) => ruleAllows(r, pkt.src, pkt));
    if (!rule) return { allowed: false, deniedAt: `ingress of ${dst.pod}`, ...(egressBy ? { egressBy } : {}) };
    ingressBy = { policy: rule.policy, rule: rule.rule };
  }
  return { allowed: true, ...(egressBy ? { egressBy } : {}), ...(ingressBy ? { ingressBy } : {}) };
}
