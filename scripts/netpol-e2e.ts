/**
 * `make netpol`: Kubernetes' own NetworkPolicy conformance tests (the `[sig-network] Netpol` suite of
 * k8s.io/kubernetes/test/e2e/network/netpol, pinned with the lab's Kubernetes in k8s/go.mod) against a Kubernetes lab
 * whose agents enforce NetworkPolicy. Opt-in, never part of `make test`: the whole suite runs for 20 to 30 minutes here.
 *
 *   node scripts/netpol-e2e.ts [--focus REGEX] [--keep]
 *     --focus REGEX  only the specs whose names match (ginkgo's --focus), e.g. "default-deny-ingress"
 *     --keep         leave the lab up afterwards (remove it with `bin/atoll lab down RUNID`)
 *
 * Steps: builds the suite and agnhost from their modules (`sh scripts/k8s.sh netpol`, cached), packs agnhost into the
 * image the suite names (registry.k8s.io/e2e-test-images/agnhost:<the suite's version>: no registry here, so it is
 * imported on every node and never pulled), brings up `atoll lab up --kubernetes --policy --image ...` with 2 cloud
 * nodes and one edge site of one node, taints the edge node so the suite's pods land on the cloud nodes only (the
 * suite probes by `kubectl exec`, which needs the API server to reach the pod's kubelet: it reaches the cloud nodes,
 * not an edge node behind its NAT), runs every Netpol spec except the SCTP ones (this kernel has no SCTP: a socket
 * of protocol 132 is refused; the two specs that only write SCTP into a policy run), and removes the lab. Output:
 * build/netpol/ (the suite's log, its JUnit report, the lab's JSON). Exit status: the suite's.
 */
import { execFileSync, spawn } from 'node:child_process';
import { chmodSync, copyFileSync, createWriteStream, mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { packImage } from '../src/adapters/image/image-archive.ts';

const { values } = parseArgs({ options: { focus: { type: 'string' }, keep: { type: 'boolean', default: false } } });
const out = resolve('build/netpol');
mkdirSync(out, { recursive: true });
const say = (line: string) => console.log(`netpol-e2e: ${line}`);
const started = performance.now();
const secs = () => `${((performance.now() - started) / 1000).toFixed(0)} s`;

/** The agnhost image the pinned suite runs, as test/utils/image/manifest.go of that Kubernetes names it. */
function agnhostRef(): string {
  const version = /^\s+k8s\.io\/kubernetes (v\S+)/m.exec(readFileSync('k8s/go.mod', 'utf8'))?.[1];
  if (!version) throw new Error('k8s/go.mod pins no k8s.io/kubernetes version');
  const modCache = execFileSync('go', ['env', 'GOMODCACHE'], { encoding: 'utf8' }).trim();
  const manifest = readFileSync(join(modCache, `k8s.io/kubernetes@${version}`, 'test/utils/image/manifest.go'), 'utf8');
  const tag = /configs\[Agnhost\] = Config\{list\.PromoterE2eRegistry, "agnhost", "([^"]+)"\}/.exec(manifest)?.[1];
  const registry = /PromoterE2eRegistry:\s+"([^"]+)"/.exec(manifest)?.[1];
  if (!tag || !registry) throw new Error(`cannot read agnhost's image from test/utils/image/manifest.go of k8s.io/kubernetes@${version}`);
  return `${registry}/agnhost:${tag}`;
}

/** Runs `argv`, its output to the terminal and to `log`; resolves with its exit status. */
function run(argv: readonly string[], log: string): Promise<number> {
  return new Promise((done, fail) => {
    const file = createWriteStream(log);
    const child = spawn(argv[0] as string, argv.slice(1), { stdio: ['ignore', 'pipe', 'pipe'] });
    for (const stream of [child.stdout, child.stderr]) {
      stream.on('data', (chunk: Buffer) => {
        process.stdout.write(chunk);
        file.write(chunk);
      });
    }
    child.on('error', fail);
    child.on('close', (code) => file.end(() => done(code ?? 1)));
  });
}

const bins = execFileSync('sh', ['scripts/k8s.sh', 'netpol'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] }).trim().split('\n').pop() as string;
say(`suite and agnhost in ${bins} (${secs()})`);

const ref = agnhostRef();
const work = mkdtempSync(join(tmpdir(), 'atoll-agnhost-'));
const tarball = join(out, 'agnhost.tar');
try {
  const rootfs = join(work, 'rootfs');
  for (const d of ['etc', 'tmp', 'proc', 'sys', 'dev']) mkdirSync(join(rootfs, d), { recursive: true });
  chmodSync(join(rootfs, 'tmp'), 0o1777);
  copyFileSync(join(bins, 'agnhost'), join(rootfs, 'agnhost'));
  await packImage({ rootfs, work: join(work, 'image'), out: tarball, ref, config: { Entrypoint: ['/agnhost'], Cmd: ['pause'] }, createdBy: 'atoll scripts/netpol-e2e.ts' });
} finally {
  rmSync(work, { recursive: true, force: true });
}
say(`image ${ref} packed into ${tarball} (${secs()})`);

const labJson = join(out, 'lab.json');
const upStatus = await run(['bin/atoll', 'lab', 'up', '--kubernetes', '--policy', '--image', tarball, '--detach', '--json', labJson,
  '--cloud-nodes', '2', '--edge-sites', '1', '--nodes-per-site', '1', '--pods-per-node', '1'], join(out, 'lab-up.log'));
if (upStatus !== 0) {
  say(`the lab did not come up (status ${upStatus}); its output is in ${join(out, 'lab-up.log')}`);
  process.exit(upStatus);
}
const lab = JSON.parse(readFileSync(labJson, 'utf8')) as { runId: string; nodes: { name: string; site: string }[]; kubernetes: { kubectl: string[] } };
const kubectl = lab.kubernetes.kubectl;
const launcher = kubectl.slice(0, kubectl.indexOf('--') + 1);
const kubeconfig = kubectl[kubectl.indexOf('--kubeconfig') + 1] as string;
let status = 1;
try {
  const edges = lab.nodes.filter((n) => n.site !== 'cloud').map((n) => n.name);
  for (const node of edges) execFileSync(kubectl[0] as string, [...kubectl.slice(1), 'taint', 'node', node, 'atoll.dev/netpol-e2e=unreachable-kubelet:NoSchedule'], { stdio: 'inherit' });
  say(`lab ${lab.runId} up; ${edges.join(', ')} tainted (the API server cannot reach an edge kubelet to exec); running the suite (${secs()})`);
  status = await run([...launcher, join(bins, 'e2e-netpol'), '--kubeconfig', kubeconfig, '--report-dir', out,
    '--ginkgo.label-filter', '(Feature: containsAny NetworkPolicy && !Feature: containsAny SCTPConnectivity) || Feature: isEmpty',
    ...(values.focus ? ['--ginkgo.focus', values.focus] : []),
    '--ginkgo.v', '--ginkgo.no-color', '--ginkgo.timeout', '4h', '--ginkgo.junit-report', join(out, 'junit.xml')], join(out, 'e2e.log'));
  say(`suite finished with status ${status} after ${secs()}; log ${join(out, 'e2e.log')}, JUnit ${join(out, 'junit.xml')}`);
} finally {
  if (values.keep) say(`lab ${lab.runId} stays up: bin/atoll lab down ${lab.runId}`);
  else execFileSync('bin/atoll', ['lab', 'down', lab.runId], { stdio: 'inherit' });
}
process.exit(status);
