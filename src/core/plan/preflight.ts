/**
 * Start-up checks the agent makes before it changes anything. Pure: given what the node holds, returns the
 * problems, each an AtollError saying what is wrong and how to fix it.
 */
import { AtollError } from '../errors.ts';
import { ROUTE_PROTO } from '../overlay/plan.ts';
import { type Cidr, cidrsOverlap, formatCidr, formatIpv4, gatewayOf, parseCidr } from '../net/ipv4.ts';

export interface HostAddress {
  readonly ifname: string;
  /** Address with prefix, e.g. 192.168.1.10/24. */
  readonly cidr: string;
}

export interface HostRoute {
  readonly dst: string;
  readonly dev?: string;
  readonly type?: string;
  /** The route's protocol as `ip -json` prints it (a name or a number). */
  readonly protocol?: string;
}

export interface PreflightInput {
  /** File names in the CNI conf dir. */
  readonly confFiles: readonly string[];
  readonly confDir: string;
  readonly ourConf: string;
  readonly podBlocks: readonly Cidr[];
  readonly bridgeName: string;
  /** Atoll's other devices (the overlay's VXLAN device): their addresses and routes are ours. */
  readonly ownDevices?: readonly string[];
  /** The link named like our bridge, if any. */
  readonly bridge?: { readonly kind?: string; readonly addresses: readonly string[] };
  readonly hostAddresses: readonly HostAddress[];
  readonly hostRoutes: readonly HostRoute[];
}

const CNI_CONF = /\.(conf|conflist|json)$/;

export function preflight(p: PreflightInput): AtollError[] {
  const problems: AtollError[] = [];
  const before = p.confFiles.filter((f) => CNI_CONF.test(f) && f !== p.ourConf && f < p.ourConf).sort();
  if (before.length > 0) {
    problems.push(new AtollError('PREFLIGHT_CNI_CONF_ORDER', {
      message: `${p.confDir} holds ${before.join(', ')}, which the runtime would use instead of ${p.ourConf}`,
      fix: `remove or rename ${before.join(', ')}, or set cniConfName to a name that sorts first`,
    }));
  }
  const own = new Set([p.bridgeName, ...(p.ownDevices ?? [])]);
  const onBridge = (dev: string | undefined) => dev !== undefined && own.has(dev);
  for (const a of p.hostAddresses) {
    const c = parseCidr(a.cidr, false);
    if (!c || onBridge(a.ifname)) continue;
    const hit = p.podBlocks.find((b) => cidrsOverlap(b, c));
    if (hit) {
      problems.push(new AtollError('PREFLIGHT_RANGE_OVERLAP', {
        message: `pod block ${formatCidr(hit)} overlaps address ${a.cidr} on ${a.ifname}`,
        fix: 'give this node pod blocks outside the host networks (podCidrs, or the controller cluster CIDR)',
      }));
    }
  }
  for (const r of p.hostRoutes) {
    if (r.dst === 'default' || onBridge(r.dev) || r.type === 'local' || r.type === 'broadcast' || r.protocol === String(ROUTE_PROTO)) continue;
    const c = parseCidr(r.dst.includes('/') ? r.dst : `${r.dst}/32`, false);
    if (!c || c.bits === 0) continue;
    const hit = p.podBlocks.find((b) => cidrsOverlap(b, c));
    if (hit) {
      problems.push(new AtollError('PREFLIGHT_RANGE_OVERLAP', {
        message: `pod block ${formatCidr(hit)} overlaps route ${r.dst}${r.dev ? ` via ${r.dev}` : ''}`,
        fix: 'remove the route, or give this node pod blocks that no host route covers',
      }));
    }
  }
  if (p.bridge) {
    if (p.bridge.kind !== 'bridge') {
      problems.push(new AtollError('PREFLIGHT_FOREIGN_DEVICE', {
        message: `device ${p.bridgeName} exists and is a ${p.bridge.kind ?? 'plain'} device, not a bridge`,
        fix: `delete it (ip link del ${p.bridgeName}) or set another bridge name in the agent configuration`,
      }));
    } else {
      const ours = new Set(p.podBlocks.map((b) => `${formatIpv4(gatewayOf(b))}/${b.bits}`));
      const foreign = p.bridge.addresses.filter((a) => !ours.has(a));
      if (foreign.length > 0) {
        problems.push(new AtollError('PREFLIGHT_FOREIGN_DEVICE', {
          message: `bridge ${p.bridgeName} has addresses ${foreign.join(', ')} that are not gateways of this node's pod blocks`,
          fix: `remove them (ip addr del ... dev ${p.bridgeName}) or set another bridge name`,
        }));
      }
    }
  }
  return problems;
}
