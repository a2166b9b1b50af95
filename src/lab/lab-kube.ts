/**
 * The lab's Kubernetes mode (`--kubernetes`): a real control plane in the cloud and a real kubelet per node; this file
 * starts them, waits for every Node, and reads the cluster back for the terminal and the report.
 *
 * - etcd, kube-apiserver, kube-controller-manager and kube-scheduler run in the controller's namespace; the
 *   apiserver listens on the controller's cloud address (192.0.2.2:6443), which edge nodes reach out through their
 *   NAT as they reach the Atoll controller.
 * - Every node's kubelet runs beside the node's private containerd, in its mount and network namespaces
 *   (src/lab/io/kube/kubelet.ts), registered as the Node of the plan's name with the node's underlay address and
 *   labels for its site, community and (edge sites) role; it authenticates as `system:node:<name>` with a token.
 *   A kube-proxy (nftables mode) runs in every node's namespace.
 * Every process is recorded in the run's state as it starts; the run's removal stops them by PID (kubelets before
 * containerds, whose mount namespace holds the kubelets' volume mounts).
 *
 * Beside it: Atoll installed as users install it, through its chart (src/lab/lab-kube-install.ts); the lab's pods and
 * workloads through the API (src/lab/lab-kube-pods.ts); the lab's Services (the Service check, a pod exposed alone:
 * src/lab/lab-kube-service.ts); the faults' Kubernetes forms (a sandbox crashed, the chart's containers killed, the
 * controller scaled, the agents rolled: src/lab/lab-kube-faults.ts).
 */
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { atollError } from '../core/errors.ts';
import {
  LAB_ATOLL_NAMESPACE, LAB_ETCD_PORTS, LAB_KUBE_API_PORT, LAB_KUBE_NAMESPACE, LAB_SERVICE_CIDR, labAdminNodeLabels, labNodeLabels, OPENYURT_NODEPOOL_LABEL,
} from './plan/kubernetes.ts';
import { CONTROLLER_USER_AGENT } from '../config/controller-config.ts';
import { LAB_CLUSTER_CIDR, LAB_POD_NAMESPACE, type LabNode, type LabPlan } from './plan/plan.ts';
import type { Containerd } from './io/containerd/containerd.ts';
import { startKubeControlPlane, type KubeControlPlane } from './io/kube/control-plane.ts';
import { kubeBinaries } from './io/kube/k8s-binaries.ts';
import { startKubeProxy, type KubeProxy } from './io/kube/kube-proxy.ts';
import { startKubelet, type Kubelet } from './io/kube/kubelet.ts';
import { NETNS_DIR } from './io/processes.ts';
import { sleep } from '../adapters/timers.ts';
import { exec } from '../adapters/exec.ts';
import { installRoot } from '../adapters/install-root.ts';
import { CLOUD_SITE } from './plan/spec.ts';
import { issueYurthubCertificates, makeLabCa, openyurtCharts, startYurthub, YURTHUB_PROXY_URL, type Yurthub } from './io/kube/yurthub.ts';

const NODES_READY_TIMEOUT_MS = 120_000;

/** The Kubernetes of a lab run. */
export interface LabKubernetes {
  readonly controlPlane: KubeControlPlane;
  /** The directory of the Kubernetes binaries (kubectl, helm, ...). */
  readonly bins: string;
  /** The nodes' kubelets, kube-proxies (and yurthubs): a node reboot replaces its entries. */
  readonly kubelets: ReadonlyMap<string, Kubelet>;
  readonly kubeProxies: ReadonlyMap<string, KubeProxy>;
  /** `--openyurt`: each edge node's yurthub. */
  readonly yurthubs: ReadonlyMap<string, Yurthub>;
  /** Runs kubectl as the admin in the controller's namespace; resolves with stdout. */
  kubectl(args: readonly string[], input?: string): Promise<string>;
  /** The command line that runs kubectl as the admin in the controller's namespace (for the terminal). */
  readonly kubectlCommand: readonly string[];
  /** Stops node `name`'s kube-proxy, kubelet and yurthub (a node reboot). */
  stopNode(name: string): Promise<void>;
  /** Starts them again beside `ctd` (the node's containerd, started again), as at boot. */
  startNode(node: LabNode, ctd: Containerd): Promise<void>;
}

export interface LabKubernetesInit {
  readonly plan: LabPlan;
  /** `--openyurt`: every edge node's kubelet and kube-proxy reach the API through that node's own yurthub. */
  readonly openyurt?: boolean;
  readonly containerds: ReadonlyMap<string, Containerd>;
  /** Records a process in the run's state as soon as it exists. */
  readonly record: (role: string, pid: number) => void;
}

