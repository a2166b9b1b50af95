/**
 * The faults' Kubernetes forms (`--kubernetes`; what hits whom is planned in src/lab/plan/faults.ts, src/lab/faults.ts
 * runs them): a StatefulSet's pod deleted and re-created by its controller, a pod's sandbox killed as a crash would,
 * the chart's containers killed on their nodes, the controller's Deployment scaled, the agents rolled to another image
 * (and what a node holds compared across the roll), a Node deleted with its machine switched off, a restarted pod
 * reached while its site is cut off. What reads only the node (its containerd, a probe from inside its namespace)
 * works while its site is cut off from the API server.
 */
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { asAtollError, atollError } from '../core/errors.ts';
import {
  type AgentRestart, agentRestarts, type AtollPodSighting, ATOLL_POD_WATCH_TEMPLATE, LAB_ATOLL_NAMESPACE, LAB_NODE_DELETE_GRACE_SECONDS, LAB_OPS_PORTS, parseAtollPodLine,
} from './plan/kubernetes.ts';
import { LAB_POD_NAMESPACE, type LabNode, NODE_DEVICES } from './plan/plan.ts';
import { type Containerd, importImage, killTask } from './io/containerd/containerd.ts';
import { removeContainerdLeftovers } from './io/containerd/leftovers.ts';
import { IpRoute2 } from '../adapters/kernel/iproute2.ts';
import { Child } from './io/child-process.ts';
import { exec } from '../adapters/exec.ts';
import { NETNS_DIR } from './io/processes.ts';
import { sleep } from '../adapters/timers.ts';
import { enterSandbox, type LabPodInfo } from './lab-pods.ts';
import { flushConntrack, wipeNode } from './fault-actions.ts';
import { atollPods, type LabKubernetes, podReady } from './lab-kube.ts';
import { ATOLL_IMAGE_TAG, ATOLL_READY_TIMEOUT_MS, atollImageTarball } from './lab-kube-install.ts';
import { KubePods, POD_RUNNING_TIMEOUT_MS, sandboxOf, workloadPods } from './lab-kube-pods.ts';
import { ProbeClient } from './probe.ts';
import { nsPath, type RunningLab } from './running-lab.ts';

const ip = new IpRoute2();

/** The uid of pod `name` in namespace `lab` (undefined when it does not exist). */
async function podUid(kube: LabKubernetes, name: string): Promise<string | undefined> {
  return kube.kubectl(['get', 'pod', '-n', LAB_POD_NAMESPACE, name, '-o', 'jsonpath={.metadata.uid}']).then((out) => out.trim() || undefined, () => undefined);
}

/**
 * Deletes the StatefulSet's pod `current` through the API (waiting until it is gone) and waits until its controller
 * re-created it under the same name, Running with an IP (a new uid); returns it with its sandbox, `addMs` from the
 * deletion's end. @throws AtollError LAB_STEP_FAILED when it does not come back within {@link POD_RUNNING_TIMEOUT_MS}.
 */
export async function recreateStatefulPod(kube: LabKubernetes, containerds: ReadonlyMap<string, Containerd>, current: LabPodInfo): Promise<LabPodInfo> {
  const was = await podUid(kube, current.name);
  await kube.kubectl(['delete', 'pod', '-n', LAB_POD_NAMESPACE, current.name, '--wait=true', '--timeout=60s']);
  const t = performance.now();
  const deadline = Date.now() + POD_RUNNING_TIMEOUT_MS;
  for (;;) {
    const pod = (await workloadPods(kube)).find((p) => p.metadata.name === current.name);
    if (pod && (await podUid(kube, current.name)) !== was) {
      return sandboxOf(containerds, { name: pod.metadata.name, node: pod.spec.nodeName as string, ip: pod.status.podIP as string }, Math.round(performance.now() - t));
    }
    if (Date.now() > deadline) throw atollError('LAB_STEP_FAILED', `StatefulSet pod ${current.name} not back within ${POD_RUNNING_TIMEOUT_MS / 1000} s`, `kubectl describe pod -n ${LAB_POD_NAMESPACE} ${current.name}`);
    await sleep(250);
  }
}

