/**
 * The lab's faults as data: which faults exist, whom each one hits in a given {@link LabPlan}, which pod pairs are
 * pinged continuously while it lasts, and the nftables rulesets that cut an edge uplink or a path. Pure;
 * `src/lab/faults.ts` applies the faults; ./fault-samples.ts computes loss and convergence from the ping replies, and
 * ./fault-results.ts judges each fault and draws the terminal table.
 *
 * A fault runs as: start the sample pings, apply the fault, hold it, heal it, wait (bounded) until every sample
 * answers again, stop the pings, then the whole connectivity matrix again: every cell that should work must work.
 */
import { CLOUD_SITE, labUsesUdp } from './spec.ts';
import { type LabPlan, udpBlockedAt } from './plan.ts';
import { expectationOf, expectedPath, type LabPath } from './paths.ts';
import { LAB_POLICY_NAMES } from './policy.ts';

export type LabFaultKind = 'controller-kill' | 'relay-kill' | 'direct-path-cut' | 'agent-restart' | 'offline-restart' | 'pod-recreate' | 'uplink-cut' | 'uplink-flap' | 'node-reboot'
  | 'offline-restart-all' | 'nat-reboot-offline' | 'clock-jump' | 'readdress-offline' | 'statefulset-recreate' | 'crash-offline' | 'policy-offline' | 'node-reboot-offline' | 'agent-roll'
  | 'node-delete';

/** Every fault, in the order `--faults all` runs them. */
export const LAB_FAULTS: readonly LabFaultKind[] = Object.freeze(['controller-kill', 'relay-kill', 'direct-path-cut', 'agent-restart', 'offline-restart', 'pod-recreate', 'uplink-cut', 'uplink-flap', 'node-reboot',
  'offline-restart-all', 'nat-reboot-offline', 'clock-jump', 'readdress-offline', 'statefulset-recreate', 'crash-offline', 'policy-offline', 'node-reboot-offline', 'agent-roll', 'node-delete']);

/** Faults through Kubernetes, only with `--kubernetes` (`all` without it leaves them out). */
export const LAB_KUBERNETES_FAULTS: readonly LabFaultKind[] = Object.freeze(['statefulset-recreate', 'crash-offline', 'policy-offline', 'node-reboot-offline', 'agent-roll', 'node-delete']);

/** nftables table the uplink faults add in an edge router (beside the NAT's `atoll-lab`). */
export const LAB_FAULT_NFT_TABLE = 'atoll-lab-fault';

/** Parses `--faults`: `all`, `none` or a comma-separated list of {@link LabFaultKind}. */
export function parseFaultList(text: string, opts: { kubernetes?: boolean } = {}): { faults: LabFaultKind[]; problems: string[] } {
  const t = text.trim();
  if (t === 'all') return { faults: LAB_FAULTS.filter((f) => opts.kubernetes || !LAB_KUBERNETES_FAULTS.includes(f)), problems: [] };
  if (t === 'none' || t === '') return { faults: [], problems: [] };
  const faults: LabFaultKind[] = [];
  const problems: string[] = [];
  for (const name of t.split(',').map((s) => s.trim()).filter(Boolean)) {
    if (!(LAB_FAULTS as readonly string[]).includes(name)) problems.push(`unknown fault "${name}" (known: ${LAB_FAULTS.join(', ')}, or all, none)`);
    else if (!opts.kubernetes && LAB_KUBERNETES_FAULTS.includes(name as LabFaultKind)) problems.push(`fault "${name}" goes through Kubernetes: it needs --kubernetes`);
    else if (!faults.includes(name as LabFaultKind)) faults.push(name as LabFaultKind);
  }
  return { faults: LAB_FAULTS.filter((f) => faults.includes(f)), problems };
}

export interface LabPodPair {
  readonly from: string;
  readonly to: string;
}

/** What every fault target has: what is watched while it lasts. */
interface LabFaultWatch {
  /** One line for the terminal, e.g. `agent of a-1 killed (SIGKILL) and restarted`. */
  readonly description: string;
  /** Pod pairs pinged continuously (pairs that should work when the lab is healthy). */
  readonly samples: readonly LabPodPair[];
  /** Pod pairs with a TCP connection held open through the fault, exchanging a line every 100 ms: none may break. */
  readonly flows: readonly LabPodPair[];
  /** Whether the samples are expected to keep answering while the fault lasts (the agents work offline). */
  readonly lossless: boolean;
  /**
   * Faults of a site cut off from the cloud: samples that may lose nothing at all (same-site VXLAN pairs), and whether
   * the others may lose packets only inside the fault's windows (an agent's restart and 1 s after it; 5 s after a NAT
   * reboot; none for a clock jump), which the run records.
   */
  readonly strict?: { readonly lossFree: readonly LabPodPair[] };
  /**
   * Pod pairs the lab's NetworkPolicies deny (`--policy`) that the fault's restarts touch, pinged from before the fault
   * until the samples recover: none may get a single reply, at any moment.
   */
  readonly denied?: readonly LabPodPair[];
}

