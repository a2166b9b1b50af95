/**
 * NetworkPolicy on one node: follows the node's part of the policy state from the controller (`GET /v1/policy`), keeps
 * it on disk, compiles it for the node's pods (src/core/policy/compile.ts) and applies what changed since the tables
 * it last applied (src/core/policy/nft.ts) in one `nft -f` transaction, or both tables whole when something else
 * committed since or the delta fails. The view, the compiling and the rendering live in a worker process
 * (src/adapters/node/policy-compute.ts, src/core/policy/engine.ts): a large view takes a hundred milliseconds and
 * more to compile, which the CNI calls served on the agent's thread must not wait behind.
 *
 * Offline rules: the view is written crash-safely after every change and read back at start, and the agent applies it
 * before it serves any CNI ADD; the kernel keeps the last ruleset across an agent restart or crash, so a view file
 * that cannot be read leaves that ruleset in force (never an open door) until the controller sends a snapshot. A
 * pod's own address and veth come from the node's IPAM records, so a pod restarted while the cloud is away is
 * enforced on with its last known labels as soon as it has its (sticky) address; a pod the view does not know is
 * classified from the labels of its CRI sandbox when the node's runtime is given (src/agent/pod-classifier.ts, merged
 * by src/core/policy/local-pods.ts), its namespace's labels and the remote pods staying the view's.
 */
import { existsSync, readFileSync } from 'node:fs';
import { asAtollError, atollError } from '../core/errors.ts';
import type { Logger } from '../core/ports.ts';
import { type Cidr, formatIpv4, parseIpv4 } from '../core/net/ipv4.ts';
import type { SandboxRuntime } from '../core/policy/local-pods.ts';
import { parseL4, type PolicyTrace, policyTraceOf } from '../core/ops/policy-trace.ts';
import { type PolicySummary, summaryOf } from '../core/policy/engine.ts';
import { POLICY_TABLE } from '../core/policy/nft.ts';
import type { NodePolicyView, PolicyLine } from '../core/policy/scope.ts';
import type { IpamRecord } from '../core/ipam/sticky-pool.ts';
import { Backoff } from '../core/retry.ts';
import { decodePolicyLine } from '../config/policy-line.ts';
import type { Nft } from '../adapters/kernel/nft.ts';
import type { ControllerClient } from '../adapters/node/controller-client.ts';
import { sleep } from '../adapters/timers.ts';
import { PodClassifier } from './pod-classifier.ts';
import { PolicyCompute } from '../adapters/node/policy-compute.ts';
import { STATE_WRITE_FIX } from '../adapters/node/state-writer.ts';

/** Changes arriving together are applied in one transaction. */
const COALESCE_MS = 20;
/** How long to wait before asking again a controller that follows no Kubernetes. */
const NOT_SERVED_RETRY_MS = 5 * 60_000;
/** How often a connected node asks which of its reserved addresses peers no longer hold, and how many at most. */
const REUSE_ASK_MS = 5_000;
const REUSE_ASK_MAX = 4096;

export interface PolicyComponents {
  readonly nft: Nft;
  readonly log: Logger;
  /** The node's pod records and blocks now (IPAM). */
  readonly pods: () => { readonly records: readonly IpamRecord[]; readonly blocks: readonly Cidr[] };
  /** The node's container runtime (CRI), to classify pods the view does not know; without it they wait for the view. */
  readonly runtime?: SandboxRuntime;
  /** Reservations another pod may not take yet (IPAM, guarded reuse), and marking some reusable. */
  readonly awaitingReuse?: () => readonly IpamRecord[];
  readonly markReusable?: (cleared: readonly IpamRecord[]) => Promise<void>;
}

export interface PolicyInit {
  readonly nodeName: string;
  /** Where the node's view is kept. */
  readonly statePath: string;
}

/**
 * The policies in force: those of the ruleset last applied, so a change shows here once the kernel has it, not when
 * the view is received (`revision`: src/core/policy/scope.ts `policyRevision`).
 */
