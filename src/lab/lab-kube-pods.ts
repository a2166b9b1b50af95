/**
 * The lab's pods through the Kubernetes API (`--kubernetes`, src/lab/lab-kube.ts): a Pod per planned pod, bound to
 * its node by `spec.nodeName`, running the test bed's image ({@link KubePods}); and the workloads, a Deployment and a
 * StatefulSet the scheduler places ({@link startWorkloads}). A pod's IP is read from the API, its network namespace
 * from its node's containerd (the sandbox the kubelet made), so the checks and faults enter it as under plain CRI.
 */
import { atollError } from '../core/errors.ts';
import { LAB_WORKLOAD_LABEL, LAB_WORKLOADS, labPodObject, labWorkloadObjects } from './plan/kubernetes.ts';
import { LAB_POD_NAMESPACE, type LabNode, type LabPlan, type LabPod } from './plan/plan.ts';
import type { Containerd } from './io/containerd/containerd.ts';
import { PAUSE_IMAGE_REF } from './io/containerd/pause-image.ts';
import { sleep } from '../adapters/timers.ts';
import { type CriPods, enterSandbox, type LabPodInfo, type LabPodRuntime, POD_CREATION } from './lab-pods.ts';
import { compareText } from '../core/order.ts';
import type { LabKubernetes } from './lab-kube.ts';

export const POD_RUNNING_TIMEOUT_MS = 90_000;

interface PodJson {
  status: { phase?: string; podIP?: string };
}

/** The lab's pods as Pods in the API, run by each node's kubelet through its containerd. */
export class KubePods implements LabPodRuntime {
  readonly mode = 'kubernetes';
  readonly description = POD_CREATION.kubernetes;
  readonly #cri: CriPods;
  readonly #kube: LabKubernetes;

  constructor(cri: CriPods, kube: LabKubernetes) {
    this.#cri = cri;
    this.#kube = kube;
  }

  /** Every node's containerd, by node name (where the kubelets run the pods). */
  get containerds(): ReadonlyMap<string, Containerd> {
    return this.#cri.containerds;
  }

  /** Node `node`'s containerd killed with every container and started again (a reboot: {@link CriPods.rebootNode}). */
  rebootContainerd(node: LabNode): Promise<Containerd> {
    return this.#cri.rebootNode(node);
  }

  agentLauncher(node: LabNode): string[] {
    return this.#cri.agentLauncher(node);
  }

  async create(pod: LabPod): Promise<LabPodInfo> {
    const t = performance.now();
    const fail = (what: string, cause?: unknown) => atollError('LAB_STEP_FAILED', `pod ${LAB_POD_NAMESPACE}/${pod.name} on ${pod.node}: ${what}`, `kubectl describe pod -n ${LAB_POD_NAMESPACE} ${pod.name}; read the kubelet's log`, cause);
    await this.#kube.kubectl(['apply', '-f', '-'], JSON.stringify(labPodObject(pod, PAUSE_IMAGE_REF))).catch((err: Error) => {
      throw fail(`apply failed: ${err.message}`, err);
    });
    const deadline = Date.now() + POD_RUNNING_TIMEOUT_MS;
    let status: PodJson['status'] = {};
    while (status.phase !== 'Running' || !status.podIP) {
      if (Date.now() > deadline) throw fail(`not Running with an IP within ${POD_RUNNING_TIMEOUT_MS / 1000} s (phase ${status.phase ?? 'unknown'})\n${this.#kube.kubelets.get(pod.node)?.logTail(15)}`);
      await sleep(250);
      status = await this.#kube.kubectl(['get', 'pod', '-n', LAB_POD_NAMESPACE, pod.name, '-o', 'json']).then((out) => (JSON.parse(out) as PodJson).status, () => ({}));
    }
    return sandboxOf(this.#cri.containerds, { name: pod.name, node: pod.node, ip: status.podIP }, Math.round(performance.now() - t)).catch((err: Error) => {
      throw fail(err.message, err);
    });
  }

  async recreate(pod: LabPod, _current: LabPodInfo): Promise<LabPodInfo> {
    await this.#kube.kubectl(['delete', 'pod', '-n', LAB_POD_NAMESPACE, pod.name, '--wait=true', '--timeout=60s']).catch((err: Error) => {
      throw atollError('LAB_STEP_FAILED', `deleting pod ${LAB_POD_NAMESPACE}/${pod.name} failed: ${err.message}`, 'read the kubelet\'s log', err);
    });
    return this.create(pod);
  }

  close(): void {
    this.#cri.close();
  }
}

/**
 * A Running pod of namespace `lab` as the lab's checks enter it: the ready sandbox its kubelet made in its node's
 * containerd (found by name), whose IP must be the one the API gives. @throws AtollError LAB_STEP_FAILED naming the
 * disagreement.
 */