/** Whom each kind of fault hits. */
interface LabFaultHits {
  readonly 'controller-kill': object;
  readonly 'relay-kill': object;
  /** `site`'s router drops everything to and from `peerAddress` (another edge router's public address). */
  readonly 'direct-path-cut': { readonly site: string; readonly peerAddress: string };
  readonly 'agent-restart': { readonly node: string };
  readonly 'offline-restart': { readonly node: string };
  readonly 'pod-recreate': { readonly node: string; readonly pod: string };
  readonly 'uplink-cut': { readonly site: string };
  readonly 'uplink-flap': { readonly site: string };
  readonly 'node-reboot': { readonly site: string; readonly node: string };
  /** The StatefulSet's pod on `node`, deleted through the API; its controller re-creates it under its name. */
  readonly 'statefulset-recreate': { readonly node: string; readonly pod: string };
  /** `site`'s uplink cut; meanwhile `pod`'s sandbox on `node` is killed and its kubelet restarts it offline. */
  readonly 'crash-offline': { readonly site: string; readonly node: string; readonly pod: string };
  /**
   * `site` cut off from the cloud, then `policy` deleted through the API: `held` (pairs into `site` it denied, on paths
   * the cut leaves up) must stay blocked until the heal and answer soon after it; `opened` (pairs elsewhere it denied)
   * must answer while the site is still cut off. Afterwards the lab's policies are applied again.
   */
  readonly 'policy-offline': { readonly site: string; readonly cloud: readonly string[]; readonly policy: string; readonly held: readonly LabPodPair[]; readonly opened: readonly LabPodPair[] };
  /**
   * `site` cut off from the cloud (`cloud`), then `node` rebooted (`--openyurt`): its kubelet, kube-proxy and yurthub
   * stopped, its containerd killed with every container (Atoll's agent and keeper among them), its kernel state gone;
   * then everything started again as at boot, the kubelet getting its pods from yurthub's cache. Its pods must come
   * back with their addresses, `vxlan` (pairs with the site's other node) and `punched` (edge-to-edge) work again, all
   * before the cloud is back.
   */
  readonly 'node-reboot-offline': { readonly site: string; readonly cloud: readonly string[]; readonly node: string; readonly vxlan: readonly LabPodPair[]; readonly punched: readonly LabPodPair[] };
  /** The agents' DaemonSets rolled to another image tag. */
  readonly 'agent-roll': object;
  /** `node` taken out of the cluster for good (its kubelet and containerd stopped, `kubectl delete node`). */
  readonly 'node-delete': { readonly node: string };
  /**
   * `site` cut off from every cloud address (`cloud`, its router's drop rule), then each agent of `nodes` restarted in
   * turn, the first one held down long enough that `watcher` (its hole-punched peer in another site) shows the path
   * being rebuilt without the relay.
   */
  readonly 'offline-restart-all': { readonly site: string; readonly cloud: readonly string[]; readonly nodes: readonly string[]; readonly watcher: string };
  /** `site` cut off from the cloud, then its router's connection tracking flushed (its NAT rebooted). */
  readonly 'nat-reboot-offline': { readonly site: string; readonly cloud: readonly string[] };
  /** `site` cut off from the cloud, then the clocks (wall and monotonic) of its `nodes`' agents jump by days. */
  readonly 'clock-jump': { readonly site: string; readonly cloud: readonly string[]; readonly nodes: readonly string[] };
  /**
   * `site` cut off from the cloud, then every edge site's router takes a new public address (`moves`, CIDR): a pair
   * whose both addresses changed cannot find itself without a coordinator; `watcher` shows `watched` being rebuilt
   * meanwhile, and all heals once the cloud is back. Afterwards the addresses are moved back.
   */
  readonly 'readdress-offline': {
    readonly site: string; readonly cloud: readonly string[]; readonly watcher: string; readonly watched: string;
    readonly moves: readonly { readonly site: string; readonly from: string; readonly to: string }[];
  };
}

