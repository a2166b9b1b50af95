/**
 * The agent's same-site overlay: keeps the VXLAN device (with the node's lasting VTEP MAC), probes peers to find
 * its site, and brings routes, neighbours, fdb entries and the nftables table in line with the plan
 * (src/core/overlay/plan.ts) on every peer change and every resync. Only Atoll's objects are read and changed:
 * routes with protocol ROUTE_PROTO, entries on Atoll's device, Atoll's nft table. The kernel is read over netlink;
 * `ip`, `bridge` and `nft` run only when something differs, so a resync that finds all in place spawns nothing.
 */
import { atollError } from '../core/errors.ts';
import type { NodeRecord } from '../core/cluster/model.ts';
import { type Cidr, cidrsOverlap, parseCidr } from '../core/net/ipv4.ts';
import { AF_BRIDGE, AF_INET, IFF_UP, NUD_PERMANENT, RT_TABLE_MAIN } from '../core/net/netlink-codec.ts';
import { renderNftRuleset } from '../core/overlay/nft.ts';
import { afterProbe, DIRECT_LOSS_GRACE_MS, probeDue, type Reach } from '../core/overlay/reach.ts';
import { diffOverlay, type DirectRouting, type NeighEntry, type OverlayPeer, type OverlayPlan, planOverlay, renderOverlayDiff, ROUTE_PROTO, type RouteEntry } from '../core/overlay/plan.ts';
import type { Logger } from '../core/ports.ts';
import type { BridgeFdb } from '../adapters/kernel/bridge-fdb.ts';
import type { IpRoute2 } from '../adapters/kernel/iproute2.ts';
import { RtnlSocket } from '../adapters/kernel/netlink.ts';
import type { Nft } from '../adapters/kernel/nft.ts';
import { ProbeResponder, probeDirect } from '../adapters/node/underlay-probe.ts';

export interface OverlayComponents {
  readonly ip: IpRoute2;
  readonly fdb: BridgeFdb;
  readonly nft: Nft;
  readonly log: Logger;
}

export interface OverlayInit {
  readonly nodeName: string;
  readonly site: string;
  readonly device: string;
  readonly vni: number;
  readonly port: number;
  readonly vtepMac: string;
  readonly underlay: string;
  readonly underlayDevice: string;
  readonly underlayNet: Cidr;
  readonly mtu: number;
  readonly directRouting: DirectRouting;
  readonly probePort: number;
  /** Cluster ranges pod traffic is not masqueraded to, besides every known block. */
  readonly clusterCidrs: readonly Cidr[];
}


export class Overlay {
  readonly #c: OverlayComponents;
  readonly #init: OverlayInit;
  readonly #responder = new ProbeResponder();
  readonly #reach = new Map<string, Reach>();
  #last: OverlayPlan | undefined;
  /** The nft ruleset last applied and the ruleset generation right after, when that commit was ours alone. */
  #nftApplied: { ruleset: string; generation: number } | undefined;
  /** The sync under way, and the arguments of the one to run after it (latest wins). */
  #running: Promise<void> | undefined;
  #next: { blocks: readonly Cidr[]; peers: readonly NodeRecord[]; waiters: { resolve: () => void; reject: (e: unknown) => void }[] } | undefined;

  constructor(components: OverlayComponents, init: OverlayInit) {
    this.#c = components;
    this.#init = init;
  }

  get plan(): OverlayPlan | undefined {
    return this.#last;
  }

  /** Creates or repairs the VXLAN device and starts answering probes. */
  async start(): Promise<void> {
    await this.ensureDevice();
    await this.#responder.start(this.#init.underlay, this.#init.probePort);
  }

  stop(): void {
    this.#responder.stop();
  }

