/**
 * Node-local IPAM with sticky pod IPs. Pure: plans return the record changes to persist; the caller persists them
 * and only then applies them with {@link IpamState.apply}, so memory never runs ahead of the durable store.
 *
 * Rules (issue #2):
 * - a pod (namespace/name) re-created gets its previous address back, whatever its container ID;
 * - a deleted pod's address stays reserved for it until `reservationTtlMs` passes, or until the pool runs out of
 *   never-used addresses, when the oldest reservation is taken first;
 * - pods without a Kubernetes identity (plain runtimes) are not sticky: DEL frees their address at once;
 * - one address is never held by two records: the state is keyed by address;
 * - when reuse is guarded (NetworkPolicy: peers match a remote pod by its address, with the labels they were sent), a
 *   deleted pod's address goes to another namespace/name only once it is marked reusable (every peer that may hold the
 *   old pod has applied a view without it: the controller says so); until then it stays reserved, past its TTL too.
 */
import { AtollError } from '../errors.ts';
import { type Cidr, cidrContains, formatCidr, podRange } from '../net/ipv4.ts';
import type { Attachment } from '../cni-spec/model.ts';

/** One allocation or reservation. */
export interface IpamRecord {
  readonly ip: number;
  /** Kubernetes namespace, or '' for a pod without a Kubernetes identity. */
  readonly namespace: string;
  /** Pod name, or the container ID for a pod without a Kubernetes identity. */
  readonly name: string;
  readonly containerId: string;
  readonly ifName: string;
  /** Set while the pod is gone and its address is kept for it (ms since epoch). */
  readonly releasedAt?: number;
  /** Set on a reservation once no peer holds the gone pod's labels for the address (guarded reuse). */
  readonly reusable?: true;
}

export type IpamChange = { readonly op: 'put'; readonly record: IpamRecord } | { readonly op: 'remove'; readonly record: IpamRecord };

export interface AllocateRequest {
  readonly namespace?: string;
  readonly name?: string;
  readonly containerId: string;
  readonly ifName: string;
  readonly now: number;
}

export interface AllocatePlan {
  readonly record: IpamRecord;
  readonly changes: readonly IpamChange[];
  /** Changes that undo `changes` after they were applied (a failed ADD). */
  readonly undo: readonly IpamChange[];
  /** An active attachment of the same pod that this one replaces (its sandbox was re-created without a DEL). */
  readonly displaced?: IpamRecord;
  /** How the address was found, for logs, metrics and tests. */
  readonly how: AllocationHow;
}

/**
 * How ADD found an address: the attachment's own (a repeated ADD), the one reserved for the same pod (a sticky re-use),
 * a never-used or freed one, or the oldest reservation of another pod, reclaimed.
 */
export type AllocationHow = 'existing' | 'sticky' | 'fresh' | 'reclaimed';

export interface IpamUsage {
  readonly capacity: number;
  readonly allocated: number;
  readonly reserved: number;
  readonly free: number;
}

export function isSticky(r: IpamRecord): boolean {
  return r.namespace !== '';
}

export function isReleased(r: IpamRecord): boolean {
  return r.releasedAt !== undefined;
}

function podKey(namespace: string, name: string): string {
  return `${namespace}/${name}`;
}

function attachmentKey(containerId: string, ifName: string): string {
  return `${containerId}\u0000${ifName}`;
}

/** The in-memory IPAM state of one network on one node. */
export class IpamState {
  readonly #byIp = new Map<number, IpamRecord>();
  #blocks: readonly Cidr[];
  readonly #guarded: boolean;

  /** `guardReuse`: a reservation goes to another pod only once marked reusable (see the rules above). */
  constructor(blocks: readonly Cidr[], records: Iterable<IpamRecord> = [], opts: { readonly guardReuse?: boolean } = {}) {
    this.#blocks = blocks;
    this.#guarded = opts.guardReuse ?? false;
    for (const r of records) this.#byIp.set(r.ip, r);
  }

  get blocks(): readonly Cidr[] {
    return this.#blocks;
  }

  setBlocks(blocks: readonly Cidr[]): void {
    this.#blocks = blocks;
  }

