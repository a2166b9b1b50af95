/**
 * The agent's implementation of CNI ADD, DEL, CHECK, STATUS and GC on one node: sticky IPAM plus bridge and veth
 * plumbing. Every ADD step registers its undo; a failed ADD runs them in reverse, so nothing is left half-done.
 */
import { existsSync } from 'node:fs';
import { AtollError, atollError } from '../core/errors.ts';
import type { CniRequest, PodAttachment } from '../core/cni-spec/model.ts';
import type { PodNetworkPort } from '../core/cni-spec/ports.ts';
import { type IpamChange, type IpamRecord, IpamState } from '../core/ipam/sticky-pool.ts';
import { type Cidr, cidrContains, formatCidr, formatIpv4, gatewayOf } from '../core/net/ipv4.ts';
import { bridgeMac, hostVethName, isHostVethName, planPod } from '../core/plan/pod-plan.ts';
import { Mutex } from '../core/mutex.ts';
import type { Clock, Logger } from '../core/ports.ts';
import type { FsIpamStore } from '../adapters/ipam-store-fs.ts';
import type { IpRoute2 } from '../adapters/iproute2.ts';
import { writeSysctl } from '../adapters/sysctl.ts';

export interface PodNetworkComponents {
  readonly ip: IpRoute2;
  readonly store: FsIpamStore;
  readonly log: Logger;
  readonly clock: Clock;
}

export interface PodNetworkInit {
  readonly nodeName: string;
  readonly network: string;
  readonly bridge: string;
  readonly mtu: number;
  readonly blocks: readonly Cidr[];
  readonly reservationTtlMs: number;
}

type Undo = () => Promise<void> | void;

export class PodNetwork implements PodNetworkPort {
  readonly #c: PodNetworkComponents;
  readonly #init: PodNetworkInit;
  readonly #ipam: IpamState;
  readonly #lock = new Mutex();
  /** Attachments whose ADD is under way: reconcile leaves them alone. */
  readonly #inFlight = new Set<string>();
  #ready = false;

  constructor(components: PodNetworkComponents, init: PodNetworkInit) {
    this.#c = components;
    this.#init = init;
    const loaded = components.store.load();
    for (const s of loaded.skipped) components.log.warn('ignoring a file that is not an IPAM record', { dir: components.store.dir, ...s });
    this.#ipam = new IpamState(init.blocks, loaded.records);
  }

  get ipam(): IpamState {
    return this.#ipam;
  }

  /** Creates or repairs the bridge, then reconciles IPAM with the kernel and starts serving ADD. */
  async start(): Promise<void> {
    await this.ensureBridge();
    await this.reconcile();
    this.#ready = true;
  }

  stop(): void {
    this.#ready = false;
  }

  /** Replaces the node's blocks (the controller leased another); gateways of new blocks go onto the bridge. */
  async setBlocks(blocks: readonly Cidr[]): Promise<void> {
    this.#ipam.setBlocks(blocks);
    await this.ensureBridge();
  }

  /** Idempotent: the bridge exists, is up, has our MAC and the gateway address of every block. */
  async ensureBridge(): Promise<void> {
    const { bridge, mtu, nodeName } = this.#init;
    const blocks = this.#ipam.blocks;
    const link = await this.#c.ip.link(bridge);
    const lines: string[] = [];
    if (!link) lines.push(`link add ${bridge} address ${bridgeMac(nodeName)} mtu ${mtu} type bridge`);
    for (const b of blocks) lines.push(`addr replace ${formatIpv4(gatewayOf(b))}/${b.bits} dev ${bridge}`);
    lines.push(`link set dev ${bridge} up`);
    await this.#c.ip.batch(lines);
    writeSysctl('net/ipv4/ip_forward', '1');
  }