export interface NodeJson {
  metadata: { name: string; labels?: Record<string, string> };
  status: { conditions?: { type: string; status: string }[]; addresses?: { type: string; address: string }[]; nodeInfo?: { kubeletVersion: string } };
}

/** The cluster as the API shows it, for the terminal and the report. */
export interface KubernetesView {
  readonly server: string;
  readonly nodes: readonly { name: string; ready: boolean; internalIp?: string; kubeletVersion?: string; labels: Record<string, string> }[];
  readonly pods: readonly { name: string; node?: string; ip?: string; phase?: string }[];
  /** Atoll's own pods (the chart's DaemonSets and Deployments, namespace {@link LAB_ATOLL_NAMESPACE}). */
  readonly atoll: readonly { name: string; node?: string; ready: boolean; restarts: number; image?: string }[];
}

/** Reads the Nodes and the lab's Pods from the API. */
export async function kubernetesView(kube: LabKubernetes): Promise<KubernetesView> {
  const nodes = (JSON.parse(await kube.kubectl(['get', 'nodes', '-o', 'json'])) as { items: NodeJson[] }).items;
  type Pod = { metadata: { name: string }; spec: { nodeName?: string }; status: { podIP?: string; phase?: string } };
  const pods = (JSON.parse(await kube.kubectl(['get', 'pods', '-n', LAB_POD_NAMESPACE, '-o', 'json'])) as { items: Pod[] }).items;
  // the labels Atoll reads (its own, OpenYurt's, KubeEdge's role), not the kubelet's kubernetes.io/os, hostname...
  const atoll = (labels: Record<string, string> = {}) => Object.fromEntries(Object.entries(labels).filter(([k]) => !k.includes('kubernetes.io/') || k.startsWith('node-role.kubernetes.io/')));
  return {
    server: kube.controlPlane.server,
    nodes: nodes.map((n) => ({
      name: n.metadata.name, ready: n.status.conditions?.some((c) => c.type === 'Ready' && c.status === 'True') ?? false,
      internalIp: n.status.addresses?.find((a) => a.type === 'InternalIP')?.address, kubeletVersion: n.status.nodeInfo?.kubeletVersion, labels: atoll(n.metadata.labels),
    })),
    pods: pods.map((p) => ({ name: p.metadata.name, node: p.spec.nodeName, ip: p.status.podIP, phase: p.status.phase })),
    atoll: (await atollPods(kube)).map((p) => ({
      name: p.metadata.name, node: p.spec.nodeName, ready: podReady(p), restarts: p.status.containerStatuses?.reduce((n, c) => n + c.restartCount, 0) ?? 0,
      image: p.status.containerStatuses?.[0]?.image,
    })),
  };
}

/**
 * Starts the control plane, then a kubelet per node, and resolves once every node is registered in the API (Ready
 * comes with the pod network: {@link installAtoll}).
 * @throws AtollError LAB_STEP_FAILED naming what did not come up, with log tails.
 */