/**
 * Kills the sandbox of `current` in its node's containerd (SIGKILL, as a crash would) and waits, without the API,
 * until its kubelet has a new ready sandbox for the pod; returns the pod as it runs now (the sandbox's IP and
 * network namespace), `addMs` from the kill. @throws AtollError LAB_STEP_FAILED when none comes within
 * {@link POD_RUNNING_TIMEOUT_MS}.
 */
export async function crashSandbox(containerds: ReadonlyMap<string, Containerd>, current: LabPodInfo): Promise<LabPodInfo> {
  const ctd = containerds.get(current.node);
  // cannot happen: `current` came from sandboxOf, which found its node's containerd in the same map
  if (!ctd) throw new Error(`node ${current.node} has no containerd`);
  const t = performance.now();
  await killTask(ctd, current.sandboxId);
  const deadline = Date.now() + POD_RUNNING_TIMEOUT_MS;
  for (;;) {
    const next = (await ctd.cri.listPodSandbox()).find((x) => x.namespace === LAB_POD_NAMESPACE && x.name === current.name && x.state === 'SANDBOX_READY' && x.id !== current.sandboxId);
    const sbx = next && await ctd.cri.podSandboxStatus(next.id);
    if (next && sbx?.netnsPath && sbx.ip) {
      return { name: current.name, node: current.node, netns: sbx.netnsPath, enter: enterSandbox(ctd, sbx.netnsPath), ip: sbx.ip, addMs: Math.round(performance.now() - t), sandboxId: next.id };
    }
    if (Date.now() > deadline) throw atollError('LAB_STEP_FAILED', `the kubelet of ${current.node} did not restart pod ${current.name} within ${POD_RUNNING_TIMEOUT_MS / 1000} s`, `read ${current.node}'s kubelet log`);
    await sleep(200);
  }
}

/** The chart's components a fault can kill in their container (each container is named after its component). */
export type AtollComponent = keyof typeof LAB_OPS_PORTS;

/** How long a killed container of the chart's gets to be running and ready again (a kubelet's crash back-off reaches 20 s on the third kill). */
const CONTAINER_RESTART_TIMEOUT_MS = 60_000;

/** One kill of a chart's container: when it was sent, and when its successor answered ready (performance.now()). */
export interface ContainerRestart {
  readonly node: string;
  readonly fromMs: number;
  readonly toMs: number;
}

/** The chart's container labels of `component`, as the kubelet sets them on its containers. */
const containerLabels = (component: AtollComponent) => ({ 'io.kubernetes.pod.namespace': LAB_ATOLL_NAMESPACE, 'io.kubernetes.container.name': component });

/** The nodes whose containerd runs a `component` container of the chart's now. */
export async function nodesRunning(containerds: ReadonlyMap<string, Containerd>, component: AtollComponent): Promise<string[]> {
  const found = await Promise.all([...containerds].map(async ([node, ctd]) => ((await ctd.cri.listContainers(containerLabels(component))).some((c) => c.state === 'CONTAINER_RUNNING') ? [node] : [])));
  return found.flat();
}

/**
 * Kills (SIGKILL) the running `component` container of the chart's pod on `node`, in that node's containerd, as a
 * crash would; then waits until its kubelet has started another one and it answers `/readyz` with 200 on the node's
 * address. It reads the node only (its containerd, and the probe from inside its namespace), so it works while the
 * node's site is cut off from the API server.
 * @throws AtollError LAB_STEP_FAILED when no such container runs there, or none is ready again in time.
 */
export async function killAtollContainer(containerds: ReadonlyMap<string, Containerd>, node: LabNode, component: AtollComponent): Promise<ContainerRestart> {
  const ctd = containerds.get(node.name);
  // cannot happen: `node` is a planned node, and the CRI pod runtime started a containerd for each (CriPods.start)
  if (!ctd) throw new Error(`node ${node.name} has no containerd`);
  const running = async () => (await ctd.cri.listContainers(containerLabels(component))).filter((c) => c.state === 'CONTAINER_RUNNING');
  const [victim, ...more] = await running();
  if (!victim || more.length > 0) {
    throw atollError('LAB_STEP_FAILED', `node ${node.name} runs ${more.length + (victim ? 1 : 0)} ${component} containers of the chart, not one`, `ctr -a ${ctd.socket} -n k8s.io containers ls`);
  }
  const fromMs = performance.now();
  await killTask(ctd, victim.id);
  const url = `http://${node.underlay}:${LAB_OPS_PORTS[component]}/readyz`;
  const ready = () => exec('curl', ['-s', '-m', '1', '-o', '/dev/null', '-w', '%{http_code}', url], { netns: join(NETNS_DIR, node.netns) }).then((r) => r.stdout.trim() === '200', () => false);
  const deadline = Date.now() + CONTAINER_RESTART_TIMEOUT_MS;
  for (;;) {
    // the old process answers until the kill lands: only a successor's answer counts
    if ((await running()).some((c) => c.id !== victim.id) && await ready()) return { node: node.name, fromMs, toMs: performance.now() };
    if (Date.now() > deadline) {
      throw atollError('LAB_STEP_FAILED', `the ${component} container killed on ${node.name} was not running and ready again within ${CONTAINER_RESTART_TIMEOUT_MS / 1000} s`, `read ${node.name}'s kubelet log, and the ${component}'s in its pod logs`);
    }
    await sleep(100);
  }
}

