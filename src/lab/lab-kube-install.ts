/**
 * Atoll installed on the lab's Kubernetes (`--kubernetes`, src/lab/lab-kube.ts) as users install it, by the README's
 * "Install on Kubernetes": `make image`'s image imported into every node's containerd, `atoll kubernetes secret |
 * kubectl apply -f -`, the chart rendered with the lab's values and applied. Its DaemonSets' pods run the agents, its
 * Deployments the controller and the relay; each node's containerd sees that node's own directories at the
 * manifest's hostPaths (src/lab/plan/plan.ts `nodeHostDirs`), so the lab reads the agents' state and status sockets
 * there, and their logs in the kubelets' pod log directories.
 */
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { atollError } from '../core/errors.ts';
import { LAB_ATOLL_NAMESPACE, labChartValues } from './plan/kubernetes.ts';
import { CLOUD_SITE } from './plan/spec.ts';
import type { LabPlan } from './plan/plan.ts';
import { type Containerd, importImage } from './io/containerd/containerd.ts';
import { logTail } from './io/child-process.ts';
import { exec } from '../adapters/exec.ts';
import { helmTemplate } from './io/kube/helm.ts';
import { sleep } from '../adapters/timers.ts';
import { ATOLL_BIN, REPO_ROOT } from './agent-process.ts';
import { type AtollPodJson, atollPods, type LabKubernetes, type NodeJson, podReady } from './lab-kube.ts';

/** How long the chart's pods get to be Ready on every node (each agent installs the CNI, then its Node turns Ready). */
export const ATOLL_READY_TIMEOUT_MS = 180_000;

/** The tag `make image` gives the image by default: package.json's version. */
export const ATOLL_IMAGE_TAG = (JSON.parse(readFileSync(join(REPO_ROOT, 'package.json'), 'utf8')) as { version: string }).version;

/** The image `make image` writes for `tag` (a docker-archive). */
export function atollImageTarball(tag: string): string {
  return join(REPO_ROOT, 'build', 'image', `atoll-${tag}.tar`);
}

/** What installing Atoll through its chart gave: the pins the bootstrap Secret holds, and the image. */
export interface AtollInstall {
  /** The controller CA's pin (the Secret's `ca-cert-hash`), which every agent checks. */
  readonly caCertHash: string;
  /** The relay key's pin (the Secret's `relay-pin`). */
  readonly relayPin: string;
  /** The image reference the chart's pods run. */
  readonly image: string;
  /** The values the chart was rendered with. */
  readonly values: Readonly<Record<string, unknown>>;
}

/**
 * The last lines of the newest log of `container` in the newest pod named `<pod>...` of {@link LAB_ATOLL_NAMESPACE}
 * on `node`, read from its kubelet's pod log directory (`kubectl logs` would need the API server to reach the
 * kubelet, which an edge kubelet behind its NAT is not).
 */
function podLogTail(kube: LabKubernetes, node: string, pod: string, container: string, lines: number): string {
  const dir = kube.kubelets.get(node)?.podLogsDir;
  if (!dir) return `(node ${node} has no kubelet)`;
  const newest = (d: string, match: (name: string) => boolean) => {
    try {
      return readdirSync(d).filter(match).map((name) => ({ name, mtime: statSync(join(d, name)).mtimeMs })).sort((a, b) => b.mtime - a.mtime)[0]?.name;
    } catch {
      return undefined;
    }
  };
  const podDir = newest(dir, (n) => n.startsWith(`${LAB_ATOLL_NAMESPACE}_${pod}`));
  const log = podDir ? newest(join(dir, podDir, container), (n) => n.endsWith('.log')) : undefined;
  return podDir && log ? logTail(join(dir, podDir, container, log), lines) : `(no log of ${pod} ${container} on ${node})`;
}

/** The last lines of the log of `node`'s agent pod. */
export function agentPodLogTail(kube: LabKubernetes, node: string, lines = 15): string {
  return podLogTail(kube, node, 'atoll-agent-', 'agent', lines);
}

/**
 * Installs Atoll as the README's "Install on Kubernetes" does: imports `make image`'s image into every node's
 * containerd (`ctr -n k8s.io images import`), creates the namespace, applies `atoll kubernetes secret`'s output,
 * renders the chart with {@link labChartValues} (`helm template`) and applies it; then waits until every node runs a
 * Ready agent pod, the controller has one Ready replica per cloud node, the relay is Ready, and every Node is Ready
 * (its agent installed atoll-cni and the conflist in the node's own `/opt/cni/bin` and `/etc/cni/net.d`).
 * @throws AtollError LAB_PREREQUISITE_MISSING without the image; LAB_STEP_FAILED naming what did not come up, with
 * the pods' states and log tails.
 */
