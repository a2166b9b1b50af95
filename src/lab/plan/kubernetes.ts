/**
 * The lab's Kubernetes mode (`atoll lab up|run --kubernetes`) as data: where the control plane listens in the cloud,
 * the labels each node's kubelet registers its Node with, and the Pod object of each lab pod. Pure; src/lab starts
 * the processes (src/lab/io/kube/control-plane.ts, src/lab/io/kube/kubelet.ts).
 */
import { LABEL_COMMUNITY, LABEL_KUBEEDGE_EDGE, LABEL_OPENYURT_EDGE, LABEL_SITE } from '../../core/kube/placement.ts';
import { LAB_BLOCK_BITS, LAB_CLUSTER_CIDR, LAB_CONTROLLER_PORT, LAB_POD_NAMESPACE, LAB_RELAY_PORT, type LabNode, type LabPlan, type LabPod } from './plan.ts';
import { CLOUD_SITE, type LabSpec, labUsesUdp } from './spec.ts';

/** kube-apiserver's port on the controller's cloud address (the nodes reach it there; edge nodes through their NAT). */
export const LAB_KUBE_API_PORT = 6443;
/** etcd's client and peer ports, on the loopback of the controller's namespace. */
export const LAB_ETCD_PORTS = Object.freeze({ client: 2379, peer: 2380 });
/** The Service range (no Service uses it yet; the apiserver needs one, disjoint from the pods' 10.100.0.0/16). */
export const LAB_SERVICE_CIDR = '10.96.0.0/16';
/** Seconds a lab pod is given to stop (its `sleep` ignores SIGTERM as PID 1). */
export const LAB_POD_GRACE_SECONDS = 1;

/**
 * The labels a lab node's kubelet registers its Node with: its site, community, and on edge sites
 * `openyurt.io/is-edge-worker=true` (a kubelet may not set `node-role.kubernetes.io/*` on itself: `--node-labels`
 * refuses the kubernetes.io namespace outside a short allowed list; {@link labAdminNodeLabels} adds KubeEdge's).
 */
export function labNodeLabels(node: Pick<LabNode, 'site' | 'community'>): Record<string, string> {
  return {
    [LABEL_SITE]: node.site,
    ...(node.community ? { [LABEL_COMMUNITY]: node.community } : {}),
    ...(node.site === CLOUD_SITE ? {} : { [LABEL_OPENYURT_EDGE]: 'true' }),
  };
}

/**
 * The labels the lab, as the cluster's admin, adds to a registered Node, as KubeEdge's `keadm join` does for its edge
 * nodes: `node-role.kubernetes.io/edge` (empty) on edge sites, nothing in the cloud.
 */
export function labAdminNodeLabels(node: Pick<LabNode, 'site'>): Record<string, string> {
  return node.site === CLOUD_SITE ? {} : { [LABEL_KUBEEDGE_EDGE]: '' };
}

/** OpenYurt's label of a Node's NodePool (`--openyurt`: each edge site is a pool). */
export const OPENYURT_NODEPOOL_LABEL = 'apps.openyurt.io/nodepool';

/** The Kubernetes namespace of the lab's pods, as an object to apply. */
export const LAB_KUBE_NAMESPACE = Object.freeze({ apiVersion: 'v1', kind: 'Namespace', metadata: { name: LAB_POD_NAMESPACE } });

/**
 * The Pod of lab pod `pod`: bound to its node by `spec.nodeName` (the plan places pods), running `image` (present
 * on every node: never pulled), stopped within a second; it never talks to the API, so it mounts no token.
 */
export function labPodObject(pod: Pick<LabPod, 'name' | 'node' | 'labels'>, image: string): Record<string, unknown> {
  return {
    apiVersion: 'v1', kind: 'Pod',
    metadata: { name: pod.name, namespace: LAB_POD_NAMESPACE, labels: { 'app.kubernetes.io/part-of': 'atoll-lab', ...pod.labels } },
    spec: {
      nodeName: pod.node,
      terminationGracePeriodSeconds: LAB_POD_GRACE_SECONDS,
      automountServiceAccountToken: false,
      containers: [{ name: 'sleep', image, imagePullPolicy: 'Never' }],
    },
  };
}

