/**
 * The agent's implementation of CNI ADD, DEL, CHECK, STATUS and GC on one node: sticky IPAM plus bridge and veth
 * plumbing. Every ADD step registers its undo; a failed ADD runs them in reverse, so nothing is left half-done.
 *
 * The hot path (ADD's veth, address and route; DEL's and GC's link deletions) talks rtnetlink directly
 * (adapters/kernel/netlink.ts), two batches per ADD, with every kernel wait on libuv's pool; so do the reads of the
 * bridge and of reconcile (dumps), which spawn `ip` only to repair; CHECK stays on `ip` (docs/architecture.md,
 * "A CNI call").
 */
import { closeSync, existsSync, openSync } from 'node:fs';
import { AtollError, atollError } from '../core/errors.ts';
import type { CniRequest, PodAttachment } from '../core/cni-spec/model.ts';
import type { PodNetworkPort } from '../core/cni-spec/ports.ts';
import { type AllocationHow, type IpamChange, type IpamRecord, IpamState } from '../core/ipam/sticky-pool.ts';
import { damagedHold } from '../core/ipam/record-codec.ts';
import { type Cidr, cidrContains, formatCidr, formatIpv4, gatewayOf } from '../core/net/ipv4.ts';
import { decodeLink, IFF_UP, type LinkInfo } from '../core/net/netlink-codec.ts';
import { bridgeMac, hostRequests, hostVethName, isHostVethName, type PodPlan, planPod, podRequests } from '../core/plan/pod-plan.ts';
import { Mutex } from '../core/mutex.ts';
import type { Clock, Logger } from '../core/ports.ts';
import type { FsIpamStore } from '../adapters/node/ipam-store-fs.ts';
import type { IpRoute2 } from '../adapters/kernel/iproute2.ts';
import { initNetlink, netlinkError, RtnlSocket } from '../adapters/kernel/netlink.ts';
import { LinkWatch } from '../adapters/kernel/link-watch.ts';
import { inNetns } from '../adapters/kernel/netns.ts';
import { writeSysctl, writeSysctlHere } from '../adapters/kernel/sysctl.ts';

export interface PodNetworkComponents {
  readonly ip: IpRoute2;
  readonly store: FsIpamStore;
  readonly log: Logger;
  /** Stamps allocations and releases (ms since the epoch). */
  readonly clock: Clock;
  /**
   * What reservations' ages are read on (the plain clock when absent): the agent's is the wall clock less the jumps
   * it saw (src/adapters/timers.ts jumpFreeWallClock), so a clock stepped by days expires no reservation.
   */
  readonly ageClock?: Clock;
  /** Told after the pod records change in memory (an ADD, DEL or GC): NetworkPolicy follows the node's pods. */
  readonly onRecordsChanged?: () => void;
}

export interface PodNetworkInit {
  readonly nodeName: string;
  readonly network: string;
  readonly bridge: string;
  readonly mtu: number;
  readonly blocks: readonly Cidr[];
  readonly reservationTtlMs: number;
  /** A deleted pod's address goes to another pod only once marked reusable (NetworkPolicy: src/core/ipam/sticky-pool.ts). */
  readonly guardReuse?: boolean;
}

type Undo = () => Promise<void> | void;

export class PodNetwork implements PodNetworkPort {
  readonly #c: PodNetworkComponents;
  readonly #init: PodNetworkInit;
  readonly #ipam: IpamState;
  readonly #lock = new Mutex();
  /** Attachments whose ADD is under way: reconcile leaves them alone. */
  readonly #inFlight = new Set<string>();
  /** Link removal notices, for deletions that need the link gone rather than reclaimed; opened on first use. */
  #watch: LinkWatch | undefined;
  /** ifindex of the bridge, for IFLA_MASTER; refreshed by ensureBridge and when a veth creation fails. */
  #bridgeIndex: number | undefined;
  #ready = false;
  /** Addresses handed out by ADD since the start, by how (a sticky re-use, a fresh one...), for the metrics. */
  readonly allocations: Record<AllocationHow, number> = { existing: 0, sticky: 0, fresh: 0, reclaimed: 0 };

