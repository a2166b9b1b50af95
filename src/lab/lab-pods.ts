/**
 * How the lab creates its pods, behind one small interface:
 * - `cri`: as the kubelet does. A private containerd per node (src/lab/io/containerd/containerd.ts: its own root,
 *   state and socket under the node's directory, running in the node's namespace, with that node's CNI bin and conf
 *   dirs, so its CNI calls reach that node's agent) and RunPodSandbox / PodSandboxStatus / StopPodSandbox /
 *   RemovePodSandbox for every pod (Kubernetes namespace `lab`, the pod's name, a fresh uid). containerd creates the
 *   pod's network namespace; its path, as the sandbox reports it, is only visible in that containerd's mount
 *   namespace, so the lab enters a pod with `nsenter` into containerd's mount namespace, then into the path.
 * - `direct`: the lab calls each node's installed `atoll-cni` itself, with the conflist its agent wrote, in the
 *   namespace the plan names for the pod.
 * `auto` takes `cri` when containerd, runc and the rest are installed.
 *
 * Clean-up: every containerd is recorded in the run's state (src/lab/io/lab-state.ts) as soon as it is spawned;
 * the run's removal kills it and everything of it by PID (removeContainerdLeftovers), whatever process removes it.
 */
import { randomUUID } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, rmSync, symlinkSync } from 'node:fs';
import { join } from 'node:path';
import type { LabPodsChoice } from './lab-spec.ts';
import { atollError } from '../core/errors.ts';
import { LAB_POD_NAMESPACE, type LabNode, type LabPlan, type LabPod, nodeContainerdSocket, nodeHostDirs } from './plan/plan.ts';
import { invokeCni } from './io/cni-invoke.ts';
import { type Containerd, startContainerd } from './io/containerd/containerd.ts';
import { type ContainerdLeftovers, removeContainerdLeftovers } from './io/containerd/leftovers.ts';
import { layout } from './io/containerd/config.ts';
import { buildPauseImage } from './io/containerd/pause-image.ts';
import { NETNS_DIR } from './io/processes.ts';

/** How a run's pods are made: `cri` and `direct` as chosen by `--pods`; `kubernetes` through the API (`--kubernetes`, on `cri`). */
export type LabPodMode = 'cri' | 'direct' | 'kubernetes';
export type { LabPodsChoice };

export interface LabPodInfo {
  readonly name: string;
  readonly node: string;
  /** The pod's network namespace: the path its sandbox reports (cri), or the lab's name for it (direct). */
  readonly netns: string;
  /** Argument prefix that runs a command inside the pod's network namespace. */
  readonly enter: readonly string[];
  readonly ip: string;
  /** Pod start latency, ms: the wall time of RunPodSandbox (cri), of the CNI ADD (direct), or from applying the Pod to Running with an IP (Kubernetes). */
  readonly addMs?: number;
  /** The CRI sandbox id (cri), or the CNI container id (direct). */
  readonly sandboxId: string;
}

/** A node's containerd as the run's state records it. */
export interface LabContainerdRecord extends ContainerdLeftovers {
  readonly node: string;
}

/** Creates and re-creates the lab's pods. */
export interface LabPodRuntime {
  readonly mode: LabPodMode;
  /** What creates the pods, for the terminal and the report. */
  readonly description: string;
  /** Argument prefix to start `node`'s agent behind (the agent must see the pod namespaces' paths). */
  agentLauncher(node: LabNode): string[];
  /** Creates `pod`. @throws AtollError LAB_STEP_FAILED. */
  create(pod: LabPod): Promise<LabPodInfo>;
  /** Deletes `current` and creates its pod again under the same name. @throws AtollError LAB_STEP_FAILED. */
  recreate(pod: LabPod, current: LabPodInfo): Promise<LabPodInfo>;
  /** Lets go of in-process handles (gRPC channels). Processes and mounts go with the run's removal. */
  close(): void;
}

/** What `cri` mode needs on this machine: [path, what to install]. */
const CRI_REQUIREMENTS = [
  ['/usr/bin/containerd', 'containerd'],
  ['/usr/sbin/runc', 'runc'],
  ['/usr/bin/ctr', 'ctr (package containerd)'],
  ['/usr/bin/nsenter', 'nsenter (util-linux)'],
  ['/usr/bin/unshare', 'unshare (util-linux)'],
  ['/usr/lib/cni/loopback', 'the loopback CNI plugin (containernetworking-plugins)'],
  ['/bin/busybox', 'busybox-static (for the pause image)'],
] as const;

