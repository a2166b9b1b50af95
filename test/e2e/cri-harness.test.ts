/**
 * Self-test of the containerd/CRI harness (test/support): a private containerd 1.6 runs two pod sandboxes on the
 * REFERENCE bridge + host-local plugins, the pods get distinct addresses and reach each other, and teardown leaves
 * no netns, process or mount behind. Needs root and containerd; skips otherwise.
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { accessSync, constants, existsSync } from 'node:fs';
import { mkdir, mkdtemp, readdir, rm, symlink, writeFile } from 'node:fs/promises';
import { isIPv4 } from 'node:net';
import { tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';
import { test, type TestContext } from 'node:test';
import { promisify } from 'node:util';
import { startContainerd, type Containerd } from '../../src/lab/io/containerd/containerd.ts';

const run = promisify(execFile);

/** Where Debian's containernetworking-plugins installs the reference plugins. */
const REFERENCE_PLUGIN_DIR = '/usr/lib/cni';
const REFERENCE_PLUGINS = ['bridge', 'host-local', 'loopback', 'portmap'] as const;
const POD_SUBNET_PREFIX = '10.99.0.';
const REQUIRED_TOOLS = ['containerd', 'ctr', 'runc', 'nsenter', 'unshare', 'ip', 'ping', 'tar'] as const;

/** True if `name` is an executable on PATH. */
function onPath(name: string): boolean {
  return (process.env['PATH'] ?? '').split(delimiter).some((dir) => {
    try {
      accessSync(join(dir, name), constants.X_OK);
      return true;
    } catch {
      return false;
    }
  });
}

/** Why this test cannot run here, or false if it can. */
function skipReason(): string | false {
  if (process.getuid?.() !== 0) return 'needs root (creates network namespaces and runs containerd)';
  const missing = REQUIRED_TOOLS.filter((tool) => !onPath(tool));
  if (missing.length > 0) return `missing ${missing.join(', ')} (apt-get install containerd runc iproute2 iputils-ping)`;
  const plugins = REFERENCE_PLUGINS.filter((p) => !existsSync(join(REFERENCE_PLUGIN_DIR, p)));
  if (plugins.length > 0) return `missing CNI plugins ${plugins.join(', ')} in ${REFERENCE_PLUGIN_DIR} (containernetworking-plugins)`;
  if (!existsSync('/bin/busybox')) return 'missing /bin/busybox (busybox-static) for the pause image';
  return false;
}

/** The per-run resources this test creates and must remove. */
interface TestBed {
  id: string;
  netns: string;
  workDir: string;
  cniBinDir: string;
  cniConfDir: string;
  ipamDir: string;
  networkName: string;
}

/** Renders the conflist: reference bridge (unique name) with host-local IPAM, then portmap. */
function conflist(bed: TestBed): string {
  return JSON.stringify({
    cniVersion: '1.0.0',
    name: bed.networkName,
    plugins: [
      {
        type: 'bridge',
        bridge: `atltbr${bed.id}`,
        isGateway: true,
        ipam: { type: 'host-local', ranges: [[{ subnet: `${POD_SUBNET_PREFIX}0/24` }]], dataDir: bed.ipamDir },
      },
      { type: 'portmap', capabilities: { portMappings: true } },
    ],
  }, null, 2);
}

/** Creates netns, workDir, CNI bin dir (symlinks to the reference plugins) and the conflist, written in place. */
async function createTestBed(): Promise<TestBed> {
  const id = randomBytes(4).toString('hex');
  const workDir = await mkdtemp(join(tmpdir(), `atlt-${id}-`));
  const bed: TestBed = {
    id,
    netns: `atlt-${id}-cri`,
    workDir,
    cniBinDir: join(workDir, 'cni-bin'),
    cniConfDir: join(workDir, 'cni-conf'),
    ipamDir: join(workDir, 'ipam'),
    networkName: `atlt-${id}`,
  };
  await run('ip', ['netns', 'add', bed.netns]);
  await mkdir(bed.cniBinDir);
  await mkdir(bed.cniConfDir);
  for (const plugin of REFERENCE_PLUGINS) await symlink(join(REFERENCE_PLUGIN_DIR, plugin), join(bed.cniBinDir, plugin));
  await writeFile(join(bed.cniConfDir, '10-atlt.conflist'), conflist(bed));
  return bed;
}

