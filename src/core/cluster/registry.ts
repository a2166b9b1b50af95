/**
 * The controller's decisions: registering nodes, leasing blocks, deregistering, auditing. Talks only to the
 * {@link ClusterStore} port; every decision is one compare-and-swap transaction, retried on a lost race, so no block
 * is ever leased twice, whatever the number of controller replicas.
 */
import { AtollError, atollError } from '../errors.ts';
import { type Cidr, formatCidr, parseCidr } from '../net/ipv4.ts';
import type { Clock } from '../ports.ts';
import { auditLeases, FreeBlocks, type LeaseProblem } from './blocks.ts';
import {
  type BlockLease,
  blockKey,
  blockOfKey,
  BLOCKS_PREFIX,
  type NodeFields,
  nodeKey,
  type NodeRecord,
  type NodeUsage,
  NODES_PREFIX,
  USAGE_PREFIX,
  usageKey,
} from './model.ts';
import type { ClusterStore, KvEntry, WatchEvent } from './store.ts';

export interface RegistryInit {
  readonly clusterCidrs: readonly Cidr[];
  /** Prefix length of node blocks, e.g. 26 for 64 addresses. */
  readonly blockBits: number;
  readonly maxBlocksPerNode: number;
  /** A node reporting fewer free addresses than this gets another block. */
  readonly refillBelow: number;
}

export interface RegistryComponents {
  readonly store: ClusterStore;
  readonly clock: Clock;
}

export interface Registration extends NodeFields {
  readonly name: string;
  readonly identity: string;
  readonly observedAddress: string;
}

export interface NodeView {
  readonly node: NodeRecord;
  readonly blocks: readonly string[];
}

/** A change of the node set, as streamed to agents. */
export type NodeEvent = { readonly type: 'put'; readonly node: NodeRecord; readonly revision: number } | { readonly type: 'delete'; readonly name: string; readonly revision: number };

const MAX_RACE_RETRIES = 50;

function parse<T>(e: KvEntry): T {
  return JSON.parse(e.value) as T;
}

export class ClusterRegistry {
  readonly #c: RegistryComponents;
  readonly #init: RegistryInit;
  /** Blocks this registry is trying to lease right now: concurrent grants pick others instead of racing for one. */
  readonly #pending = new Map<string, Cidr>();
  /** Which blocks are leased, as far as this replica knows: listed from the store at its first grant. */
  readonly #free: FreeBlocks;
  #freeListed = false;

  constructor(components: RegistryComponents, init: RegistryInit) {
    this.#c = components;
    this.#init = init;
    this.#free = new FreeBlocks(init.clusterCidrs, init.blockBits);
  }

