/**
 * A node's NetworkPolicy plan as nftables: two tables of ours, replaced together in one `nft -f` transaction. Pure.
 *
 * `inet atoll_policy` decides. Its forward chain accepts established and related traffic first, then finds the
 * source's egress chain and the destination's ingress chain through two verdict maps keyed by pod address, so a pod no
 * policy isolates costs two failed lookups and nothing else. An egress chain returns when a rule allows (the ingress
 * side is judged next) and drops otherwise; an ingress chain accepts or drops. Peers are named interval sets, one per
 * distinct address list, shared by every rule that names the same addresses. Every path a pod's packets take crosses
 * this hook: routed ones (VXLAN, the tunnel's TUN, the uplink) and, through br_netfilter, ones bridged between two
 * pods of the node. Traffic from and to the node itself (kubelet probes) goes through input and output, never here.
 * Each pod chain's final drop counts into a named counter of its own (`drop_<chain>`), which the agent reads for its
 * metrics (`nft list counters`: a read, no commit); a delta that refills the chain keeps the counter and its count.
 *
 * `bridge atoll_policy` makes the address a pod sends from as good as its veth: IPv4 from one of our pod ports is
 * dropped before routing or bridging when its source is outside the node's blocks, or is another known pod's address,
 * so no pod can borrow a neighbour's address to pass a rule. (The maps are keyed by address, not by veth, because the
 * inet hooks see the bridge, not its port, for bridged traffic, and this kernel's bridge family has no conntrack:
 * NF_CONNTRACK_BRIDGE is not set.) A pod added since the last render is not yet a known address: until the next
 * render (which the pod's ADD asks for) its address is as open to borrowing as its own traffic is to policy.
 */
import { type Cidr, formatCidr, formatIpv4 } from '../net/ipv4.ts';
import { formatRange, type Range } from '../net/ranges.ts';
import { HOST_VETH_PREFIX } from '../plan/pod-plan.ts';
import { fnv1a, hex } from '../fnv.ts';
import type { CompiledRule, PolicyPlan, PortMatch } from './compile.ts';

export const POLICY_TABLE = 'atoll_policy';

/** A pod of the node: its host-side veth and the one address it may send from. */
export interface PodSource {
  readonly port: string;
  readonly ip: string;
}

/** nft comments hold at most 128 bytes and no double quote. */
function comment(text: string): string {
  return `comment "${text.replaceAll('"', "'").slice(0, 127)}"`;
}

function portsClause(ports: readonly PortMatch[]): string[] {
  const byProto = new Map<string, string[] | 'all'>();
  for (const m of ports) {
    const had = byProto.get(m.protocol);
    if (had === 'all') continue;
    if (m.first === undefined) {
      byProto.set(m.protocol, 'all');
      continue;
    }
    const item = m.first === m.last ? String(m.first) : `${m.first}-${m.last}`;
    byProto.set(m.protocol, [...(had ?? []), item]);
  }
  return [...byProto.keys()].sort().map((proto) => {
    const items = byProto.get(proto) as string[] | 'all';
    if (items === 'all') return `meta l4proto ${proto}`;
    const unique = [...new Set(items)];
    return `meta l4proto ${proto} th dport ${unique.length === 1 ? unique[0] : `{ ${unique.join(', ')} }`}`;
  });
}

/** The name of the chain holding a pod's rules for one direction. */
function podChain(direction: 'ingress' | 'egress', ip: number): string {
  return `${direction}_${formatIpv4(ip).replaceAll('.', '_')}`;
}

/** The named counter the final drop of a pod's chain counts into. */
export function dropCounterOf(direction: 'ingress' | 'egress', ip: number): string {
  return `drop_${podChain(direction, ip)}`;
}

/**
 * Packets dropped per (direction, policies isolating the pod) since the last reading: the deltas of each pod's drop
 * counter in `counters` (packets by counter name, as read from the kernel) against `last` (the previous reading, which
 * is replaced). A counter lower than last time was made anew (a whole apply, or a pod's chain gone and back): all of
 * its count is new. Keys are `direction` and the isolating policies, comma-separated (`ingress x/a,x/b`).
 */