export async function startLabKubernetes(init: LabKubernetesInit): Promise<LabKubernetes> {
  const { plan } = init;
  const bins = await kubeBinaries();
  const token = () => randomBytes(18).toString('base64url');
  const adminToken = token();
  const nodeTokens = new Map(plan.nodes.map((n) => [n.name, token()]));
  const proxyToken = token();
  const launcher = ['nsenter', `--net=${join(NETNS_DIR, plan.controller.netns)}`, '--'];
  const kubeDir = join(plan.dir, 'kube');
  // yurthubs authenticate with client certificates of a CA of the lab's that the apiserver trusts
  const openyurtCa = init.openyurt ? await makeLabCa(join(kubeDir, 'openyurt'), 'atoll-lab-openyurt-ca') : undefined;
  const controlPlane = await startKubeControlPlane({
    bins, dir: kubeDir, launcher, ...(openyurtCa ? { clientCaFile: openyurtCa.cert } : {}),
    address: plan.controller.address, ports: { etcdClient: LAB_ETCD_PORTS.client, etcdPeer: LAB_ETCD_PORTS.peer, api: LAB_KUBE_API_PORT },
    serviceCidr: LAB_SERVICE_CIDR, controllers: true,
    users: [{ token: adminToken, name: 'atoll-lab-admin', groups: ['system:masters'] },
      ...[...nodeTokens].map(([name, t]) => ({ token: t, name: `system:node:${name}`, groups: ['system:nodes'] })),
      { token: proxyToken, name: 'system:kube-proxy', groups: [] }],
  }).catch((err: Error) => {
    throw atollError('LAB_STEP_FAILED', `the Kubernetes control plane did not start: ${err.message}`, `read the logs under ${join(plan.dir, 'kube')}`, err);
  });
  for (const [role, pid] of Object.entries(controlPlane.pids)) init.record(role, pid);
  const adminKubeconfig = controlPlane.kubeconfig(adminToken, 'admin');
  const kubectl = (args: readonly string[], input?: string) => controlPlane.kubectl(adminKubeconfig, args, input);
  const kubelets = new Map<string, Kubelet>();
  const kubeProxies = new Map<string, KubeProxy>();
  const yurthubs = new Map<string, Yurthub>();
  const stop = async () => {
    for (const p of kubeProxies.values()) await p.stop();
    for (const k of kubelets.values()) await k.stop();
    for (const h of yurthubs.values()) await h.stop();
    await controlPlane.stop();
  };
  /**
   * Starts node `node`'s yurthub (`--openyurt`, edge nodes: its certificates issued `first`; a restart keeps its
   * cache and certificates), kubelet and kube-proxy beside `ctd`, each recorded in the run's state.
   */
  const startNode = async (node: LabNode, ctd: Containerd, first: boolean) => {
    let server = controlPlane.server;
    const extraLabels: Record<string, string> = {};
    if (openyurtCa && node.site !== CLOUD_SITE) {
      const dir = join(node.dir, 'yurthub');
      if (first) await issueYurthubCertificates(openyurtCa, node.name, join(dir, 'root', 'pki'), join(dir, 'certs'));
      const hub = await startYurthub({ binary: join(bins, 'yurthub'), dir, netnsPath: join(NETNS_DIR, node.netns), nodeName: node.name, pool: node.site,
        apiServer: { server: controlPlane.server, ca: controlPlane.ca } });
      yurthubs.set(node.name, hub);
      init.record(`yurthub ${node.name}`, hub.pid);
      server = YURTHUB_PROXY_URL;
      extraLabels[OPENYURT_NODEPOOL_LABEL] = node.site;
    }
    const kubelet = startKubelet({
      binary: join(bins, 'kubelet'), dir: join(node.dir, 'kubelet'), runtime: ctd, nodeName: node.name, nodeIp: node.underlay,
      labels: { ...labNodeLabels(node), ...extraLabels }, apiServer: { server, ca: controlPlane.ca, token: nodeTokens.get(node.name) as string },
      clientCa: controlPlane.kubeletClientCa,
    });
    kubelets.set(node.name, kubelet);
    init.record(`kubelet ${node.name}`, kubelet.pid);
    const proxy = startKubeProxy({
      binary: join(bins, 'kube-proxy'), dir: join(node.dir, 'kube-proxy'), netnsPath: join(NETNS_DIR, node.netns), nodeName: node.name,
      clusterCidr: LAB_CLUSTER_CIDR, apiServer: { server, ca: controlPlane.ca, token: proxyToken },
    });
    kubeProxies.set(node.name, proxy);
    init.record(`kube-proxy ${node.name}`, proxy.pid);
  };
  const stopNode = async (name: string) => {
    await kubeProxies.get(name)?.stop();
    await kubelets.get(name)?.stop();
    await yurthubs.get(name)?.stop();
  };
  try {
    if (openyurtCa) await installOpenyurt(kubectl, bins, plan);
    for (const node of plan.nodes) {
      const ctd = init.containerds.get(node.name);
      // cannot happen: the CRI pod runtime starts a containerd for every planned node or fails (CriPods.start)
      if (!ctd) throw new Error(`node ${node.name} has no containerd`);
      await startNode(node, ctd, true);
    }
    await waitForNodes(plan.nodes, kubelets, kubeProxies, kubectl, false);
    for (const node of plan.nodes) {
      const labels = Object.entries(labAdminNodeLabels(node));
      if (labels.length > 0) await kubectl(['label', 'node', node.name, '--overwrite', ...labels.map(([k, v]) => `${k}=${v}`)]);
    }
    await kubectl(['apply', '-f', '-'], JSON.stringify(LAB_KUBE_NAMESPACE));
  } catch (err) {
    await stop();
    throw atollError('LAB_STEP_FAILED', `Kubernetes nodes: ${(err as Error).message}`, 'read the kubelet log tails above', err);
  }
  return {
    controlPlane, bins, kubelets, kubeProxies, yurthubs, kubectl, kubectlCommand: [...launcher, join(bins, 'kubectl'), '--kubeconfig', adminKubeconfig],
    stopNode, startNode: (node, ctd) => startNode(node, ctd, false),
  };
}

