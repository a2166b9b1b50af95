/**
 * The pods a node compiles its NetworkPolicy for: the controller's view (last known) merged with what the node itself
 * holds, its IPAM records and, for a pod the view does not know, the labels of its CRI sandbox. Pure.
 *
 * Why: a pod the kubelet starts while the cloud is away (a static pod, a pod the API never told the controller about
 * yet, one moved here from another node) is in no view, so no policy would select it until the controller comes back.
 * Its labels are on the sandbox the kubelet asked the runtime for (kubelet's `newPodLabels`: the pod's labels plus
 * `io.kubernetes.pod.name`, `.namespace` and `.uid`), so the node classifies it from there at once. Its namespace's
 * labels and every remote pod stay the view's, last known.
 */
import type { IpamRecord } from '../ipam/sticky-pool.ts';
import { formatIpv4 } from '../net/ipv4.ts';
import { keyOf, type NetworkPolicy, type PolicyPod } from './model.ts';
import type { ViewPod } from './scope.ts';

/** What the kubelet adds to a pod's labels on its sandbox (k8s.io/kubelet/pkg/types: KubernetesPod*Label). */
export const KUBELET_SANDBOX_LABELS: readonly string[] = ['io.kubernetes.pod.name', 'io.kubernetes.pod.namespace', 'io.kubernetes.pod.uid'];

/** A pod as its CRI sandbox describes it: the sandbox's metadata and the pod's own labels. */
export interface SandboxPod {
  readonly namespace: string;
  readonly name: string;
  readonly uid: string;
  readonly labels: Readonly<Record<string, string>>;
}

/**
 * The node's container runtime, as far as NetworkPolicy asks it (a port: src/adapters/node/cri-runtime.ts is the CRI
 * one).
 */
export interface SandboxRuntime {
  /**
   * The pod of sandbox `id`, or undefined when the runtime holds no such sandbox (yet: containerd registers a sandbox
   * only once RunPodSandbox, which includes the CNI ADD, has returned). Bounded by a deadline.
   * @throws AtollError CRI_UNREACHABLE when nothing answers on the runtime's socket in time; CRI_CALL_FAILED otherwise.
   */
  sandboxPod(id: string): Promise<SandboxPod | undefined>;
}

/** A sandbox's pod from its metadata and labels: the kubelet's own labels left out (as the kubelet reads them back). */
export function sandboxPodOf(meta: { readonly namespace: string; readonly name: string; readonly uid: string }, labels: Readonly<Record<string, string>>): SandboxPod {
  const own = Object.fromEntries(Object.entries(labels).filter(([k]) => !KUBELET_SANDBOX_LABELS.includes(k)));
  return { namespace: meta.namespace, name: meta.name, uid: meta.uid, labels: own };
}

/**
 * The node's active pod records that the view holds no pod of this node for: the ones to classify from their
 * sandbox. A record without a Kubernetes identity (namespace '') is left out: no policy can select it.
 */
export function unknownLocalPods(viewPods: readonly ViewPod[], active: readonly IpamRecord[], nodeName: string): IpamRecord[] {
  const here = new Set(viewPods.filter((p) => p.node === nodeName).map(keyOf));
  return active.filter((r) => r.namespace !== '' && !here.has(keyOf(r)));
}

export interface PolicyPodsInput {
  /** The view's pods (last known). */
  readonly viewPods: readonly ViewPod[];
  /** The node's active IPAM records (not released). */
  readonly active: readonly IpamRecord[];
  /** Sandbox pods by sandbox id (an IPAM record's containerId), for records of {@link unknownLocalPods}. */
  readonly classified: ReadonlyMap<string, SandboxPod>;
  readonly nodeName: string;
}

/**
 * The pods and the local set to compile policies with:
 * - a view pod of this node takes the address of the node's own record for it (sticky, and known while offline);
 * - a record the view holds no pod of this node for, whose sandbox was classified under the same namespace/name,
 *   is a local pod with the sandbox's labels (no named ports: those are on containers, which the view brings); it
 *   replaces a view pod of that name on another node (the pod runs here now);
 * - every other view pod is kept as the view has it; a record neither known nor classified is left out (as before).
 */
export function policyPods(input: PolicyPodsInput): { readonly pods: readonly PolicyPod[]; readonly local: ReadonlySet<string> } {
  const mine = new Map(input.active.map((r) => [keyOf(r), r]));
  const fromSandbox = new Map<string, PolicyPod>();
  for (const r of unknownLocalPods(input.viewPods, input.active, input.nodeName)) {
    const s = input.classified.get(r.containerId);
    if (s === undefined || s.namespace !== r.namespace || s.name !== r.name) continue;
    fromSandbox.set(keyOf(r), { namespace: r.namespace, name: r.name, ip: formatIpv4(r.ip), labels: s.labels, ports: [] });
  }
  const pods: PolicyPod[] = [];
  const local = new Set<string>(fromSandbox.keys());
  for (const p of input.viewPods) {
    const key = keyOf(p);
    if (fromSandbox.has(key)) continue;
    if (p.node !== input.nodeName) {
      pods.push(p);
      continue;
    }
    local.add(key);
    const r = mine.get(key);
    pods.push(r ? { ...p, ip: formatIpv4(r.ip) } : p);
  }
  pods.push(...fromSandbox.values());
  return { pods, local };
}

/** Why a pod is closed that no policy is known to select yet: shown where a policy's name would be (trace, metrics). */
export const CLASSIFYING = '(its CRI sandbox being read)';

/** A pod of the node closed in the directions its namespace's policies could isolate it, until its labels are known. */
export interface ClosedPod {
  /** `namespace/name`. */
  readonly pod: string;
  readonly ip: number;
  readonly ingress: boolean;
  readonly egress: boolean;
}

/**
 * The node's pods the view does not know whose sandbox is still to be read (the runtime is asked, `readsSandboxes`,
 * and has neither answered nor been given up on, `givenUp` by sandbox id): each is closed in every direction some
 * policy of its namespace covers, since one of them may select it once its labels are in (fail-closed: an allowed
 * pod waits that long, a denied one is never open). A pod in a namespace without policies cannot be selected and
 * stays open. Once read, the pod is compiled as any other; once given up on, it is left to the view.
 */
export function closedPods(input: PolicyPodsInput & { readonly policies: readonly NetworkPolicy[]; readonly readsSandboxes: boolean; readonly givenUp: ReadonlySet<string> }): ClosedPod[] {
  const out: ClosedPod[] = [];
  if (!input.readsSandboxes) return out;
  for (const r of unknownLocalPods(input.viewPods, input.active, input.nodeName)) {
    if (input.givenUp.has(r.containerId) || input.classified.has(r.containerId)) continue;
    const types = new Set(input.policies.filter((p) => p.namespace === r.namespace).flatMap((p) => p.policyTypes));
    if (types.size > 0) out.push({ pod: keyOf(r), ip: r.ip, ingress: types.has('Ingress'), egress: types.has('Egress') });
  }
  return out;
}
