/**
 * The routes of the tunnel peers' pod blocks into the TUN device: the plan's routes (src/core/tunnel/plan.ts) against
 * the ones the kernel holds on the device with our route protocol, applied as one `ip -batch`; and the node's VTEP
 * address on the device, so the node's own packets to remote pods leave with a source the far end routes back.
 */
import type { Logger } from '../core/ports.ts';
import { ROUTE_PROTO } from '../core/overlay/plan.ts';
import { renderTunnelRouteDiff, type TunnelPlan, tunnelRoutes } from '../core/tunnel/plan.ts';
import type { IpRoute2 } from '../adapters/iproute2.ts';

/**
 * Brings the routes on `device` in line with `plan`: adds what is missing, removes ours that are not planned; puts
 * `source` (a /32: tunnelSourceAddress in src/core/tunnel/plan.ts) on the device when it lacks it. Idempotent. A refused line (a foreign route) does not stall the rest. @throws AtollError KERNEL_OP_FAILED.
 */
export async function syncTunnelRoutes(ip: IpRoute2, log: Logger, device: string, plan: TunnelPlan, source: string | undefined): Promise<void> {
  if (source) {
    const addrs = await ip.json<{ addr_info?: { family: string; local: string; prefixlen: number }[] }>(['addr', 'show', 'dev', device]);
    const has = addrs.some((a) => a.addr_info?.some((i) => i.family === 'inet' && `${i.local}/${i.prefixlen}` === source));
    if (!has) {
      await ip.batch([`addr replace ${source} dev ${device}`]);
      log.info('tunnel source address set', { address: source });
    }
  }
  const have = (await ip.json<{ dst: string; gateway?: string }>(['route', 'show', 'proto', String(ROUTE_PROTO), 'dev', device]))
    .filter((r) => !r.gateway).map((r) => (r.dst.includes('/') ? r.dst : `${r.dst}/32`));
  const lines = renderTunnelRouteDiff(tunnelRoutes(plan), have, device);
  if (lines.length > 0) {
    await ip.batch(lines, { force: true }); // one refused line (a foreign route) must not stall the rest
    log.info('tunnel routes updated', { changes: lines });
  }
}