/** Deletes the netns and the workDir; each step runs even if the other fails. */
async function destroyTestBed(bed: TestBed): Promise<void> {
  const results = await Promise.allSettled([
    existsSync(`/var/run/netns/${bed.netns}`) ? run('ip', ['netns', 'del', bed.netns]) : Promise.resolve(),
    rm(bed.workDir, { recursive: true, force: true }),
  ]);
  const failed = results.filter((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (failed.length > 0) throw new AggregateError(failed.map((f) => f.reason), `cleaning up test bed ${bed.id} failed`);
}

/** Writes what a failure needs: the test netns's links and routes and containerd's log tail. */
async function dumpDiagnostics(t: TestContext, bed: TestBed, ctd: Containerd | undefined): Promise<void> {
  for (const args of [['-d', 'link'], ['addr'], ['route']]) {
    const out = await run('ip', ['netns', 'exec', bed.netns, 'ip', ...args]).then((r) => r.stdout, (e: Error) => e.message);
    t.diagnostic(`ip ${args.join(' ')} in ${bed.netns}:\n${out}`);
  }
  if (ctd) t.diagnostic(`containerd log tail (${ctd.logPath}):\n${await ctd.logTail(40)}`);
}

/** Runs one pod sandbox and returns its id, IP and netns path, asserting what every pod must have. */
async function runPod(ctd: Containerd, name: string): Promise<{ id: string; ip: string; netnsPath: string }> {
  const id = await ctd.cri.runPodSandbox({ name, namespace: 'atlt-e2e', uid: `uid-${name}-${randomBytes(4).toString('hex')}` });
  const status = await ctd.cri.podSandboxStatus(id);
  assert.equal(status.state, 'SANDBOX_READY', `sandbox ${name} should be ready`);
  assert.ok(isIPv4(status.ip) && status.ip.startsWith(POD_SUBNET_PREFIX), `pod ${name} IP ${status.ip} not in ${POD_SUBNET_PREFIX}0/24`);
  assert.ok(status.netnsPath, `sandbox ${name} status should name its netns path`);
  return { id, ip: status.ip, netnsPath: status.netnsPath };
}

/** host-local keeps one file per reserved IP in <dataDir>/<network>; after DEL only bookkeeping files remain. */
async function reservedIps(bed: TestBed): Promise<string[]> {
  const entries = await readdir(join(bed.ipamDir, bed.networkName)).catch(() => [] as string[]);
  return entries.filter((name) => isIPv4(name));
}

/** What must not exist once teardown is over. */
async function assertNothingLeft(bed: TestBed, containerdPid: number | undefined): Promise<void> {
  const { stdout: netnsList } = await run('ip', ['netns', 'list']);
  assert.ok(!netnsList.includes(bed.netns), `netns ${bed.netns} still listed:\n${netnsList}`);
  assert.ok(!existsSync(bed.workDir), `workDir ${bed.workDir} still exists`);
  if (containerdPid !== undefined) assert.ok(!isAlive(containerdPid), `containerd pid ${containerdPid} still running`);
  const { stdout: mounts } = await run('cat', ['/proc/self/mounts']);
  assert.ok(!mounts.includes(bed.workDir) && !mounts.includes(bed.netns), `mounts left behind:\n${mounts}`);
}

/** True if a process `pid` exists (the harness's children are reaped by Node, so no zombies linger). */
function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

test('CRI harness: containerd runs two pods on the reference bridge and they reach each other', { skip: skipReason(), timeout: 180_000 }, async (t) => {
  const bed = await createTestBed();
  let ctd: Containerd | undefined;
  let containerdPid: number | undefined;
  try {
    ctd = await startContainerd({ workDir: bed.workDir, netns: bed.netns, cniBinDir: bed.cniBinDir, cniConfDir: bed.cniConfDir });
    containerdPid = ctd.pid;
    const version = await ctd.cri.version();
    assert.equal(version.runtimeName, 'containerd');

    const a = await runPod(ctd, 'pod-a');
    const b = await runPod(ctd, 'pod-b');
    assert.notEqual(a.ip, b.ip, 'two pods must not share an IP');
    assert.deepEqual((await reservedIps(bed)).sort(), [a.ip, b.ip].sort(), 'host-local should hold exactly the two pod IPs');

    await ctd.execInNetns(a.netnsPath, ['ping', '-c1', '-W2', b.ip]);
    await ctd.execInNetns(b.netnsPath, ['ping', '-c1', '-W2', a.ip]);

    for (const pod of [a, b]) {
      await ctd.cri.stopPodSandbox(pod.id);
      await ctd.cri.removePodSandbox(pod.id);
    }
    assert.deepEqual(await ctd.cri.listPodSandbox(), [], 'no sandbox should remain after remove');
    assert.deepEqual(await reservedIps(bed), [], 'CNI DEL should have released both IPs');
  } catch (err) {
    await dumpDiagnostics(t, bed, ctd);
    throw err;
  } finally {
    try {
      await ctd?.stop();
    } finally {
      await destroyTestBed(bed);
    }
  }
  await assertNothingLeft(bed, containerdPid);
});
