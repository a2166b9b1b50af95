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

/** The whole transaction for `nft -f -`: both tables declared, deleted and re-created. */
export function renderPolicyRuleset(plan: PolicyPlan, node: { readonly sources: readonly PodSource[]; readonly localBlocks: readonly Cidr[] }): string {
  const sets = new Map<string, { name: string; ranges: readonly Range[] }>();
  const byList = new Map<readonly Range[], string>(); // the compiler shares one list among the rules naming one peer
  const setOf = (ranges: readonly Range[]): string => {
    const known = byList.get(ranges);
    if (known) return known;
    const key = ranges.map((r) => `${r.first}-${r.last}`).join(',');
    let s = sets.get(key);
    if (!s) sets.set(key, (s = { name: `peers${sets.size}`, ranges }));
    byList.set(ranges, s.name);
    return s.name;
  };
  const ruleLines = (rules: readonly CompiledRule[], dir: 'ingress' | 'egress'): string[] => {
    const addr = dir === 'ingress' ? 'ip saddr' : 'ip daddr';
    const verdict = dir === 'ingress' ? 'accept' : 'return';
    const lines: string[] = [];
    for (const r of rules) {
      const peer = r.peers === 'any' ? '' : `${addr} @${setOf(r.peers)} `;
      const note = comment(`${r.policy} ${dir} rule ${r.rule}`);
      if (r.ports === 'any') lines.push(`    ${peer}${verdict} ${note}`);
      else for (const ports of portsClause(r.ports)) lines.push(`    ${peer}${ports} ${verdict} ${note}`);
    }
    return lines;
  };

  const chains: string[] = [];
  const ingressMap: string[] = [];
  const egressMap: string[] = [];
  plan.pods.forEach((pod, i) => {
    if (pod.egress) {
      egressMap.push(`${formatIpv4(pod.ip)} : jump egress${i}`);
      chains.push(`  chain egress${i} {`, `    ${comment(`egress of ${pod.pod}`)}`, ...ruleLines(pod.egress, 'egress'), `    counter drop ${comment(`egress of ${pod.pod}: no rule allows`)}`, '  }');
    }
    if (pod.ingress) {
      ingressMap.push(`${formatIpv4(pod.ip)} : jump ingress${i}`);
      chains.push(`  chain ingress${i} {`, `    ${comment(`ingress of ${pod.pod}`)}`, ...ruleLines(pod.ingress, 'ingress'), `    counter drop ${comment(`ingress of ${pod.pod}: no rule allows`)}`, '  }');
    }
  });
  const elements = (items: readonly string[]): string => (items.length === 0 ? '' : ` elements = { ${items.join(', ')} };`);
  const sources = [...node.sources].sort((a, b) => (a.port < b.port ? -1 : a.port > b.port ? 1 : 0));

  return [
    `table inet ${POLICY_TABLE}`,
    `delete table inet ${POLICY_TABLE}`,
    `table inet ${POLICY_TABLE} {`,
    `  comment "managed by atoll; do not edit"`,
    ...[...sets.values()].map((s) => `  set ${s.name} { type ipv4_addr; flags interval;${elements(s.ranges.map(formatRange))} }`),
    `  map egress { type ipv4_addr : verdict;${elements(egressMap)} }`,
    `  map ingress { type ipv4_addr : verdict;${elements(ingressMap)} }`,
    `  chain forward {`,
    `    type filter hook forward priority filter; policy accept;`,
    `    ct state established,related accept`,
    `    ip saddr vmap @egress`,
    `    ip daddr vmap @ingress`,
    `  }`,
    ...chains,
    `}`,
    `table bridge ${POLICY_TABLE}`,
    `delete table bridge ${POLICY_TABLE}`,
    `table bridge ${POLICY_TABLE} {`,
    `  comment "managed by atoll; do not edit"`,
    `  set local_blocks { type ipv4_addr; flags interval;${elements(node.localBlocks.map(formatCidr))} }`,
    `  set pod_addresses { type ipv4_addr;${elements([...new Set(sources.map((s) => s.ip))])} }`,
    `  set pod_sources { type ifname . ipv4_addr;${elements(sources.map((s) => `"${s.port}" . ${s.ip}`))} }`,
    `  chain prerouting {`,
    `    type filter hook prerouting priority filter; policy accept;`,
    `    iifname "${HOST_VETH_PREFIX}*" ether type ip ip saddr != @local_blocks counter drop ${comment("a pod sending from outside the node's blocks")}`,
    `    iifname "${HOST_VETH_PREFIX}*" ether type ip ip saddr @pod_addresses iifname . ip saddr != @pod_sources counter drop ${comment("a pod sending from another pod's address")}`,
    `  }`,
    `}`,
    '',
  ].join('\n');
}
