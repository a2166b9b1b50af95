/**
 * A Kubernetes control plane from real processes: etcd v3.6, kube-apiserver v1.34 and, when asked, the
 * kube-controller-manager and kube-scheduler, started as controller-runtime's envtest and hack/local-up-cluster.sh
 * do. For the lab's Kubernetes mode and the tests (harness/kube.ts).
 *
 * Why this shape:
 * - Every process runs behind an optional launcher prefix (`nsenter --net=...`) so the control plane can live in a
 *   network namespace (the lab's cloud) and bind an address the nodes reach there; etcd listens on that
 *   namespace's loopback only.
 * - Authentication is a static token file (users and groups given by the caller: an admin in system:masters, a
 *   `system:node:<name>` per kubelet) so no client certificates are minted; the apiserver makes its self-signed
 *   serving certificate in its cert dir (it is its own CA). `--authorization-mode=Node,RBAC`.
 * - Readiness is asked with kubectl through the same launcher, so it works whether or not this process can reach
 *   the apiserver's address.
 * - The apiserver calls kubelets (`kubectl exec`, `logs`, `port-forward`) with a client certificate of a small CA of
 *   its own (`kubeletClientCa`, which kubelets trust as their x509 client CA), in group system:masters, so a kubelet's
 *   webhook authorization allows it: as kubeadm's apiserver-kubelet-client. It reaches only kubelets on its own
 *   network (the lab's cloud nodes; an edge kubelet behind its NAT is out of its reach, as in a real edge cluster
 *   without a tunnel for it).
 * Processes are stopped by PID (SIGKILL: nothing here needs a graceful stop; etcd runs without fsync).
 */
import { execFile } from 'node:child_process';
import { generateKeyPairSync } from 'node:crypto';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { atollError } from '../../../core/errors.ts';
import { Child, logTail } from '../child-process.ts';
import { renderTokenKubeconfig } from './token-kubeconfig.ts';
import { exec } from '../../../adapters/exec.ts';

const START_DEADLINE_MS = 90_000;

/** A user of the static token file. */
export interface KubeTokenUser {
  readonly token: string;
  readonly name: string;
  readonly groups: readonly string[];
}

/** Options of {@link startKubeControlPlane}. */
export interface KubeControlPlaneInit {
  /** The folder with etcd, kube-apiserver, kubectl (and kube-controller-manager, kube-scheduler with `controllers`). */
  readonly bins: string;
  /** A private directory: data, certificates, keys, kubeconfigs and logs go below it. */
  readonly dir: string;
  /** Prefix that leads into the namespace to run in (e.g. `['nsenter', '--net=/var/run/netns/X']`); none: here. */
  readonly launcher?: readonly string[];
  /** Where the apiserver listens and what it advertises (an address of that namespace). */
  readonly address: string;
  readonly ports: { readonly etcdClient: number; readonly etcdPeer: number; readonly api: number };
  readonly serviceCidr: string;
  /** The static token file's users; the first must be in system:masters (readiness checks and the controllers use it). */
  readonly users: readonly KubeTokenUser[];
  /** Also run kube-controller-manager and kube-scheduler (node IPAM off: the CNI allocates pod addresses). */
  readonly controllers?: boolean;
  /**
   * kube-apiserver's `--endpoint-reconciler-type` (what keeps the `kubernetes` Service's endpoints on the apiservers'
   * addresses). Default: not given, the apiserver's own default (`lease`). kube-apiserver v1.37 refuses to start with
   * `lease` when `address` is a loopback one ("cannot use public IP 127.0.0.1 with endpoint reconciler: ... may not be
   * in the loopback range"; v1.34 starts); `none` starts it, and leaves that Service without endpoints: fine where
   * nothing reaches the apiserver through it.
   */
  readonly endpointReconciler?: 'lease' | 'none';
  /**
   * A CA (PEM file) whose client certificates the apiserver accepts (`--client-ca-file`): user = CN, groups = O.
   * Default: none, tokens only. For clients that authenticate with a certificate alone (yurthub).
   */
  readonly clientCaFile?: string;
}

/** A running control plane. */
export interface KubeControlPlane {
  /** https://ADDRESS:PORT */
  readonly server: string;
  /** The apiserver's serving certificate, PEM (self-signed: it is its own CA). */
  readonly ca: string;
  /** The CA of the apiserver's client certificate for kubelets, PEM: a kubelet's `authentication.x509.clientCAFile`. */
  readonly kubeletClientCa: string;
  /** A kubeconfig for `token` at `dir/<name>.kubeconfig`, written on demand; returns its path. */
  kubeconfig(token: string, name: string): string;
  /** PIDs by role (etcd, kube-apiserver, ...), for state files and crash clean-up. */
  readonly pids: Readonly<Record<string, number>>;
  /** Runs kubectl with `kubeconfig` through the launcher; resolves with stdout, rejects with stderr. */
  kubectl(kubeconfig: string, args: readonly string[], input?: string): Promise<string>;
  /** Kills kube-apiserver (SIGKILL) and waits until it exited; etcd keeps running. */
  killApiServer(): Promise<void>;
  /** Starts kube-apiserver again on the same port and waits until it is ready. */
  startApiServer(): Promise<void>;
  /** Last lines of every log, for failure messages. */
  logTails(lines?: number): string;
  /** Stops every process (by PID). Idempotent. */
  stop(): Promise<void>;
}

