/**
 * A real kubelet (v1.34) beside a node's private containerd 1.6 (src/lab/io/containerd/containerd.ts), for the
 * lab's Kubernetes mode and its end-to-end test.
 *
 * Why this shape (measured on the test machines: cgroup v1 hybrid layout, PID 1 not systemd, no swap):
 * - The kubelet joins containerd's mount AND network namespaces (`nsenter --mount=/proc/<containerd>/ns/mnt
 *   --net=...`). The volumes it mounts under its root dir (configMap, secret, projected tmpfs) must be visible to
 *   runc, which containerd's shims start in that mount namespace; `ip netns exec` would give the kubelet a private
 *   mount namespace of its own, hiding them.
 * - Configured as hack/local-up-cluster.sh does on such hosts: `cgroupDriver: cgroupfs`, `cgroupsPerQOS: false`,
 *   `enforceNodeAllocatable: []`, `failSwapOn: false`. Without per-QOS cgroups the kubelet gives sandboxes no cgroup
 *   parent (a `cgroupRoot` is ignored then), so containerd puts each container in `/k8s.io/<container id>` of every
 *   hierarchy, which runc removes with the container.
 * - `resolvConf: ""`: pods get no DNS servers from the host (the lab's namespaces must not address anything
 *   outside them).
 * - The kubelet API (port 10250 on the node IP) takes bearer tokens checked by the apiserver (webhook authn/authz)
 *   and, with `clientCa`, certificates that CA signed (the apiserver's own, for `kubectl exec` and `logs`); nothing
 *   is anonymous.
 * - It writes vm.overcommit_memory=1, kernel.panic=10 and kernel.panic_on_oops=1 on the machine at start
 *   (`protectKernelDefaults` false), as every kubelet does; other sysctls are namespaced.
 * Stopped by PID; what it mounted under its root dir is unmounted inside containerd's mount namespace.
 */
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Child, logTail } from '../child-process.ts';
import { renderTokenKubeconfig } from './token-kubeconfig.ts';
import { exec } from '../../../adapters/exec.ts';
import { atollError } from '../../../core/errors.ts';

/** The slice of a running containerd the kubelet needs. */
export interface KubeletRuntime {
  /** containerd's PID: its mount and network namespaces are the node's. */
  readonly pid: number;
  /** containerd's gRPC socket (CRI). */
  readonly socket: string;
}

/** Options of {@link startKubelet}. */
export interface KubeletInit {
  /** The kubelet binary (`sh scripts/k8s.sh all`). */
  readonly binary: string;
  /** A private directory: root dir, config, kubeconfig and log go below it. */
  readonly dir: string;
  readonly runtime: KubeletRuntime;
  /** The Node's name (`--hostname-override`). */
  readonly nodeName: string;
  /** The node's address in its namespace (`--node-ip`, and where the kubelet API listens). */
  readonly nodeIp: string;
  /** Labels the kubelet registers its Node with. */
  readonly labels: Readonly<Record<string, string>>;
  /** The apiserver as this node reaches it, its CA (PEM) and a bearer token of user `system:node:<nodeName>`. */
  readonly apiServer: { readonly server: string; readonly ca: string; readonly token: string };
  /** PEM of the CA whose client certificates the kubelet API accepts (the control plane's `kubeletClientCa`). Default: none. */
  readonly clientCa?: string;
  /**
   * klog's `--vmodule` (`file=level,...`: more verbose logs from those source files only), e.g. `generic=5` for the
   * PLEG's `"GenericPLEG: Relisting"` line at the start of each relist. Default: none (`--v=1` everywhere).
   */
  readonly vmodule?: string;
  /**
   * The KubeletConfiguration's `featureGates`, e.g. `{ EventedPLEG: true }` (alpha in v1.34: needs a runtime that
   * sends CRI container events, containerd 1.7 or newer; with 1.6 the kubelet falls back to its generic PLEG).
   * Default: none.
   */
  readonly featureGates?: Readonly<Record<string, boolean>>;
  /**
   * The KubeletConfiguration's `failCgroupV1`. Kubelets v1.35 and newer default it to true and then refuse to start on
   * a cgroup v1 host such as the test machines ("kubelet is configured to not run on a host using cgroup v1"); false
   * lets them run there. Default: not set (v1.34, the pinned version, has no such check).
   */
  readonly failCgroupV1?: boolean;
}

/** A running kubelet. */
export interface Kubelet {
  readonly pid: number;
  readonly logPath: string;
  readonly rootDir: string;
  /** Where its containers' logs are: `<namespace>_<pod>_<uid>/<container>/<restart>.log`. */
  readonly podLogsDir: string;
  /** False once it exited. */
  readonly running: boolean;
  logTail(lines?: number): string;
  /**
   * SIGTERM (SIGKILL after 5 s), then unmounts what it left under its root dir in containerd's mount namespace.
   * Call before stopping containerd; idempotent. Pods keep running: containerd's stop removes them.
   */
  stop(): Promise<void>;
}

/**
 * The KubeletConfiguration (YAML; JSON is YAML) for a kubelet beside a private containerd on this kind of host; its
 * containers' logs go to `podLogsDir` (the default, the machine's /var/log/pods, would be shared by every kubelet here
 * and outlive it).
 */