const LOOPBACK_PLUGIN = '/usr/lib/cni/loopback';

/**
 * The pod mode for `choice`: `auto` is `cri` when everything containerd needs is installed, else `direct`.
 * @throws AtollError LAB_PREREQUISITE_MISSING when `cri` is asked for and something is missing.
 */
export function choosePodMode(choice: LabPodsChoice): { mode: 'cri' | 'direct'; why: string } {
  const missing = CRI_REQUIREMENTS.filter(([path]) => !existsSync(path)).map(([, what]) => what);
  if (choice === 'direct') return { mode: 'direct', why: '--pods direct' };
  if (missing.length === 0) return { mode: 'cri', why: choice === 'cri' ? '--pods cri' : 'containerd is installed' };
  if (choice === 'cri') {
    throw atollError('LAB_PREREQUISITE_MISSING', `--pods cri needs ${missing.join(', ')}`, 'install them (make setup), or use --pods direct');
  }
  return { mode: 'direct', why: `containerd's CRI needs ${missing.join(', ')}` };
}

export const POD_CREATION: Readonly<Record<LabPodMode, string>> = Object.freeze({
  cri: 'containerd\'s CRI (RunPodSandbox on a private containerd per node, which calls the node\'s atoll-cni)',
  direct: 'direct CNI calls to atoll-cni',
  kubernetes: 'the Kubernetes API (a Pod per lab pod bound to its node; the node\'s kubelet runs it through its containerd, which calls the node\'s atoll-cni)',
});

// ---------------------------------------------------------------------------------------------------------------
// direct

/** Pods by direct CNI calls, in namespaces the plan names (the lab's topology creates them). */
export class DirectPods implements LabPodRuntime {
  readonly mode = 'direct';
  readonly description = POD_CREATION.direct;
  readonly #plan: LabPlan;
  #recreated = 0;

  constructor(plan: LabPlan) {
    this.#plan = plan;
  }

  agentLauncher(node: LabNode): string[] {
    return ['ip', 'netns', 'exec', node.netns];
  }

  async create(pod: LabPod, containerId = pod.containerId): Promise<LabPodInfo> {
    const t = performance.now();
    const res = await this.#call(pod, 'ADD', containerId);
    const addMs = Math.round(performance.now() - t);
    const address = (res.output?.ips as { address?: string }[] | undefined)?.[0]?.address;
    if (res.code !== 0 || !address) {
      throw atollError('LAB_STEP_FAILED', `CNI ADD of pod ${pod.name} on ${pod.node} failed (status ${res.code}): ${res.stdout.trim() || res.stderr.trim()}`, 'read the agent\'s log');
    }
    return { name: pod.name, node: pod.node, netns: pod.netns, enter: ['nsenter', `--net=${join(NETNS_DIR, pod.netns)}`, '--'], ip: address.split('/')[0] as string, addMs, sandboxId: containerId };
  }

  async recreate(pod: LabPod, current: LabPodInfo): Promise<LabPodInfo> {
    const res = await this.#call(pod, 'DEL', current.sandboxId);
    if (res.code !== 0) throw atollError('LAB_STEP_FAILED', `CNI DEL of pod ${pod.name} on ${pod.node} failed (status ${res.code}): ${res.stdout.trim() || res.stderr.trim()}`, 'read the agent\'s log');
    return this.create(pod, `${pod.containerId}-r${++this.#recreated}`);
  }

  close(): void {}

  #call(pod: LabPod, command: 'ADD' | 'DEL', containerId: string) {
    const node = this.#plan.nodes.find((n) => n.name === pod.node);
    // cannot happen: the plan puts every pod on one of its nodes (src/lab/plan/plan.ts)
    if (!node) throw new Error(`pod ${pod.name} names an unknown node ${pod.node}`);
    const conflist = JSON.parse(readFileSync(join(node.cniConfDir, '10-atoll.conflist'), 'utf8')) as { cniVersion: string; name: string; plugins: Record<string, unknown>[] };
    const plugin = conflist.plugins[0] as Record<string, unknown>;
    return invokeCni({
      binDir: node.cniBinDir, type: String(plugin.type), command, containerId, netns: join(NETNS_DIR, pod.netns), ifname: 'eth0',
      args: { K8S_POD_NAMESPACE: LAB_POD_NAMESPACE, K8S_POD_NAME: pod.name, K8S_POD_INFRA_CONTAINER_ID: containerId },
      config: { cniVersion: conflist.cniVersion, name: conflist.name, ...plugin },
    });
  }
}

