/**
 * The lab's NetworkPolicy run (`--kubernetes --policy`): applies the lab's policies (src/lab/plan/policy.ts) through
 * the API once the pods run, and waits until every node's agent enforces them, which is how long a policy takes to
 * be in force on every node it concerns (from `kubectl apply` to the last agent's status).
 */
import { atollError } from '../core/errors.ts';
import { readAgentStatus, statusSocketOf } from '../adapters/ops/status-socket.ts';
import { sleep } from '../adapters/timers.ts';
import type { LabKubernetes } from './lab-kube.ts';
import { LAB_POD_NAMESPACE, type LabPlan } from './plan/plan.ts';
import { labPodIsolated, labPolicyDenies, labPolicyObjects, labPolicySites } from './plan/policy.ts';
import type { RunningLab } from './running-lab.ts';

/** How long the agents get to enforce the policies after they are applied. */
const IN_FORCE_TIMEOUT_MS = 30_000;

/**
 * Applies the lab's policies and resolves once every node's agent isolates exactly the pods of the node the policies
 * select. Needs an edge site (the egress policy's).
 * @throws AtollError LAB_STEP_FAILED when an agent does not within {@link IN_FORCE_TIMEOUT_MS}, with each node's policy status.
 */
export async function applyLabPolicies(kube: LabKubernetes, plan: LabPlan): Promise<NonNullable<RunningLab['policy']>> {
  const sites = labPolicySites(plan.spec);
  // cannot happen: the CLI refuses --policy without an edge site
  if (sites === undefined) throw new Error('the lab\'s policies need an edge site');
  const labels = new Map(plan.pods.map((p) => [p.name, p.labels]));
  const expected = new Map(plan.nodes.map((n) => [n.name, plan.pods.filter((p) => p.node === n.name && labPodIsolated(p.labels, sites)).length]));
  const t = performance.now();
  await kube.kubectl(['apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: labPolicyObjects(LAB_POD_NAMESPACE, sites) }));
  let lacking: string[] = [];
  while (performance.now() - t < IN_FORCE_TIMEOUT_MS) {
    const states = await Promise.all(plan.nodes.map(async (n) => {
      const st = await readAgentStatus(statusSocketOf(n.socketPath), 2000).catch(() => undefined);
      const isolated = st?.policy?.hasView ? st.policy.isolatedPods : undefined;
      return isolated === expected.get(n.name) ? undefined : `${n.name}: ${isolated ?? 'no view'} of ${expected.get(n.name)} pods isolated`;
    }));
    lacking = states.filter((s) => s !== undefined);
    if (lacking.length === 0) {
      return {
        inForceMs: Math.round(performance.now() - t),
        denies: (from, to) => labPolicyDenies(labels.get(from) ?? {}, labels.get(to) ?? {}, sites),
      };
    }
    await sleep(50);
  }
  throw atollError('LAB_STEP_FAILED', `the lab's NetworkPolicies not in force on every node within ${IN_FORCE_TIMEOUT_MS / 1000} s: ${lacking.join('; ')}`,
    `${kube.kubectlCommand.join(' ')} get networkpolicies -n ${LAB_POD_NAMESPACE}; read the agents' logs`);
}
