/**
 * The lab's kernel configuration as text, pure: the NAT routers' nftables ruleset, the uplinks' qdiscs (`tc -batch`
 * lines; planLab in ./plan.ts puts both into the plan), and the whole plan as ordered phases of `ip -batch`,
 * `tc -batch`, `nft -f` and sysctl steps, which `src/lab/lab.ts` runs.
 */
import type { LabPlan } from './plan.ts';
import type { NatType, UplinkConditions } from './spec.ts';

/** The lab's nftables table in the NAT routers. */
export const LAB_NFT_TABLE = 'atoll-lab';

/** Frames a delay line's TAP device holds for the process (a wire does not drop; the default 1000 did, in bursts). */
export const DELAY_TAP_QUEUE = 65_536;
/**
 * Sysctls of the namespaces whose bridges are wires (the wan, a delay line's): frames crossing them skip netfilter.
 * With br_netfilter loaded (as on Kubernetes hosts) every new namespace's bridges pass their frames through the IP
 * hooks, conntrack included: on the lossy benchmark's path, bridging that way took about a tenth of the delay lines'
 * CPU on the 2-vCPU VM, which the reference and the tunnel then lacked (plain TCP 0.74 to 0.80 Gbit/s with it, 0.82 to
 * 0.84 without). Routers and nodes keep the host's default.
 */
export const WIRE_SYSCTLS: readonly string[] = ['net/bridge/bridge-nf-call-iptables=0', 'net/bridge/bridge-nf-call-ip6tables=0', 'net/bridge/bridge-nf-call-arptables=0'];

/** A tbf burst of 10 ms at the rate, at least 32 KiB (tbf needs at least one packet per timer tick). */
function tbfBurstBytes(rateMbit: number): number {
  return Math.max(32 * 1024, Math.ceil((rateMbit * 1_000_000) / 8 / 100));
}

/**
 * `tc -batch` lines for one direction of an uplink: netem for the delay (its queue sized for 1 Gbit/s at that delay),
 * tbf for the rate, tbf under netem when both.
 */
export function uplinkQdiscLines(dev: string, c: UplinkConditions): string[] {
  const tbf = (rate: number) => `tbf rate ${rate}mbit burst ${tbfBurstBytes(rate)} latency 50ms`;
  const netem = (delay: number) => `netem delay ${delay}ms limit 100000`;
  if (c.delayMs !== undefined && c.rateMbit !== undefined) {
    return [`qdisc replace dev ${dev} root handle 1: ${netem(c.delayMs)}`, `qdisc replace dev ${dev} parent 1:1 handle 10: ${tbf(c.rateMbit)}`];
  }
  if (c.delayMs !== undefined) return [`qdisc replace dev ${dev} root ${netem(c.delayMs)}`];
  if (c.rateMbit !== undefined) return [`qdisc replace dev ${dev} root ${tbf(c.rateMbit)}`];
  return [];
}

/**
 * The NAT router's ruleset: masquerade the site LAN out of the uplink (`fully-random` for symmetric NAT), and let in
 * from the uplink only what belongs to a connection from inside (a home router's stateful filter).
 */
export function natRuleset(opts: { site: string; type: NatType; lan: string; uplink: string; lanDev: string; udpBlocked?: boolean }): string {
  return [
    `table ip ${LAB_NFT_TABLE}`,
    `delete table ip ${LAB_NFT_TABLE}`,
    `table ip ${LAB_NFT_TABLE} {`,
    `  comment "atoll lab: NAT router of edge site ${opts.site} (${opts.type})"`,
    `  chain postrouting {`,
    `    type nat hook postrouting priority srcnat; policy accept;`,
    `    oifname "${opts.uplink}" ip saddr ${opts.lan} masquerade${opts.type === 'symmetric' ? ' fully-random' : ''}`,
    `  }`,
    `  chain forward {`,
    `    type filter hook forward priority filter; policy accept;`,
    // a network that blocks UDP (--block-udp): the tunnel's datagram path must fall back to its TCP streams
    ...(opts.udpBlocked ? [`    oifname "${opts.uplink}" meta l4proto udp drop`, `    iifname "${opts.uplink}" meta l4proto udp drop`] : []),
    `    iifname "${opts.uplink}" oifname "${opts.lanDev}" ct state established,related accept`,
    `    iifname "${opts.uplink}" oifname "${opts.lanDev}" drop`,
    `  }`,
    // like home and carrier NAT gateways: unsolicited packets to the router itself are dropped, not answered with a
    // reset (a reset would also leave a conntrack entry that makes the NAT pick another port for a punching SYN)
    `  chain input {`,
    `    type filter hook input priority filter; policy accept;`,
    `    iifname "${opts.uplink}" ct state established,related accept`,
    `    iifname "${opts.uplink}" drop`,
    `  }`,
    `}`,
    '',
  ].join('\n');
}