export function tallyDrops(plan: PolicyPlan, counters: ReadonlyMap<string, number>, last: Map<string, number>): Map<string, number> {
  const out = new Map<string, number>();
  const seen = new Set<string>();
  for (const pod of plan.pods) {
    for (const direction of ['ingress', 'egress'] as const) {
      if (!pod[direction]) continue;
      const name = dropCounterOf(direction, pod.ip);
      const now = counters.get(name);
      if (now === undefined) continue;
      const was = last.get(name) ?? 0;
      const key = `${direction} ${pod.isolatedBy[direction].join(',')}`;
      out.set(key, (out.get(key) ?? 0) + (now >= was ? now - was : now));
      last.set(name, now);
      seen.add(name);
    }
  }
  for (const name of last.keys()) if (!seen.has(name)) last.delete(name);
  return out;
}

/** What the two tables hold, as data: what {@link renderPolicyTables} writes whole and {@link renderPolicyDelta} diffs. */
/**
 * A peer set: pod addresses one by one in a hash set (`pods_...`), or intervals (`peers_...`, when an ipBlock is among
 * the peers). Why two kinds: to change an interval set, nft first reads the elements of every interval set of the
 * table (30 to 50 ms with 12,000 of them), while a hash set's element is added or removed without reading anything, and
 * most changes are a pod coming or going.
 */
export interface PeerSet {
  readonly addresses: boolean;
  /** Its elements, as nft writes them. */
  readonly items: readonly string[];
}

export interface PolicyTables {
  /** Peer sets of the inet table by name. */
  readonly sets: ReadonlyMap<string, PeerSet>;
  /** Pod address -> its egress or ingress chain. */
  readonly egress: ReadonlyMap<string, string>;
  readonly ingress: ReadonlyMap<string, string>;
  /** The per-pod chains by name: their rules (the last one drops, counting into `drop_<chain>`). */
  readonly chains: ReadonlyMap<string, readonly string[]>;
  /** The bridge table's three sets. */
  readonly localBlocks: readonly string[];
  readonly podAddresses: readonly string[];
  readonly podSources: readonly string[];
}

/**
 * The tables for a plan. Names are stable, so a change touches only what changed: a pod's chains are named by its
 * address, a peer set by what its peers are (the compiler's `peerKey`), not by what they hold now.
 */
export function buildPolicyTables(plan: PolicyPlan, node: { readonly sources: readonly PodSource[]; readonly localBlocks: readonly Cidr[] }): PolicyTables {
  const sets = new Map<string, PeerSet>();
  const setKeys = new Map<string, string>();
  const setOf = (rule: CompiledRule, ranges: readonly Range[]): string => {
    const kind = rule.podsOnly ? 'pods' : 'peers';
    let name = `${kind}_${hex(fnv1a(rule.peerKey), 8)}${hex(fnv1a(rule.peerKey, 0x12345678), 4)}`;
    // two keys with one hash (48 bits: not expected) get distinct names, still stable while both exist
    for (let i = 1; setKeys.has(name) && setKeys.get(name) !== rule.peerKey; i++) name = `${name.slice(0, kind.length + 13)}_${i}`;
    if (!setKeys.has(name)) {
      setKeys.set(name, rule.peerKey);
      sets.set(name, rule.podsOnly ? { addresses: true, items: ranges.flatMap(addressesOf) } : { addresses: false, items: ranges.map(formatRange) });
    }
    return name;
  };
  const ruleLines = (rules: readonly CompiledRule[], dir: 'ingress' | 'egress'): string[] => {
    const addr = dir === 'ingress' ? 'ip saddr' : 'ip daddr';
    const verdict = dir === 'ingress' ? 'accept' : 'return';
    const lines: string[] = [];
    for (const r of rules) {
      const peer = r.peers === 'any' ? '' : `${addr} @${setOf(r, r.peers)} `;
      const note = comment(`${r.policy} ${dir} rule ${r.rule}`);
      if (r.ports === 'any') lines.push(`${peer}${verdict} ${note}`);
      else for (const ports of portsClause(r.ports)) lines.push(`${peer}${ports} ${verdict} ${note}`);
    }
    return lines;
  };
  const chains = new Map<string, readonly string[]>();
  const egress = new Map<string, string>();
  const ingress = new Map<string, string>();
  for (const pod of plan.pods) {
    const ip = formatIpv4(pod.ip);
    for (const [dir, map] of [['egress', egress], ['ingress', ingress]] as const) {
      const rules = pod[dir];
      if (!rules) continue;
      const chain = podChain(dir, pod.ip);
      map.set(ip, chain);
      chains.set(chain, [...ruleLines(rules, dir), `counter name "${dropCounterOf(dir, pod.ip)}" drop ${comment(`${dir} of ${pod.pod}: no rule allows`)}`]);
    }
  }
  const sources = [...node.sources].sort((a, b) => (a.port < b.port ? -1 : a.port > b.port ? 1 : 0));
  return {
    sets, egress, ingress, chains,
    localBlocks: node.localBlocks.map(formatCidr),
    podAddresses: [...new Set(sources.map((s) => s.ip))],
    podSources: sources.map((s) => `"${s.port}" . ${s.ip}`),
  };
}