  constructor(components: PodNetworkComponents, init: PodNetworkInit) {
    this.#c = components;
    this.#init = init;
    const loaded = components.store.load();
    const held: IpamRecord[] = [];
    for (const s of loaded.skipped) {
      if (!s.held) {
        components.log.warn('ignoring a file that is not an IPAM record', { dir: components.store.dir, file: s.file, reason: s.reason });
        continue;
      }
      // a damaged record still names its address and pod: the address stays held (a reservation for that pod)
      held.push(damagedHold(s.held, components.clock()));
      const err = atollError('IPAM_RECORD_DAMAGED', `IPAM record ${components.store.dir}/${s.file} is damaged: ${s.reason}`,
        `its address is kept as a reservation for pod ${s.held.namespace}/${s.held.name} (re-created, it gets it back; else it is reclaimed like a reservation); look at the file, or remove it to free the address at the next start`);
      components.log.error('damaged IPAM record: its address stays reserved for its pod', { err, fix: err.fix });
    }
    const byIp = new Set(loaded.records.map((r) => r.ip));
    this.#ipam = new IpamState(init.blocks, [...loaded.records, ...held.filter((h) => !byIp.has(h.ip))], { guardReuse: init.guardReuse ?? false });
    initNetlink();
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
    this.#watch?.close();
    this.#watch = undefined;
  }

  /** Marks reservations reusable (the controller said no peer holds their pods any more); resolves once on disk. */
  async markReusable(cleared: readonly IpamRecord[]): Promise<void> {
    await this.#change(() => this.#ipam.planReusable(cleared));
  }

  /** Replaces the node's blocks (the controller leased another); gateways of new blocks go onto the bridge. */
  async setBlocks(blocks: readonly Cidr[]): Promise<void> {
    this.#ipam.setBlocks(blocks);
    await this.ensureBridge();
  }

