/**
 * The running lab as the steps after `labUp` (src/lab/lab.ts) see it: the options they share, the handle
 * ({@link RunningLab}) the checks, the faults and the teardown work on, how a node's agent is launched, recording a
 * process started later in the run's state (for its removal), saving the run's logs; and the small helpers the lab's
 * steps share (a lab namespace's path, a bounded map, timings).
 */
import { copyFileSync, cpSync, existsSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { asAtollError } from '../core/errors.ts';
import type { LabNode, LabPlan } from './plan/plan.ts';
import type { LabWorkloadPod } from './plan/faults.ts';
import type { LabState, LabStateStore } from './io/lab-state.ts';
import { NETNS_DIR } from './io/processes.ts';
import { type AgentProcess, fakeClockLauncher } from './agent-process.ts';
import type { ServiceProcess } from './service-process.ts';
import type { LabPodInfo, LabPodRuntime, LabPodsChoice } from './lab-pods.ts';
import type { LabKubernetes } from './lab-kube.ts';
import type { AtollInstall } from './lab-kube-install.ts';
import type { LabRuns } from './lab-down.ts';

export interface LabOptions {
  /** Progress lines for the terminal. */
  readonly say: (line: string) => void;
  readonly store?: LabStateStore;
  /** Copy the controller's and agents' logs here before a failed `labUp` removes the run, and after a fault that fails. */
  readonly keepLogs?: string;
  /** How to create pods (`--pods`); default `auto`: through containerd's CRI when it is installed. */
  readonly pods?: LabPodsChoice;
  /**
   * `--kubernetes`: a real control plane in the cloud and a kubelet per node (src/lab/lab-kube.ts); the pods are
   * created through the API. Needs containerd (`--pods cri` or `auto` with containerd installed).
   */
  readonly kubernetes?: boolean;
  /** `--policy` (with `kubernetes`): the chart's `networkPolicy.enabled` on: every agent enforces NetworkPolicy. */
  readonly networkPolicy?: boolean;
  /** `--openyurt` (with `kubernetes`): each edge node's kubelet and kube-proxy behind its own yurthub. */
  readonly openyurt?: boolean;
  /**
   * `--image FILE` (with `kubernetes`): docker-archive images imported into every node's containerd beside Atoll's,
   * for workloads of the user's own (the Netpol suite's agnhost: scripts/netpol-e2e.sh).
   */
  readonly images?: readonly string[];
  /**
   * The first edge site's agents run under libfaketime, their clocks moved through a file per node (the clock-jump
   * fault, src/lab/faults.ts); nothing when libfaketime is not installed.
   */
  readonly fakeClocks?: boolean;
}

export type { LabPodInfo } from './lab-pods.ts';

export interface RunningLab {
  /** The plan; the node-delete fault takes its node out of it for the rest of the run. */
  plan: LabPlan;
  readonly store: LabStateStore;
  readonly caCertHash: string;
  /** The pods as they are now (a re-created pod replaces its entry). */
  readonly pods: LabPodInfo[];
  /** Creates and re-creates pods (containerd's CRI or direct CNI calls). */
  readonly podRuntime: LabPodRuntime;
  /** How the pods were created, for the report. */
  readonly podCreation: string;
  readonly timingsMs: Readonly<Record<string, number>>;
  /** The lab's controller process (the controller-kill fault replaces it); none when the chart installed Atoll (`--kubernetes`). */
  controller?: ServiceProcess;
  /** The lab's relay process (the relay-kill fault replaces it); none when the chart installed Atoll. */
  relay?: ServiceProcess;
  /** The relay's key pin, as the edge agents have it. */
  readonly relayPin: string;
  /** The agent process of every node, by node name; empty when the chart's DaemonSets run the agents (`--kubernetes`). */
  readonly agents: ReadonlyMap<string, AgentProcess>;
  /** The runs of the process that built it. */
  readonly runs: LabRuns;
  state: LabState;
  /** The control plane and kubelets (`--kubernetes`). */
  readonly kubernetes?: LabKubernetes;
  /** How the chart installed Atoll (`--kubernetes`). */
  readonly atollInstall?: AtollInstall;
  /**
   * `--policy`: the lab's NetworkPolicies (src/lab/plan/policy.ts), in force on every node `inForceMs` after they
   * were applied; `denies` is their truth table by pod name (the workloads' pods carry no lab labels).
   */
  readonly policy?: { readonly inForceMs: number; denies(from: string, to: string): string | undefined };
  /** The workloads' pods once started (`--kubernetes`, checkWorkloads in src/lab/lab-checks.ts), where the scheduler put them. */
  readonly workloadPods: LabWorkloadPod[];
  /** The libfaketime file of each agent run with faked clocks ({@link LabOptions.fakeClocks}), by node. */
  readonly clockFiles: ReadonlyMap<string, string>;
}

/** How `node`'s agent is started: behind the pod runtime's launcher, and under libfaketime when its clocks are faked. */
export function agentLauncher(lab: Pick<RunningLab, 'podRuntime' | 'clockFiles'>, node: LabNode): string[] {
  const file = lab.clockFiles.get(node.name);
  return [...lab.podRuntime.agentLauncher(node), ...(file ? fakeClockLauncher(file) : [])];
}

/** The path of a lab namespace, for the adapters' `netns` option. */
export const nsPath = (name: string): string => join(NETNS_DIR, name);
export const since = (t0: number) => Math.round(performance.now() - t0);
export const secs = (ms: number) => `${(ms / 1000).toFixed(1)} s`;

/** Runs `fn` over `items`, at most `limit` at a time, keeping the order of results. */
export async function mapLimit<T, R>(items: readonly T[], limit: number, fn: (item: T) => Promise<R>): Promise<R[]> {
  const out: R[] = new Array(items.length);
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const i = next++;
      out[i] = await fn(items[i] as T);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return out;
}

/** Records a process the lab started after `labUp` (a restarted controller or agent) in the run's state, for clean-up. */
export function recordProcess(lab: RunningLab, role: string, pid: number | undefined): void {
  if (pid === undefined) return;
  lab.state = { ...lab.state, processes: [...lab.state.processes, { role, pid }] };
  lab.store.save(lab.state);
  const active = lab.runs.active;
  if (active?.state.runId === lab.state.runId) active.state = lab.state;
}

/** Copies the controller's, agents', containerds' and kubelets' logs to `toDir` (the run's directory goes with the run). */
export function saveLogs(plan: LabPlan, toDir: string, say: (l: string) => void): void {
  try {
    mkdirSync(toDir, { recursive: true });
    const containerdLogs = plan.nodes.map((n) => [join(n.dir, 'containerd', 'containerd.log'), `containerd-${n.name}.log`] as const);
    for (const [from, name] of [[plan.controller.logPath, 'controller.log'], ...plan.nodes.map((n) => [n.logPath, `agent-${n.name}.log`] as const), ...containerdLogs] as const) {
      if (existsSync(from)) copyFileSync(from, join(toDir, name));
    }
    // --kubernetes: each kubelet's log, and its containers' logs (the chart's agents, controller and relay among them)
    for (const n of plan.nodes) {
      const kubelet = join(n.dir, 'kubelet');
      if (existsSync(join(kubelet, 'kubelet.log'))) copyFileSync(join(kubelet, 'kubelet.log'), join(toDir, `kubelet-${n.name}.log`));
      if (existsSync(join(kubelet, 'pod-logs'))) cpSync(join(kubelet, 'pod-logs'), join(toDir, `pod-logs-${n.name}`), { recursive: true });
    }
    say(`  logs saved in ${toDir}`);
  } catch (err) {
    say(`  (could not save the logs in ${toDir}: ${asAtollError(err).message})`);
  }
}