export function renderKubeletConfig(init: {
  socket: string;
  nodeIp: string;
  podLogsDir: string;
  /** The file of the CA whose client certificates the kubelet API accepts. */
  clientCaFile?: string;
  featureGates?: Readonly<Record<string, boolean>>;
  failCgroupV1?: boolean;
}): string {
  return `${JSON.stringify({
    apiVersion: 'kubelet.config.k8s.io/v1beta1',
    kind: 'KubeletConfiguration',
    cgroupDriver: 'cgroupfs',
    cgroupsPerQOS: false,
    enforceNodeAllocatable: [],
    failSwapOn: false,
    containerRuntimeEndpoint: `unix://${init.socket}`,
    address: init.nodeIp,
    readOnlyPort: 0,
    healthzBindAddress: '127.0.0.1',
    authentication: { anonymous: { enabled: false }, webhook: { enabled: true }, ...(init.clientCaFile ? { x509: { clientCAFile: init.clientCaFile } } : {}) },
    authorization: { mode: 'Webhook' },
    resolvConf: '',
    rotateCertificates: false,
    podLogsDir: init.podLogsDir,
    ...(init.featureGates ? { featureGates: init.featureGates } : {}),
    ...(init.failCgroupV1 === undefined ? {} : { failCgroupV1: init.failCgroupV1 }),
  }, null, 2)}\n`;
}

/** Mount points at or below `dir` in the mount namespace of `pid`, deepest first. */
function mountsUnder(pid: number, dir: string): string[] {
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/mounts`, 'utf8');
  } catch {
    return []; // the namespace is gone, and its mounts with it
  }
  return text.split('\n')
    .map((line) => (line.split(' ')[1] ?? '').replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8))))
    .filter((m) => m === dir || m.startsWith(`${dir}/`))
    .sort((a, b) => b.split('/').length - a.split('/').length);
}

/**
 * Starts a kubelet in the namespaces of `init.runtime` (a private containerd) and returns once it runs; readiness
 * is the caller's to wait for (the Node turns Ready in the API). Preconditions: root; the containerd is running;
 * the apiserver is reachable from its network namespace. The kubelet registers itself as Node `nodeName`.
 */
export function startKubelet(init: KubeletInit): Kubelet {
  const rootDir = join(init.dir, 'root');
  mkdirSync(rootDir, { recursive: true, mode: 0o700 });
  const caPath = join(init.dir, 'ca.crt');
  const configPath = join(init.dir, 'kubelet.json');
  const kubeconfigPath = join(init.dir, 'kubelet.kubeconfig');
  const logPath = join(init.dir, 'kubelet.log');
  const podLogsDir = join(init.dir, 'pod-logs');
  mkdirSync(podLogsDir, { recursive: true, mode: 0o755 });
  writeFileSync(caPath, init.apiServer.ca);
  const clientCaFile = init.clientCa ? join(init.dir, 'client-ca.crt') : undefined;
  if (clientCaFile) writeFileSync(clientCaFile, init.clientCa as string);
  writeFileSync(configPath, renderKubeletConfig({ socket: init.runtime.socket, nodeIp: init.nodeIp, podLogsDir, clientCaFile, featureGates: init.featureGates, failCgroupV1: init.failCgroupV1 }));
  writeFileSync(kubeconfigPath, renderTokenKubeconfig(init.apiServer.server, caPath, init.apiServer.token), { mode: 0o600 });
  const ns = `/proc/${init.runtime.pid}/ns`;
  const labels = Object.entries(init.labels).map(([k, v]) => `${k}=${v}`).join(',');
  const child = new Child(['nsenter', `--mount=${ns}/mnt`, `--net=${ns}/net`, '--', init.binary,
    '--config', configPath, '--kubeconfig', kubeconfigPath, '--root-dir', rootDir, '--cert-dir', join(init.dir, 'pki'),
    '--hostname-override', init.nodeName, '--node-ip', init.nodeIp, ...(labels ? ['--node-labels', labels] : []), '--v=1',
    ...(init.vmodule ? ['--vmodule', init.vmodule] : [])],
  { output: { log: logPath }, detached: true });
  const pid = child.pid;
  if (pid === undefined) throw atollError('LAB_STEP_FAILED', `kubelet for node ${init.nodeName}: could not start ${init.binary} (nsenter missing?)`, 'install util-linux (nsenter)');
  let stopping: Promise<void> | undefined;
  const stop = async () => {
    await child.stop();
    const mntNs = `--mount=/proc/${init.runtime.pid}/ns/mnt`;
    for (const target of mountsUnder(init.runtime.pid, rootDir)) {
      const res = await exec('nsenter', [mntNs, '--', 'umount', target]);
      if (res.code !== 0) await exec('nsenter', [mntNs, '--', 'umount', '-l', target]);
    }
  };
  return {
    pid,
    logPath,
    rootDir,
    podLogsDir,
    get running() {
      return child.running;
    },
    logTail: (lines = 30) => logTail(logPath, lines),
    stop: () => (stopping ??= stop()),
  };
}