/**
 * Starts etcd and kube-apiserver (and with `controllers` the controller-manager and scheduler) and resolves once
 * the apiserver answers /readyz. On failure everything started is stopped and the error carries the log tails.
 */
export async function startKubeControlPlane(init: KubeControlPlaneInit): Promise<KubeControlPlane> {
  const { bins, dir, address, ports } = init;
  const launcher = init.launcher ?? [];
  const admin = init.users[0];
  // cannot happen: both callers (src/lab/lab-kube.ts, harness/kube.ts) put their admin, in system:masters, first
  if (admin === undefined || !admin.groups.includes('system:masters')) throw new Error('kube control plane: the first user must be in group system:masters');
  const certDir = join(dir, 'certs');
  mkdirSync(certDir, { recursive: true, mode: 0o700 });
  const server = `https://${address.includes(':') ? `[${address}]` : address}:${ports.api}`;
  const procs = new Map<string, Child>();
  const logs = new Map<string, string>();
  const start = (role: string, args: readonly string[]) => {
    const log = join(dir, `${role}.log`);
    logs.set(role, log);
    procs.set(role, new Child([...launcher, join(bins, role), ...args], { output: { log }, detached: true }));
  };
  const etcdUrl = `http://127.0.0.1:${ports.etcdClient}`;
  const peerUrl = `http://127.0.0.1:${ports.etcdPeer}`;
  start('etcd', ['--data-dir', join(dir, 'etcd'), '--listen-client-urls', etcdUrl, '--advertise-client-urls', etcdUrl,
    '--listen-peer-urls', peerUrl, '--initial-advertise-peer-urls', peerUrl, '--initial-cluster', `default=${peerUrl}`,
    '--unsafe-no-fsync', '--log-level', 'warn']);
  const tokenLines = init.users.map((u) => `${u.token},${u.name},${u.name},"${u.groups.join(',')}"`);
  writeFileSync(join(dir, 'tokens.csv'), `${tokenLines.join('\n')}\n`, { mode: 0o600 });
  const sa = generateKeyPairSync('rsa', { modulusLength: 2048 });
  const saKey = join(dir, 'sa.key');
  writeFileSync(saKey, sa.privateKey.export({ type: 'pkcs8', format: 'pem' }) as string, { mode: 0o600 });
  writeFileSync(join(dir, 'sa.pub'), sa.publicKey.export({ type: 'spki', format: 'pem' }) as string);
  const kubeletClient = await mintKubeletClient(certDir);
  const apiArgs = [
    '--kubelet-client-certificate', kubeletClient.cert, '--kubelet-client-key', kubeletClient.key,
    '--etcd-servers', etcdUrl, '--cert-dir', certDir, '--secure-port', String(ports.api), '--bind-address', address,
    '--advertise-address', address, '--service-cluster-ip-range', init.serviceCidr, '--allow-privileged=true',
    '--service-account-issuer', 'https://kubernetes.default.svc', '--service-account-key-file', join(dir, 'sa.pub'),
    '--service-account-signing-key-file', saKey, '--authorization-mode', 'Node,RBAC',
    '--token-auth-file', join(dir, 'tokens.csv'),
    // pods get their ServiceAccount's token mounted (ServiceAccount admission) only where the controller-manager
    // runs: its service-account controllers make each namespace's `default` account, which that admission requires
    ...(init.controllers ? [] : ['--disable-admission-plugins', 'ServiceAccount']),
    '--kubelet-preferred-address-types', 'InternalIP', '--enable-priority-and-fairness=false', '--profiling=false', '--v=0',
    ...(init.endpointReconciler ? ['--endpoint-reconciler-type', init.endpointReconciler] : []),
    ...(init.clientCaFile ? ['--client-ca-file', init.clientCaFile] : []),
  ];
  start('kube-apiserver', apiArgs);
  let ca = '';
  const caPath = join(dir, 'ca.crt');
  const kubeconfig = (token: string, name: string) => {
    const path = join(dir, `${name}.kubeconfig`);
    writeFileSync(path, renderTokenKubeconfig(server, caPath, token), { mode: 0o600 });
    return path;
  };
  const adminConfig = () => kubeconfig(admin.token, 'admin');
  const kubectl = (config: string, args: readonly string[], input?: string) => new Promise<string>((resolve, reject) => {
    const argv = [...launcher, join(bins, 'kubectl'), '--kubeconfig', config, ...args];
    const child = execFile(argv[0] as string, argv.slice(1), { maxBuffer: 64 * 1024 * 1024, timeout: 60_000 }, (err, stdout, stderr) => {
      if (err) reject(atollError('LAB_STEP_FAILED', `kubectl ${args.join(' ')}: ${stderr.trim() || err.message}`, `kubectl says why; the API server logs to ${join(dir, 'kube-apiserver.log')}`, err));
      else resolve(stdout);
    });
    // kubectl may exit before it reads its input (an API server not up yet): its exit status says why, not an EPIPE
    child.stdin?.on('error', () => {});
    child.stdin?.end(input ?? '');
  });
  const logTails = (lines = 15) => [...logs].map(([role, log]) => `--- ${role}:\n${logTail(log, lines)}`).join('\n');
  const waitReady = async () => {
    const deadline = Date.now() + START_DEADLINE_MS;
    let last = 'no answer yet';
    while (Date.now() < deadline) {
      for (const [role, p] of procs) if (!p.running) throw atollError('LAB_STEP_FAILED', `${role} exited while starting:\n${logTail(logs.get(role) as string, 20)}`, `read ${logs.get(role)}`);
      try {
        ca ||= readFileSync(join(certDir, 'apiserver.crt'), 'utf8');
        writeFileSync(caPath, ca);
        if ((await kubectl(adminConfig(), ['get', '--raw=/readyz'])).trim() === 'ok') return;
      } catch (err) {
        last = (err as Error).message;
      }
      await new Promise((r) => setTimeout(r, 250));
    }
    throw atollError('LAB_STEP_FAILED', `kube-apiserver at ${server} not ready within ${START_DEADLINE_MS} ms (${last}):\n${logTails()}`, `read the logs under ${dir}`);
  };
  const stopAll = async () => {
    for (const p of [...procs.values()].reverse()) await p.stop('SIGKILL');
  };
  let stopping: Promise<void> | undefined;
  try {
    await waitReady();
    if (init.controllers) {
      start('kube-controller-manager', ['--kubeconfig', adminConfig(), '--service-account-private-key-file', saKey, '--root-ca-file', caPath,
        '--use-service-account-credentials', '--allocate-node-cidrs=false', '--leader-elect=false', '--secure-port=0', '--v=0']);
      start('kube-scheduler', ['--kubeconfig', adminConfig(), '--leader-elect=false', '--secure-port=0', '--v=0']);
    }
  } catch (err) {
    await stopAll();
    throw err;
  }
  return {
    server,
    get ca() {
      return ca;
    },
    kubeletClientCa: kubeletClient.caPem,
    get pids() {
      return Object.fromEntries([...procs].filter(([, p]) => p.running && p.pid !== undefined).map(([role, p]) => [role, p.pid as number]));
    },
    kubeconfig,
    kubectl,
    async killApiServer() {
      await procs.get('kube-apiserver')?.stop('SIGKILL');
    },
    async startApiServer() {
      start('kube-apiserver', apiArgs);
      await waitReady();
    },
    logTails,
    stop: () => (stopping ??= stopAll()),
  };
}