  /**
   * Idempotent: the bridge exists, is up, has our MAC and the gateway address of every block. Read over netlink;
   * `ip` runs only when something is missing, so a resync that finds the bridge as it should be spawns nothing.
   */
  async ensureBridge(): Promise<void> {
    const { bridge, mtu, nodeName } = this.#init;
    const blocks = this.#ipam.blocks;
    const { link, addresses } = await this.#withHostSocket(async (sock) => {
      const l = await sock.link({ name: bridge });
      return { link: l, addresses: l ? (await sock.addresses()).filter((a) => a.index === l.index).map((a) => `${a.local}/${a.prefixLen}`) : [] };
    });
    const lines: string[] = [];
    if (!link) lines.push(`link add ${bridge} address ${bridgeMac(nodeName)} mtu ${mtu} type bridge`);
    for (const b of blocks) {
      const gateway = `${formatIpv4(gatewayOf(b))}/${b.bits}`;
      if (!addresses.includes(gateway)) lines.push(`addr replace ${gateway} dev ${bridge}`);
    }
    if (!link || !(link.flags & IFF_UP)) lines.push(`link set dev ${bridge} up`);
    await this.#c.ip.batch(lines);
    this.#bridgeIndex = lines.length > 0 ? (await this.#hostLink(bridge))?.index : link?.index;
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
    /** The record's write failed: #commit has reverted memory already, and there is nothing on disk to undo. */
    let unwritten = false;
    try {
      const { plan, durable } = await this.#lock.run(() => {
        const p = this.#ipam.planAllocate({ ...req.pod, containerId: req.containerId, ifName: req.ifName, now: this.#c.clock() });
        const written = this.#commit(p.changes);
        undo.push(() => (unwritten ? undefined : this.#change(() => p.undo)));
        return { plan: p, durable: written };
      });
      // The record goes to disk while the kernel work runs; ADD answers only once it is there (awaited below).
      durable.catch(() => {
        unwritten = true;
      });
      if (plan.displaced) await this.#deleteLink(hostVethName(plan.displaced.containerId, plan.displaced.ifName));
      const block = this.#ipam.blocks.find((b) => cidrContains(b, plan.record.ip)) as Cidr;
      const pod = planPod({ ...req, ip: plan.record.ip, block, bridge: this.#init.bridge, mtu: this.#init.mtu });
      if (plan.how === 'existing') await this.#deleteLink(pod.hostIfName); // a repeated ADD: start clean
      undo.push(() => this.#deleteLink(pod.hostIfName));
      const podIfIndex = await this.#createVeth(pod);
      await this.#plumbPodSide(pod, podIfIndex);
      await durable;
      this.allocations[plan.how]++;
      this.#c.log.info('pod attached', { pod: podName(req), container: req.containerId, ip: pod.address, how: plan.how });
      return { hostIfName: pod.hostIfName, hostMac: pod.hostMac, ifName: req.ifName, mac: pod.podMac, sandbox: req.netns, mtu: this.#init.mtu, address: pod.address, gateway: pod.gateway };
    } catch (err) {
      await this.#rollback(undo, req);
      throw err;
    } finally {
      this.#inFlight.delete(key);
    }
  }

  /**
   * Creates the veth (pod end in the pod namespace), enslaves it with hairpin and brings the host end up, in one
   * netlink batch; returns the pod end's ifindex. If the creation fails because the bridge vanished (a node
   * "reboot") or was re-created under another index, recreates or re-reads it once and retries.
   */
  async #createVeth(pod: PodPlan): Promise<number> {
    const fd = openPodNetns(pod.veth.netns);
    const sock = RtnlSocket.open();
    try {
      const bridgeIndex = this.#bridgeIndex ?? (await this.#bridgeIndexNow(sock));
      let reqs = hostRequests(pod, { bridgeIndex, podNetnsFd: fd });
      let res = await sock.exchange(reqs);
      if (res[0]?.errno !== 0 && (await this.#bridgeIndexNow(sock)) !== bridgeIndex) {
        reqs = hostRequests(pod, { bridgeIndex: this.#bridgeIndex as number, podNetnsFd: fd });
        res = await sock.exchange(reqs);
      }
      res.forEach((r, i) => {
        if (r.errno !== 0) throw netlinkError(reqs[i] as (typeof reqs)[number], r, sock.where);
      });
      const reply = res[3]?.replies[0];
      const peer = reply && decodeLink(reply).link;
      if (!peer) throw atollError('KERNEL_OP_FAILED', `veth ${pod.hostIfName} was created but the kernel did not report its peer's ifindex`);
      return peer;
    } finally {
      sock.close();
      closeSync(fd);
    }
  }

  /** Reads the bridge's ifindex now, recreating the bridge when it is missing; caches it. */
  async #bridgeIndexNow(sock: RtnlSocket): Promise<number> {
    const link = await sock.link({ name: this.#init.bridge });
    if (link) {
      this.#bridgeIndex = link.index;
      return link.index;
    }
    this.#c.log.warn('bridge missing during ADD; recreating it', { bridge: this.#init.bridge });
    await this.ensureBridge();
    if (this.#bridgeIndex === undefined) throw atollError('KERNEL_OP_FAILED', `bridge ${this.#init.bridge} is missing right after it was created`);
    return this.#bridgeIndex;
  }

  /**
   * The pod side: sysctls and a netlink socket opened while the main thread is inside the pod namespace (one
   * synchronous switch), then address, link up and default route in one batch on that socket.
   */
  async #plumbPodSide(pod: PodPlan, podIfIndex: number): Promise<void> {
    const netns = pod.veth.netns;
    let sock: RtnlSocket;
    try {
      sock = inNetns(netns, () => {
        for (const [k, v] of pod.podSysctls) writeSysctlHere(k, v, netns);
        return RtnlSocket.open(`network namespace ${netns}`);
      });
    } catch (err) {
      if (err instanceof AtollError) throw err;
      throw podNetnsError(netns, err);
    }
    try {
      await sock.run(podRequests(pod, podIfIndex));
    } finally {
      sock.close();
    }
  }

  /**
   * Deletes a link in the agent's namespace (both ends of a veth); succeeds when it is already gone. Resolves once
   * the kernel announces the link gone (its name is free again, its ports and addresses removed); the kernel's
   * reclamation and its ack follow in the background, where a late failure is logged. Falls back on the ack when
   * the announcement is missed.
   * @throws AtollError KERNEL_OP_FAILED when the kernel refuses the deletion.
   */
  async #deleteLink(name: string): Promise<void> {
    const sock = RtnlSocket.open();
    let background = false;
    try {
      const link = await sock.link({ name });
      if (!link) return;
      this.#watch ??= LinkWatch.open();
      const gone = this.#watch.gone(link.index);
      const deleted = sock.deleteLink({ index: link.index, label: name });
      try {
        await Promise.race([gone.promise, deleted]);
      } finally {
        gone.cancel();
      }
      background = true;
      void deleted.then(
        () => sock.close(),
        (err: unknown) => {
          sock.close();
          this.#c.log.error('the kernel failed to finish deleting a link it had announced gone', { link: name, err });
        },
      );
    } finally {
      if (!background) sock.close();
    }
  }

  async #hostLink(name: string): Promise<LinkInfo | undefined> {
    return this.#withHostSocket((sock) => sock.link({ name }));
  }

  /** Runs `fn` with a netlink socket in the agent's namespace, closed after. */
  async #withHostSocket<T>(fn: (sock: RtnlSocket) => Promise<T>): Promise<T> {
    const sock = RtnlSocket.open();
    try {
      return await fn(sock);
    } finally {
      sock.close();
    }
  }

  /** The names of the links in the agent's namespace. */
  async #hostLinkNames(): Promise<string[]> {
    return (await this.#withHostSocket((sock) => sock.links())).map((l) => l.name);
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

  /**
   * Deletes the host veth (both ends), then releases the address: an address is never free for another pod while
   * its old port can still carry traffic. The deletion counts as done when the kernel announces the link gone
   * (closed, unlisted, off the bridge: about 1 ms), not when it has reclaimed it (16 to 33 ms more).
   */
  async del(req: CniRequest): Promise<void> {
    this.#checkNetwork(req);
    await this.#deleteLink(hostVethName(req.containerId, req.ifName));
    await this.#change(() => this.#ipam.planRelease(req.containerId, req.ifName, this.#c.clock()));
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
    const released = await this.#lock.run(async () => {
      const changes = this.#ipam.planGc(req.validAttachments, this.#c.clock()).filter((c) => !this.#inFlight.has(`${c.record.containerId}/${c.record.ifName}`));
      await this.#commit(changes);
      return changes.map((c) => c.record);
    });
    for (const r of released) await this.#deleteLink(hostVethName(r.containerId, r.ifName));
    await this.#removeOrphanVeths();
    if (released.length > 0) this.#c.log.info('GC released attachments', { count: released.length });
  }

  /**
   * Brings IPAM in line with the kernel: an active allocation whose host veth is gone (its sandbox died, the node
   * rebooted, the agent was killed mid-ADD) is released (kept as a reservation for its pod); an `atl` veth with no
   * allocation is deleted; expired reservations are dropped.
   */
  async reconcile(): Promise<void> {
    const names = await this.#hostLinkNames();
    const present = new Set(names);
    const now = this.#c.clock();
    await this.#lock.run(async () => {
      const gone = this.#ipam.planReleaseAllBut((r) => this.#inFlight.has(`${r.containerId}/${r.ifName}`) || present.has(hostVethName(r.containerId, r.ifName)), now);
      const released = this.#commit(gone); // applied in memory now, so the expiry below is planned on top of it
      const expired = this.#commit(this.#ipam.planExpire(this.#c.ageClock?.() ?? now, this.#init.reservationTtlMs));
      const [r, e] = await Promise.allSettled([released, expired]);
      // A disk that cannot be written (full, read-only) must not stop the agent: memory was reverted, so the records
      // stay as they are on disk and the next reconcile tries again; the rest of the node keeps being served.
      const failed = [r, e].find((x) => x.status === 'rejected');
      if (failed) {
        const err = failed.reason as unknown;
        if (!(err instanceof AtollError && err.code === 'IPAM_STORE_FAILED')) throw err;
        this.#c.log.error('cannot write IPAM records: releases and expiries wait for the next reconcile; ADD and DEL fail until the disk takes writes', { err });
      } else if (gone.length > 0) {
        this.#c.log.info('released allocations whose pod network is gone', { count: gone.length });
      }
    });
    await this.#removeOrphanVeths(names);
  }

  async #removeOrphanVeths(names?: readonly string[]): Promise<void> {
    const all = names ?? (await this.#hostLinkNames());
    const owned = new Set(this.#ipam.records().filter((r) => r.releasedAt === undefined).map((r) => hostVethName(r.containerId, r.ifName)));
    for (const inFlight of this.#inFlight) {
      const [cid, ifn] = inFlight.split('/') as [string, string];
      owned.add(hostVethName(cid, ifn));
    }
    for (const name of all) {
      if (isHostVethName(name) && !owned.has(name)) {
        await this.#deleteLink(name);
        this.#c.log.info('deleted an Atoll veth with no allocation', { link: name });
      }
    }
  }

  /**
   * Applies `changes` in memory at once (so the next plan sees them) and queues them for disk (group commit, off the
   * main thread); the promise resolves when they are durable. Call with the lock held, so memory and disk see
   * changes in the same order. If the write fails, each change is reverted in memory unless something changed that
   * address since (then the later change stands), and the promise rejects with IPAM_STORE_FAILED.
   */
  #commit(changes: readonly IpamChange[]): Promise<void> {
    if (changes.length === 0) return Promise.resolve();
    const before = changes.map((c) => this.#ipam.get(c.record.ip));
    this.#ipam.apply(changes);
    this.#c.onRecordsChanged?.();
    const after = changes.map((c) => this.#ipam.get(c.record.ip));
    return this.#c.store.persistQueued(changes).catch((err: unknown) => {
      for (let i = changes.length - 1; i >= 0; i--) {
        const ip = (changes[i] as IpamChange).record.ip;
        const now = this.#ipam.get(ip);
        if (now !== after[i]) continue;
        const was = before[i];
        if (was) this.#ipam.apply([{ op: 'put', record: was }]);
        else if (now) this.#ipam.apply([{ op: 'remove', record: now }]);
      }
      throw err;
    });
  }

  /** Plans with the lock held, commits, releases the lock, and resolves once the changes are durable. */
  async #change(plan: () => readonly IpamChange[]): Promise<void> {
    const { durable } = await this.#lock.run(() => ({ durable: this.#commit(plan()) }));
    await durable;
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

/** Opens the pod namespace (for IFLA_NET_NS_FD). @throws AtollError CNI_NETNS_MISSING or KERNEL_OP_FAILED. */
function openPodNetns(netns: string): number {
  try {
    return openSync(netns, 'r');
  } catch (err) {
    throw podNetnsError(netns, err);
  }
}

function podNetnsError(netns: string, cause: unknown): AtollError {
  if ((cause as NodeJS.ErrnoException).code === 'ENOENT') {
    return atollError('CNI_NETNS_MISSING', `network namespace ${netns} does not exist`, 'the runtime must create the pod namespace before ADD', cause);
  }
  return atollError('KERNEL_OP_FAILED', `cannot enter network namespace ${netns}`, 'check that it is a network namespace and the agent runs as root', cause);
}

function podName(req: CniRequest): string {
  return req.pod.namespace ? `${req.pod.namespace}/${req.pod.name}` : req.containerId;
}
