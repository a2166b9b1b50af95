/**
 * A throwaway Kubernetes control plane for tests, started as controller-runtime's envtest does: a real etcd v3.6
 * (no fsync) and a real kube-apiserver v1.34 on 127.0.0.1 with free ports, a self-signed serving certificate it
 * makes in its cert dir, service-account signing keys, `--authorization-mode=Node,RBAC` and a static token for an
 * admin user (group system:masters). Binaries come from `sh scripts/k8s.sh control-plane` (built once, cached outside
 * the checkout). Stopped by pid; the directory is removed.
 *
 * With `netns`, both run inside that network namespace (on its loopback), for processes there (controllers in a
 * test cloud); this process cannot reach them then, so `admin` throws and readiness and kubectl go through
 * `ip netns exec`.
 *
 * With `nodes`, each name also gets a token of user `system:node:<name>` (group system:nodes), for a real kubelet
 * (`nodeToken`); with `controllers`, kube-controller-manager and kube-scheduler run too. The processes are started
 * by src/lab/io/kube/control-plane.ts.
 */
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { startKubeControlPlane } from '../src/lab/io/kube/control-plane.ts';
import { KubeClient } from '../src/adapters/kube/kube-client.ts';
import { freePort } from './ports.ts';

let binDir: string | undefined;

/** The folder holding etcd, kube-apiserver, kubectl and helm (builds them the first time: minutes). */
export function kubeBinDir(): string {
  binDir ??= process.env.ATOLL_K8S_BIN ?? execFileSync('sh', ['scripts/k8s.sh', 'control-plane'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] }).trim().split('\n').pop() as string;
  return binDir;
}

export interface ControlPlane {
  /** https://127.0.0.1:PORT */
  readonly server: string;
  /** etcd's client URL, http://127.0.0.1:PORT (its JSON gateway writes what the API server would refuse). */
  readonly etcd: string;
  /** The serving certificate (self-signed: it is its own CA). */
  readonly ca: string;
  readonly adminToken: string;
  /** The token of user `system:node:<name>` for each of `nodes` given at start. @throws for another name. */
  nodeToken(name: string): string;
  /** A client authenticated as the admin (system:masters). */
  readonly admin: KubeClient;
  /** Writes a kubeconfig for `token` (default: the admin's) and returns its path. */
  kubeconfig(token?: string, name?: string): string;
  /** Runs kubectl as the admin; returns stdout. Throws with stderr on failure. */
  kubectl(args: readonly string[], input?: string): string;
  /** A token for service account `namespace/name` (TokenRequest, one hour). */
  serviceAccountToken(namespace: string, name: string): Promise<string>;
  /** Kills kube-apiserver (SIGKILL) and waits until it has exited; etcd keeps running. */
  killApiServer(): Promise<void>;
  /** Starts kube-apiserver again on the same port and waits until it is ready. */
  startApiServer(): Promise<void>;
  stop(): Promise<void>;
}

/**
 * Starts the control plane below `dir` (see above). `bins`: a folder with etcd, kube-apiserver, kubectl (and with
 * `controllers` kube-controller-manager and kube-scheduler) to run instead of {@link kubeBinDir}'s;
 * `endpointReconciler`: see src/lab/io/kube/control-plane.ts (`none` for kube-apiserver v1.37 on this loopback);
 * `clientCa`: a CA (PEM file) whose client certificates the apiserver accepts (user = CN, groups = O).
 */
export async function startControlPlane(dir: string, opts: {
  netns?: string; nodes?: readonly string[]; controllers?: boolean; bins?: string; endpointReconciler?: 'lease' | 'none'; clientCa?: string;
} = {}): Promise<ControlPlane> {
  const { netns } = opts;
  const bins = opts.bins ?? kubeBinDir();
  const root = join(dir, `kube-${randomBytes(3).toString('hex')}`);
  mkdirSync(root, { recursive: true });
  const adminToken = randomBytes(16).toString('hex');
  const nodeTokens = new Map((opts.nodes ?? []).map((n) => [n, randomBytes(16).toString('hex')]));
  const launcher = netns ? ['ip', 'netns', 'exec', netns] : [];
  const etcdClient = await freePort();
  const kcp = await startKubeControlPlane({
    bins, dir: root, launcher, address: '127.0.0.1', ports: { etcdClient, etcdPeer: await freePort(), api: await freePort() },
    serviceCidr: '10.96.0.0/16', controllers: opts.controllers, endpointReconciler: opts.endpointReconciler, clientCaFile: opts.clientCa,
    users: [{ token: adminToken, name: 'atoll-test-admin', groups: ['system:masters'] },
      ...[...nodeTokens].map(([n, token]) => ({ token, name: `system:node:${n}`, groups: ['system:nodes'] }))],
  });
  const admin = netns ? undefined : new KubeClient({ server: new URL(kcp.server), ca: kcp.ca, token: () => adminToken, userAgent: 'atoll-test' });

  const cp: ControlPlane = {
    server: kcp.server,
    etcd: `http://127.0.0.1:${etcdClient}`,
    get ca() {
      return kcp.ca;
    },
    adminToken,
    nodeToken(name) {
      const token = nodeTokens.get(name);
      if (token === undefined) throw new Error(`no token for node ${name}: pass it in startControlPlane's nodes`);
      return token;
    },
    get admin() {
      if (admin === undefined) throw new Error(`the control plane runs in network namespace ${netns}: use kubectl`);
      return admin;
    },
    kubeconfig: (token = adminToken, name = 'admin') => kcp.kubeconfig(token, name),
    kubectl(args, input) {
      const argv = [...launcher, join(bins, 'kubectl'), '--kubeconfig', cp.kubeconfig(), ...args];
      return execFileSync(argv[0]!, argv.slice(1), { encoding: 'utf8', input, stdio: ['pipe', 'pipe', 'pipe'] });
    },
    async serviceAccountToken(namespace, name) {
      const res = await cp.admin.create<{ status: { token: string } }>(`/api/v1/namespaces/${namespace}/serviceaccounts/${name}/token`,
        { apiVersion: 'authentication.k8s.io/v1', kind: 'TokenRequest', spec: { expirationSeconds: 3600 } });
      return res.status.token;
    },
    killApiServer: () => kcp.killApiServer(),
    startApiServer: () => kcp.startApiServer(),
    async stop() {
      admin?.close();
      await kcp.stop();
      rmSync(root, { recursive: true, force: true });
    },
  };
  return cp;
}