  /**
   * Registers a node, or re-registers it under the same identity (keeping its blocks), and makes sure it holds a
   * block. @throws AtollError NODE_IDENTITY_MISMATCH when the name is registered with another key.
   */
  async register(r: Registration): Promise<NodeView> {
    for (let attempt = 0; attempt < MAX_RACE_RETRIES; attempt++) {
      const existing = await this.#c.store.get(nodeKey(r.name));
      const prev = existing && parse<NodeRecord>(existing);
      if (prev && prev.identity !== r.identity) {
        throw atollError('NODE_IDENTITY_MISMATCH', `node ${r.name} is registered with another identity key`,
          `if the node was rebuilt, deregister it first (atoll node deregister ${r.name}); otherwise pick another node name`);
      }
      const now = this.#c.clock();
      const node: NodeRecord = {
        name: r.name, identity: r.identity, site: r.site, community: r.community, addresses: [...r.addresses],
        observedAddress: r.observedAddress, vtepMac: r.vtepMac, tunnelKey: r.tunnelKey, agentVersion: r.agentVersion,
        annotations: { ...r.annotations }, blocks: prev?.blocks ?? [], registeredAt: prev?.registeredAt ?? now, updatedAt: now,
      };
      const unchanged = prev !== undefined && sameFields(prev, node);
      if (!unchanged) {
        const res = await this.#c.store.txn([{ key: nodeKey(r.name), modRevision: existing?.modRevision ?? 0 }], [{ type: 'put', key: nodeKey(r.name), value: JSON.stringify(node) }]);
        if (!res.succeeded) continue;
      }
      const blocks = await this.blocksOf(r.name);
      if (blocks.length > 0) return { node: unchanged ? (prev as NodeRecord) : node, blocks };
      return { node, blocks: await this.#grant(r.name) };
    }
    throw this.#contended(r.name);
  }

  /** Updates a registered node's own fields. */
  async update(name: string, fields: NodeFields): Promise<NodeRecord> {
    for (let attempt = 0; attempt < MAX_RACE_RETRIES; attempt++) {
      const existing = await this.#c.store.get(nodeKey(name));
      if (!existing) throw notRegistered(name);
      const prev = parse<NodeRecord>(existing);
      const node: NodeRecord = { ...prev, ...fields, annotations: { ...fields.annotations }, addresses: [...fields.addresses], blocks: prev.blocks, updatedAt: this.#c.clock() };
      if (sameFields(prev, node)) return prev;
      const res = await this.#c.store.txn([{ key: nodeKey(name), modRevision: existing.modRevision }], [{ type: 'put', key: nodeKey(name), value: JSON.stringify(node) }]);
      if (res.succeeded) return node;
    }
    throw this.#contended(name);
  }

  async node(name: string): Promise<NodeRecord | undefined> {
    const e = await this.#c.store.get(nodeKey(name));
    return e && parse<NodeRecord>(e);
  }

  /** The blocks leased to `name`, in address order. */
  async blocksOf(name: string): Promise<string[]> {
    // the node record lists its blocks, written in the same transaction as each lease: one read, not a scan
    const e = await this.#c.store.get(nodeKey(name));
    return e ? [...parse<NodeRecord>(e).blocks] : [];
  }

  async leases(): Promise<(BlockLease & { block: Cidr })[]> {
    const { entries } = await this.#c.store.list(BLOCKS_PREFIX);
    const out: (BlockLease & { block: Cidr })[] = [];
    for (const e of entries) {
      const block = blockOfKey(e.key);
      if (block) out.push({ ...parse<BlockLease>(e), block });
    }
    return out.sort((a, b) => a.block.base - b.block.base);
  }

  /**
   * Records a node's usage and, when it has fewer than `refillBelow` free addresses and is under its maximum,
   * leases it another block. Returns its blocks.
   */
  async reportUsage(name: string, usage: Omit<NodeUsage, 'at'>): Promise<string[]> {
    if (!(await this.#c.store.get(nodeKey(name)))) throw notRegistered(name);
    const value = JSON.stringify({ ...usage, at: this.#c.clock() });
    const current = await this.#c.store.get(usageKey(name));
    await this.#c.store.txn([{ key: usageKey(name), modRevision: current?.modRevision ?? 0 }], [{ type: 'put', key: usageKey(name), value }]);
    const blocks = await this.blocksOf(name);
    if (usage.free >= this.#init.refillBelow || blocks.length >= this.#init.maxBlocksPerNode) return blocks;
    return this.#grant(name);
  }

  /** Deregisters a node and releases its blocks, in one transaction. Returns the released blocks. */
  async deregister(name: string): Promise<string[]> {
    for (let attempt = 0; attempt < MAX_RACE_RETRIES; attempt++) {
      const existing = await this.#c.store.get(nodeKey(name));
      if (!existing) throw notRegistered(name);
      // the record lists its blocks (written with each lease): their keys, not a scan of every lease
      const listed = parse<NodeRecord>(existing).blocks.flatMap((b) => parseCidr(b) ?? []);
      const mine = (await Promise.all(listed.map((b) => this.#c.store.get(blockKey(b)))))
        .filter((e): e is NonNullable<typeof e> => e !== undefined && parse<BlockLease>(e).node === name);
      const usage = await this.#c.store.get(usageKey(name));
      const res = await this.#c.store.txn(
        [{ key: nodeKey(name), modRevision: existing.modRevision }, ...mine.map((e) => ({ key: e.key, modRevision: e.modRevision }))],
        [{ type: 'delete', key: nodeKey(name) }, ...mine.map((e) => ({ type: 'delete' as const, key: e.key })), ...(usage ? [{ type: 'delete' as const, key: usageKey(name) }] : [])],
      );
      if (res.succeeded) {
        for (const e of mine) {
          const block = blockOfKey(e.key);
          if (block) this.#free.release(block);
        }
        return mine.map((e) => parse<BlockLease>(e).cidr);
      }
    }
    throw this.#contended(name);
  }

  /** Every registered node and the store revision of that view. */
  async snapshot(): Promise<{ nodes: NodeRecord[]; revision: number }> {
    const { entries, revision } = await this.#c.store.list(NODES_PREFIX);
    return { nodes: entries.map((e) => parse<NodeRecord>(e)), revision };
  }

  /** Streams node changes after `afterRevision` until `signal` aborts. */
  watchNodes(afterRevision: number, onEvents: (events: NodeEvent[]) => void, signal: AbortSignal): Promise<void> {
    return this.#c.store.watch(NODES_PREFIX, afterRevision, (events: readonly WatchEvent[]) => {
      onEvents(events.map((e): NodeEvent => (e.type === 'put'
        ? { type: 'put', node: JSON.parse(e.value) as NodeRecord, revision: e.modRevision }
        : { type: 'delete', name: e.key.slice(NODES_PREFIX.length), revision: e.modRevision })));
    }, signal);
  }

  /** Blocks and reported usage per node, for `atoll ipam show`. */
  async ipamReport(): Promise<{ nodes: { name: string; blocks: string[]; usage?: NodeUsage }[]; problems: LeaseProblem[] }> {
    const [{ nodes }, leases, usage] = await Promise.all([this.snapshot(), this.leases(), this.#c.store.list(USAGE_PREFIX)]);
    const usageOf = new Map(usage.entries.map((e) => [e.key.slice(USAGE_PREFIX.length), parse<NodeUsage>(e)]));
    const names = new Set(nodes.map((n) => n.name));
    const holders = [...new Set([...names, ...leases.map((l) => l.node)])].sort();
    return {
      nodes: holders.map((name) => ({ name, blocks: leases.filter((l) => l.node === name).map((l) => l.cidr), usage: usageOf.get(name) })),
      problems: auditLeases(leases, names, this.#init.clusterCidrs),
    };
  }

  /** Leases one more block to `name` (if it is under its maximum); returns all its blocks. */
  async #grant(name: string): Promise<string[]> {
    if (!this.#freeListed) await this.#listLeases();
    for (let attempt = 0; attempt < MAX_RACE_RETRIES; attempt++) {
      const node = await this.#c.store.get(nodeKey(name));
      if (!node) throw notRegistered(name);
      const mine = [...parse<NodeRecord>(node).blocks];
      if (mine.length >= this.#init.maxBlocksPerNode) return mine;
      let block = this.#free.take();
      if (!block) {
        // none free as far as this replica knows: leases released through another replica count too
        await this.#listLeases();
        block = this.#free.take();
      }
      if (!block) {
        throw atollError('CLUSTER_CIDR_EXHAUSTED', `every /${this.#init.blockBits} block of ${this.#init.clusterCidrs.map(formatCidr).join(', ')} is leased`,
          'add a cluster CIDR to the controller configuration, or deregister nodes that are gone');
      }
      const lease: BlockLease = { cidr: formatCidr(block), node: name, leasedAt: this.#c.clock() };
      const blocks = sortCidrs([...mine, lease.cidr]);
      const record: NodeRecord = { ...parse<NodeRecord>(node), blocks };
      // the block must still be free and the node unchanged; its record lists the new block in the same transaction
      this.#pending.set(lease.cidr, block);
      let res;
      try {
        res = await this.#c.store.txn(
          [{ key: blockKey(block), modRevision: 0 }, { key: nodeKey(name), modRevision: node.modRevision }],
          [{ type: 'put', key: blockKey(block), value: JSON.stringify(lease) }, { type: 'put', key: nodeKey(name), value: JSON.stringify(record) }],
        );
      } finally {
        this.#pending.delete(lease.cidr);
      }
      if (res.succeeded) return blocks;
      // lost a race: for the block (leased through another replica: it stays taken) or for the node's record
      if (!(await this.#c.store.get(blockKey(block)))) this.#free.release(block);
    }
    throw this.#contended(name);
  }

  /** Lists the leases into {@link FreeBlocks}, keeping the blocks grants are leasing right now taken. */
  async #listLeases(): Promise<void> {
    const leases = await this.leases();
    this.#free.reset([...leases.map((l) => l.block), ...this.#pending.values()]);
    this.#freeListed = true;
  }

  #contended(name: string): AtollError {
    return atollError('STORE_UNAVAILABLE', `gave up on node ${name} after ${MAX_RACE_RETRIES} lost races in the store`, 'retry; if it persists, check the controllers and the store');
  }
}

function sortCidrs(cidrs: string[]): string[] {
  const key = (c: string) => c.split(/[./]/).reduce((n, part, i) => (i < 4 ? n * 256 + Number(part) : n), 0);
  return cidrs.sort((a, b) => key(a) - key(b));
}

function notRegistered(name: string): AtollError {
  return atollError('NODE_NOT_REGISTERED', `node ${name} is not registered`, 'the agent registers itself at start with its bootstrap token');
}

function sameFields(a: NodeRecord, b: NodeRecord): boolean {
  return a.site === b.site && a.community === b.community && a.vtepMac === b.vtepMac && a.tunnelKey === b.tunnelKey &&
    a.agentVersion === b.agentVersion && a.observedAddress === b.observedAddress && a.addresses.join(',') === b.addresses.join(',') &&
    JSON.stringify(a.annotations ?? {}) === JSON.stringify(b.annotations ?? {});
}