  async add(req: CniRequest): Promise<PodAttachment> {
    this.#checkNetwork(req);
    if (!this.#ready) throw atollError('AGENT_NOT_READY', 'the atoll agent is starting and not serving ADD yet', 'retry in a moment');
    if (!existsSync(req.netns)) {
      throw atollError('CNI_NETNS_MISSING', `network namespace ${req.netns} does not exist`, 'the runtime must create the pod namespace before ADD');
    }
    const key = `${req.containerId}/${req.ifName}`;
    this.#inFlight.add(key);
    const undo: Undo[] = [];
    try {
      const plan = await this.#lock.run(() => {
        const p = this.#ipam.planAllocate({ ...req.pod, containerId: req.containerId, ifName: req.ifName, now: this.#c.clock() });
        this.#commit(p.changes);
        undo.push(() => this.#lock.run(() => this.#commit(p.undo)));
        return p;
      });
      if (plan.displaced) await this.#c.ip.deleteLink(hostVethName(plan.displaced.containerId, plan.displaced.ifName));
      const block = this.#ipam.blocks.find((b) => cidrContains(b, plan.record.ip)) as Cidr;
      const pod = planPod({ ...req, ip: plan.record.ip, block, bridge: this.#init.bridge, mtu: this.#init.mtu });
      if (plan.how === 'existing') await this.#c.ip.deleteLink(pod.hostIfName); // a repeated ADD: start clean
      undo.push(() => this.#c.ip.deleteLink(pod.hostIfName));
      await this.#createVeth(pod.hostLines);
      for (const [k, v] of pod.podSysctls) writeSysctl(k, v, req.netns);
      await this.#c.ip.batch(pod.podLines, { netns: req.netns });
      this.#c.log.info('pod attached', { pod: podName(req), container: req.containerId, ip: pod.address, how: plan.how });
      return { hostIfName: pod.hostIfName, hostMac: pod.hostMac, ifName: req.ifName, mac: pod.podMac, sandbox: req.netns, mtu: this.#init.mtu, address: pod.address, gateway: pod.gateway };
    } catch (err) {
      await this.#rollback(undo, req);
      throw err;
    } finally {
      this.#inFlight.delete(key);
    }
  }

  /** Creates the veth; if the bridge vanished (a node "reboot"), recreates it once and retries. */
  async #createVeth(lines: readonly string[]): Promise<void> {
    try {
      await this.#c.ip.batch(lines);
    } catch (err) {
      if (await this.#c.ip.link(this.#init.bridge)) throw err;
      this.#c.log.warn('bridge missing during ADD; recreating it', { bridge: this.#init.bridge });
      await this.ensureBridge();
      await this.#c.ip.batch(lines);
    }
  }

  async #rollback(undo: readonly Undo[], req: CniRequest): Promise<void> {
    for (const step of [...undo].reverse()) {
      try {
        await step();
      } catch (e) {
        this.#c.log.error('rollback step failed after a failed ADD', { container: req.containerId, err: e });
      }
    }
  }

  async del(req: CniRequest): Promise<void> {
    this.#checkNetwork(req);
    await this.#c.ip.deleteLink(hostVethName(req.containerId, req.ifName));
    await this.#lock.run(() => this.#commit(this.#ipam.planRelease(req.containerId, req.ifName, this.#c.clock())));
  }

  async check(req: CniRequest): Promise<void> {
    this.#checkNetwork(req);
    const fail = (what: string) => {
      throw atollError('CNI_CHECK_FAILED', `CHECK of container ${req.containerId} (${req.ifName}): ${what}`, 'delete and re-create the pod sandbox');
    };
    const rec = this.#ipam.findAttachment(req.containerId, req.ifName);
    if (!rec) fail('Atoll holds no address for it');
    const record = rec as IpamRecord;
    if (!existsSync(req.netns)) fail(`network namespace ${req.netns} does not exist`);
    const hostIf = hostVethName(req.containerId, req.ifName);
    const host = await this.#c.ip.link(hostIf);
    if (!host) fail(`host interface ${hostIf} is missing`);
    if (host?.master !== this.#init.bridge) fail(`host interface ${hostIf} is not attached to bridge ${this.#init.bridge}`);
    const block = this.#ipam.blocks.find((b) => cidrContains(b, record.ip));
    if (!block) fail(`its address ${formatIpv4(record.ip)} is outside the node's blocks`);
    const want = planPod({ ...req, ip: record.ip, block: block as Cidr, bridge: this.#init.bridge, mtu: this.#init.mtu });
    const addrs = await this.#c.ip.json<{ address?: string; addr_info: { local: string; prefixlen: number }[] }>(['addr', 'show', 'dev', req.ifName], { netns: req.netns });
    const has = addrs[0]?.addr_info.some((a) => `${a.local}/${a.prefixlen}` === want.address);
    if (!has) fail(`interface ${req.ifName} in ${req.netns} lacks address ${want.address}`);
    if (req.prevResult) {
      if (!req.prevResult.addresses.includes(want.address)) {
        fail(`prevResult lists ${req.prevResult.addresses.join(', ') || 'no address'}, but the pod holds ${want.address}`);
      }
      const prevIf = req.prevResult.interfaces.find((i) => i.name === req.ifName && i.sandbox !== undefined);
      if (prevIf?.mac && prevIf.mac.toLowerCase() !== addrs[0]?.address?.toLowerCase()) {
        fail(`prevResult gives ${req.ifName} MAC ${prevIf.mac}, but it has ${addrs[0]?.address ?? 'none'}`);
      }
    }
    const routes = await this.#c.ip.json<{ dst: string; gateway?: string }>(['route', 'show', 'default'], { netns: req.netns });
    if (!routes.some((r) => r.gateway === want.gateway)) fail(`no default route via ${want.gateway} in ${req.netns}`);
  }

  async status(_req: CniRequest): Promise<void> {
    if (!this.#ready) throw atollError('AGENT_NOT_READY', 'the atoll agent is starting and not serving ADD yet', 'retry in a moment');
    if (!this.#ipam.canAllocate()) {
      const blocks = this.#ipam.blocks.map(formatCidr).join(', ') || 'none';
      throw atollError('AGENT_NOT_READY', `no pod address is free on this node (blocks: ${blocks})`, 'delete pods or give the node another block');
    }
  }

  async gc(req: CniRequest): Promise<void> {
    this.#checkNetwork(req);
    const released = await this.#lock.run(() => {
      const changes = this.#ipam.planGc(req.validAttachments, this.#c.clock()).filter((c) => !this.#inFlight.has(`${c.record.containerId}/${c.record.ifName}`));
      this.#commit(changes);
      return changes.map((c) => c.record);
    });
    for (const r of released) await this.#c.ip.deleteLink(hostVethName(r.containerId, r.ifName));
    await this.#removeOrphanVeths();
    if (released.length > 0) this.#c.log.info('GC released attachments', { count: released.length });
  }

  /**
   * Brings IPAM in line with the kernel: an active allocation whose host veth is gone (its sandbox died, the node
   * rebooted, the agent was killed mid-ADD) is released (kept as a reservation for its pod); an `atl` veth with no
   * allocation is deleted; expired reservations are dropped.
   */
  async reconcile(): Promise<void> {
    const links = await this.#c.ip.links();
    const present = new Set(links.map((l) => l.ifname));
    const now = this.#c.clock();
    await this.#lock.run(() => {
      const gone = this.#ipam.planReleaseAllBut((r) => this.#inFlight.has(`${r.containerId}/${r.ifName}`) || present.has(hostVethName(r.containerId, r.ifName)), now);
      this.#commit(gone);
      this.#commit(this.#ipam.planExpire(now, this.#init.reservationTtlMs));
      if (gone.length > 0) this.#c.log.info('released allocations whose pod network is gone', { count: gone.length });
    });
    await this.#removeOrphanVeths(links.map((l) => l.ifname));
  }

  async #removeOrphanVeths(names?: readonly string[]): Promise<void> {
    const all = names ?? (await this.#c.ip.links()).map((l) => l.ifname);
    const owned = new Set(this.#ipam.records().filter((r) => r.releasedAt === undefined).map((r) => hostVethName(r.containerId, r.ifName)));
    for (const inFlight of this.#inFlight) {
      const [cid, ifn] = inFlight.split('/') as [string, string];
      owned.add(hostVethName(cid, ifn));
    }
    for (const name of all) {
      if (isHostVethName(name) && !owned.has(name)) {
        await this.#c.ip.deleteLink(name);
        this.#c.log.info('deleted an Atoll veth with no allocation', { link: name });
      }
    }
  }

  #commit(changes: readonly IpamChange[]): void {
    this.#c.store.persist(changes);
    this.#ipam.apply(changes);
  }

  #checkNetwork(req: CniRequest): void {
    if (req.network !== this.#init.network) {
      throw new AtollError('CNI_CONFIG_INVALID', {
        message: `network "${req.network}" is not served by this agent (it serves "${this.#init.network}")`,
        fix: 'make the conflist name match the agent configuration key "network"',
      });
    }
  }
}

function podName(req: CniRequest): string {
  return req.pod.namespace ? `${req.pod.namespace}/${req.pod.name}` : req.containerId;
}