/** The label that puts a lab pod behind the lab's Service. */
export const LAB_SERVICE_LABEL = 'atoll.dev/lab-service';
export const LAB_SERVICE_NAME = 'lab-echo';

/** The ClusterIP Service in front of the lab pods labelled {@link LAB_SERVICE_LABEL}, on the TCP probe's echo port. */
export function labServiceObject(port: number): Record<string, unknown> {
  return {
    apiVersion: 'v1', kind: 'Service',
    metadata: { name: LAB_SERVICE_NAME, namespace: LAB_POD_NAMESPACE },
    spec: { type: 'ClusterIP', selector: { [LAB_SERVICE_LABEL]: LAB_SERVICE_NAME }, ports: [{ name: 'echo', protocol: 'TCP', port, targetPort: port }] },
  };
}

/** The label and the Service that put one pod alone behind a ClusterIP (the crash-offline fault). */
export const LAB_CRASH_LABEL = 'atoll.dev/lab-crash';
export const LAB_CRASH_SERVICE = 'lab-crash';

/** The ClusterIP Service in front of the one pod labelled {@link LAB_CRASH_LABEL}, on the TCP probe's echo port. */
export function labCrashServiceObject(port: number): Record<string, unknown> {
  return {
    apiVersion: 'v1', kind: 'Service',
    metadata: { name: LAB_CRASH_SERVICE, namespace: LAB_POD_NAMESPACE },
    spec: { type: 'ClusterIP', selector: { [LAB_CRASH_LABEL]: 'true' }, ports: [{ name: 'echo', protocol: 'TCP', port, targetPort: port }] },
  };
}

/**
 * The Service's endpoints: the pods of the last site that has pods (an edge site when there is one), so most
 * clients reach them across sites.
 */
export function labServiceBackends<P extends Pick<LabPod, 'name' | 'node'>>(pods: readonly P[], nodes: readonly Pick<LabNode, 'name' | 'site'>[]): P[] {
  const siteOf = (p: P) => nodes.find((n) => n.name === p.node)?.site;
  const site = siteOf(pods.at(-1) as P);
  return pods.filter((p) => siteOf(p) === site);
}

/** The Kubernetes view in one line, for the picture: the API server, Nodes Ready, Pods Running, the Service's endpoints and answers (pods and nodes). */
export function kubernetesLine(
  view: { readonly server: string; readonly nodes: readonly { readonly ready: boolean; readonly kubeletVersion?: string }[]; readonly pods: readonly { readonly phase?: string }[] },
  service?: { readonly clusterIp: string; readonly port: number; readonly backends?: readonly string[]; readonly probes: readonly { readonly ok: boolean }[] },
): string {
  const version = view.nodes.find((n) => n.kubeletVersion)?.kubeletVersion;
  const parts = [
    `Kubernetes${version ? ` ${version}` : ''} at ${view.server.replace(/^https:\/\//, '')}: ${view.nodes.filter((n) => n.ready).length}/${view.nodes.length} Nodes Ready`,
    `${view.pods.filter((p) => p.phase === 'Running').length}/${view.pods.length} Pods Running`,
    ...(service ? [`Service ${service.clusterIp}:${service.port}${service.backends?.length ? ` (endpoints ${service.backends.join(', ')})` : ''} answered ${service.probes.filter((p) => p.ok).length}/${service.probes.length}`] : []),
  ];
  return parts.join(', ');
}

/** How long the lab's controller waits after a Node's deletion before releasing its blocks (the chart's default is 60 s). */
export const LAB_NODE_DELETE_GRACE_SECONDS = 10;

/** The namespace Atoll is installed in (the chart's release namespace, as the README's install uses). */
export const LAB_ATOLL_NAMESPACE = 'atoll-system';

/**
 * The chart's values for the lab, as an operator would write them for this cluster: the lab's pod range and block
 * size, the edge sites' community (when they share one; the nodes' `atoll.dev/community` labels say it per site
 * anyway), the image `tag`, one controller replica per cloud node (their anti-affinity puts one on each), dialled
 * at the cloud nodes' addresses (what edges reach through their NAT), releasing a deleted Node's blocks after
 * {@link LAB_NODE_DELETE_GRACE_SECONDS}, the relay on the first cloud node at its address, and with `networkPolicy`
 * (`--policy`) the agents enforcing NetworkPolicy. Every other value keeps the chart's default.
 */