/** One step of setting up the lab: a tool fed `input` on stdin, in a namespace (the host's when absent). */
export interface LabSetupStep {
  readonly netns?: string;
  /** `ip -batch -`, `tc -batch -`, `nft -f -`, or sysctl `key=value` lines (keys as paths under /proc/sys). */
  readonly tool: 'ip' | 'tc' | 'nft' | 'sysctl';
  readonly lines: readonly string[];
  /** sysctl: a key the namespace does not have is skipped (its module is not loaded: nothing to turn off). */
  readonly ifPresent?: boolean;
}

/**
 * The plan as ordered phases of steps. The steps of one phase are independent (run them in parallel); a phase
 * starts when the previous one is done: namespaces, then devices (veths are created from one end's namespace
 * with the other end born in its own), then addresses, ports, routes, forwarding, NAT and qdiscs.
 */
export function renderLabSetup(plan: LabPlan): LabSetupStep[][] {
  const byNs = <T extends { netns: string }>(items: readonly T[], netns: string) => items.filter((i) => i.netns === netns);
  const create: LabSetupStep[] = [{ tool: 'ip', lines: plan.namespaces.map((n) => `netns add ${n.name}`) }];
  const devices: LabSetupStep[] = [];
  const configure: LabSetupStep[] = [];
  for (const { name, role } of plan.namespaces) {
    const lines = ['link set lo up'];
    for (const b of byNs(plan.bridges, name)) lines.push(`link add ${b.ifname} type bridge`);
    for (const v of plan.veths.filter((x) => x.a.netns === name)) lines.push(`link add ${v.a.ifname} type veth peer name ${v.b.ifname} netns ${v.b.netns}`);
    const taps = byNs(plan.delayLines, name).flatMap((d) => d.ports);
    for (const t of taps) lines.push(`tuntap add dev ${t.tap} mode tap vnet_hdr`);
    devices.push({ netns: name, tool: 'ip', lines });

    const ends = plan.veths.flatMap((v) => [v.a, v.b]).filter((e) => e.netns === name);
    const conf: string[] = [];
    for (const b of byNs(plan.bridges, name)) conf.push(...(b.address ? [`addr add ${b.address} dev ${b.ifname}`] : []), `link set ${b.ifname} up`);
    for (const e of ends) {
      if (e.master) conf.push(`link set ${e.ifname} master ${e.master}`);
      if (e.address) conf.push(`addr add ${e.address} dev ${e.ifname}`);
      conf.push(`link set ${e.ifname} up`);
    }
    for (const t of taps) conf.push(`link set ${t.tap} master ${t.bridge} txqueuelen ${DELAY_TAP_QUEUE} up`);
    for (const r of byNs(plan.routes, name)) conf.push(`route add ${r.dst} via ${r.via}`);
    if (conf.length > 0) configure.push({ netns: name, tool: 'ip', lines: conf });
    if (plan.forwarding.includes(name)) configure.push({ netns: name, tool: 'sysctl', lines: ['net/ipv4/ip_forward=1'] });
    if (role === 'wan' || role === 'delay') configure.push({ netns: name, tool: 'sysctl', lines: WIRE_SYSCTLS, ifPresent: true });
    for (const n of byNs(plan.nat, name)) configure.push({ netns: name, tool: 'nft', lines: n.ruleset.trimEnd().split('\n') });
    const tc = byNs(plan.qdiscs, name).flatMap((q) => q.tc);
    if (tc.length > 0) configure.push({ netns: name, tool: 'tc', lines: tc });
  }
  return [create, devices, configure];
}
