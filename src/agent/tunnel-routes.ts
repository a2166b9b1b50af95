/**
 * The routes of the tunnel peers' pod blocks into the TUN device: the plan's routes (src/core/tunnel/plan.ts) against
 * the ones the kernel holds on the device with our route protocol (read over netlink), applied as one `ip -batch`
 * when they differ; and the node's VTEP address on the device, so the node's own packets to remote pods leave with a
 * source the far end routes back.
 */
import type { Logger } from '../core/ports.ts';
import { RT_TABLE_MAIN } from '../core/net/netlink-codec.ts';
import { ROUTE_PROTO } from '../core/overlay/plan.ts';
import { renderTunnelRouteDiff, type TunnelPlan, tunnelRoutes } from '../core/tunnel/plan.ts';
import type { IpRoute2 } from '../adapters/kernel/iproute2.ts';
import { RtnlSocket } from '../adapters/kernel/netlink.ts';

/** At most this many peers or routes are named in one log line (with their count beside). */
export const LOG_LIST_MAX = 20;

/**
 * Brings the routes on `device` in line with `plan`: adds what is missing, removes ours that are not planned; puts
 * `source` (a /32: tunnelSourceAddress in src/core/tunnel/plan.ts) on the device when it lacks it. Idempotent. A refused line (a foreign route) does not stall the rest. @throws AtollError KERNEL_OP_FAILED.
 */
export async function syncTunnelRoutes(ip: IpRoute2, log: Logger, device: string, plan: TunnelPlan, source: string | undefined): Promise<void> {
  const sock = RtnlSocket.open();
  let addresses: string[];
  let have: string[];
  try {
    const index = (await sock.link({ name: device }))?.index;
    addresses = (await sock.addresses()).filter((a) => a.index === index).map((a) => `${a.local}/${a.prefixLen}`);
    have = (await sock.routes()).filter((r) => r.oif === index && r.protocol === ROUTE_PROTO && r.table === RT_TABLE_MAIN && !r.gateway).map((r) => r.dst);
  } finally {
    sock.close();
  }
  if (source && !addresses.includes(source)) {
    await ip.batch([`addr replace ${source} dev ${device}`]);
    log.info('tunnel source address set', { address: source });
  }
  const lines = renderTunnelRouteDiff(tunnelRoutes(plan), have, device);
  if (lines.length > 0) {
    await ip.batch(lines, { force: true }); // one refused line (a foreign route) must not stall the rest
    log.info('tunnel routes updated', { count: lines.length, changes: lines.slice(0, LOG_LIST_MAX) });
  }
}