/** The chart's controller Deployment. */
const CONTROLLER_DEPLOYMENT = 'atoll-controller';

/**
 * Scales the chart's controller Deployment to `replicas` (`kubectl scale`) and waits until it has that many pods, every
 * one Ready, and no other (a replica that is stopping still counts).
 * @throws AtollError LAB_STEP_FAILED when it does not get there within the chart's start-up bound.
 */
export async function scaleController(kube: LabKubernetes, replicas: number): Promise<void> {
  await kube.kubectl(['scale', '-n', LAB_ATOLL_NAMESPACE, `deployment/${CONTROLLER_DEPLOYMENT}`, `--replicas=${replicas}`]);
  const deadline = Date.now() + ATOLL_READY_TIMEOUT_MS;
  for (;;) {
    const pods = (await atollPods(kube)).filter((p) => p.metadata.labels?.['app.kubernetes.io/component'] === 'controller');
    if (pods.length === replicas && pods.every(podReady)) return;
    if (Date.now() > deadline) {
      throw atollError('LAB_STEP_FAILED', `the controller did not get to ${replicas} Ready replicas within ${ATOLL_READY_TIMEOUT_MS / 1000} s (${pods.length} pods, ${pods.filter(podReady).length} Ready)`,
        `kubectl get pods -n ${LAB_ATOLL_NAMESPACE} -l app.kubernetes.io/component=controller`);
    }
    await sleep(250);
  }
}

/** Every pod's IP in namespace `lab`, by name, as the API has it. */
export async function podIps(kube: LabKubernetes): Promise<Map<string, string>> {
  type Pod = { metadata: { name: string }; status: { podIP?: string } };
  const items = (JSON.parse(await kube.kubectl(['get', 'pods', '-n', LAB_POD_NAMESPACE, '-o', 'json'])) as { items: Pod[] }).items;
  return new Map(items.map((p) => [p.metadata.name, p.status.podIP ?? '']));
}

/** The agents' DaemonSets of the chart. */
const AGENT_DAEMONSETS = ['atoll-agent-cloud', 'atoll-agent-edge'] as const;

/**
 * Rolls the agents to image `atoll.dev/atoll:<tag>` as an operator would: the image imported into every node's
 * containerd, `kubectl set image` on both DaemonSets (RollingUpdate, one node at a time each), then `kubectl rollout
 * status` until both are done. Meanwhile a watch of Atoll's pods times each node's agent restart.
 * @returns the restarts, as {@link agentRestarts} found them. @throws AtollError LAB_PREREQUISITE_MISSING without the
 * image; LAB_STEP_FAILED when the rollout does not finish.
 */