export function labChartValues(plan: Pick<LabPlan, 'nodes'> & { readonly spec: Pick<LabSpec, 'tunnelUdp'> }, tag: string, opts: { readonly networkPolicy?: boolean } = {}): Record<string, unknown> {
  const { controllers, relay } = labChartEndpoints(plan);
  const communities = [...new Set(plan.nodes.filter((n) => n.site !== CLOUD_SITE).map((n) => n.community))];
  const agent = labUsesUdp(plan.spec) ? {} : { udp: false };
  return {
    image: { tag },
    clusterCidrs: [LAB_CLUSTER_CIDR],
    blockBits: LAB_BLOCK_BITS,
    community: communities.length === 1 ? communities[0] : '',
    controller: { replicas: controllers.length, urls: controllers.map((a) => `https://${a}`), nodeDeleteGraceSeconds: LAB_NODE_DELETE_GRACE_SECONDS },
    relay: { address: relay.address, nodeSelector: { 'kubernetes.io/hostname': relay.node } },
    metrics: { agentPort: LAB_OPS_PORTS.agent, controllerPort: LAB_OPS_PORTS.controller, relayPort: LAB_OPS_PORTS.relay },
    ...(Object.keys(agent).length > 0 ? { agent } : {}),
    // the chart's default criSocket, /run/containerd/containerd.sock, is where each lab node's containerd serves
    ...(opts.networkPolicy ? { networkPolicy: { enabled: true } } : {}),
  };
}

/**
 * The operations port of each of the chart's components (`/readyz`, on the node's address: every Atoll pod runs on
 * the host network); the lab sets them and its faults probe them.
 */
export const LAB_OPS_PORTS = Object.freeze({ agent: 9470, controller: 9471, relay: 9472 });

/**
 * Where the chart's pods listen in the lab (host network): a controller replica on every cloud node, the relay on
 * the first one. The lab's own controller and relay addresses (in the `ctl` namespace) are unused in this mode.
 * @throws Error when the lab has no cloud node (a spec the lab refuses: labSpecProblems).
 */
export function labChartEndpoints(plan: Pick<LabPlan, 'nodes'>): { controllers: string[]; relay: { node: string; address: string } } {
  const cloud = plan.nodes.filter((n) => n.site === CLOUD_SITE);
  const first = cloud[0];
  // cannot happen: labSpecProblems refuses a spec without a cloud node (src/lab/plan/spec.ts)
  if (!first) throw new Error('the lab has no cloud node for the controller and the relay');
  return { controllers: cloud.map((n) => `${n.underlay}:${LAB_CONTROLLER_PORT}`), relay: { node: first.name, address: `${first.underlay}:${LAB_RELAY_PORT}` } };
}

/** The lab's workloads (`lab run --kubernetes`): a Deployment with a pod on every node and a StatefulSet. */
export const LAB_WORKLOADS = Object.freeze({ deployment: 'lab-web', statefulSet: 'lab-db' });
/** The label every workload pod carries (the workload's name). */
export const LAB_WORKLOAD_LABEL = 'app.kubernetes.io/name';

/** A workload's pod template: the test bed's image, never pulled, no token, one pod per node at most (hostname spread). */
function workloadTemplate(name: string, image: string): Record<string, unknown> {
  return {
    metadata: { labels: { [LAB_WORKLOAD_LABEL]: name, 'app.kubernetes.io/part-of': 'atoll-lab' } },
    spec: {
      terminationGracePeriodSeconds: LAB_POD_GRACE_SECONDS,
      automountServiceAccountToken: false,
      topologySpreadConstraints: [{ maxSkew: 1, topologyKey: 'kubernetes.io/hostname', whenUnsatisfiable: 'DoNotSchedule', labelSelector: { matchLabels: { [LAB_WORKLOAD_LABEL]: name } } }],
      containers: [{ name: 'sleep', image, imagePullPolicy: 'Never' }],
    },
  };
}

