/**
 * What the kernel must hold for one pod attachment, as data: names, MAC addresses, the veth, the pod's address and
 * default route; the rtnetlink requests that create them (host side, pod side); and the same steps as `ip` command
 * lines, for logs and explanations. Pure; the agent's pod network service executes the requests.
 *
 * Choices:
 * - the host-side veth name is `atl` + a hash of (container ID, interface name): DEL finds it without the pod
 *   namespace, and the `atl` prefix marks it as ours;
 * - the pod's MAC is derived from its IP (0a:58:a.b.c.d, locally administered): a pod re-created with its sticky IP
 *   gets the same MAC too, so neighbours cut off from any announcement still deliver to it;
 * - the veth's pod end is created directly inside the pod namespace (moving a link costs about 13 ms), and the host
 *   end is enslaved to the bridge in the same request;
 * - `arp_notify` on the pod interface makes the kernel send a gratuitous ARP when the link comes up with its address.
 */
import { type Cidr, formatIpv4, gatewayOf } from '../net/ipv4.ts';
import { fnv1a, hex } from '../fnv.ts';
import { getLink, newAddr4, newDefaultRoute4, newVeth, type NlRequest, setBridgePortHairpin, setUp } from '../net/netlink-codec.ts';

export const HOST_VETH_PREFIX = 'atl';

/** The host-side veth name of an attachment: 15 characters, `atl` + 12 hex digits. */
export function hostVethName(containerId: string, ifName: string): string {
  const key = `${containerId}/${ifName}`;
  return HOST_VETH_PREFIX + hex(fnv1a(key), 8) + hex(fnv1a(key, 0x12345678), 4);
}

export function isHostVethName(name: string): boolean {
  return /^atl[0-9a-f]{12}$/.test(name);
}

function macFromBytes(bytes: readonly number[]): string {
  return bytes.map((b) => hex(b & 255, 2)).join(':');
}

/** 0a:58 followed by the four bytes of the address. */
export function macForIp(ip: number): string {
  return macFromBytes([0x0a, 0x58, ip >>> 24, ip >>> 16, ip >>> 8, ip]);
}

/** A locally administered MAC for the host end of a veth, stable for the attachment. */
export function hostVethMac(containerId: string, ifName: string): string {
  const h = fnv1a(`${containerId}/${ifName}`, 0x9e3779b9);
  const l = fnv1a(`${ifName}/${containerId}`, 0x85ebca6b);
  return macFromBytes([0x0e, h >>> 24, h >>> 16, h >>> 8, h, l]);
}

export interface PodPlanInput {
  readonly containerId: string;
  readonly ifName: string;
  /** Path of the pod network namespace. */
  readonly netns: string;
  readonly ip: number;
  readonly block: Cidr;
  readonly bridge: string;
  readonly mtu: number;
}

export interface VethEndPlan {
  readonly name: string;
  readonly mac: string;
  readonly mtu: number;
}

export interface PodPlan {
  readonly hostIfName: string;
  readonly hostMac: string;
  readonly podMac: string;
  /** The pod's address with its prefix length, e.g. 10.244.1.7/24. */
  readonly address: string;
  readonly gateway: string;
  /** The veth: host end enslaved to `bridge` with hairpin on, pod end created directly in the pod namespace. */
  readonly veth: { readonly host: VethEndPlan; readonly pod: VethEndPlan; readonly bridge: string; readonly netns: string };
  /** Sysctls (path under /proc/sys, value) set in the pod namespace before its interface comes up. */
  readonly podSysctls: readonly (readonly [string, string])[];
  /** Added to the pod interface before it comes up (so `arp_notify` announces it). */
  readonly podAddress: { readonly ip: number; readonly prefixLen: number };
  /** The pod's default route, via the block's gateway on the pod interface. */
  readonly podGateway: number;
  /** The host-side steps as `ip` commands (what {@link hostRequests} does), for logs and explanations. */
  readonly hostLines: readonly string[];
  /** The pod-side steps as `ip` commands run in the pod namespace (what {@link podRequests} does). */
  readonly podLines: readonly string[];
}

export function planPod(p: PodPlanInput): PodPlan {
  const hostIfName = hostVethName(p.containerId, p.ifName);
  const hostMac = hostVethMac(p.containerId, p.ifName);
  const podMac = macForIp(p.ip);
  const gw = gatewayOf(p.block);
  const gateway = formatIpv4(gw);
  const address = `${formatIpv4(p.ip)}/${p.block.bits}`;
  return {
    hostIfName,
    hostMac,
    podMac,
    address,
    gateway,
    veth: { host: { name: hostIfName, mac: hostMac, mtu: p.mtu }, pod: { name: p.ifName, mac: podMac, mtu: p.mtu }, bridge: p.bridge, netns: p.netns },
    podSysctls: [[`net/ipv4/conf/${p.ifName}/arp_notify`, '1']],
    podAddress: { ip: p.ip, prefixLen: p.block.bits },
    podGateway: gw,
    hostLines: [
      `link add ${hostIfName} mtu ${p.mtu} address ${hostMac} master ${p.bridge} type veth peer name ${p.ifName} mtu ${p.mtu} address ${podMac} netns ${p.netns}`,
      `link set dev ${hostIfName} type bridge_slave hairpin on`,
      `link set dev ${hostIfName} up`,
    ],
    podLines: [
      `addr add ${address} dev ${p.ifName}`,
      `link set dev ${p.ifName} up`,
      `route add default via ${gateway} dev ${p.ifName}`,
    ],
  };
}

/** Kernel handles the host-side requests need: the bridge's ifindex and an open descriptor of the pod namespace. */
export interface HostSideHandles {
  readonly bridgeIndex: number;
  readonly podNetnsFd: number;
}

/**
 * The host-side rtnetlink batch, sent in one `send()` from the node namespace: create the veth (pod end born in the
 * pod namespace, host end enslaved to the bridge in the same request), hairpin on, host end up, then read the host
 * end back: its IFLA_LINK is the pod end's ifindex, which the pod-side requests need. The kernel goes on after a
 * failed request, so the later ones then fail too (no such device) or touch only a same-named `atl` link, which the
 * ADD's rollback deletes.
 */
export function hostRequests(plan: PodPlan, h: HostSideHandles): NlRequest[] {
  const { host, pod, netns } = plan.veth;
  const ref = { name: host.name };
  return [
    newVeth({ ...host, masterIndex: h.bridgeIndex, peer: { ...pod, netnsFd: h.podNetnsFd, netnsPath: netns } }),
    setBridgePortHairpin(ref),
    setUp(ref),
    getLink(ref),
  ];
}

/** The pod-side batch, sent on a socket opened in the pod namespace: address, link up, default route. */
export function podRequests(plan: PodPlan, podIfIndex: number): NlRequest[] {
  const ifName = plan.veth.pod.name;
  return [
    newAddr4({ index: podIfIndex, ip: plan.podAddress.ip, prefixLen: plan.podAddress.prefixLen, ifName }),
    setUp({ index: podIfIndex, label: ifName }),
    newDefaultRoute4({ gateway: plan.podGateway, oif: podIfIndex, ifName }),
  ];
}

/** The bridge's own MAC: fixed, so it does not change as ports come and go. */
export function bridgeMac(nodeName: string): string {
  const h = fnv1a(`bridge/${nodeName}`);
  return macFromBytes([0x0a, 0x5a, h >>> 24, h >>> 16, h >>> 8, h]);
}