/**
 * A CA and the apiserver's client certificate for kubelets it signs (CN kube-apiserver-kubelet-client, O
 * system:masters), EC P-256 keys, with the `openssl` CLI (Node cannot issue certificates), under `certDir`.
 * @throws AtollError LAB_STEP_FAILED naming the openssl step that failed.
 */
async function mintKubeletClient(certDir: string): Promise<{ cert: string; key: string; caPem: string }> {
  const path = (name: string) => join(certDir, name);
  const openssl = async (args: readonly string[]) => {
    const res = await exec('openssl', args);
    if (res.code !== 0) throw atollError('LAB_STEP_FAILED', `openssl ${args[0]} for the apiserver's kubelet client certificate failed: ${res.stderr.trim()}`, 'install openssl (apt-get install openssl)');
  };
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes'];
  await openssl(['req', '-x509', ...ec, '-keyout', path('kubelet-client-ca.key'), '-out', path('kubelet-client-ca.crt'), '-days', '3650', '-subj', '/CN=atoll-lab-kubelet-client-ca']);
  await openssl(['req', ...ec, '-keyout', path('kubelet-client.key'), '-out', path('kubelet-client.csr'), '-subj', '/O=system:masters/CN=kube-apiserver-kubelet-client']);
  await openssl(['x509', '-req', '-in', path('kubelet-client.csr'), '-CA', path('kubelet-client-ca.crt'), '-CAkey', path('kubelet-client-ca.key'),
    '-CAcreateserial', '-out', path('kubelet-client.crt'), '-days', '3650']);
  return { cert: path('kubelet-client.crt'), key: path('kubelet-client.key'), caPem: readFileSync(path('kubelet-client-ca.crt'), 'utf8') };
}