  /**
   * Idempotent: the device exists as our VXLAN with our MAC, VNI, port and MTU, and is up. Read over netlink; `ip`
   * runs only to create or repair it.
   */
  async ensureDevice(): Promise<void> {
    const { device, vni, port, vtepMac, underlay, underlayDevice, mtu } = this.#init;
    const link = await withSocket((sock) => sock.link({ name: device }));
    if (link && link.kind !== 'vxlan') {
      throw atollError('PREFLIGHT_FOREIGN_DEVICE', `device ${device} exists and is a ${link.kind ?? 'plain'} device, not VXLAN`, `delete it or set overlay.device`);
    }
    // a VXLAN's VNI, port, local address and learning cannot be changed in place: re-create it (same MAC)
    const v = link?.vxlan;
    const stale = link !== undefined && (v?.id !== vni || v?.port !== port || v?.local !== underlay || v?.learning === true);
    const lines: string[] = [];
    if (stale) lines.push(`link del ${device}`);
    if (!link || stale) {
      lines.push(`link add ${device} address ${vtepMac} mtu ${mtu} type vxlan id ${vni} dstport ${port} local ${underlay} dev ${underlayDevice} nolearning`);
    } else if (link.mac !== vtepMac) {
      lines.push(`link set dev ${device} address ${vtepMac}`);
    }
    if (lines.length > 0 || link?.mtu !== mtu || !((link?.flags ?? 0) & IFF_UP)) lines.push(`link set dev ${device} mtu ${mtu} up`);
    await this.#c.ip.batch(lines);
  }

  /**
   * Brings the kernel in line with the plan for `blocks` (ours) and `peers`. Serialised and coalesced: calls made
   * while a sync runs are merged into one more sync with the latest arguments, so a burst of peer updates costs two
   * passes, not one per update. Resolves when a pass that started after this call has finished.
   */
  sync(blocks: readonly Cidr[], peers: readonly NodeRecord[]): Promise<void> {
    if (!this.#running) {
      this.#running = this.#sync(blocks, peers).finally(() => this.#afterRun());
      return this.#running;
    }
    return new Promise((resolve, reject) => {
      const waiters = this.#next?.waiters ?? [];
      waiters.push({ resolve, reject });
      this.#next = { blocks, peers, waiters };
    });
  }

