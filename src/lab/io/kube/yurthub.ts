/**
 * OpenYurt's yurthub v1.7 (built by `sh scripts/k8s.sh all` from the wrapper module k8s/yurthub) in front of an
 * edge node's kubelet and kube-proxy, for the lab's `--openyurt` mode and its tests: the edge cache that keeps a node's
 * API while the cloud is away.
 *
 * Why this shape (measured with yurthub v1.7 and kube-apiserver v1.34, test/kube/yurthub.test.ts):
 * - Edge working mode, in the node's network namespace, listening on its loopback at yurthub's default ports (the
 *   kubelet and kube-proxy reach it at http://127.0.0.1:10261, as OpenYurt configures them).
 * - Its client certificate (user `system:node:<node>`, groups `openyurt:yurthub` and `system:nodes`, what its own CSR
 *   would ask for) and its serving certificate come from a CA of the lab that the apiserver trusts (`--client-ca-file`),
 *   written where its file store keeps them (`<root>/pki/<name>-current.pem`), so it files no CSR that nobody would
 *   approve. Its bootstrap file names only the server and its CA.
 * - It writes /var/lib/yurthub whatever its flags say: it runs in a mount namespace of its own (`unshare`) whose
 *   /var/lib is a folder of the node, so its cache and certificates survive its restarts as on a real node's disk.
 * - It needs the NodePool CRD, a NodePool named by `--nodepool-name`, its RBAC and the `yurt-hub-cfg` ConfigMap
 *   (labelled `openyurt.io/configmap-name=yurt-hub-cfg`, where `cache_agents` is read): applied once per cluster from
 *   OpenYurt's own charts in the Go module cache ({@link openyurtCharts}).
 * Stopped by PID.
 */
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { atollError } from '../../../core/errors.ts';
import { exec } from '../../../adapters/exec.ts';
import { Child, logTail } from '../child-process.ts';

/** Where the kubelet and kube-proxy of a node behind yurthub reach the API: its proxy port, plain HTTP, on loopback. */
export const YURTHUB_PROXY_URL = 'http://127.0.0.1:10261';
/** yurthub's health, readiness and metrics port (on the same loopback). */
const YURTHUB_SERVE_PORT = 10267;
const READY_DEADLINE_MS = 60_000;

/** A CA of the lab that the apiserver trusts for client certificates; yurthubs' certificates are issued from it. */
export interface LabCa {
  readonly cert: string;
  readonly key: string;
}

async function openssl(args: readonly string[], what: string): Promise<void> {
  const res = await exec('openssl', args);
  if (res.code !== 0) throw atollError('LAB_STEP_FAILED', `openssl ${args[0]} for ${what} failed: ${res.stderr.trim()}`, 'install openssl (apt-get install openssl)');
}

const EC = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes'];

/** Makes a CA (EC P-256) in `dir`, for the apiserver's `--client-ca-file`. */
export async function makeLabCa(dir: string, name: string): Promise<LabCa> {
  mkdirSync(dir, { recursive: true });
  const ca = { cert: join(dir, `${name}.crt`), key: join(dir, `${name}.key`) };
  await openssl(['req', '-x509', ...EC, '-keyout', ca.key, '-out', ca.cert, '-days', '3650', '-subj', `/CN=${name}`], `the CA ${name}`);
  return ca;
}

/**
 * Issues node `node`'s yurthub client and serving certificates from `ca` into `pki` (the client-go file store's
 * layout: `<name>-current.pem` holds the certificate and its key), with exactly the names its own CSRs would ask for
 * (else it asks for new ones); `work` keeps the keys and requests.
 */
export async function issueYurthubCertificates(ca: LabCa, node: string, pki: string, work: string): Promise<void> {
  mkdirSync(pki, { recursive: true });
  mkdirSync(work, { recursive: true });
  const p = (f: string) => join(work, f);
  const issue = async (name: string, subject: string, ext: string) => {
    writeFileSync(p(`${name}.ext`), ext);
    await openssl(['req', ...EC, '-keyout', p(`${name}.key`), '-out', p(`${name}.csr`), '-subj', subject], `yurthub's ${name} certificate of ${node}`);
    await openssl(['x509', '-req', '-in', p(`${name}.csr`), '-CA', ca.cert, '-CAkey', ca.key, '-CAcreateserial', '-out', p(`${name}.crt`), '-days', '3650', '-extfile', p(`${name}.ext`)],
      `yurthub's ${name} certificate of ${node}`);
    writeFileSync(join(pki, `${name}-current.pem`), readFileSync(p(`${name}.crt`), 'utf8') + readFileSync(p(`${name}.key`), 'utf8'), { mode: 0o600 });
  };
  await issue('yurthub', `/O=openyurt:yurthub/O=system:nodes/CN=system:node:${node}`, 'keyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n');
  // the kubernetes Service's ClusterIP and its default dummy-interface address even with the interface off
  await issue('yurthub-server', `/O=system:nodes/CN=system:node:${node}`, 'keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n'
    + 'subjectAltName=IP:10.96.0.1,IP:169.254.2.1,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n');
}