export async function installAtoll(kube: LabKubernetes, init: {
  plan: LabPlan;
  containerds: ReadonlyMap<string, Containerd>;
  tag: string;
  /** The chart's `networkPolicy.enabled`. */
  networkPolicy?: boolean;
  /** docker-archive images of the user's own, imported beside Atoll's. */
  images?: readonly string[];
  say: (l: string) => void;
}): Promise<AtollInstall> {
  const { plan, say } = init;
  const tarball = atollImageTarball(init.tag);
  if (!existsSync(tarball)) throw atollError('LAB_PREREQUISITE_MISSING', `--kubernetes installs Atoll's image ${tarball}, which is not built`, 'run make image');
  const fail = (what: string, cause?: unknown) => atollError('LAB_STEP_FAILED', `installing Atoll through its chart: ${what}`, `${kube.kubectlCommand.join(' ')} get pods -n ${LAB_ATOLL_NAMESPACE}`, cause);
  let t = performance.now();
  const images = [tarball, ...(init.images ?? [])];
  for (const ctd of init.containerds.values()) for (const image of images) await importImage(ctd, image);
  say(`  image${images.length === 1 ? '' : 's'}: ${images.join(', ')} imported into ${init.containerds.size} containerds (${((performance.now() - t) / 1000).toFixed(1)} s)`);
  t = performance.now();
  await kube.kubectl(['apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'Namespace', metadata: { name: LAB_ATOLL_NAMESPACE } }));
  const secretRun = await exec(ATOLL_BIN, ['kubernetes', 'secret', '--namespace', LAB_ATOLL_NAMESPACE]);
  if (secretRun.code !== 0) throw fail(`atoll kubernetes secret failed (status ${secretRun.code}): ${secretRun.stderr.trim()}`);
  const secret = JSON.parse(secretRun.stdout) as { stringData: Record<string, string> };
  await kube.kubectl(['apply', '-f', '-'], secretRun.stdout);
  const values = labChartValues(plan, init.tag, { networkPolicy: init.networkPolicy ?? false });
  const manifest = await helmTemplate({ binary: join(kube.bins, 'helm'), chart: join(REPO_ROOT, 'deploy', 'helm', 'atoll'), release: 'atoll', namespace: LAB_ATOLL_NAMESPACE, values });
  await kube.kubectl(['apply', '-f', '-'], manifest).catch((err: Error) => {
    throw fail(`kubectl apply of the rendered chart failed: ${err.message}`, err);
  });
  const cloud = plan.nodes.filter((n) => n.site === CLOUD_SITE).length;
  const deadline = Date.now() + ATOLL_READY_TIMEOUT_MS;
  let lacking: string[] = [];
  for (;;) {
    const pods = await atollPods(kube);
    const component = (p: AtollPodJson) => p.metadata.labels?.['app.kubernetes.io/component'] ?? '';
    const ready = (c: (x: string) => boolean) => pods.filter((p) => c(component(p)) && podReady(p));
    const agentNodes = new Set(ready((c) => c.startsWith('agent-')).map((p) => p.spec.nodeName));
    const nodesReady = await kube.kubectl(['get', 'nodes', '-o', 'json']).then((out) => (JSON.parse(out) as { items: NodeJson[] }).items, () => [])
      .then((items) => new Set(items.filter((n) => n.status.conditions?.some((c) => c.type === 'Ready' && c.status === 'True')).map((n) => n.metadata.name)));
    lacking = [
      ...plan.nodes.filter((n) => !agentNodes.has(n.name)).map((n) => `no Ready agent pod on ${n.name}`),
      ...plan.nodes.filter((n) => !nodesReady.has(n.name)).map((n) => `Node ${n.name} not Ready`),
      ...(ready((c) => c === 'controller').length < cloud ? [`${ready((c) => c === 'controller').length}/${cloud} controller replicas Ready`] : []),
      ...(ready((c) => c === 'relay').length < 1 ? ['the relay not Ready'] : []),
    ];
    if (lacking.length === 0) break;
    if (Date.now() > deadline) {
      const states = pods.map((p) => `${p.metadata.name} on ${p.spec.nodeName ?? '-'}: ${p.status.phase}${podReady(p) ? ', Ready' : ''}, restarts ${p.status.containerStatuses?.map((c) => c.restartCount).join('/') ?? '-'}`);
      const containerOf = (p: AtollPodJson) => component(p).replace(/^agent-.*/, 'agent');
      const tails = pods.filter((p) => !podReady(p) && p.spec.nodeName).slice(0, 3)
        .map((p) => `--- ${p.metadata.name}:\n${podLogTail(kube, p.spec.nodeName as string, p.metadata.name, containerOf(p), 15)}`);
      throw fail(`not up within ${ATOLL_READY_TIMEOUT_MS / 1000} s: ${lacking.join('; ')}\n${states.join('\n')}\n${tails.join('\n')}`);
    }
    await sleep(1000);
  }
  const image = `atoll.dev/atoll:${init.tag}`;
  say(`  atoll: installed through deploy/helm/atoll (${image}): ${plan.nodes.length} agent pods Ready, ${cloud} controller replica${cloud === 1 ? '' : 's'} and the relay Ready, every Node Ready (${((performance.now() - t) / 1000).toFixed(1)} s)`);
  return { caCertHash: secret.stringData['ca-cert-hash'] ?? '', relayPin: secret.stringData['relay-pin'] ?? '', image, values };
}