// ---------------------------------------------------------------------------------------------------------------
// cri

/** Argument prefix that runs a command in a sandbox's network namespace: into containerd's mount namespace, then the path. */
export function enterSandbox(ctd: Pick<Containerd, 'pid'>, netnsPath: string): string[] {
  return ['nsenter', `--mount=/proc/${ctd.pid}/ns/mnt`, '--', 'nsenter', `--net=${netnsPath}`, '--'];
}

export interface CriPodsInit {
  readonly plan: LabPlan;
  /** Records a containerd in the run's state, called as soon as it is spawned. */
  readonly record: (rec: LabContainerdRecord) => void;
  /** How many containerds start at once. */
  readonly concurrency?: number;
  /** Aborted: start no further containerd (the run is being removed). */
  readonly signal?: AbortSignal;
  /**
   * `--kubernetes` (Atoll installed through its chart): every containerd sees its node's own directories at the
   * manifest's hostPaths ({@link nodeHostDirs}), uses `/opt/cni/bin` and `/etc/cni/net.d` there, and puts pod network
   * namespaces under `/var/run/netns`, as on a real node; the node's agent pod installs atoll-cni and the conflist.
   */
  readonly nodeHostPaths?: boolean;
}

/** Starts node `node`'s containerd as {@link CriPods.start} does, noting what identifies its leftovers in `spawned`. */
async function startNodeContainerd(init: CriPodsInit, node: LabNode, tarball: string, spawned: Map<string, LabContainerdRecord>): Promise<Containerd> {
  // the node's CNI plugins as its distribution installs them: loopback
  mkdirSync(node.cniBinDir, { recursive: true });
  if (!existsSync(join(node.cniBinDir, 'loopback'))) symlinkSync(LOOPBACK_PLUGIN, join(node.cniBinDir, 'loopback'));
  mkdirSync(node.cniConfDir, { recursive: true });
  const cni = init.nodeHostPaths
    ? { cniBinDir: '/opt/cni/bin', cniConfDir: '/etc/cni/net.d', hostDirs: nodeHostDirs(node), netnsUnderStateDir: false, socket: nodeContainerdSocket(node) }
    : { cniBinDir: node.cniBinDir, cniConfDir: node.cniConfDir };
  try {
    return await startContainerd({
      workDir: join(node.dir, 'containerd'), netns: node.netns, ...cni,
      pauseImageTarball: tarball, cgroupPrefix: `${init.plan.prefix}${node.name}`,
      onSpawn: (l) => {
        const rec = { node: node.name, ...l };
        spawned.set(node.name, rec);
        init.record(rec);
      },
    });
  } catch (err) {
    throw atollError('LAB_STEP_FAILED', `containerd of node ${node.name} did not start: ${(err as Error).message}`, 'read the containerd log quoted above; `--pods direct` avoids containerd', err);
  }
}

/** Pods through a private containerd per node. */
export class CriPods implements LabPodRuntime {
  readonly mode = 'cri';
  readonly description = POD_CREATION.cri;
  readonly #plan: LabPlan;
  readonly #containerd: Map<string, Containerd>;
  readonly #init: CriPodsInit;
  readonly #pauseTarball: string;
  /** What identifies each containerd's leftovers, for a node reboot. */
  readonly #spawned: Map<string, LabContainerdRecord>;

  private constructor(plan: LabPlan, containerd: Map<string, Containerd>, init: CriPodsInit, pauseTarball: string, spawned: Map<string, LabContainerdRecord>) {
    this.#plan = plan;
    this.#containerd = containerd;
    this.#init = init;
    this.#pauseTarball = pauseTarball;
    this.#spawned = spawned;
  }