/** The target of one kind of fault: whom it hits and what is watched while it lasts. */
export type LabFaultTargetOf<K extends LabFaultKind> = LabFaultWatch & { readonly kind: K } & LabFaultHits[K];

/** Whom a fault hits, by kind, and what is watched while it lasts. */
export type LabFaultTarget = { [K in LabFaultKind]: LabFaultTargetOf<K> }[LabFaultKind];

/** A fault that cannot run in a lab, and why. */
export interface LabFaultSkipped {
  readonly kind: LabFaultKind;
  readonly skipped: string;
}

const MAX_SAMPLES = 4;

/** A workload pod placed by the scheduler (`--kubernetes`), for the faults that go through it. */
export interface LabWorkloadPod {
  readonly name: string;
  readonly node: string;
  readonly workload: 'deployment' | 'statefulset';
}

/**
 * The target of `kind` in `plan`, or the reason it cannot run there (e.g. an uplink fault without edge sites).
 * Deterministic: the first edge site, its first node and that node's first pod. The pairs sampled for loss are pairs
 * that must work: allowed by the topology, and not denied by `policyDenies` (the lab's NetworkPolicies, `--policy`).
 */
export function planFault(plan: LabPlan, kind: LabFaultKind, pods: 'cri' | 'direct' | 'kubernetes' = 'direct', workloads: readonly LabWorkloadPod[] = [],
  policyDenies: (from: string, to: string) => string | undefined = () => undefined, opts: { readonly openyurt?: boolean } = {}): LabFaultTarget | LabFaultSkipped {
  const podsOf = (node: string) => plan.pods.filter((p) => p.node === node).map((p) => p.name);
  const nodeOf = (pod: string) => plan.pods.find((p) => p.name === pod)?.node ?? workloads.find((p) => p.name === pod)?.node;
  const cloudPod = plan.pods.find((p) => plan.nodes.find((n) => n.name === p.node)?.site === CLOUD_SITE)?.name;
  const edgeSite = plan.spec.edges[0]?.name;
  const edgeNodes = plan.nodes.filter((n) => n.site === edgeSite);
  const reachable = (a: string, b: string) => {
    const na = nodeOf(a);
    const nb = nodeOf(b);
    return na !== undefined && nb !== undefined && a !== b && expectationOf(expectedPath(plan, na, nb)) === 'reachable';
  };
  const works = (a: string, b: string) => reachable(a, b) && policyDenies(a, b) === undefined;
  const pathOf = (a: string, b: string) => expectedPath(plan, nodeOf(a) ?? '', nodeOf(b) ?? '');
  /** Pairs of lab pods the policies deny (by `policy`, when given) that the topology lets through, as `keep` chooses. */
  const deniedPairs = (keep: (from: string, to: string) => boolean, policy?: string): LabPodPair[] => plan.pods.flatMap((a) => plan.pods
    .filter((b) => reachable(a.name, b.name) && keep(a.name, b.name) && (policy === undefined ? policyDenies(a.name, b.name) !== undefined : policyDenies(a.name, b.name) === policy))
    .map((b) => ({ from: a.name, to: b.name })));
  /** Denied pairs with an end on `nodes`, on paths a cut leaves up (`inside`: both ends in the site cut off), for the restarts. */
  const deniedAround = (nodes: readonly string[], inside?: (pod: string) => boolean): { denied?: LabPodPair[] } => {
    const list = deniedPairs((a, b) => [a, b].some((p) => nodes.includes(nodeOf(p) ?? '')) && (inside === undefined || (inside(a) && inside(b)))).slice(0, MAX_SAMPLES);
    return list.length > 0 ? { denied: list } : {};
  };
  const pairs = (list: readonly (readonly [string | undefined, string | undefined])[]): LabPodPair[] => {
    const out: LabPodPair[] = [];
    for (const [from, to] of list) {
      if (from === undefined || to === undefined || !works(from, to) || out.some((p) => p.from === from && p.to === to)) continue;
      out.push({ from, to });
    }
    return out.slice(0, MAX_SAMPLES);
  };
  // the node a node-level fault hits: the first edge node, or the last cloud node when there are no edge sites
  const node = edgeNodes[0] ?? plan.nodes.filter((n) => n.site === CLOUD_SITE).at(-1);
  const nodePods = node ? podsOf(node.name) : [];
  const sameSitePod = node ? plan.nodes.filter((n) => n.site === node.site && n.name !== node.name).flatMap((n) => podsOf(n.name))[0] : undefined;
  const sitePods = edgeNodes.map((n) => podsOf(n.name)[0]);
  if (pods !== 'kubernetes' && LAB_KUBERNETES_FAULTS.includes(kind)) return { kind, skipped: 'it goes through Kubernetes (--kubernetes)' };
  // with --kubernetes the chart's pods run the controller, the relay and the agents: a kill is their container's, and
  // its kubelet starts it again
  const k8s = pods === 'kubernetes';
  switch (kind) {
    case 'controller-kill': {
      const firstOfEach = plan.spec.edges.map((e) => plan.pods.find((p) => plan.nodes.find((n) => n.name === p.node)?.site === e.name)?.name);
      const samples = pairs([...firstOfEach.map((p) => [cloudPod, p] as const), ...firstOfEach.map((p) => [p, cloudPod] as const), [nodePods[0], sameSitePod]]);
      const description = k8s ? 'every controller replica\'s container killed (SIGKILL); their kubelets start them again' : 'controller killed (SIGKILL), restarted after a pause';
      return { kind, description, samples, flows: samples.slice(0, 1), lossless: true };
    }
    case 'relay-kill': {
      const byPath = (path: LabPath) => plan.pods.flatMap((a) => plan.pods.filter((b) => b.node !== a.node && expectedPath(plan, a.node, b.node) === path).map((b) => [a.name, b.name] as const));
      const punched = byPath('tunnel hole-punched')[0];
      const relayed = byPath('tunnel relayed')[0];
      if (!punched && !relayed) return { kind, skipped: 'no edge <-> edge pair: nothing uses the relay' };
      const list = [punched, relayed].filter((p): p is readonly [string, string] => p !== undefined);
      const samples = pairs(list.flatMap(([a, b]) => [[a, b], [b, a]] as const));
      const killed = k8s ? 'relay\'s container killed (SIGKILL), started again by its kubelet' : 'relay killed (SIGKILL), restarted after a pause';
      return { kind, description: `${killed}: hole-punched pairs must not notice, relayed pairs must come back`, lossless: false,
        samples, flows: pairs(list) };
    }
    case 'direct-path-cut': {
      const punched = plan.pods.flatMap((a) => plan.pods.filter((b) => expectedPath(plan, a.node, b.node) === 'tunnel hole-punched').map((b) => [a, b] as const))[0];
      if (!punched) return { kind, skipped: 'no hole-punched pair' };
      const [from, to] = punched;
      const site = plan.nodes.find((x) => x.name === from.node)?.site;
      const peerSite = plan.nodes.find((x) => x.name === to.node)?.site;
      if (site === undefined || peerSite === undefined) return { kind, skipped: 'no hole-punched pair' };
      const peerAddress = routerAddress(plan, peerSite);
      if (!peerAddress) return { kind, skipped: `edge site ${peerSite} has no router address` };
      return { kind, site, peerAddress, lossless: false,
        description: `the direct path between edge sites ${site} and ${peerSite} cut (${site}-router drops packets to and from ${peerAddress}) for a while; the relay stays reachable`,
        samples: pairs([[from.name, to.name], [to.name, from.name]]), flows: pairs([[from.name, to.name]]) };
    }
    case 'agent-restart': {
      if (!node) return { kind, skipped: 'no node' };
      const samples = pairs([[cloudPod, nodePods[0]], [nodePods[0], cloudPod], [sameSitePod, nodePods[0]], [nodePods[0], nodePods[1]]]);
      // with the datagram path, the node's keeper holds the tunnel's data plane while the agent is away: no sample may
      // lose a packet but what the agent held when killed ({@link LossWindow.inHand}); over the streams alone (UDP off
      // or blocked) the tunnel pairs lose the restart's gap
      const kept = labUsesUdp(plan.spec) && !udpBlockedAt(plan, node.name) && (cloudPod === undefined || !udpBlockedAt(plan, nodeOf(cloudPod) ?? ''));
      return { kind, node: node.name, lossless: false, flows: [], samples, ...(kept ? { strict: { lossFree: samples } } : {}), ...deniedAround([node.name]),
        description: `${k8s ? `agent container of ${node.name} killed (SIGKILL) and started again by its kubelet` : `agent of ${node.name} killed (SIGKILL) and started again`}`
          + `${kept ? ': its keeper holds the tunnel\'s data plane meanwhile, so no sample may lose a packet but those the agent held at the kill' : ''}` };
    }
    case 'offline-restart': {
      if (!node) return { kind, skipped: 'no node' };
      // its tunnel pairs of every kind: to the cloud, hole-punched, relayed (whichever the lab has)
      const firstTo = (path: LabPath) => plan.pods.find((p) => p.node !== node.name && expectedPath(plan, node.name, p.node) === path)?.name;
      const peers = [cloudPod, firstTo('tunnel hole-punched'), firstTo('tunnel relayed'), sameSitePod];
      const description = k8s
        ? `controller Deployment scaled to 0; while it has no replica the agent container of ${node.name} is killed and started again by its kubelet, and must rebuild its tunnels from its local state; then the controller is scaled back`
        : `controller stopped; while it is down the agent of ${node.name} is killed and started again, and must rebuild its tunnels from its local state; then the controller comes back`;
      return { kind, node: node.name, description, ...deniedAround([node.name]),
        lossless: false, flows: [], samples: pairs(peers.map((p) => [nodePods[0], p] as const)) };
    }
    case 'pod-recreate': {
      const pod = nodePods[0];
      if (!node || !pod) return { kind, skipped: 'no pod' };
      const how = {
        cri: ['(CRI StopPodSandbox, RemovePodSandbox)', '(RunPodSandbox: a new sandbox and network namespace)'],
        direct: ['(CNI DEL)', '(CNI ADD)'],
        kubernetes: ['through the API (its kubelet stops the sandbox)', '(the Pod applied again: its kubelet runs a new sandbox)'],
      }[pods];
      return { kind, node: node.name, pod, description: `pod ${pod} deleted ${how[0]} and added again under the same name ${how[1]}`, lossless: false, flows: [],
        samples: pairs([[cloudPod, pod], [sameSitePod, pod], [nodePods[1], pod], [pod, cloudPod]]) };
    }
    case 'statefulset-recreate': {
      const pod = node && workloads.find((p) => p.node === node.name && p.workload === 'statefulset')?.name;
      if (!node || !pod) return { kind, skipped: 'no StatefulSet pod on the target node' };
      return { kind, node: node.name, pod, lossless: false, flows: [], samples: pairs([[cloudPod, pod], [sameSitePod, pod], [nodePods[0], pod], [pod, cloudPod]]),
        description: `StatefulSet pod ${pod} on ${node.name} deleted through the API; its controller re-creates it under its name (the spread sends it back to ${node.name})` };
    }
    case 'crash-offline': {
      const pod = nodePods[0];
      if (!edgeSite || !node || !pod) return { kind, skipped: 'no edge site' };
      const inSite = (p: string) => edgeNodes.some((n) => n.name === nodeOf(p));
      return { kind, site: edgeSite, node: node.name, pod, lossless: false, flows: [], samples: pairs([[sameSitePod, pod], [nodePods[1], pod], [cloudPod, pod], [pod, cloudPod]]), ...deniedAround([node.name], inSite),
        description: `uplink of edge site ${edgeSite} cut; meanwhile pod ${pod}'s sandbox is killed and ${node.name}'s kubelet restarts it without the API; the site's pods reach it directly and through a Service; uplink restored` };
    }
    case 'node-reboot-offline': {
      const cloud = cloudAddresses(plan);
      if (!opts.openyurt) return { kind, skipped: 'a rebooted node\'s kubelet gets its pods back while cut off only from an edge cache: it needs --openyurt (yurthub)' };
      if (!edgeSite || !node || cloud.length === 0 || nodePods.length === 0) return { kind, skipped: 'no edge site with pods' };
      const inSite = (p: string) => edgeNodes.some((n) => n.name === nodeOf(p));
      const others = plan.pods.filter((p) => p.node !== node.name).map((p) => p.name);
      const vxlan = pairs(nodePods.flatMap((p) => others.filter((o) => inSite(o)).flatMap((o) => [[o, p], [p, o]] as const))).slice(0, 2);
      const punched = pairs(nodePods.flatMap((p) => others.filter((o) => pathOf(o, p) === 'tunnel hole-punched').flatMap((o) => [[o, p], [p, o]] as const))).slice(0, 2);
      return { kind, site: edgeSite, cloud, node: node.name, vxlan, punched, lossless: false, flows: [], samples: [...vxlan, ...punched],
        description: `edge site ${edgeSite} cut off from the cloud; node ${node.name} rebooted (kubelet, kube-proxy, yurthub stopped, containerd killed with every container, its kernel state gone, `
          + 'all started again as at boot): its pods must come back from yurthub\'s cache with their addresses and the site\'s and edge-to-edge paths work again, before the cloud is back' };
    }
    case 'policy-offline': {
      const policy = LAB_POLICY_NAMES[0] as string;
      const cloud = cloudAddresses(plan);
      if (!edgeSite || cloud.length === 0) return { kind, skipped: 'no edge site' };
      const inSite = (p: string) => edgeNodes.some((n) => n.name === nodeOf(p));
      const inCloud = (p: string) => plan.nodes.find((n) => n.name === nodeOf(p))?.site === CLOUD_SITE;
      const firstOf = (keep: (from: string, to: string) => boolean) => deniedPairs(keep, policy).slice(0, 1);
      // into the site from the site itself and hole-punched from another edge site: paths its cut from the cloud leaves up
      const held = [...firstOf((a, b) => inSite(a) && inSite(b)), ...firstOf((a, b) => inSite(b) && pathOf(a, b) === 'tunnel hole-punched')];
      // elsewhere: within the cloud, and from another edge site into it
      const opened = [...firstOf((a, b) => inCloud(a) && inCloud(b)), ...firstOf((a, b) => !inSite(a) && !inCloud(a) && inCloud(b))];
      if (held.length === 0) return { kind, skipped: `no pair into edge site ${edgeSite} that ${policy} denies on a path its cut from the cloud leaves up (it needs --policy, 2 edge sites, 2 pods per node)` };
      return { kind, site: edgeSite, cloud, policy, held, opened, samples: [...held, ...opened], flows: [], lossless: false,
        description: `edge site ${edgeSite} cut off from the cloud (${cloud.join(', ')}) by its router; NetworkPolicy ${policy} deleted through the API: pairs into ${edgeSite} it denied stay blocked until the heal `
          + `and open soon after, pairs elsewhere it denied open while ${edgeSite} is still cut off; afterwards the lab's policies applied again` };
    }
    case 'agent-roll': {
      const firstOfEach = plan.spec.edges.map((e) => plan.pods.find((p) => plan.nodes.find((n) => n.name === p.node)?.site === e.name)?.name);
      const sameSite = pairs([[nodePods[0], sameSitePod]]);
      const tunnel = pairs(firstOfEach.flatMap((p) => [[cloudPod, p], [p, cloudPod]] as const)).slice(0, MAX_SAMPLES - sameSite.length);
      // the chart's keepers hold the datagram path's data plane while an agent restarts: pairs on it lose nothing
      const kept = tunnel.filter((p) => labUsesUdp(plan.spec) && ![p.from, p.to].some((pod) => udpBlockedAt(plan, nodeOf(pod) ?? '')));
      return { kind, lossless: false, flows: [], strict: { lossFree: [...kept, ...sameSite] }, samples: [...tunnel, ...sameSite], ...deniedAround(plan.nodes.map((n) => n.name)),
        description: 'the agents\' DaemonSets rolled to another image tag while traffic flows (one node at a time per DaemonSet); pairs on the datagram path lose nothing (the keepers hold it), '
          + 'other tunnel pairs packets only while an end\'s agent restarts (its old pod stopping until its new one is ready, and 1 s after), same-site pairs nothing' };
    }
    case 'node-delete': {
      // the last node of the first edge site: not the other faults' target, not a cloud node (the controller's and relay's)
      const gone = edgeNodes.length >= 2 ? edgeNodes.at(-1) : undefined;
      if (!gone || !node) return { kind, skipped: 'the first edge site has fewer than 2 nodes' };
      const stays = (p: string | undefined) => (p !== undefined && nodeOf(p) !== gone.name ? p : undefined);
      return { kind, node: gone.name, lossless: true, flows: [], samples: pairs([[cloudPod, stays(nodePods[0])], [stays(nodePods[0]), cloudPod], [stays(sitePods[0]), stays(nodePods[1])]]),
        description: `node ${gone.name} taken out of the cluster: its kubelet and containerd stopped (the machine off), \`kubectl delete node ${gone.name}\`; the controller releases its blocks and every other node drops their routes` };
    }
    case 'offline-restart-all': {
      const planned = planOfflineEdgeFault(plan, kind, pods, pairs);
      const outOfCloud = (p: string) => plan.nodes.find((n) => n.name === nodeOf(p))?.site !== CLOUD_SITE;
      return 'skipped' in planned ? planned : { ...planned, ...deniedAround(edgeNodes.map((n) => n.name), outOfCloud) };
    }
    case 'nat-reboot-offline':
    case 'clock-jump':
    case 'readdress-offline':
      return planOfflineEdgeFault(plan, kind, pods, pairs);
    case 'uplink-cut':
    case 'uplink-flap':
    case 'node-reboot': {
      if (!edgeSite || !node) return { kind, skipped: 'no edge site' };
      if (kind === 'node-reboot' && pods === 'kubernetes') {
        return { kind, skipped: 'with --kubernetes a cut-off node\'s Pods cannot be deleted and applied again through the API (its kubelet cannot confirm the deletion); node-reboot-offline reboots one with --openyurt' };
      }
      const samples = pairs([[cloudPod, sitePods[0]], [sitePods[0], cloudPod], [cloudPod, sitePods[1]], [sitePods[1], cloudPod]]);
      // a TCP flow across a cut uplink survives (it pauses and resumes); one into a rebooted node does not (its pods are new)
      switch (kind) {
        case 'uplink-cut':
          return { kind, site: edgeSite, description: `uplink of edge site ${edgeSite} cut, then restored`, samples, lossless: false, flows: samples.slice(0, 1) };
        case 'uplink-flap':
          return { kind, site: edgeSite, description: `uplink of edge site ${edgeSite} flapping (down and up several times), then restored`, samples, lossless: false, flows: samples.slice(0, 1) };
        case 'node-reboot':
          return { kind, site: edgeSite, node: node.name, lossless: false, flows: [], samples,
            description: `node ${node.name} rebooted while site ${edgeSite} is cut off: agent killed, its devices and nft table deleted, agent started offline, pods added again, uplink restored` };
      }
    }
  }
}