export async function sandboxOf(containerds: ReadonlyMap<string, Containerd>, pod: { name: string; node: string; ip: string }, addMs?: number): Promise<LabPodInfo> {
  const ctd = containerds.get(pod.node);
  const where = `pod ${LAB_POD_NAMESPACE}/${pod.name} on ${pod.node}`;
  if (!ctd) throw atollError('LAB_STEP_FAILED', `${where}: the API puts it on a node without a containerd in the lab`, 'kubectl get nodes: only the lab\'s nodes should be registered');
  const sandbox = (await ctd.cri.listPodSandbox()).find((s) => s.namespace === LAB_POD_NAMESPACE && s.name === pod.name && s.state === 'SANDBOX_READY');
  if (!sandbox) throw atollError('LAB_STEP_FAILED', `${where}: Running in the API but no ready sandbox in ${ctd.socket}`, `read ${ctd.logPath}`);
  const sbx = await ctd.cri.podSandboxStatus(sandbox.id);
  if (!sbx.netnsPath) throw atollError('LAB_STEP_FAILED', `${where}: sandbox ${sandbox.id} reports no network namespace`, `read ${ctd.logPath}`);
  if (sbx.ip !== pod.ip) throw atollError('LAB_STEP_FAILED', `${where}: the API says IP ${pod.ip}, the sandbox ${sbx.ip}`, 'read the agent\'s log: the CNI result and the sandbox disagree');
  return { name: pod.name, node: pod.node, netns: sbx.netnsPath, enter: enterSandbox(ctd, sbx.netnsPath), ip: pod.ip, ...(addMs === undefined ? {} : { addMs }), sandboxId: sandbox.id };
}

interface WorkloadPodJson {
  metadata: { name: string; labels?: Record<string, string>; deletionTimestamp?: string };
  spec: { nodeName?: string };
  status: { phase?: string; podIP?: string };
}

/** The lab's workloads as they run: their pods (IPs from the API, entered through their sandboxes), by workload. */
export interface LabWorkloads {
  readonly deployment: readonly LabPodInfo[];
  readonly statefulSet: readonly LabPodInfo[];
  /** From applying them until every pod was Running with an IP, ms. */
  readonly readyMs: number;
}

/** The workloads' Running pods with an IP (not being deleted), from the API. */
export async function workloadPods(kube: LabKubernetes): Promise<WorkloadPodJson[]> {
  const selector = `${LAB_WORKLOAD_LABEL} in (${LAB_WORKLOADS.deployment},${LAB_WORKLOADS.statefulSet})`;
  const items = await kube.kubectl(['get', 'pods', '-n', LAB_POD_NAMESPACE, '-l', selector, '-o', 'json']).then((out) => (JSON.parse(out) as { items: WorkloadPodJson[] }).items, () => []);
  return items.filter((p) => p.status.phase === 'Running' && p.status.podIP && p.spec.nodeName && !p.metadata.deletionTimestamp);
}

/**
 * Applies the workloads ({@link labWorkloadObjects}: a Deployment and a StatefulSet, each with a pod per node), lets
 * the scheduler place them, waits until every pod is Running with an
 * IP (at most {@link POD_RUNNING_TIMEOUT_MS}) and returns them with their sandboxes.
 * @throws AtollError LAB_STEP_FAILED naming the pods missing.
 */
export async function startWorkloads(kube: LabKubernetes, init: { plan: LabPlan; containerds: ReadonlyMap<string, Containerd> }): Promise<LabWorkloads> {
  const t = performance.now();
  const nodes = init.plan.nodes.length;
  const want = { [LAB_WORKLOADS.deployment]: nodes, [LAB_WORKLOADS.statefulSet]: nodes };
  for (const obj of labWorkloadObjects({ nodes, image: PAUSE_IMAGE_REF })) {
    await kube.kubectl(['apply', '-f', '-'], JSON.stringify(obj));
  }
  const deadline = Date.now() + POD_RUNNING_TIMEOUT_MS;
  for (;;) {
    const pods = await workloadPods(kube);
    const of = (name: string) => pods.filter((p) => p.metadata.labels?.[LAB_WORKLOAD_LABEL] === name);
    const short = Object.entries(want).filter(([name, n]) => of(name).length < n);
    if (short.length === 0) {
      const info = (name: string) => Promise.all(of(name).sort((a, b) => compareText(a.metadata.name, b.metadata.name))
        .map((p) => sandboxOf(init.containerds, { name: p.metadata.name, node: p.spec.nodeName as string, ip: p.status.podIP as string })));
      const [deployment, statefulSet] = await Promise.all([info(LAB_WORKLOADS.deployment), info(LAB_WORKLOADS.statefulSet)]);
      return { deployment, statefulSet, readyMs: Math.round(performance.now() - t) };
    }
    if (Date.now() > deadline) {
      throw atollError('LAB_STEP_FAILED', `workloads not Running within ${POD_RUNNING_TIMEOUT_MS / 1000} s: ${short.map(([name, n]) => `${name} ${of(name).length}/${n}`).join(', ')}`,
        `kubectl get pods -n ${LAB_POD_NAMESPACE} -o wide; kubectl describe pods -n ${LAB_POD_NAMESPACE}`);
    }
    await sleep(500);
  }
}