/**
 * What yurthub needs of the cluster, from OpenYurt's own charts in the Go module cache: the NodePool CRD (yurt-manager's
 * chart), yurthub's RBAC and its `yurt-hub-cfg` ConfigMap (yurthub's chart, rendered with helm; `cache_agents` names
 * Atoll's controller, as the README tells OpenYurt users to), and a NodePool per edge site.
 */
async function installOpenyurt(kubectl: LabKubernetes['kubectl'], bins: string, plan: LabPlan): Promise<void> {
  const charts = await openyurtCharts(installRoot());
  await kubectl(['apply', '--server-side', '-f', join(charts, 'yurt-manager', 'crds', 'apps.openyurt.io_nodepools.yaml')]);
  await kubectl(['wait', '--for=condition=Established', '--timeout=60s', 'crd/nodepools.apps.openyurt.io']);
  const rendered = await exec(join(bins, 'helm'), ['template', 'yurthub', join(charts, 'yurthub'), '--namespace', 'kube-system',
    '--show-only', 'templates/yurthub-cfg.yaml', '--set', `cacheAgents=${CONTROLLER_USER_AGENT}`]);
  if (rendered.code !== 0) throw atollError('LAB_STEP_FAILED', `helm template of OpenYurt's yurthub chart failed: ${rendered.stderr.trim()}`, 'run make k8s again (it downloads the openyurt module)');
  await kubectl(['apply', '-f', '-'], rendered.stdout);
  const pools = [...new Set(plan.nodes.filter((n) => n.site !== CLOUD_SITE).map((n) => n.site))];
  for (const pool of pools) await kubectl(['apply', '-f', '-'], JSON.stringify({ apiVersion: 'apps.openyurt.io/v1beta2', kind: 'NodePool', metadata: { name: pool }, spec: { type: 'Edge' } }));
}

/**
 * Polls the Nodes until every planned node is registered (`ready` false) or Ready, failing fast when a kubelet or
 * kube-proxy exits; the error lists the others with their kubelet's log tail.
 */
async function waitForNodes(nodes: readonly LabNode[], kubelets: ReadonlyMap<string, Kubelet>, kubeProxies: ReadonlyMap<string, KubeProxy>, kubectl: LabKubernetes['kubectl'], ready: boolean): Promise<void> {
  const deadline = Date.now() + NODES_READY_TIMEOUT_MS;
  let notReady = nodes.map((n) => n.name);
  while (Date.now() < deadline) {
    const exited = [...[...kubelets].map(([n, k]) => [`kubelet of ${n}`, k] as const), ...[...kubeProxies].map(([n, p]) => [`kube-proxy of ${n}`, p] as const)].filter(([, p]) => !p.running);
    if (exited.length > 0) throw atollError('LAB_STEP_FAILED', exited.map(([what, p]) => `the ${what} exited:\n${p.logTail(20)}`).join('\n'), 'its log tail says why');
    const listed = await kubectl(['get', 'nodes', '-o', 'json']).then((out) => (JSON.parse(out) as { items: NodeJson[] }).items, () => []);
    const done = new Set(listed.filter((n) => !ready || n.status.conditions?.some((c) => c.type === 'Ready' && c.status === 'True')).map((n) => n.metadata.name));
    notReady = nodes.map((n) => n.name).filter((n) => !done.has(n));
    if (notReady.length === 0) return;
    await sleep(1000);
  }
  throw atollError('LAB_STEP_FAILED', `not ${ready ? 'Ready' : 'registered'} within ${NODES_READY_TIMEOUT_MS / 1000} s: ${notReady.join(', ')}\n${notReady.map((n) => `--- kubelet ${n}:\n${kubelets.get(n)?.logTail(15)}`).join('\n')}`,
    'the kubelets\' log tails say why');
}

export interface AtollPodJson {
  metadata: { name: string; labels?: Record<string, string> };
  spec: { nodeName?: string };
  status: { phase?: string; conditions?: { type: string; status: string }[]; containerStatuses?: { ready: boolean; restartCount: number; image?: string }[] };
}

export const podReady = (p: AtollPodJson) => p.status.conditions?.some((c) => c.type === 'Ready' && c.status === 'True') ?? false;

/** The chart's pods in {@link LAB_ATOLL_NAMESPACE}, from the API. */
export async function atollPods(kube: LabKubernetes): Promise<AtollPodJson[]> {
  return kube.kubectl(['get', 'pods', '-n', LAB_ATOLL_NAMESPACE, '-o', 'json']).then((out) => (JSON.parse(out) as { items: AtollPodJson[] }).items, () => []);
}