/** Every address of a range of pod addresses (the compiler merged neighbours), one by one. */
function addressesOf(r: Range): string[] {
  const out: string[] = [];
  for (let ip = r.first; ip <= r.last; ip++) out.push(formatIpv4(ip));
  return out;
}

/** A peer set's declaration after its name. */
const setType = (set: PeerSet): string => (set.addresses ? '{ type ipv4_addr;' : '{ type ipv4_addr; flags interval;');

const INET = `inet ${POLICY_TABLE}`;
const BRIDGE = `bridge ${POLICY_TABLE}`;

function elements(items: readonly string[]): string {
  return items.length === 0 ? '' : ` elements = { ${items.join(', ')} };`;
}

const mapItems = (m: ReadonlyMap<string, string>) => [...m].map(([ip, chain]) => `${ip} : jump ${chain}`);

/** The whole transaction for `nft -f -`: both tables declared, deleted and re-created. */
export function renderPolicyTables(t: PolicyTables): string {
  return [
    `table ${INET}`,
    `delete table ${INET}`,
    `table ${INET} {`,
    `  comment "managed by atoll; do not edit"`,
    ...[...t.sets].map(([name, set]) => `  set ${name} ${setType(set)}${elements(set.items)} }`),
    ...[...t.chains.keys()].map((name) => `  counter drop_${name} { }`),
    `  map egress { type ipv4_addr : verdict;${elements(mapItems(t.egress))} }`,
    `  map ingress { type ipv4_addr : verdict;${elements(mapItems(t.ingress))} }`,
    `  chain forward {`,
    `    type filter hook forward priority filter; policy accept;`,
    `    ct state established,related accept`,
    `    ip saddr vmap @egress`,
    `    ip daddr vmap @ingress`,
    `  }`,
    ...[...t.chains].flatMap(([name, rules]) => [`  chain ${name} {`, ...rules.map((r) => `    ${r}`), '  }']),
    `}`,
    `table ${BRIDGE}`,
    `delete table ${BRIDGE}`,
    `table ${BRIDGE} {`,
    `  comment "managed by atoll; do not edit"`,
    `  set local_blocks { type ipv4_addr; flags interval;${elements(t.localBlocks)} }`,
    `  set pod_addresses { type ipv4_addr;${elements(t.podAddresses)} }`,
    `  set pod_sources { type ifname . ipv4_addr;${elements(t.podSources)} }`,
    `  chain prerouting {`,
    `    type filter hook prerouting priority filter; policy accept;`,
    `    iifname "${HOST_VETH_PREFIX}*" ether type ip ip saddr != @local_blocks counter drop ${comment("a pod sending from outside the node's blocks")}`,
    `    iifname "${HOST_VETH_PREFIX}*" ether type ip ip saddr @pod_addresses iifname . ip saddr != @pod_sources counter drop ${comment("a pod sending from another pod's address")}`,
    `  }`,
    `}`,
    '',
  ].join('\n');
}