export interface PolicyStatus extends PolicySummary {
  /** When the ruleset in force was applied (ms since epoch), if any was this run. */
  readonly appliedAt?: number;
  /** Whether a view has been received from the controller (or read from disk) this run. */
  readonly hasView: boolean;
}

/** A mark of the policy stream, and the controller that sent it. */
interface StreamMark {
  readonly from: string;
  readonly stream: string;
  readonly seq: number;
}

export class PolicyEnforcer {
  readonly #c: PolicyComponents;
  readonly #init: PolicyInit;
  readonly #compute: PolicyCompute;
  #hasView = false;
  /** The ruleset generation right after our last apply, when that commit was the only one since (the worker keeps its tables). */
  #keptGeneration: number | undefined;
  #appliedAt: number | undefined;
  #inForce: PolicySummary = summaryOf([], { pods: [], problems: [] });
  #reported = new Set<string>();
  #timer: NodeJS.Timeout | undefined;
  #chain: Promise<void> = Promise.resolve();
  #dirty = false;
  /** Why the last write of the kept view failed (its errno), while it does: the same again is not logged again. */
  #saveFailing: string | undefined;
  /** The last mark of the policy stream, and where it came from: answered once a sync after it succeeded. */
  #mark: StreamMark | undefined;
  #client: ControllerClient | undefined;
  readonly #classifier: PodClassifier;
  /** Drop totals since start, by `direction policies`; the reading under way. */
  readonly #drops = new Map<string, number>();
  #reading: Promise<ReadonlyMap<string, number>> | undefined;

  constructor(c: PolicyComponents, init: PolicyInit) {
    this.#c = c;
    this.#init = init;
    this.#classifier = new PodClassifier({ runtime: c.runtime, log: c.log, onClassified: () => this.poke() });
    this.#compute = new PolicyCompute((err) => this.#c.log.error('NetworkPolicy changes are no longer applied; the ruleset in the kernel stays in force', { code: 'POLICY_ENGINE_FAILED', err: err.message }));
  }