export async function rollAgents(kube: LabKubernetes, containerds: ReadonlyMap<string, Containerd>, tag: string): Promise<AgentRestart[]> {
  const tarball = atollImageTarball(tag);
  if (!existsSync(tarball)) throw atollError('LAB_PREREQUISITE_MISSING', `the agent-roll fault rolls to ${tarball}, which is not built`, `node_modules/.bin/node scripts/image.ts --tag ${tag}`);
  for (const ctd of containerds.values()) await importImage(ctd, tarball);
  const sightings: AtollPodSighting[] = [];
  // bounded: it ends by itself should this process die without stopping it
  const watch = new Child([...kube.kubectlCommand, 'get', 'pods', '-n', LAB_ATOLL_NAMESPACE, '--watch', `--request-timeout=${WATCH_MAX_S}s`, '-o', `jsonpath=${ATOLL_POD_WATCH_TEMPLATE}`], { output: 'stdout' });
  let partial = '';
  watch.stdout?.on('data', (d: Buffer) => {
    const lines = (partial + d.toString()).split('\n');
    partial = lines.pop() ?? '';
    const at = performance.now();
    for (const line of lines) {
      const s = parseAtollPodLine(line, at);
      if (s) sightings.push(s);
    }
  });
  try {
    // the watch's first list: every agent seen before anything changes
    const listed = Date.now() + WATCH_START_TIMEOUT_MS;
    while (sightings.length === 0 && Date.now() < listed) await sleep(50);
    for (const ds of AGENT_DAEMONSETS) await kube.kubectl(['set', 'image', '-n', LAB_ATOLL_NAMESPACE, `daemonset/${ds}`, `agent=atoll.dev/atoll:${tag}`]);
    await Promise.all(AGENT_DAEMONSETS.map((ds) => kube.kubectl(['rollout', 'status', '-n', LAB_ATOLL_NAMESPACE, `daemonset/${ds}`, '--timeout=300s']).catch((err: Error) => {
      throw atollError('LAB_STEP_FAILED', `rolling daemonset/${ds} to ${tag}: ${err.message}`, `kubectl get pods -n ${LAB_ATOLL_NAMESPACE} -o wide`, err);
    })));
    await sleep(WATCH_SETTLE_MS);
  } finally {
    await watch.stop();
  }
  return agentRestarts(sightings);
}

/** How long the watch of the roll may take to list Atoll's pods, and how long it runs on after the rollout is done. */
const WATCH_START_TIMEOUT_MS = 10_000;
const WATCH_SETTLE_MS = 1000;
/** The longest a watch of a roll may run: the rollouts' own bound (300 s) and a margin. */
const WATCH_MAX_S = 600;

/** The image tag the agent-roll fault rolls the agents to (`node scripts/image.ts --tag <it>`). */
export const ATOLL_ROLL_TAG = `${ATOLL_IMAGE_TAG}-b`;

/** How long a client of the site keeps trying the restarted pod while its site is cut (crash-offline). */
const REACH_TIMEOUT_MS = 15_000;

/**
 * `--kubernetes`: kills the chart's `component` container on each of `nodes` (default: every node running one) at
 * once and waits until each is running and ready again (src/lab/lab-kube-faults.ts killAtollContainer).
 */
export async function killAtollContainers(lab: RunningLab, component: AtollComponent, nodes?: readonly string[]): Promise<ContainerRestart[]> {
  const { containerds } = kubeOf(lab);
  const names = nodes ?? await nodesRunning(containerds, component);
  if (names.length === 0) throw atollError('LAB_STEP_FAILED', `no node runs the chart's ${component}`, `read the kubelets' logs in --keep-logs: the ${component}'s pods did not start`);
  return Promise.all(names.map((name) => {
    const n = lab.plan.nodes.find((x) => x.name === name);
    // cannot happen: faults name only the plan's own sites, nodes and pods (planFault)
    if (!n) throw new Error(`unknown node ${name}`);
    return killAtollContainer(containerds, n, component);
  }));
}

/** {@link killAtollContainers}, told as one line for the fault's facts. */
export async function killChartContainers(lab: RunningLab, component: AtollComponent, nodes?: readonly string[]): Promise<string> {
  const restarts = await killAtollContainers(lab, component, nodes);
  return `${component} container killed (SIGKILL) on ${restarts.map((r) => r.node).join(', ')}; running and ready again after ${restarts.map((r) => `${((r.toMs - r.fromMs) / 1000).toFixed(1)} s`).join(', ')}`;
}

/** The Kubernetes of a `--kubernetes` lab and its nodes' containerds, for the faults through it. */
export function kubeOf(lab: RunningLab): { kube: LabKubernetes; containerds: KubePods['containerds'] } {
  // cannot happen: planFault gives the Kubernetes forms only to a --kubernetes lab
  if (!lab.kubernetes || !(lab.podRuntime instanceof KubePods)) throw new Error('this fault goes through Kubernetes (--kubernetes)');
  return { kube: lab.kubernetes, containerds: lab.podRuntime.containerds };
}

