/**
 * A node's NetworkPolicy computation as one stateful value: the view it holds (the controller's lines applied), the
 * plan and tables last compiled, those in force (last applied) and the ones the next delta starts from. Pure: no
 * clock, no I/O. The agent runs it off its main thread (src/adapters/node/policy-worker.ts), since compiling a large view takes
 * hundreds of milliseconds that a CNI ADD must not wait behind; src/agent/policy.ts applies what it renders.
 */
import type { IpamRecord } from '../ipam/sticky-pool.ts';
import { type Cidr, formatIpv4 } from '../net/ipv4.ts';
import { hostVethName } from '../plan/pod-plan.ts';
import { compilePolicies, explain, type Flow, type PolicyPlan, type PolicyProblem, type PolicySide } from './compile.ts';
import { CLASSIFYING, closedPods, policyPods, type SandboxPod, unknownLocalPods } from './local-pods.ts';
import { keyOf, type NetworkPolicy } from './model.ts';
import { buildPolicyTables, type PolicyTables, renderPolicyDelta, renderPolicyTables, tallyDrops } from './nft.ts';
import { HeldPolicyView, type NodePolicyView, type PolicyLine, policyRevision } from './scope.ts';

/** How many policy names a summary carries. */
const NAMES_SHOWN = 10;

/** What `atoll status` shows of the policies in force. */
export interface PolicySummary {
  readonly policies: number;
  /** `namespace/name` of the first {@link NAMES_SHOWN} policies, sorted. */
  readonly names: readonly string[];
  /** Their revision (`policyRevision`). */
  readonly revision: string;
  readonly isolatedPods: number;
}

export interface CompileRequest {
  readonly nodeName: string;
  /** The node's active IPAM records (not released). */
  readonly active: readonly IpamRecord[];
  readonly blocks: readonly Cidr[];
  /** Sandbox pods by sandbox id, for records the view does not know (the classifier's answers so far). */
  readonly classified: readonly (readonly [string, SandboxPod])[];
  /** Whether the node's runtime is asked for those records' sandboxes: then each is closed until read or given up on. */
  readonly readsSandboxes: boolean;
  /** Sandbox ids of those the runtime could not tell (left to the view, open). */
  readonly givenUp: readonly string[];
  /** Whether the kernel still holds exactly what was last committed with `kept` (no other commit since): then a delta. */
  readonly keptValid: boolean;
}

export interface CompileResult {
  /**
   * The nft transaction to apply: the delta from the tables last committed with `kept` when `keptValid`, else both
   * tables whole; '' when nothing changed (nothing to apply: the plan is in force as it is).
   */
  readonly text: string;
  readonly delta: boolean;
  /** Of the plan compiled (in force once committed). */
  readonly summary: PolicySummary;
  readonly problems: readonly PolicyProblem[];
  /** The active records the view does not know: the ones to classify from their sandboxes. */
  readonly unknown: readonly IpamRecord[];
}

export function summaryOf(policies: readonly NetworkPolicy[], plan: PolicyPlan): PolicySummary {
  return { policies: policies.length, names: policies.slice(0, NAMES_SHOWN).map(keyOf), revision: policyRevision(policies), isolatedPods: plan.pods.length };
}

export class PolicyEngine {
  readonly #held = new HeldPolicyView();
  /** The plan in force (committed), for trace and the drop counters. */
  #plan: PolicyPlan = { pods: [], problems: [] };
  /** The tables last committed as what the kernel holds, when the commit was the only one since ours. */
  #kept: PolicyTables | undefined;
  /** Compiled, not yet committed. */
  #pending: { tables: PolicyTables; plan: PolicyPlan } | undefined;
  readonly #dropsRead = new Map<string, number>();

  /** Applies a line of the controller's policy stream (a snapshot replaces the view). */
  apply(line: PolicyLine): void {
    this.#held.apply(line);
  }

  view(): NodePolicyView {
    return this.#held.view();
  }

  /** The active records the view holds no pod of this node for. */
  unknown(active: readonly IpamRecord[], nodeName: string): IpamRecord[] {
    return unknownLocalPods(this.#held.view().pods, active, nodeName);
  }

  /** Compiles the view for the node's pods and renders what to apply; nothing is in force until {@link committed}. */
  compile(req: CompileRequest): CompileResult {
    const view = this.#held.view();
    const unknown = unknownLocalPods(view.pods, req.active, req.nodeName);
    const podsInput = { viewPods: view.pods, active: req.active, classified: new Map(req.classified), nodeName: req.nodeName };
    const { pods, local } = policyPods(podsInput);
    const closed = closedPods({ ...podsInput, policies: view.policies, readsSandboxes: req.readsSandboxes, givenUp: new Set(req.givenUp) }).map((c) => ({ ...c, why: CLASSIFYING }));
    const plan = compilePolicies({ policies: view.policies, namespaces: view.namespaces, pods, local, closed });
    const tables = buildPolicyTables(plan, { sources: req.active.map((r) => ({ port: hostVethName(r.containerId, r.ifName), ip: formatIpv4(r.ip) })), localBlocks: req.blocks });
    const kept = req.keptValid ? this.#kept : undefined;
    const text = kept ? renderPolicyDelta(kept, tables) : renderPolicyTables(tables);
    this.#pending = { tables, plan };
    return { text, delta: kept !== undefined, summary: summaryOf(view.policies, plan), problems: plan.problems, unknown };
  }

  /** Both tables whole for what was last compiled (a delta the kernel refused). */
  whole(): string {
    return this.#pending ? renderPolicyTables(this.#pending.tables) : '';
  }

  /**
   * What was last compiled is in force; `kept`: the kernel holds exactly its tables and nothing else committed since,
   * so the next compile may render a delta from them.
   */
  committed(kept: boolean): void {
    if (!this.#pending) return;
    this.#plan = this.#pending.plan;
    this.#kept = kept ? this.#pending.tables : undefined;
    this.#pending = undefined;
  }

  /** Which policy and rule let a flow through, or which side drops it, by the plan in force. */
  explain(flow: Flow): PolicySide[] {
    return explain(this.#plan, flow);
  }

  /** Packets dropped since the counters were last read, by `direction policies` (src/core/policy/nft.ts `tallyDrops`). */
  drops(counters: ReadonlyMap<string, number>): Map<string, number> {
    return tallyDrops(this.#plan, counters, this.#dropsRead);
  }
}
