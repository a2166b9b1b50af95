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
 * (`nodeToken`).
 */
import { spawn, execFileSync, type ChildProcess } from 'node:child_process';
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { closeSync, mkdirSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { KubeClient } from '../../src/adapters/kube/kube-client.ts';
import { freePort } from './ports.ts';

const START_DEADLINE_MS = 90_000;

let binDir: string | undefined;

/** The folder holding etcd, kube-apiserver, kubectl and helm (builds them the first time: minutes). */
export function kubeBinDir(): string {
  binDir ??= process.env.ATOLL_K8S_BIN ?? execFileSync('sh', ['scripts/k8s.sh', 'control-plane'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] }).trim().split('\n').pop() as string;
  return binDir;
}

export interface ControlPlane {
  /** https://127.0.0.1:PORT */
  readonly server: string;
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

interface Proc {
  readonly child: ChildProcess;
  readonly exited: Promise<void>;
  alive: boolean;
}

function run(bin: string, args: readonly string[], log: string, netns?: string): Proc {
  const out = openSync(log, 'a');
  const child = netns ? spawn('ip', ['netns', 'exec', netns, bin, ...args], { stdio: ['ignore', out, out] }) : spawn(bin, args, { stdio: ['ignore', out, out] });
  closeSync(out);
  const p: Proc = { child, alive: true, exited: Promise.resolve() };
  (p as { exited: Promise<void> }).exited = new Promise((resolve) => child.once('exit', () => {
    p.alive = false;
    resolve();
  }));
  return p;
}

async function stopProc(p: Proc | undefined): Promise<void> {
  if (p?.alive && p.child.pid) process.kill(p.child.pid, 'SIGKILL');
  await p?.exited;
}

function tail(file: string): string {
  try {
    return readFileSync(file, 'utf8').split('\n').slice(-20).join('\n');
  } catch {
    return '(no log)';
  }
}

export async function startControlPlane(dir: string, opts: { netns?: string; nodes?: readonly string[] } = {}): Promise<ControlPlane> {
  const { netns } = opts;
  const bins = kubeBinDir();
  const root = join(dir, `kube-${randomBytes(3).toString('hex')}`);
  const certDir = join(root, 'certs');
  mkdirSync(certDir, { recursive: true });
  const [etcdClient, etcdPeer, apiPort] = [await freePort(), await freePort(), await freePort()];
  const etcdUrl = `http://127.0.0.1:${etcdClient}`;
  const etcdLog = join(root, 'etcd.log');
  const etcd = run(join(bins, 'etcd'), [
    '--data-dir', join(root, 'etcd'), '--listen-client-urls', etcdUrl, '--advertise-client-urls', etcdUrl,
    '--listen-peer-urls', `http://127.0.0.1:${etcdPeer}`, '--initial-advertise-peer-urls', `http://127.0.0.1:${etcdPeer}`,
    '--initial-cluster', `default=http://127.0.0.1:${etcdPeer}`, '--unsafe-no-fsync', '--log-level', 'warn',
  ], etcdLog, netns);

  const adminToken = randomBytes(16).toString('hex');
  const nodeTokens = new Map((opts.nodes ?? []).map((n) => [n, randomBytes(16).toString('hex')]));
  const tokenLines = [`${adminToken},atoll-test-admin,atoll-test-admin,"system:masters"`,
    ...[...nodeTokens].map(([n, t]) => `${t},system:node:${n},node-${n},"system:nodes"`)];
  writeFileSync(join(root, 'tokens.csv'), `${tokenLines.join('\n')}\n`, { mode: 0o600 });
  const sa = generateKeyPairSync('rsa', { modulusLength: 2048 });
  writeFileSync(join(root, 'sa.key'), sa.privateKey.export({ type: 'pkcs8', format: 'pem' }) as string, { mode: 0o600 });
  writeFileSync(join(root, 'sa.pub'), sa.publicKey.export({ type: 'spki', format: 'pem' }) as string);
  const server = `https://127.0.0.1:${apiPort}`;
  const apiLog = join(root, 'kube-apiserver.log');
  const apiArgs = [
    '--etcd-servers', etcdUrl, '--cert-dir', certDir, '--secure-port', String(apiPort), '--bind-address', '127.0.0.1',
    '--advertise-address', '127.0.0.1', '--service-cluster-ip-range', '10.96.0.0/16', '--allow-privileged=true',
    '--service-account-issuer', 'https://kubernetes.default.svc', '--service-account-key-file', join(root, 'sa.pub'),
    '--service-account-signing-key-file', join(root, 'sa.key'), '--authorization-mode', 'Node,RBAC',
    '--token-auth-file', join(root, 'tokens.csv'), '--disable-admission-plugins', 'ServiceAccount',
    '--enable-priority-and-fairness=false', '--profiling=false', '--v=0',
  ];
  let api: Proc | undefined = run(join(bins, 'kube-apiserver'), apiArgs, apiLog, netns);
  let admin: KubeClient | undefined;
  let ca = '';

  const waitReady = async () => {
    const deadline = Date.now() + START_DEADLINE_MS;
    let last = 'no answer yet';
    while (Date.now() < deadline) {
      if (!etcd.alive) throw new Error(`etcd exited while starting:\n${tail(etcdLog)}`);
      if (!api?.alive) throw new Error(`kube-apiserver exited while starting:\n${tail(apiLog)}`);
      try {
        ca ||= readFileSync(join(certDir, 'apiserver.crt'), 'utf8');
        if (netns) {
          if (cp.kubectl(['get', '--raw=/readyz']).trim() === 'ok') return;
        } else {
          admin ??= new KubeClient({ server: new URL(server), ca, token: () => adminToken, userAgent: 'atoll-test' });
          const ready = await admin.request<string>('GET', '/readyz');
          if (String(ready) === 'ok' || ready === undefined) return;
        }
      } catch (err) {
        last = String(err);
      }
      await new Promise((r) => setTimeout(r, 250));
    }
    throw new Error(`kube-apiserver at ${server} not ready within ${START_DEADLINE_MS} ms (${last}):\n${tail(apiLog)}`);
  };

  const cp: ControlPlane = {
    server,
    get ca() {
      return ca;
    },
    adminToken,
    nodeToken(name) {
      const token = nodeTokens.get(name);
      if (token === undefined) throw new Error(`no token for node ${name}: pass it in startControlPlane's nodes`);
      return token;
    },
    get admin() {
      if (netns) throw new Error(`the control plane runs in network namespace ${netns}: use kubectl`);
      return admin as KubeClient;
    },
    kubeconfig(token = adminToken, name = 'admin') {
      const path = join(root, `${name}.kubeconfig`);
      writeFileSync(join(root, 'ca.crt'), ca);
      writeFileSync(path, [
        'apiVersion: v1', 'kind: Config', 'current-context: test',
        'clusters:', `- name: test`, '  cluster:', `    server: ${server}`, `    certificate-authority: ${join(root, 'ca.crt')}`,
        'users:', `- name: ${name}`, '  user:', `    token: ${token}`,
        'contexts:', '- name: test', '  context:', '    cluster: test', `    user: ${name}`, '',
      ].join('\n'), { mode: 0o600 });
      return path;
    },
    kubectl(args, input) {
      const argv = [join(bins, 'kubectl'), '--kubeconfig', cp.kubeconfig(), ...args];
      return netns ? execFileSync('ip', ['netns', 'exec', netns, ...argv], { encoding: 'utf8', input, stdio: ['pipe', 'pipe', 'pipe'] })
        : execFileSync(argv[0]!, argv.slice(1), { encoding: 'utf8', input, stdio: ['pipe', 'pipe', 'pipe'] });
    },
    async serviceAccountToken(namespace, name) {
      const res = await (admin as KubeClient).create<{ status: { token: string } }>(`/api/v1/namespaces/${namespace}/serviceaccounts/${name}/token`,
        { apiVersion: 'authentication.k8s.io/v1', kind: 'TokenRequest', spec: { expirationSeconds: 3600 } });
      return res.status.token;
    },
    async killApiServer() {
      await stopProc(api);
      api = undefined;
    },
    async startApiServer() {
      api = run(join(bins, 'kube-apiserver'), apiArgs, apiLog, netns);
      await waitReady();
    },
    async stop() {
      admin?.close();
      await stopProc(api);
      await stopProc(etcd);
      rmSync(root, { recursive: true, force: true });
    },
  };
  try {
    await waitReady();
  } catch (err) {
    await cp.stop();
    throw err;
  }
  return cp;
}