/** How long the controller gets to release a deleted Node's blocks: its grace, then a resync or two. */
const RELEASE_TIMEOUT_MS = (LAB_NODE_DELETE_GRACE_SECONDS + 30) * 1000;

/**
 * `node-delete`: the node's kubelet and kube-proxy stopped and its containerd with every pod killed (the machine
 * switched off), `kubectl delete node`, then until the API holds no IPBlock of the node and no other node routes one
 * of its blocks. The node and its pods leave the lab (its plan, pods and workloads) for the rest of the run; its
 * namespace stays until the run's removal. Returns facts; what fails goes to `notes`.
 */
export async function deleteNode(lab: RunningLab, node: string, notes: string[]): Promise<string[]> {
  const { kube } = kubeOf(lab);
  const n = lab.plan.nodes.find((x) => x.name === node);
  const ctd = lab.state.containerds?.find((c) => c.node === node);
  // cannot happen: faults name only the plan's own sites, nodes and pods (planFault)
  if (!n || !ctd) throw new Error(`node ${node} has no containerd in the run`);
  let blocks: string[] = [];
  try {
    blocks = (JSON.parse(readFileSync(join(n.dataDir, 'cluster-state.json'), 'utf8')) as { blocks: string[] }).blocks;
  } catch (err) {
    notes.push(`could not read ${node}'s blocks: ${asAtollError(err).message}`);
  }
  const inApi = async () => (await kube.kubectl(['get', 'ipblocks', '-l', `atoll.dev/node=${node}`, '-o', 'name'])).trim().split('\n').filter(Boolean).length;
  const before = await inApi();
  await kube.kubelets.get(node)?.stop();
  await kube.kubeProxies.get(node)?.stop();
  await removeContainerdLeftovers(ctd);
  const t = performance.now();
  await kube.kubectl(['delete', 'node', node, '--wait=true', '--timeout=60s']);
  // from here on the lab goes on without it
  lab.plan = { ...lab.plan, nodes: lab.plan.nodes.filter((x) => x.name !== node), pods: lab.plan.pods.filter((p) => p.node !== node) };
  for (const list of [lab.pods, lab.workloadPods]) {
    for (let i = list.length - 1; i >= 0; i--) if (list[i]?.node === node) list.splice(i, 1);
  }
  const released = await waitUntilAsync(async () => (await inApi()) === 0, RELEASE_TIMEOUT_MS);
  const releasedMs = Math.round(performance.now() - t);
  if (!released) notes.push(`${node}'s IPBlocks still in the API ${RELEASE_TIMEOUT_MS / 1000} s after its deletion`);
  const routedBy = async () => (await Promise.all(lab.plan.nodes.map(async (x) => {
    const have = new Set((await ip.json<{ dst: string }>(['route', 'show', 'proto', '44'], { netns: nsPath(x.netns) })).map((r) => r.dst));
    return blocks.some((b) => have.has(b)) ? [x.name] : [];
  }))).flat();
  const dropped = await waitUntilAsync(async () => (await routedBy()).length === 0, RELEASE_TIMEOUT_MS);
  if (!dropped) notes.push(`still routing ${node}'s blocks ${blocks.join(', ')}: ${(await routedBy()).join(', ')}`);
  return [`${node} deleted: ${before} IPBlock${before === 1 ? '' : 's'} (${blocks.join(', ')}) released ${released ? `${(releasedMs / 1000).toFixed(1)} s after the deletion` : 'never'} (grace ${LAB_NODE_DELETE_GRACE_SECONDS} s), `
    + `${dropped ? `their routes gone from all ${lab.plan.nodes.length} other nodes ${((performance.now() - t) / 1000).toFixed(1)} s after it` : 'routes still held'}`];
}

async function waitUntilAsync(check: () => Promise<boolean>, timeoutMs: number): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await check().catch(() => false)) return true;
    if (Date.now() > deadline) return false;
    await sleep(500);
  }
}