  /**
   * Reads the kept view and applies it. Call before the CNI socket serves. A view file that cannot be read is logged
   * (POLICY_STATE_INVALID) and ignored: the ruleset already in the kernel stays until the controller sends a view.
   * The node's pods the view does not know are asked about first (each within the runtime's deadline); without a
   * runtime, that they cannot be classified is logged once (POLICY_POD_UNCLASSIFIED).
   */
  async start(): Promise<void> {
    if (this.#c.runtime === undefined) {
      this.#c.log.warn('no criSocket: a pod the NetworkPolicy view does not know (started while the controller is away) is selected by no policy until the controller sends it',
        { code: 'POLICY_POD_UNCLASSIFIED' });
    }
    const view = this.#load();
    if (!view) return;
    await this.#compute.line({ type: 'snapshot', ...view });
    this.#hasView = true;
    await this.#classifier.classify(await this.#compute.unknown(this.#active(), this.#init.nodeName)).asked;
    await this.sync();
  }

  /** Follows the controller's policy stream with `client` until `signal` aborts (one connected session). */
  async follow(client: ControllerClient, signal: AbortSignal): Promise<void> {
    this.#client = client;
    await Promise.all([this.#followStream(client, signal), this.#askReuse(client, signal)]);
  }

  async #followStream(client: ControllerClient, signal: AbortSignal): Promise<void> {
    const backoff = new Backoff({ minMs: 1000, maxMs: 30_000 }, sleep);
    while (!signal.aborted) {
      try {
        await client.watchPolicy((line, from) => this.#onLine(line, from), signal);
        backoff.reset();
      } catch (e) {
        if (signal.aborted) return;
        const err = asAtollError(e);
        if (err.code === 'POLICY_NOT_SERVED') {
          this.#report(err.message, () => this.#c.log.warn('the controller serves no NetworkPolicies; enforcing what this node last had', { code: err.code, err: err.message }));
          await sleep(NOT_SERVED_RETRY_MS, signal);
          continue;
        }
        this.#c.log.debug('policy stream ended; following again', { err: err.message, code: err.code, retryInMs: backoff.delayMs });
        await backoff.wait(signal);
      }
    }
  }

  /**
   * While connected, asks the controller every {@link REUSE_ASK_MS} which of the node's reservations no peer holds
   * any more, and marks those reusable (IPAM, guarded reuse: src/core/policy/reuse.ts). A failed question is asked
   * again at the next turn: until then the addresses stay reserved, never handed on.
   */
  async #askReuse(client: ControllerClient, signal: AbortSignal): Promise<void> {
    const { awaitingReuse, markReusable } = this.#c;
    if (!awaitingReuse || !markReusable) return;
    while (!signal.aborted) {
      await sleep(REUSE_ASK_MS, signal);
      const awaiting = awaitingReuse().slice(0, REUSE_ASK_MAX);
      if (awaiting.length === 0 || signal.aborted) continue;
      try {
        const reusable = await client.reusable(awaiting.map((r) => ({ ip: formatIpv4(r.ip), namespace: r.namespace, name: r.name })));
        const cleared = awaiting.filter((r) => reusable.has(formatIpv4(r.ip)));
        if (cleared.length > 0) await markReusable(cleared);
        this.#c.log.debug('asked which reserved addresses peers no longer hold', { asked: awaiting.length, reusable: cleared.length });
      } catch (e) {
        this.#c.log.debug('cannot ask the controller which reserved addresses peers no longer hold; asking again', { err: asAtollError(e).message });
      }
    }
  }

  /** Asks for a sync soon: a pod was added or deleted, or the blocks changed. */
  poke(): void {
    if (this.#timer) return;
    this.#timer = setTimeout(() => {
      this.#timer = undefined;
      const save = this.#dirty;
      this.#dirty = false;
      this.#serially(async () => {
        if (save) await this.#save();
        await this.#syncNow();
      }).catch((e: unknown) => {
        const err = asAtollError(e);
        // a dead worker was said once, when it died
        if (err.code !== 'POLICY_ENGINE_FAILED') this.#c.log.error('applying NetworkPolicy failed; the next change retries', { err: err.message, code: err.code });
      });
    }, COALESCE_MS);
  }

  /** Compiles the view for the node's pods and applies what changed (after any sync under way: one at a time). */
  sync(): Promise<void> {
    return this.#serially(() => this.#syncNow());
  }

  #serially(step: () => Promise<void>): Promise<void> {
    const run = this.#chain.then(step);
    this.#chain = run.catch(() => undefined);
    return run;
  }

  async #syncNow(): Promise<void> {
    if (!this.#hasView) return;
    // every line before this mark reached the worker before this sync's compile (one message at a time, in order)
    const mark = this.#mark;
    // answered only when the kept view holds every line before the mark too (none received since the last save, and
    // that save worked): a restart starts from that file, and the controller takes the answer for what this node
    // holds from then on (src/core/policy/reuse.ts); otherwise the mark waits for a later sync
    const onDisk = !this.#dirty && this.#saveFailing === undefined;
    await this.#applyNow();
    if (mark && onDisk) this.#answer(mark);
  }

  /** Tells the controller that sent `mark` that this node applied what came before it; a failure is retried at the next sync. */
  #answer(mark: StreamMark): void {
    const client = this.#client;
    if (!client || this.#mark !== mark) return;
    this.#mark = undefined;
    client.policyApplied(mark.from, mark.stream, mark.seq).catch((e: unknown) => {
      this.#mark ??= mark;
      this.#c.log.debug('cannot tell the controller which NetworkPolicy view this node applied; the next sync tries again', { err: asAtollError(e).message });
    });
  }

  async #applyNow(): Promise<void> {
    const { blocks } = this.#c.pods();
    const active = this.#active();
    // only what changed when the kernel holds what we last applied (no commit since ours), else both tables whole
    const before = await this.#generation();
    const keptValid = this.#keptGeneration !== undefined && before === this.#keptGeneration;
    // the node's own records' addresses win over what the API last said (sticky, and known while offline); a pod the
    // view does not know takes the labels of its sandbox, once the runtime told them
    const res = await this.#compute.compile({
      nodeName: this.#init.nodeName, active, blocks, classified: [...this.#classifier.known()], readsSandboxes: this.#classifier.reads, givenUp: this.#classifier.givenUp(), keptValid,
    });
    this.#classifier.classify(res.unknown);
    for (const p of res.problems) this.#report(`${p.policy}: ${p.message}`, () => this.#c.log.warn('a NetworkPolicy is enforced more strictly than written', { code: 'POLICY_UNSUPPORTED', policy: p.policy, err: p.message }));
    if (res.delta && res.text === '') {
      await this.#compute.committed(true);
      this.#inForce = res.summary;
      return;
    }
    this.#keptGeneration = undefined;
    try {
      await this.#c.nft.apply(res.text);
    } catch (err) {
      if (!res.delta) throw err;
      this.#c.log.warn('applying the NetworkPolicy change alone failed; applying both tables whole', { err: asAtollError(err).message });
      await this.#c.nft.apply(await this.#compute.whole());
    }
    const after = await this.#generation();
    const kept = before !== undefined && after === ((before + 1) >>> 0);
    this.#keptGeneration = kept ? after : undefined;
    await this.#compute.committed(kept);
    this.#appliedAt = Date.now();
    this.#inForce = res.summary;
    // a change is routine (every pod ADD); a whole apply says the tables were rebuilt
    const fields = { policies: res.summary.policies, isolatedPods: res.summary.isolatedPods };
    if (!res.delta) this.#c.log.info('NetworkPolicy applied, both tables whole', fields);
    else this.#c.log.debug('NetworkPolicy change applied', fields);
  }

  #active(): IpamRecord[] {
    return this.#c.pods().records.filter((r) => r.releasedAt === undefined);
  }

  /** The agent namespace's nftables ruleset generation, or undefined when it cannot be read (then: apply whole). */
  async #generation(): Promise<number | undefined> {
    try {
      return await this.#c.nft.generation();
    } catch (err) {
      this.#c.log.debug('cannot read the nftables ruleset generation; applying the policy tables whole', { err: asAtollError(err).message });
      return undefined;
    }
  }

  /**
   * The periodic resync: a sync, which applies both tables whole when anything committed since our last apply (a
   * table someone removed comes back; the overlay's own commits count too, so one whole apply may follow each of them).
   */
  async resync(): Promise<void> {
    await this.#serially(async () => {
      // a view the disk refused earlier
      if (this.#dirty && this.#saveFailing !== undefined) {
        this.#dirty = false;
        await this.#save();
      }
      await this.#syncNow();
    });
  }

  status(): PolicyStatus {
    return { ...this.#inForce, hasView: this.#hasView, ...(this.#appliedAt ? { appliedAt: this.#appliedAt } : {}) };
  }

  /**
   * Which policy and rule let a flow through on this node, or which side drops it, from the plan in force (`atoll
   * trace`). `port` is PROTOCOL/NUMBER (`tcp/80`), or absent for every rule that names the remote address.
   * @throws AtollError POLICY_TRACE_INVALID when `from` or `to` is not an IPv4 address, or `port` not PROTOCOL/NUMBER.
   */
  async trace(q: { readonly from: string; readonly to: string; readonly port: string | undefined }): Promise<PolicyTrace> {
    const src = parseIpv4(q.from);
    const dst = parseIpv4(q.to);
    const l4 = q.port === undefined ? undefined : parseL4(q.port);
    if (src === undefined || dst === undefined || (q.port !== undefined && !l4)) {
      throw atollError('POLICY_TRACE_INVALID', `cannot trace from ${JSON.stringify(q.from)} to ${JSON.stringify(q.to)}${q.port === undefined ? '' : ` on ${JSON.stringify(q.port)}`}: give two IPv4 addresses and a port as tcp/80`,
        'use atoll trace FROM TO [--port PROTOCOL/PORT] of the same Atoll version as the agent');
    }
    return policyTraceOf(await this.#compute.explain({ src, dst, ...(l4 ? { l4 } : {}) }));
  }

  /**
   * Packets NetworkPolicy dropped on this node since the agent started, by `direction policies` (the policies
   * isolating the pod, comma-separated), from the pods' drop counters in the kernel (read now; calls at once share
   * one read). A failed read is logged at debug and answers the totals so far.
   */
  droppedPackets(): Promise<ReadonlyMap<string, number>> {
    this.#reading ??= this.#c.nft.counters(`inet ${POLICY_TABLE}`).then((counters) => this.#compute.drops(counters)).then((dropped) => {
      for (const [key, n] of dropped) this.#drops.set(key, (this.#drops.get(key) ?? 0) + n);
      return this.#drops;
    }, (err: unknown) => {
      this.#c.log.debug('cannot read the NetworkPolicy drop counters', { err: asAtollError(err).message });
      return this.#drops;
    }).finally(() => {
      this.#reading = undefined;
    });
    return this.#reading;
  }

  async stop(): Promise<void> {
    this.#classifier.stop();
    clearTimeout(this.#timer);
    await this.#chain;
    await this.#compute.close();
  }

  #onLine(line: PolicyLine, from: string): void {
    if (line.type === 'ping') return;
    if (line.type === 'mark') {
      this.#mark = { from, stream: line.stream, seq: line.seq };
      this.poke();
      return;
    }
    // in order with the saves and syncs that follow (the worker answers one message at a time)
    this.#compute.line(line).catch(() => undefined);
    this.#hasView = true;
    this.#dirty = true;
    this.poke();
  }

  #report(key: string, log: () => void): void {
    if (this.#reported.has(key)) return;
    this.#reported.add(key);
    log();
  }

  /**
   * Writes the view kept for restarts. A disk that refuses it (full, read-only) does not hold the view back: it is
   * applied from memory, the failure said once (NODE_STATE_WRITE_FAILED), and the file written at the next change or
   * resync. Before, the refusal ended the step with the worker's code, so the view was not applied, nor said.
   */
  async #save(): Promise<void> {
    const path = this.#init.statePath;
    const failed = await this.#compute.save(path);
    if (!failed) {
      if (this.#saveFailing !== undefined) this.#c.log.info('the NetworkPolicy view written again', { path });
      this.#saveFailing = undefined;
      return;
    }
    this.#dirty = true;
    const err = atollError('NODE_STATE_WRITE_FAILED', `cannot write the NetworkPolicy view ${path}: ${failed.message}`, STATE_WRITE_FIX);
    const key = failed.errno ?? failed.message;
    if (key !== this.#saveFailing) {
      this.#c.log.error('cannot write the NetworkPolicy view; it is applied from memory (a restart meanwhile starts from the older file), and the file is written at the next change or resync', { code: err.code, err: err.message, path, fix: err.fix });
    } else this.#c.log.debug('the NetworkPolicy view still not written', { code: err.code, err: err.message, path });
    this.#saveFailing = key;
  }

  #load(): NodePolicyView | undefined {
    const path = this.#init.statePath;
    if (!existsSync(path)) return undefined;
    try {
      const line = decodePolicyLine(readFileSync(path, 'utf8').trim(), path);
      if (line.type !== 'snapshot') throw new Error(`holds a ${line.type} line, not a snapshot`);
      return line;
    } catch (cause) {
      const err = atollError('POLICY_STATE_INVALID', `the NetworkPolicy view kept in ${path} cannot be read: ${asAtollError(cause).message}`,
        'nothing to do: the ruleset already in the kernel stays in force until the controller sends this node its view, which replaces the file', cause);
      this.#c.log.error('kept NetworkPolicy view unreadable; keeping the ruleset in the kernel', { code: err.code, err: err.message });
      return undefined;
    }
  }
}
