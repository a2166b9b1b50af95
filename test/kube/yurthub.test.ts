/**
 * OpenYurt's yurthub v1.7 (built by `make k8s` from the wrapper module k8s/yurthub) beside a real kube-apiserver
 * v1.34 (harness/kube.ts): the edge cache issue #36 puts in front of an edge node's kubelet and kube-proxy. Installed
 * as OpenYurt installs it: the NodePool CRD from its yurt-manager chart, the `yurt-hub-cfg` ConfigMap and yurthub's
 * RBAC from its yurthub chart (both in the openyurt module, rendered with helm), naming one client in `cache_agents`.
 * yurthub runs for node edge-1 in edge working mode with certificates from a CA of the test (the apiserver's
 * `--client-ca-file`), pre-seeded so it files no CSR (which nobody here would approve). With the apiserver killed, a
 * list and a get made online by the named client are answered from yurthub's disk cache, a watch closes at its
 * timeout, a delete is refused; a client not named in `cache_agents` is refused.
 *
 * yurthub writes /var/lib/yurthub/autonomy whatever its flags say: it runs in a mount namespace of its own whose
 * /var/lib is a folder of the test. Everything listens on 127.0.0.1 with free ports; the process is stopped by PID.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Child, logTail } from '../../src/lab/io/child-process.ts';
import { kubeBinDir, startControlPlane, type ControlPlane } from '../../harness/kube.ts';
import { isRoot } from '../../harness/netns.ts';
import { freePort } from '../../harness/ports.ts';
import { until } from '../../harness/wait.ts';

const NODE = 'edge-1';
const POOL = 'edge-pool';
/** Named in `cache_agents` (yurthub compares the User-Agent up to its first slash). */
const CACHED = 'atoll-test-cached/v0';
/** Not named there, nor among yurthub's defaults (kubelet, kube-proxy, flanneld, coredns, ...). */
const UNCACHED = 'atoll-test-uncached/v0';
const POD_LIST = `/api/v1/pods?fieldSelector=${encodeURIComponent(`spec.nodeName=${NODE}`)}`;
const POD_GET = '/api/v1/namespaces/default/pods/p1';

/** OpenYurt's charts in the Go module cache (`sh scripts/k8s.sh all` downloads the module to build yurthub). */
function openyurtCharts(): string {
  const version = /^\s*github\.com\/openyurtio\/openyurt (v\S+)/m.exec(readFileSync('k8s/yurthub/go.mod', 'utf8'))?.[1];
  const modcache = execFileSync('go', ['env', 'GOMODCACHE'], { encoding: 'utf8' }).trim();
  return join(modcache, `github.com/openyurtio/openyurt@${version ?? '(no pin in k8s/yurthub/go.mod)'}`, 'charts');
}

function skipReason(): string | false {
  if (!isRoot()) return 'needs root: yurthub runs in a mount namespace of its own (it writes /var/lib/yurthub)';
  let bins: string;
  try {
    bins = kubeBinDir();
  } catch (err) {
    return `no Kubernetes binaries (${(err as Error).message.split('\n')[0]}): run make k8s`;
  }
  if (!existsSync(join(bins, 'yurthub'))) return `no yurthub in ${bins}: build it with make k8s (sh scripts/k8s.sh all)`;
  try {
    if (!existsSync(openyurtCharts())) return `OpenYurt's charts are not in the Go module cache (${openyurtCharts()}): run make k8s`;
  } catch (err) {
    return `no Go toolchain to find OpenYurt's charts in the module cache (${(err as Error).message.split('\n')[0]})`;
  }
  return false;
}

/** A CA of the test and, signed by it, yurthub's client and serving certificates as its file store keeps them. */
function mintCertificates(dir: string, pki: string): string {
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes'];
  const ssl = (args: readonly string[]) => execFileSync('openssl', args, { stdio: ['ignore', 'pipe', 'pipe'] });
  const p = (f: string) => join(dir, f);
  ssl(['req', '-x509', ...ec, '-keyout', p('ca.key'), '-out', p('ca.crt'), '-days', '2', '-subj', '/CN=atoll-test-yurthub-ca']);
  const issue = (name: string, subject: string, ext: string) => {
    writeFileSync(p(`${name}.ext`), ext);
    ssl(['req', ...ec, '-keyout', p(`${name}.key`), '-out', p(`${name}.csr`), '-subj', subject]);
    ssl(['x509', '-req', '-in', p(`${name}.csr`), '-CA', p('ca.crt'), '-CAkey', p('ca.key'), '-CAcreateserial',
      '-out', p(`${name}.crt`), '-days', '2', '-extfile', p(`${name}.ext`)]);
    // the client-go file store's layout: <name>-current.pem holds the certificate and its key
    writeFileSync(join(pki, `${name}-current.pem`), readFileSync(p(`${name}.crt`), 'utf8') + readFileSync(p(`${name}.key`), 'utf8'), { mode: 0o600 });
  };
  // what yurthub's own CSRs would ask for (pkg/yurthub/certificate): user system:node:<node>, its groups
  issue('yurthub', `/O=openyurt:yurthub/O=system:nodes/CN=system:node:${NODE}`, 'keyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n');
  // its serving certificate with exactly the names it would ask for (the kubernetes Service's ClusterIP, its default
  // dummy-interface address even with the interface off, the bind and node addresses), else it asks for a new one
  issue('yurthub-server', `/O=system:nodes/CN=system:node:${NODE}`, 'keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n'
    + 'subjectAltName=IP:10.96.0.1,IP:169.254.2.1,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n');
  return p('ca.crt');
}