  /**
   * Builds the pause image once and starts every node's containerd (before its agent: the agent must run in
   * containerd's mount namespace to open the pod namespaces' paths). On failure the ones started are left to the
   * run's removal (they are recorded). @throws AtollError LAB_STEP_FAILED.
   */
  static async start(init: CriPodsInit): Promise<CriPods> {
    const { plan } = init;
    const tarball = await buildPauseImage(join(plan.dir, 'pause-image'));
    const started = new Map<string, Containerd>();
    const spawned = new Map<string, LabContainerdRecord>();
    const queue = [...plan.nodes];
    const worker = async () => {
      for (let n = queue.shift(); n; n = queue.shift()) {
        const node = n;
        if (init.signal?.aborted) throw atollError('LAB_STEP_FAILED', 'the lab is being removed: no further containerd is started', 'nothing to do');
        started.set(node.name, await startNodeContainerd(init, node, tarball, spawned));
      }
    };
    const results = await Promise.allSettled(Array.from({ length: init.concurrency ?? 3 }, worker));
    const failed = results.find((r) => r.status === 'rejected');
    if (failed) {
      for (const c of started.values()) c.cri.close();
      throw (failed as PromiseRejectedResult).reason;
    }
    return new CriPods(plan, started, init, tarball, spawned);
  }

  /**
   * A node's reboot as its containerd sees it: the containerd killed with every container and sandbox it runs (as a
   * power cut would), its state directory emptied (a reboot clears /run), then started again on the same root (its
   * images and metadata, as on the node's disk) and recorded in the run's state. Resolves with the new instance, now
   * in {@link containerds}. @throws AtollError LAB_STEP_FAILED when it does not come back.
   */
  async rebootNode(node: LabNode): Promise<Containerd> {
    const was = this.#containerd.get(node.name);
    const leftovers = this.#spawned.get(node.name);
    // cannot happen: start() made and recorded a containerd for every planned node
    if (!was || !leftovers) throw new Error(`node ${node.name} has no containerd`);
    was.cri.close();
    await removeContainerdLeftovers(leftovers);
    rmSync(layout(leftovers.workDir).state, { recursive: true, force: true });
    const now = await startNodeContainerd(this.#init, node, this.#pauseTarball, this.#spawned);
    this.#containerd.set(node.name, now);
    return now;
  }

  /** The running containerds, by node name. */
  get containerds(): ReadonlyMap<string, Containerd> {
    return this.#containerd;
  }

  agentLauncher(node: LabNode): string[] {
    return ['nsenter', `--mount=/proc/${this.#ctd(node.name).pid}/ns/mnt`, `--net=${join(NETNS_DIR, node.netns)}`, '--'];
  }

  async create(pod: LabPod): Promise<LabPodInfo> {
    const ctd = this.#ctd(pod.node);
    const t = performance.now();
    let id: string;
    try {
      id = await ctd.cri.runPodSandbox({ name: pod.name, namespace: LAB_POD_NAMESPACE, uid: randomUUID() });
    } catch (err) {
      throw atollError('LAB_STEP_FAILED', `RunPodSandbox of pod ${pod.name} on ${pod.node} failed: ${(err as Error).message}`, `read the agent's log and ${ctd.logPath}`, err);
    }
    const addMs = Math.round(performance.now() - t);
    const status = await ctd.cri.podSandboxStatus(id);
    if (status.state !== 'SANDBOX_READY' || !status.ip || !status.netnsPath) {
      throw atollError('LAB_STEP_FAILED', `sandbox ${id} of pod ${pod.name} on ${pod.node} is ${status.state} with IP "${status.ip}" and netns "${status.netnsPath ?? ''}"`, `read ${ctd.logPath}`);
    }
    return { name: pod.name, node: pod.node, netns: status.netnsPath, enter: enterSandbox(ctd, status.netnsPath), ip: status.ip, addMs, sandboxId: id };
  }

  async recreate(pod: LabPod, current: LabPodInfo): Promise<LabPodInfo> {
    const ctd = this.#ctd(pod.node);
    try {
      await ctd.cri.stopPodSandbox(current.sandboxId);
      await ctd.cri.removePodSandbox(current.sandboxId);
    } catch (err) {
      throw atollError('LAB_STEP_FAILED', `removing sandbox ${current.sandboxId} of pod ${pod.name} on ${pod.node} failed: ${(err as Error).message}`, `read the agent's log and ${ctd.logPath}`, err);
    }
    return this.create(pod);
  }

  close(): void {
    for (const c of this.#containerd.values()) c.cri.close();
  }

  #ctd(node: string): Containerd {
    const c = this.#containerd.get(node);
    // cannot happen: start() made a containerd for every planned node or failed, and pods run on planned nodes
    if (!c) throw new Error(`node ${node} has no containerd`);
    return c;
  }
}
