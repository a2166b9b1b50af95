/**
 * What the kernel must hold for one pod attachment, as data: names, MAC addresses and the `ip -batch` lines for the
 * host side and the pod side. Pure; the agent's pod-network adapter executes it.
 *
 * Choices:
 * - the host-side veth name is `atl` + a hash of (container ID, interface name): DEL finds it without the pod
 *   namespace, and the `atl` prefix marks it as ours;
 * - the pod's MAC is derived from its IP (0a:58:a.b.c.d, locally administered): a pod re-created with its sticky IP
 *   gets the same MAC too, so neighbours cut off from any announcement still deliver to it;
 * - the veth's pod end is created directly inside the pod namespace (moving a link costs about 13 ms);
 * - `arp_notify` on the pod interface makes the kernel send a gratuitous ARP when the link comes up with its address.
 */
import { type Cidr, formatIpv4, gatewayOf } from '../net/ipv4.ts';

export const HOST_VETH_PREFIX = 'atl';

/** 32-bit FNV-1a; pure and stable across runs. */
function fnv1a(text: string, seed = 0x811c9dc5): number {
  let h = seed >>> 0;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h >>> 0;
}

function hex(n: number, width: number): string {
  return n.toString(16).padStart(width, '0').slice(-width);
}

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

export interface PodPlan {
  readonly hostIfName: string;
  readonly hostMac: string;
  readonly podMac: string;
  readonly address: string;
  readonly gateway: string;
  /** `ip -batch` lines run in the host namespace: the veth with its pod end created in the pod namespace. */
  readonly hostLines: readonly string[];
  /** Sysctls (path under /proc/sys, value) set in the pod namespace before `podLines`. */
  readonly podSysctls: readonly (readonly [string, string])[];
  /** `ip -batch` lines run in the pod namespace. */
  readonly podLines: readonly string[];
}

export function planPod(p: PodPlanInput): PodPlan {
  const hostIfName = hostVethName(p.containerId, p.ifName);
  const hostMac = hostVethMac(p.containerId, p.ifName);
  const podMac = macForIp(p.ip);
  const gateway = formatIpv4(gatewayOf(p.block));
  const address = `${formatIpv4(p.ip)}/${p.block.bits}`;
  return {
    hostIfName,
    hostMac,
    podMac,
    address,
    gateway,
    hostLines: [
      `link add ${hostIfName} mtu ${p.mtu} address ${hostMac} type veth peer name ${p.ifName} mtu ${p.mtu} address ${podMac} netns ${p.netns}`,
      `link set dev ${hostIfName} master ${p.bridge}`,
      `link set dev ${hostIfName} type bridge_slave hairpin on`,
      `link set dev ${hostIfName} up`,
    ],
    podSysctls: [[`net/ipv4/conf/${p.ifName}/arp_notify`, '1']],
    podLines: [
      `addr add ${address} dev ${p.ifName}`,
      `link set dev ${p.ifName} up`,
      `route add default via ${gateway} dev ${p.ifName}`,
    ],
  };
}

/** The bridge's own MAC: fixed, so it does not change as ports come and go. */
export function bridgeMac(nodeName: string): string {
  const h = fnv1a(`bridge/${nodeName}`);
  return macFromBytes([0x0a, 0x5a, h >>> 24, h >>> 16, h >>> 8, h]);
}