/** Options of {@link startYurthub}. */
export interface YurthubInit {
  readonly binary: string;
  /** The node's folder for yurthub: its root (certificates), cache, /var/lib and log go below it. */
  readonly dir: string;
  /** The node's network namespace (a path under /var/run/netns). */
  readonly netnsPath: string;
  readonly nodeName: string;
  /** Its NodePool (the lab's: the node's site). */
  readonly pool: string;
  /** The apiserver as the node reaches it, and its CA (PEM). */
  readonly apiServer: { readonly server: string; readonly ca: string };
}

export interface Yurthub {
  readonly pid: number;
  readonly logPath: string;
  readonly running: boolean;
  logTail(lines?: number): string;
  /** Whether its readiness answers 200 now (asked inside the node's namespace). */
  ready(): Promise<boolean>;
  stop(): Promise<void>;
}

/**
 * Starts yurthub for `init.nodeName` (its certificates already issued into `<dir>/root/pki`: {@link
 * issueYurthubCertificates}) and resolves once it is ready.
 * @throws AtollError LAB_STEP_FAILED when it exits or is not ready within a minute, with its log tail.
 */
export async function startYurthub(init: YurthubInit): Promise<Yurthub> {
  const root = join(init.dir, 'root');
  const varLib = join(init.dir, 'var-lib');
  const cache = join(init.dir, 'cache');
  const logPath = join(init.dir, 'yurthub.log');
  for (const d of [root, varLib, cache]) mkdirSync(d, { recursive: true });
  const bootstrap = join(init.dir, 'bootstrap-hub.conf');
  writeFileSync(bootstrap, `${JSON.stringify({
    apiVersion: 'v1', kind: 'Config', 'current-context': 'hub',
    clusters: [{ name: 'cloud', cluster: { server: init.apiServer.server, 'certificate-authority-data': Buffer.from(init.apiServer.ca).toString('base64') } }],
    users: [{ name: 'hub', user: {} }], contexts: [{ name: 'hub', context: { cluster: 'cloud', user: 'hub' } }],
  })}\n`, { mode: 0o600 });
  const args = [`--server-addr=${init.apiServer.server}`, `--node-name=${init.nodeName}`, `--nodepool-name=${init.pool}`, '--working-mode=edge',
    '--enable-dummy-if=false', '--node-ip=127.0.0.1', '--bind-address=127.0.0.1', '--bind-proxy-address=127.0.0.1',
    `--root-dir=${root}`, `--disk-cache-path=${cache}/`, `--bootstrap-file=${bootstrap}`, '--heartbeat-interval-seconds=2', '--heartbeat-failed-retry=1', '--v=2'];
  // nsenter execs unshare, which execs sh, which execs yurthub: one PID throughout, the one stopped
  const child = new Child(['nsenter', `--net=${init.netnsPath}`, '--', 'unshare', '--mount', '--propagation', 'private', '--',
    'sh', '-c', 'mount --bind "$0" /var/lib && exec "$@"', varLib, init.binary, ...args], { output: { log: logPath }, detached: true });
  const pid = child.pid;
  if (pid === undefined) throw atollError('LAB_STEP_FAILED', `yurthub of ${init.nodeName}: could not start ${init.binary}`, 'install util-linux (nsenter, unshare)');
  const ready = async () => (await exec('nsenter', [`--net=${init.netnsPath}`, '--', 'curl', '-s', '-o', '/dev/null', '-w', '%{http_code}', '--max-time', '2',
    `http://127.0.0.1:${YURTHUB_SERVE_PORT}/v1/readyz`])).stdout.trim() === '200';
  const hub: Yurthub = {
    pid, logPath,
    get running() {
      return child.running;
    },
    logTail: (lines = 30) => logTail(logPath, lines),
    ready,
    stop: () => child.stop(),
  };
  const deadline = Date.now() + READY_DEADLINE_MS;
  while (!(await ready())) {
    if (!child.running || Date.now() > deadline) {
      await child.stop();
      throw atollError('LAB_STEP_FAILED', `yurthub of ${init.nodeName} ${child.running ? `not ready within ${READY_DEADLINE_MS / 1000} s` : 'exited'}:\n${logTail(logPath, 20)}`,
        'its log tail says why: a missing NodePool CRD or NodePool keeps readiness at 500; an unlabelled yurt-hub-cfg ConfigMap leaves cache_agents unread');
    }
    await new Promise((r) => setTimeout(r, 500));
  }
  return hub;
}

/** OpenYurt's charts in the Go module cache, at the version k8s/yurthub/go.mod pins (`sh scripts/k8s.sh all` downloads it). */
export async function openyurtCharts(repoRoot: string): Promise<string> {
  const pin = /^\s*github\.com\/openyurtio\/openyurt (v\S+)/m.exec(readFileSync(join(repoRoot, 'k8s', 'yurthub', 'go.mod'), 'utf8'))?.[1];
  const res = await exec('go', ['env', 'GOMODCACHE']);
  const charts = join(res.stdout.trim(), `github.com/openyurtio/openyurt@${pin ?? '(no pin in k8s/yurthub/go.mod)'}`, 'charts');
  if (res.code !== 0 || !existsSync(charts)) {
    throw atollError('LAB_PREREQUISITE_MISSING', `OpenYurt's charts are not in the Go module cache (${charts})`, 'run make k8s (sh scripts/k8s.sh all downloads the openyurt module to build yurthub)');
  }
  return charts;
}