interface Answer {
  readonly status: number;
  readonly body: string;
  readonly ms: number;
}

describe('yurthub v1.7 beside our control plane: edge-1 keeps its API while the cloud is away', { skip: skipReason(), timeout: 240_000 }, () => {
  const dir = mkdtempSync(join(tmpdir(), 'atoll-yurthub-'));
  let cp: ControlPlane;
  let hub: Child | undefined;
  let hubUrl = '';
  let readyUrl = '';
  let metricsUrl = '';
  const hubLog = join(dir, 'yurthub.log');

  /** One request to yurthub's HTTP proxy as `agent`; the body read whole (a watch: until it closes). */
  const ask = async (agent: string, path: string, method = 'GET'): Promise<Answer> => {
    const t0 = Date.now();
    const res = await fetch(hubUrl + path, { method, headers: { 'user-agent': agent, accept: 'application/json' }, signal: AbortSignal.timeout(20_000) });
    return { status: res.status, body: await res.text(), ms: Date.now() - t0 };
  };
  const podNames = (a: Answer) => (JSON.parse(a.body) as { items: { metadata: { name: string } }[] }).items.map((i) => i.metadata.name);
  /** The files yurthub keeps for a client (its cache is a tree per component: the User-Agent up to its slash). */
  const cached = (agent: string) => {
    const base = join(dir, 'cache', agent.split('/')[0] as string);
    return existsSync(base) ? readdirSync(base, { recursive: true, encoding: 'utf8' }).map((f) => `/${f}`) : [];
  };
  /** yurthub's view of the apiserver (its metric `..._server_healthy_status`); undefined until it first changes. */
  const apiServerHealthy = async () => {
    const text = await fetch(metricsUrl).then((r) => r.text());
    const m = /_server_healthy_status\{[^}]*\} (\d)/.exec(text);
    return m === null ? undefined : m[1] === '1';
  };
  const context = () => `\n--- yurthub log ---\n${logTail(hubLog, 40)}`;

  before(async () => {
    const bins = kubeBinDir();
    const charts = openyurtCharts();
    const root = join(dir, 'yurthub');
    const pki = join(root, 'pki');
    mkdirSync(pki, { recursive: true });
    mkdirSync(join(dir, 'var-lib'));
    const clientCa = mintCertificates(dir, pki);
    cp = await startControlPlane(dir, { clientCa });

    // what yurthub needs, from OpenYurt's own charts: the NodePool CRD, yurthub's RBAC and the labelled ConfigMap
    cp.kubectl(['apply', '--server-side', '-f', join(charts, 'yurt-manager/crds/apps.openyurt.io_nodepools.yaml')]);
    cp.kubectl(['wait', '--for=condition=Established', '--timeout=60s', 'crd/nodepools.apps.openyurt.io']);
    const cfg = execFileSync(join(bins, 'helm'), ['template', 'yurthub', join(charts, 'yurthub'), '--namespace', 'kube-system',
      '--show-only', 'templates/yurthub-cfg.yaml', '--set', `cacheAgents=${CACHED.split('/')[0]}`], { encoding: 'utf8' });
    assert.match(cfg, /openyurt\.io\/configmap-name: yurt-hub-cfg/, 'the chart labels the ConfigMap as yurthub v1.7 selects it');
    cp.kubectl(['apply', '-f', '-'], cfg);
    cp.kubectl(['apply', '-f', '-'], `apiVersion: apps.openyurt.io/v1beta2\nkind: NodePool\nmetadata: {name: ${POOL}}\nspec: {type: Edge}\n`);
    cp.kubectl(['apply', '-f', '-'], `apiVersion: v1\nkind: Node\nmetadata: {name: ${NODE}, labels: {apps.openyurt.io/nodepool: ${POOL}}}\n`);
    // a pod bound to the node (no kubelet runs it): what the node's kubelet would list through yurthub
    cp.kubectl(['apply', '-f', '-'], `apiVersion: v1\nkind: Pod\nmetadata: {name: p1, namespace: default}\nspec: {nodeName: ${NODE}, containers: [{name: c, image: pause}]}\n`);

    // its bootstrap file only names the server and its CA: the client certificate is already in pki/
    const bootstrap = join(dir, 'bootstrap-hub.conf');
    writeFileSync(bootstrap, JSON.stringify({
      apiVersion: 'v1', kind: 'Config', 'current-context': 'hub',
      clusters: [{ name: 'cloud', cluster: { server: cp.server, 'certificate-authority-data': Buffer.from(cp.ca).toString('base64') } }],
      users: [{ name: 'hub', user: {} }], contexts: [{ name: 'hub', context: { cluster: 'cloud', user: 'hub' } }],
    }), { mode: 0o600 });
    const [serve, proxy, secure, mux] = [await freePort(), await freePort(), await freePort(), await freePort()];
    hubUrl = `http://127.0.0.1:${proxy}`;
    readyUrl = `http://127.0.0.1:${serve}/v1/readyz`;
    metricsUrl = `http://127.0.0.1:${serve}/metrics`;
    const args = [`--server-addr=${cp.server}`, `--node-name=${NODE}`, `--nodepool-name=${POOL}`, '--working-mode=edge',
      '--enable-dummy-if=false', '--node-ip=127.0.0.1', '--bind-address=127.0.0.1', '--bind-proxy-address=127.0.0.1',
      `--serve-port=${serve}`, `--proxy-port=${proxy}`, `--proxy-secure-port=${secure}`, `--multiplexer-port=${mux}`,
      `--root-dir=${root}`, `--disk-cache-path=${join(dir, 'cache')}/`, `--bootstrap-file=${bootstrap}`,
      '--heartbeat-interval-seconds=2', '--heartbeat-failed-retry=1', '--v=2'];
    // unshare execs sh, which execs yurthub: one PID throughout, the one we stop
    hub = new Child(['unshare', '--mount', '--propagation', 'private', '--', 'sh', '-c', 'mount --bind "$0" /var/lib && exec "$@"',
      join(dir, 'var-lib'), join(bins, 'yurthub'), ...args], { output: { log: hubLog }, detached: true });
    await until('yurthub ready (/v1/readyz 200)', async () => {
      if (!hub?.running) throw new Error(`yurthub exited (${hub?.exitCode ?? hub?.signalCode})${context()}`);
      return (await fetch(readyUrl).then((r) => r.status, () => 0)) === 200;
    }, 60_000, 250);
  });

  after(async () => {
    await hub?.stop();
    await cp?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  test('online: the named client lists and gets through yurthub, which keeps the answers on disk', async () => {
    assert.notEqual(await apiServerHealthy(), false, 'yurthub sees the apiserver healthy');
    assert.equal(cp.kubectl(['get', 'certificatesigningrequests', '-o', 'name']).trim(), '', 'the seeded certificates satisfy it: no CSR');
    const list = await ask(CACHED, POD_LIST);
    assert.equal(list.status, 200, list.body + context());
    assert.deepEqual(podNames(list), ['p1']);
    const get = await ask(CACHED, POD_GET);
    assert.equal(get.status, 200, get.body + context());
    // the client not named is proxied as well while the apiserver answers: only its caching differs
    assert.equal((await ask(UNCACHED, POD_LIST)).status, 200);
    await until('the pod in yurthub\'s disk cache, under the named client', () => cached(CACHED).some((f) => f.endsWith('/default/p1')), 10_000, 100);
    assert.deepEqual(cached(UNCACHED), [], 'nothing kept for the client not named');
  });

  test('apiserver killed: the same list and get come from the cache, a watch closes at its timeout, a delete is refused', async () => {
    await cp.killApiServer();
    // until its health check marks the apiserver down (meanwhile a request may still be sent there: a watch gets 502)
    const t0 = Date.now();
    await until('yurthub to mark the apiserver unhealthy (its metric server_healthy_status 0)', async () => await apiServerHealthy() === false, 30_000, 250);
    console.log(`# yurthub marked the apiserver down ${Date.now() - t0} ms after it was killed`);
    const list = await ask(CACHED, POD_LIST);
    assert.equal(list.status, 200, list.body + context());
    assert.deepEqual(podNames(list), ['p1']);
    const get = await ask(CACHED, POD_GET);
    assert.equal(get.status, 200, get.body + context());
    assert.equal((JSON.parse(get.body) as { metadata: { name: string } }).metadata.name, 'p1');
    const watch = await ask(CACHED, `${POD_LIST}&watch=true&timeoutSeconds=2`);
    assert.equal(watch.status, 200, watch.body);
    assert.equal(watch.body.trim(), '', 'no events while the cloud is away');
    assert.ok(watch.ms >= 1500 && watch.ms < 10_000, `the watch closed after ${watch.ms} ms, not at its 2 s timeout`);
    const del = await ask(CACHED, POD_GET, 'DELETE');
    assert.equal(del.status, 403, del.body);
  });

  test('apiserver killed: a client not named in cache_agents is refused', async () => {
    const res = await ask(UNCACHED, POD_LIST);
    assert.equal(res.status, 400, res.body);
  });
});