/** What a node holds that a rolling update of its agent must leave alone: its routes of ours and its VTEP MAC. */
export async function nodeHoldings(lab: RunningLab): Promise<Map<string, string>> {
  return new Map(await Promise.all(lab.plan.nodes.map(async (n) => {
    const netns = nsPath(n.netns);
    const routes = (await ip.json<{ dst: string; dev?: string; gateway?: string }>(['route', 'show', 'proto', '44'], { netns })).map((r) => `${r.dst} ${r.dev ?? ''} ${r.gateway ?? ''}`).sort();
    const vtep = (await ip.json<{ address?: string }>(['link', 'show', NODE_DEVICES.overlay], { netns }).catch(() => []))[0]?.address ?? 'none';
    return [n.name, `vtep ${vtep}; routes ${routes.join(', ')}`] as const;
  })));
}

/**
 * `crash-offline`, while the site is cut off: from every other pod of the site and every node namespace of it, a TCP
 * echo to the restarted pod directly and through a ClusterIP Service in front of it only (made before the cut: the
 * site's kube-proxies keep its endpoint, which is still right because the pod kept its IP). Returns notes for what
 * failed, and the counts.
 */
export async function reachWhileCut(lab: RunningLab, site: string, pod: LabPodInfo, clusterIp: string): Promise<{ notes: string[]; line: string }> {
  const siteNodes = lab.plan.nodes.filter((n) => n.site === site);
  const clients = [
    ...lab.pods.filter((p) => p.name !== pod.name && siteNodes.some((n) => n.name === p.node)).map((p) => ({ from: p.name, enter: p.enter })),
    ...siteNodes.map((n) => ({ from: `node ${n.name}`, enter: ['nsenter', `--net=${nsPath(n.netns)}`, '--'] })),
  ];
  const server = new ProbeClient(pod.enter, pod.name, lab.state.dir);
  const probes = clients.map((c) => ({ ...c, probe: new ProbeClient(c.enter, c.from, lab.state.dir) }));
  try {
    await Promise.all([server.ready(), ...probes.map((p) => p.probe.ready())]);
    const tryTcp = async (probe: ProbeClient, to: string) => {
      const deadline = Date.now() + REACH_TIMEOUT_MS;
      for (;;) {
        if ((await probe.tcp(to, 2000)).ok) return true;
        if (Date.now() > deadline) return false;
        await sleep(500);
      }
    };
    const results = await Promise.all(probes.map(async (c) => ({ from: c.from, direct: await tryTcp(c.probe, pod.ip), service: await tryTcp(c.probe, clusterIp) })));
    const notes = results.flatMap((r) => [...(r.direct ? [] : [`${r.from} did not reach ${pod.name} at ${pod.ip} while the site was cut`]), ...(r.service ? [] : [`${r.from} did not reach ${pod.name} through Service ${clusterIp} while the site was cut`])]);
    const n = (k: 'direct' | 'service') => results.filter((r) => r[k]).length;
    return { notes, line: `while cut: ${n('direct')}/${results.length} of the site reached it directly, ${n('service')}/${results.length} through the Service` };
  } finally {
    await Promise.all([server.close(), ...probes.map((p) => p.probe.close())]);
  }
}

/** How long a rebooted node's pods get to come back, and its samples to answer again, before the cloud is back. */
const REBOOT_PODS_TIMEOUT_MS = 120_000;
const REBOOT_PATHS_TIMEOUT_MS = 60_000;

/**
 * `node-reboot-offline` (`--openyurt`), with the node's site already cut off from the cloud: the node "rebooted":
 * its kube-proxy, kubelet and yurthub stopped, its containerd killed with every container and sandbox (Atoll's agent
 * and keeper among them) and its state directory emptied, its kernel state (Atoll's devices and tables) gone; its
 * network namespace and directories kept, as a real node keeps its disks. Then, as at boot: containerd, yurthub,
 * kubelet and kube-proxy started again; the kubelet gets its pods from yurthub's cache. Waits until each pod of the
 * node in `lab.pods` (the lab's and the workloads') has a ready sandbox again (`replace` puts it in), then until `healthy`
 * (every sample answering since); never needs the cloud. Returns when the pods were back and the paths answered,
 * from the boot, and what the node held before and after (its VTEP MAC and routes); what fails goes to `notes`.
 */