  records(): IpamRecord[] {
    return [...this.#byIp.values()].sort((a, b) => a.ip - b.ip);
  }

  get(ip: number): IpamRecord | undefined {
    return this.#byIp.get(ip);
  }

  /** The active record of an attachment, if any. */
  findAttachment(containerId: string, ifName: string): IpamRecord | undefined {
    const key = attachmentKey(containerId, ifName);
    for (const r of this.#byIp.values()) {
      if (!isReleased(r) && attachmentKey(r.containerId, r.ifName) === key) return r;
    }
    return undefined;
  }

  findPod(namespace: string, name: string): IpamRecord | undefined {
    const key = podKey(namespace, name);
    for (const r of this.#byIp.values()) if (isSticky(r) && podKey(r.namespace, r.name) === key) return r;
    return undefined;
  }

  /** Applies persisted changes. */
  apply(changes: readonly IpamChange[]): void {
    for (const c of changes) {
      if (c.op === 'put') this.#byIp.set(c.record.ip, c.record);
      else if (sameOwner(this.#byIp.get(c.record.ip), c.record)) this.#byIp.delete(c.record.ip);
    }
  }

  /** Reservations another pod may not take yet: their peers may still hold the gone pod's labels (guarded reuse). */
  awaitingReuse(): IpamRecord[] {
    if (!this.#guarded) return [];
    return this.records().filter((r) => r.releasedAt !== undefined && r.reusable === undefined);
  }

  /**
   * Plans marking reservations reusable: each of `cleared` that is still the same reservation (same pod, released at
   * the same time; not re-taken by its pod meanwhile) and not yet marked.
   */
  planReusable(cleared: readonly Pick<IpamRecord, 'ip' | 'namespace' | 'name' | 'releasedAt'>[]): IpamChange[] {
    const out: IpamChange[] = [];
    for (const c of cleared) {
      const r = this.#byIp.get(c.ip);
      if (!r || r.releasedAt === undefined || r.reusable !== undefined || r.releasedAt !== c.releasedAt || !sameOwner(r, c)) continue;
      out.push({ op: 'put', record: { ...r, reusable: true } });
    }
    return out;
  }

  /** Whether another pod may take the reservation `r` now. */
  #takeable(r: IpamRecord): boolean {
    return !this.#guarded || r.reusable !== undefined;
  }

  usage(): IpamUsage {
    let capacity = 0;
    for (const b of this.#blocks) {
      const r = podRange(b);
      if (r) capacity += r.last - r.first + 1;
    }
    let allocated = 0;
    let reserved = 0;
    for (const r of this.#byIp.values()) {
      if (!this.#inBlocks(r.ip)) continue;
      if (isReleased(r)) reserved++;
      else allocated++;
    }
    return { capacity, allocated, reserved, free: capacity - allocated - reserved };
  }

  /** True when an ADD could get an address now (a free one, or a reservation to reclaim). */
  canAllocate(): boolean {
    return this.usage().free > 0 || this.#oldestReservation() !== undefined;
  }

  #inBlocks(ip: number): boolean {
    return this.#blocks.some((b) => cidrContains(b, ip));
  }

  #firstFree(): number | undefined {
    for (const b of this.#blocks) {
      const range = podRange(b);
      if (!range) continue;
      for (let ip = range.first; ip <= range.last; ip++) if (!this.#byIp.has(ip)) return ip;
    }
    return undefined;
  }

  #oldestReservation(): IpamRecord | undefined {
    let oldest: IpamRecord | undefined;
    for (const r of this.#byIp.values()) {
      if (r.releasedAt === undefined || !this.#takeable(r) || !this.#inBlocks(r.ip)) continue;
      if (!oldest || r.releasedAt < (oldest.releasedAt ?? 0)) oldest = r;
    }
    return oldest;
  }

  /**
   * Plans an allocation. Idempotent for a repeated ADD of the same attachment.
   * @throws AtollError IPAM_NO_BLOCKS when the node holds no block, IPAM_EXHAUSTED when every address is taken.
   */
  planAllocate(req: AllocateRequest): AllocatePlan {
    const existing = this.findAttachment(req.containerId, req.ifName);
    if (existing) return { record: existing, changes: [], undo: [releaseChange(existing, req.now)], how: 'existing' };
    const sticky = req.namespace !== undefined && req.name !== undefined;
    const namespace = sticky ? (req.namespace ?? '') : '';
    const name = sticky ? (req.name ?? '') : req.containerId;
    const fresh = (ip: number): IpamRecord => ({ ip, namespace, name, containerId: req.containerId, ifName: req.ifName });
    if (sticky) {
      const previous = this.findPod(namespace, name);
      if (previous && this.#inBlocks(previous.ip)) {
        const record = fresh(previous.ip);
        const displaced = isReleased(previous) ? undefined : previous;
        return { record, changes: [{ op: 'put', record }], undo: [{ op: 'put', record: previous }], displaced, how: 'sticky' };
      }
    }
    if (this.#blocks.length === 0) {
      throw new AtollError('IPAM_NO_BLOCKS', {
        message: 'this node holds no pod address block',
        fix: 'set podCidrs in the agent configuration, or wait until the controller leases a block to this node',
      });
    }
    const ip = this.#firstFree();
    if (ip !== undefined) {
      const record = fresh(ip);
      return { record, changes: [{ op: 'put', record }], undo: [{ op: 'remove', record }], how: 'fresh' };
    }
    const oldest = this.#oldestReservation();
    if (oldest) {
      const record = fresh(oldest.ip);
      return {
        record,
        changes: [{ op: 'remove', record: oldest }, { op: 'put', record }],
        undo: [{ op: 'remove', record }, { op: 'put', record: oldest }],
        how: 'reclaimed',
      };
    }
    const u = this.usage();
    if (u.reserved > 0) {
      throw new AtollError('IPAM_EXHAUSTED', {
        message: `all ${u.capacity} pod addresses of ${this.#blocks.map(formatCidr).join(', ')} are allocated or reserved, and the ${u.reserved} reserved for deleted pods may still be matched by peers' NetworkPolicy as those pods`,
        fix: 'wait until the controller says the peers dropped those pods (it needs every peer that may hold them connected), or give the node another block (the controller leases one below refillBelow free addresses)',
      });
    }
    throw new AtollError('IPAM_EXHAUSTED', {
      message: `all ${u.capacity} pod addresses of ${this.#blocks.map(formatCidr).join(', ')} are allocated`,
      fix: 'delete pods on this node, or give the node another block (podCidrs, or the controller)',
    });
  }

  /** Plans the release of an attachment: a sticky pod keeps a reservation, others free the address. */
  planRelease(containerId: string, ifName: string, now: number): IpamChange[] {
    const r = this.findAttachment(containerId, ifName);
    if (!r) return [];
    return [releaseChange(r, now)];
  }

  /** Plans dropping reservations older than `ttlMs` (guarded: only those marked reusable; the others stay reserved). */
  planExpire(now: number, ttlMs: number): IpamChange[] {
    const out: IpamChange[] = [];
    for (const r of this.#byIp.values()) {
      if (r.releasedAt !== undefined && now - r.releasedAt >= ttlMs && this.#takeable(r)) out.push({ op: 'remove', record: r });
    }
    return out;
  }

  /** Plans the release of every active attachment that `keep` does not say is alive. */
  planReleaseAllBut(keep: (r: IpamRecord) => boolean, now: number): IpamChange[] {
    const out: IpamChange[] = [];
    for (const r of this.#byIp.values()) if (!isReleased(r) && !keep(r)) out.push(releaseChange(r, now));
    return out;
  }

  /** GC: releases every active attachment not in `valid`. */
  planGc(valid: readonly Attachment[], now: number): IpamChange[] {
    const keep = new Set(valid.map((a) => attachmentKey(a.containerId, a.ifName)));
    return this.planReleaseAllBut((r) => keep.has(attachmentKey(r.containerId, r.ifName)), now);
  }
}

function sameOwner(a: IpamRecord | undefined, b: Pick<IpamRecord, 'namespace' | 'name'>): boolean {
  return a !== undefined && a.namespace === b.namespace && a.name === b.name;
}

function releaseChange(r: IpamRecord, now: number): IpamChange {
  return isSticky(r) ? { op: 'put', record: { ...r, releasedAt: now } } : { op: 'remove', record: r };
}