/**
 * The workloads as objects to apply, in namespace `lab`: Deployment {@link LAB_WORKLOADS}.deployment and
 * StatefulSet {@link LAB_WORKLOADS}.statefulSet (behind its headless Service), each with one replica per node: the
 * hostname spread with a skew of 1 puts one on each, and sends a StatefulSet pod deleted and re-created under its
 * name back to the one node without one, its own (where Atoll keeps its address for it). The scheduler places them;
 * their addresses come from the API.
 */
export function labWorkloadObjects(init: { nodes: number; image: string }): Record<string, unknown>[] {
  const { deployment, statefulSet } = LAB_WORKLOADS;
  const selector = (name: string) => ({ matchLabels: { [LAB_WORKLOAD_LABEL]: name } });
  return [
    { apiVersion: 'apps/v1', kind: 'Deployment', metadata: { name: deployment, namespace: LAB_POD_NAMESPACE },
      spec: { replicas: init.nodes, selector: selector(deployment), template: workloadTemplate(deployment, init.image) } },
    { apiVersion: 'v1', kind: 'Service', metadata: { name: statefulSet, namespace: LAB_POD_NAMESPACE },
      spec: { clusterIP: 'None', selector: { [LAB_WORKLOAD_LABEL]: statefulSet }, ports: [{ name: 'echo', port: 7777 }] } },
    { apiVersion: 'apps/v1', kind: 'StatefulSet', metadata: { name: statefulSet, namespace: LAB_POD_NAMESPACE },
      spec: { replicas: init.nodes, serviceName: statefulSet, podManagementPolicy: 'Parallel', selector: selector(statefulSet), template: workloadTemplate(statefulSet, init.image) } },
  ];
}

/** What a watch of Atoll's pods (namespace atoll-system) showed of one pod at one moment. */
export interface AtollPodSighting {
  readonly atMs: number;
  readonly pod: string;
  /** '' while it is not scheduled. */
  readonly node: string;
  /** Its deletion began (the kubelet is stopping it). */
  readonly deleting: boolean;
  readonly ready: boolean;
}

/** One agent's restart in a roll: from its old pod's deletion seen to the first sight of its successor ready. */
export interface AgentRestart {
  readonly node: string;
  readonly fromMs: number;
  /** Absent while the successor was not seen ready. */
  readonly toMs?: number;
}

/**
 * Each node's agent restarts in a DaemonSet roll, from the watch's sightings in order: one opens when a pod of that
 * node is first seen being deleted (later sightings of that pod, its last one included, open nothing), and closes at
 * the first sight of another pod of that node ready and not being deleted. A pod ready when the watch began opens
 * nothing.
 */
export function agentRestarts(sightings: readonly AtollPodSighting[]): AgentRestart[] {
  const done: AgentRestart[] = [];
  const open = new Map<string, { pod: string; fromMs: number }>();
  const stopping = new Set<string>();
  for (const s of sightings) {
    if (s.node === '') continue;
    const o = open.get(s.node);
    if (s.deleting) {
      if (!stopping.has(s.pod) && !o) open.set(s.node, { pod: s.pod, fromMs: s.atMs });
      stopping.add(s.pod);
    } else if (o && s.ready && s.pod !== o.pod) {
      done.push({ node: s.node, fromMs: o.fromMs, toMs: s.atMs });
      open.delete(s.node);
    }
  }
  return [...done, ...[...open].map(([node, o]) => ({ node, fromMs: o.fromMs }))];
}

/**
 * Parses one line of `kubectl get pods -w -o jsonpath=`{@link ATOLL_POD_WATCH_TEMPLATE} seen at `atMs`: name, node,
 * deletion timestamp and Ready status, separated by `|` (kubectl's watch
 * aligns tabs into spaces, and a name cannot hold a `|`). @returns undefined for anything else.
 */
export function parseAtollPodLine(line: string, atMs: number): AtollPodSighting | undefined {
  const f = line.split('|');
  if (f.length !== 4 || f[0] === '') return undefined;
  return { atMs, pod: f[0] as string, node: f[1] as string, deleting: f[2] !== '', ready: f[3] === 'True' };
}

/** The jsonpath template of {@link parseAtollPodLine}: one line per pod and event. */
export const ATOLL_POD_WATCH_TEMPLATE = '{.metadata.name}{"|"}{.spec.nodeName}{"|"}{.metadata.deletionTimestamp}{"|"}{.status.conditions[?(@.type=="Ready")].status}{"\\n"}';