export async function rebootNodeOffline(lab: RunningLab, nodeName: string, replace: (pod: string, now: LabPodInfo) => Promise<void>,
  healthy: (sinceMs: number) => boolean, notes: string[]): Promise<{ podsBackMs?: number; pathsBackMs?: number; facts: string[] }> {
  const { kube } = kubeOf(lab);
  const runtime = lab.podRuntime as KubePods;
  const node = lab.plan.nodes.find((n) => n.name === nodeName);
  // cannot happen: faults name only the plan's own sites, nodes and pods (planFault)
  if (!node) throw new Error(`unknown node ${nodeName}`);
  const held = (await nodeHoldings(lab)).get(nodeName);
  const ips = new Map(lab.pods.filter((p) => p.node === nodeName).map((p) => [p.name, p.ip]));
  const pods = [...ips.keys()];
  await kube.stopNode(nodeName);
  const ctd = await runtime.rebootContainerd(node);
  await forgetKernelState(lab, node);
  const boot = performance.now();
  await kube.startNode(node, ctd);
  const facts: string[] = [];
  const back = new Set<string>();
  const deadline = Date.now() + REBOOT_PODS_TIMEOUT_MS;
  while (back.size < pods.length && Date.now() < deadline) {
    for (const s of await ctd.cri.listPodSandbox().catch(() => [])) {
      if (s.namespace !== LAB_POD_NAMESPACE || !pods.includes(s.name) || back.has(s.name) || s.state !== 'SANDBOX_READY') continue;
      const sbx = await ctd.cri.podSandboxStatus(s.id).catch(() => undefined);
      if (!sbx?.netnsPath || !sbx.ip) continue;
      back.add(s.name);
      if (sbx.ip !== ips.get(s.name)) notes.push(`${s.name} came back with ${sbx.ip}, not its former ${ips.get(s.name)}`);
      await replace(s.name, { name: s.name, node: nodeName, netns: sbx.netnsPath, enter: enterSandbox(ctd, sbx.netnsPath), ip: sbx.ip, addMs: Math.round(performance.now() - boot), sandboxId: s.id });
    }
    if (back.size < pods.length) await sleep(250);
  }
  if (back.size < pods.length) {
    notes.push(`not back ${REBOOT_PODS_TIMEOUT_MS / 1000} s after the boot: ${pods.filter((p) => !back.has(p)).join(', ')}\n${kube.kubelets.get(nodeName)?.logTail(10)}`);
    return { facts };
  }
  const podsBackAt = performance.now();
  const podsBackMs = Math.round(podsBackAt - boot);
  const answered = await waitUntilAsync(async () => healthy(podsBackAt), REBOOT_PATHS_TIMEOUT_MS);
  const pathsBackMs = answered ? Math.round(performance.now() - podsBackAt) : undefined;
  if (!answered) notes.push(`the rebooted node's site and edge-to-edge pairs did not answer within ${REBOOT_PATHS_TIMEOUT_MS / 1000} s of its pods being back, while cut off`);
  const now = (await nodeHoldings(lab)).get(nodeName);
  if (now !== held) notes.push(`${nodeName} changed across its reboot: ${held} -> ${now}`);
  facts.push(`${nodeName} rebooted while cut off: its ${pods.length} pods Running again with their addresses ${(podsBackMs / 1000).toFixed(1)} s after the boot (yurthub's cache, no cloud), `
    + `their site and edge-to-edge pairs answering ${pathsBackMs === undefined ? 'never' : `${(pathsBackMs / 1000).toFixed(1)} s`} after that; VTEP MAC and routes ${now === held ? 'unchanged' : 'changed (notes)'}`);
  return { podsBackMs, ...(pathsBackMs === undefined ? {} : { pathsBackMs }), facts };
}

/**
 * What a reboot takes from a node's kernel that the lab made or Atoll did: its devices, its keeper, Atoll's nftables
 * tables, and its connection tracking (a stale entry kept a ping flow into the rebooted pod unanswered for good while
 * new flows worked: the first run of this fault).
 */
async function forgetKernelState(lab: RunningLab, node: LabNode): Promise<void> {
  await wipeNode(lab, node.name);
  await flushConntrack(node.netns);
  const netns = nsPath(node.netns);
  const tables = (await exec('ip', ['netns', 'exec', node.netns, 'nft', 'list', 'tables'])).stdout;
  for (const t of ['inet atoll_policy', 'bridge atoll_policy']) {
    if (tables.includes(`table ${t}\n`) || tables.endsWith(`table ${t}`)) await exec('nsenter', [`--net=${netns}`, '--', 'nft', 'delete', 'table', ...t.split(' ')]);
  }
}
