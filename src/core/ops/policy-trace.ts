/**
 * The NetworkPolicy part of `atoll trace`: which policy and rule let a flow through each side this node judges, or
 * which side drops it and why. The agent answers from the plan it enforces (`explain` in src/core/policy/compile.ts,
 * served on its status socket as `GET /v1/policy/explain`); this file holds that answer's shape and its words. Pure.
 */
import type { Flow, L4, PolicySide } from '../policy/compile.ts';

/** The agent's answer: the sides of the flow its plan judges, each rule as its policy, index and words. */
export interface PolicyTrace {
  readonly sides: readonly {
    readonly direction: 'egress' | 'ingress';
    readonly pod: string;
    readonly isolatedBy: readonly string[];
    /** `everyPort`: the rule allows every port and protocol. */
    readonly allowedBy: readonly { readonly policy: string; readonly rule: number; readonly what: string; readonly everyPort: boolean }[];
  }[];
}

/** {@link PolicySide}s as the agent sends them (without the address ranges behind each rule). */
export function policyTraceOf(sides: readonly PolicySide[]): PolicyTrace {
  return { sides: sides.map((s) => ({ ...s, allowedBy: s.allowedBy.map((r) => ({ policy: r.policy, rule: r.rule, what: r.what, everyPort: r.ports === 'any' })) })) };
}

/** `tcp/80` (or `UDP/53`, `sctp/9`) as a protocol and port; undefined when it is not one. */
export function parseL4(text: string): Flow['l4'] {
  const m = /^(tcp|udp|sctp)\/(\d{1,5})$/i.exec(text);
  const port = Number(m?.[2]);
  if (!m || port < 1 || port > 65535) return undefined;
  return { protocol: (m[1] as string).toLowerCase() as L4, port };
}

export interface PolicyTraceContext {
  /** The flow's addresses as the user sees them. */
  readonly from: string;
  readonly to: string;
  readonly l4?: Flow['l4'];
  /** This node, and the node holding TO's block (undefined when none does). */
  readonly self: string;
  readonly toNode: string | undefined;
}

/**
 * The answer in words, one line per side (egress of FROM, then ingress to TO), and the verdict: 'allowed',
 * 'dropped' (a side lets nothing of it through), or 'depends' (no port given and some side allows only some ports).
 */
export function renderPolicyTrace(t: PolicyTrace, c: PolicyTraceContext): { lines: string[]; verdict: 'allowed' | 'dropped' | 'depends' } {
  const what = c.l4 ? `${c.l4.protocol.toUpperCase()} ${c.l4.port}` : 'anything';
  const lines: string[] = [];
  let verdict: 'allowed' | 'dropped' | 'depends' = 'allowed';
  for (const direction of ['egress', 'ingress'] as const) {
    const head = direction === 'egress' ? `egress of ${c.from}` : `ingress to ${c.to}`;
    const side = t.sides.find((s) => s.direction === direction);
    if (!side) {
      if (direction === 'ingress' && c.toNode !== c.self) lines.push(`${head}: judged on node ${c.toNode ?? '(none)'}, by the policies of its own pods (this node holds no rules for it)`);
      else lines.push(`${head}: open, no NetworkPolicy isolates it for ${direction}`);
      continue;
    }
    const named = `${direction === 'egress' ? 'egress of' : 'ingress to'} ${side.pod}`;
    const isolated = `${side.pod} is isolated for ${direction} by ${side.isolatedBy.join(', ')}`;
    const remote = direction === 'egress' ? c.to : c.from;
    if (side.allowedBy.length === 0) {
      lines.push(`${named}: DROPPED: ${isolated}; no rule allows ${remote} ${what}`);
      verdict = 'dropped';
      continue;
    }
    const rules = side.allowedBy.map((r) => `${r.policy} rule ${r.rule} (${r.what})`);
    if (c.l4) lines.push(`${named}: allowed by ${rules[0]}${rules.length > 1 ? `; also by ${rules.slice(1).join('; ')}` : ''}`);
    else {
      lines.push(`${named}: ${isolated}; for ${remote}, only what these rules allow: ${rules.join('; ')}`);
      if (verdict === 'allowed' && !side.allowedBy.some((r) => r.everyPort)) verdict = 'depends';
    }
  }
  return { lines, verdict };
}