/**
 * The target of a fault of the first edge site cut off from the cloud: its hole-punched pairs both ways (the paths
 * that must heal without the relay) and a same-site VXLAN pair (which must not notice).
 */
function planOfflineEdgeFault(plan: LabPlan, kind: LabFaultKind, pods: 'cri' | 'direct' | 'kubernetes',
  pairs: (list: readonly (readonly [string | undefined, string | undefined])[]) => LabPodPair[]): LabFaultTarget | LabFaultSkipped {
  if (pods === 'kubernetes' && kind === 'clock-jump') return { kind, skipped: 'with --kubernetes the agents run from the image, which has no libfaketime: their clocks cannot be moved' };
  if (!labUsesUdp(plan.spec)) return { kind, skipped: 'it needs the datagram path (not --no-udp): TCP streams between edge sites are rebuilt only through the relay' };
  const site = plan.spec.edges[0]?.name;
  const siteNodes = plan.nodes.filter((n) => n.site === site).map((n) => n.name);
  const cloud = cloudAddresses(plan);
  const inSite = (pod: { node: string }) => siteNodes.includes(pod.node);
  const punched = plan.pods.flatMap((a) => plan.pods.filter((b) => inSite(a) && !inSite(b) && expectedPath(plan, a.node, b.node) === 'tunnel hole-punched').map((b) => [a, b] as const));
  if (!site || punched.length === 0 || cloud.length === 0) return { kind, skipped: 'no hole-punched pair from the first edge site' };
  // one pair per node of the site, both ways where the sample budget allows
  const firstOf = siteNodes.map((n) => punched.find(([a]) => a.node === n)).filter((x) => x !== undefined);
  const vxlan = plan.pods.flatMap((a) => plan.pods.filter((b) => inSite(a) && inSite(b) && a.node !== b.node).map((b) => [a.name, b.name] as const))[0];
  const lossFree = pairs(vxlan ? [vxlan] : []);
  const edge = pairs([...firstOf.map(([a, b]) => [a.name, b.name] as const), ...firstOf.map(([a, b]) => [b.name, a.name] as const)]).slice(0, 3);
  const samples = [...edge, ...lossFree];
  const cut = `edge site ${site} cut off from the cloud (${cloud.join(', ')}) by its router`;
  switch (kind) {
    case 'offline-restart-all':
      return { kind, site, cloud, nodes: siteNodes, watcher: punched[0]![1].node, samples, flows: [], lossless: false, strict: { lossFree },
        description: `${cut}; each agent of ${site} (${siteNodes.join(', ')}) killed and started again in turn `
          + `${pods === 'kubernetes' ? '(its container, by its kubelet without the API)' : '(the first after 4 s down)'}; edge-to-edge pairs may lose only inside each restart and 1 s after it, VXLAN pairs nothing` };
    case 'readdress-offline': {
      const moves = plan.spec.edges.map((e) => ({ site: e.name, from: routerAddress(plan, e.name) })).filter((m): m is { site: string; from: string } => m.from !== undefined)
        .map((m) => ({ site: m.site, from: `${m.from}/24`, to: `${movedAddress(m.from)}/24` }));
      return { kind, site, cloud, watcher: punched[0]![1].node, watched: punched[0]![0].node, moves, samples, flows: [], lossless: false, strict: { lossFree },
        description: `${cut}; then every edge site's router takes a new public address (${moves.map((m) => `${m.site} ${m.to.split('/')[0]}`).join(', ')}): with both ends moved, the edge-to-edge pairs cannot find each other without the relay, stay down cleanly and heal once the cloud is back; VXLAN pairs lose nothing; afterwards the addresses move back` };
    }
    case 'nat-reboot-offline':
      return { kind, site, cloud, samples, flows: [], lossless: false, strict: { lossFree },
        description: `${cut}; then ${site}-router's connection tracking flushed (its NAT rebooted); edge-to-edge pairs back within 5 s, VXLAN pairs lose nothing` };
    default:
      return { kind: 'clock-jump', site, cloud, nodes: siteNodes, samples, flows: [], lossless: false, strict: { lossFree },
        description: `${cut}; the clocks of ${site}'s agents (wall and monotonic, libfaketime) jump ${CLOCK_JUMP} ahead; no pair may lose anything; afterwards their clocks are set right and they are restarted` };
  }
}