  #afterRun(): void {
    const next = this.#next;
    this.#next = undefined;
    this.#running = undefined;
    if (!next) return;
    this.#running = this.#sync(next.blocks, next.peers).finally(() => this.#afterRun());
    this.#running.then(() => next.waiters.forEach((w) => w.resolve()), (e: unknown) => next.waiters.forEach((w) => w.reject(e)));
  }

  async #sync(blocks: readonly Cidr[], peers: readonly NodeRecord[]): Promise<void> {
    const init = this.#init;
    const others = peers.filter((p) => p.name !== init.nodeName);
    const overlayPeers = await Promise.all(others.map((p) => this.#toPeer(p)));
    const self = { name: init.nodeName, site: init.site, underlay: init.underlay, vtepMac: init.vtepMac, blocks };
    const plan = planOverlay(self, overlayPeers, { device: init.device, underlayNet: init.underlayNet, underlayDevice: init.underlayDevice, directRouting: init.directRouting });
    await this.ensureDevice();
    const have = await this.#readState();
    if (plan.vtepAddress && !have.addresses.includes(plan.vtepAddress)) await this.#c.ip.batch([`addr replace ${plan.vtepAddress} dev ${init.device}`]);
    const lines = renderOverlayDiff(diffOverlay(plan, have));
    await this.#c.fdb.batch(lines.bridge);
    await this.#c.ip.batch(lines.ip, { force: true }); // one refused line (a foreign route) must not stall the rest
    const known = [...blocks, ...overlayPeers.flatMap((p) => p.blocks), ...init.clusterCidrs];
    await this.#applyNft(renderNftRuleset({ localBlocks: blocks, clusterCidrs: mergeCidrs(known) }));
    if (lines.ip.length + lines.bridge.length > 0) {
      this.#c.log.info('overlay updated', { changes: lines.ip.length + lines.bridge.length, sitePeers: plan.sitePeers, remotePeers: plan.remotePeers });
    }
    this.#last = plan;
  }

  async #toPeer(p: NodeRecord): Promise<OverlayPeer> {
    const underlay = p.addresses[0] ?? '';
    const blocks = p.blocks.map((b) => parseCidr(b)).filter((b): b is Cidr => b !== undefined);
    const cached = this.#reach.get(p.name);
    let reachable = cached?.reachable ?? false;
    const needsProbe = !(this.#init.site !== '' && p.site !== ''); // labels on both sides decide without a probe
    if (needsProbe && underlay && probeDue(cached, Date.now())) {
      const answered = (await probeDirect(this.#init.underlay, underlay, this.#init.probePort)).reachable;
      const now = afterProbe(cached, answered, Date.now());
      reachable = now.reachable;
      if (cached?.reachable !== reachable) this.#c.log.info('peer reachability', { peer: p.name, underlay, direct: reachable });
      else if (now.failingSince !== undefined && cached.failingSince === undefined) {
        this.#c.log.info('peer missed a reachability probe; keeping its direct path while it may be restarting', { peer: p.name, underlay, graceMs: DIRECT_LOSS_GRACE_MS });
      }
      this.#reach.set(p.name, now);
    }
    return { name: p.name, site: p.site, underlay, vtepMac: p.vtepMac, blocks, reachable };
  }

  /**
   * Applies Atoll's table unless it is what was last applied and no transaction was committed since (the
   * namespace's ruleset generation is the one our last apply left): a resync that changes nothing spawns no `nft`.
   * Anyone's commit since (ours flushed, another tool's table) makes the next sync apply it again, and so does a
   * generation that cannot be read (the first request of a boot may find nf_tables not loaded yet).
   */
  async #applyNft(ruleset: string): Promise<void> {
    const before = await this.#nftGeneration();
    if (before !== undefined && this.#nftApplied?.ruleset === ruleset && this.#nftApplied.generation === before) return;
    this.#nftApplied = undefined;
    await this.#c.nft.apply(ruleset);
    const after = await this.#nftGeneration();
    // only when ours was the one commit in between is `after` known to hold exactly our table
    if (before !== undefined && after === ((before + 1) >>> 0)) this.#nftApplied = { ruleset, generation: after };
  }

  /** The agent namespace's nftables ruleset generation, or undefined when it cannot be read. */
  async #nftGeneration(): Promise<number | undefined> {
    try {
      return await this.#c.nft.generation();
    } catch (err) {
      this.#c.log.debug('cannot read the nftables ruleset generation; applying the table', { err });
      return undefined;
    }
  }

  /** Atoll's routes (by protocol, main table), neighbours and fdb entries on its device, and the device's addresses. */
  async #readState(): Promise<{ routes: RouteEntry[]; neighbours: NeighEntry[]; fdb: { mac: string; dst: string; dev: string }[]; addresses: string[] }> {
    const dev = this.#init.device;
    const { links, routes, neigh, fdb, addrs } = await withSocket(async (sock) => ({
      links: await sock.links(),
      routes: await sock.routes(),
      neigh: await sock.neighbours(AF_INET),
      fdb: await sock.neighbours(AF_BRIDGE),
      addrs: await sock.addresses(),
    }));
    const names = new Map(links.map((l) => [l.index, l.name]));
    const index = links.find((l) => l.name === dev)?.index;
    return {
      routes: routes.filter((r) => r.protocol === ROUTE_PROTO && r.table === RT_TABLE_MAIN && r.gateway && names.has(r.oif ?? 0))
        .map((r) => ({ dst: r.dst, via: r.gateway as string, dev: names.get(r.oif ?? 0) as string, onlink: r.onlink })),
      neighbours: neigh.filter((n) => n.index === index && n.state & NUD_PERMANENT && n.dst && n.lladdr).map((n) => ({ ip: n.dst as string, mac: n.lladdr as string, dev })),
      // static unicast entries with a remote destination (the all-zero default entry is not ours)
      fdb: fdb.filter((f) => f.index === index && f.dst && f.lladdr && f.lladdr !== '00:00:00:00:00:00').map((f) => ({ mac: f.lladdr as string, dst: f.dst as string, dev })),
      addresses: addrs.filter((a) => a.index === index).map((a) => `${a.local}/${a.prefixLen}`),
    };
  }
}

/** Runs `fn` with a netlink socket in the agent's namespace, closed after. */
async function withSocket<T>(fn: (sock: RtnlSocket) => Promise<T>): Promise<T> {
  const sock = RtnlSocket.open();
  try {
    return await fn(sock);
  } finally {
    sock.close();
  }
}

/**
 * Known blocks and ranges without ones covered by another (nft interval sets refuse overlapping elements).
 * Prefixes either nest or are disjoint, so one sweep in address order (widest first at equal bases) suffices.
 */
function mergeCidrs(cidrs: readonly Cidr[]): Cidr[] {
  const sorted = [...cidrs].sort((a, b) => a.base - b.base || a.bits - b.bits);
  const out: Cidr[] = [];
  for (const c of sorted) {
    const last = out.at(-1);
    if (!last || !cidrsOverlap(last, c)) out.push(c);
  }
  return out;
}