/** The whole transaction for a plan (see {@link renderPolicyTables}). */
export function renderPolicyRuleset(plan: PolicyPlan, node: { readonly sources: readonly PodSource[]; readonly localBlocks: readonly Cidr[] }): string {
  return renderPolicyTables(buildPolicyTables(plan, node));
}

/** Elements of `before` not in `after` and of `after` not in `before`. */
function diffItems(before: readonly string[], after: readonly string[]): { gone: string[]; added: string[] } {
  const b = new Set(before);
  const a = new Set(after);
  return { gone: before.filter((x) => !a.has(x)), added: after.filter((x) => !b.has(x)) };
}

/**
 * One transaction that turns tables holding `before` into tables holding `after`, touching only what differs: set
 * elements added and removed, a changed chain flushed and filled again, map entries replaced, what is gone deleted
 * last (a chain after the map entry that jumps to it, a set after the rules that name it). Precondition: the kernel
 * holds `before` exactly (the caller falls back to {@link renderPolicyTables} when it cannot be sure, or when this
 * fails); then the result equals `renderPolicyTables(after)` but for counters. Empty when nothing differs.
 */
export function renderPolicyDelta(before: PolicyTables, after: PolicyTables): string {
  const lines: string[] = [];
  const elementLines = (table: string, set: string, was: readonly string[], now: readonly string[]) => {
    const { gone, added } = diffItems(was, now);
    if (gone.length > 0) lines.push(`delete element ${table} ${set} { ${gone.join(', ')} }`);
    if (added.length > 0) lines.push(`add element ${table} ${set} { ${added.join(', ')} }`);
  };
  for (const [name, set] of after.sets) {
    const was = before.sets.get(name);
    if (was === undefined) {
      lines.push(`add set ${INET} ${name} ${setType(set)} }`);
      if (set.items.length > 0) lines.push(`add element ${INET} ${name} { ${set.items.join(', ')} }`);
    } else elementLines(INET, name, was.items, set.items);
  }
  for (const [name, rules] of after.chains) {
    const was = before.chains.get(name);
    if (was && was.join('\n') === rules.join('\n')) continue;
    if (!was) lines.push(`add counter ${INET} drop_${name}`);
    lines.push(was ? `flush chain ${INET} ${name}` : `add chain ${INET} ${name}`);
    for (const r of rules) lines.push(`add rule ${INET} ${name} ${r}`);
  }
  for (const map of ['egress', 'ingress'] as const) {
    const was = before[map];
    const now = after[map];
    const gone = [...was].filter(([ip, chain]) => now.get(ip) !== chain).map(([ip]) => ip);
    const added = [...now].filter(([ip, chain]) => was.get(ip) !== chain).map(([ip, chain]) => `${ip} : jump ${chain}`);
    if (gone.length > 0) lines.push(`delete element ${INET} ${map} { ${gone.join(', ')} }`);
    if (added.length > 0) lines.push(`add element ${INET} ${map} { ${added.join(', ')} }`);
  }
  for (const name of before.chains.keys()) if (!after.chains.has(name)) lines.push(`flush chain ${INET} ${name}`, `delete chain ${INET} ${name}`, `delete counter ${INET} drop_${name}`);
  for (const name of before.sets.keys()) if (!after.sets.has(name)) lines.push(`delete set ${INET} ${name}`);
  elementLines(BRIDGE, 'local_blocks', before.localBlocks, after.localBlocks);
  elementLines(BRIDGE, 'pod_addresses', before.podAddresses, after.podAddresses);
  elementLines(BRIDGE, 'pod_sources', before.podSources, after.podSources);
  return lines.length === 0 ? '' : `${lines.join('\n')}\n`;
}