/** The address a router moves to in the readdress-offline fault: 100 above its own in the wan's /24 (edge routers sit at .11 up). */
function movedAddress(address: string): string {
  const parts = address.split('.');
  return [...parts.slice(0, 3), String(Number(parts[3]) + 100)].join('.');
}

/** How far the clock-jump fault moves the clocks (libfaketime's syntax). */
export const CLOCK_JUMP = '+8d';

/** Every address of the cloud as the wan sees it: its router's and the cloud network routed behind it. */
export function cloudAddresses(plan: LabPlan): string[] {
  const router = routerAddress(plan, CLOUD_SITE);
  if (!router) return [];
  const routed = plan.routes.filter((r) => r.via === router).map((r) => r.dst);
  return [router, ...new Set(routed)];
}

/** The public (wan) address of `site`'s router. */
function routerAddress(plan: LabPlan, site: string): string | undefined {
  const router = `${plan.prefix}${site}-router`;
  return plan.veths.find((v) => v.b.netns === router && v.b.ifname === 'up0')?.b.address?.split('/')[0];
}

/**
 * The ruleset that makes an edge router drop everything forwarded to or from `peers` (public addresses or prefixes):
 * another edge site's router (a direct path cut) or the whole cloud (a site cut off from its coordinators).
 */
export function peerCutRuleset(peers: string | readonly string[], what = 'direct path cut'): string {
  const list = typeof peers === 'string' ? [peers] : peers;
  return [
    `table ip ${LAB_FAULT_NFT_TABLE}`,
    `delete table ip ${LAB_FAULT_NFT_TABLE}`,
    `table ip ${LAB_FAULT_NFT_TABLE} {`,
    `  comment "atoll lab: ${what} (fault)"`,
    `  chain forward {`,
    `    type filter hook forward priority filter - 10; policy accept;`,
    ...list.flatMap((p) => [`    ip saddr ${p} drop`, `    ip daddr ${p} drop`]),
    `  }`,
    `}`,
    '',
  ].join('\n');
}

/** The ruleset that cuts an edge router's uplink: nothing is forwarded in or out of it (the NAT's state stays). */
export function uplinkCutRuleset(uplink: string): string {
  return [
    `table ip ${LAB_FAULT_NFT_TABLE}`,
    `delete table ip ${LAB_FAULT_NFT_TABLE}`,
    `table ip ${LAB_FAULT_NFT_TABLE} {`,
    `  comment "atoll lab: uplink cut (fault)"`,
    `  chain forward {`,
    `    type filter hook forward priority filter - 10; policy accept;`,
    `    iifname "${uplink}" drop`,
    `    oifname "${uplink}" drop`,
    `  }`,
    `}`,
    '',
  ].join('\n');
}

/** The transaction that lifts {@link uplinkCutRuleset} (idempotent). */
export function uplinkRestoreRuleset(): string {
  return [`table ip ${LAB_FAULT_NFT_TABLE}`, `delete table ip ${LAB_FAULT_NFT_TABLE}`, ''].join('\n');
}
