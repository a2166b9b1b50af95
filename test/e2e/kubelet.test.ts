/**
 * The smallest real Kubernetes node on this kind of host (cgroup v1, PID 1 not systemd, no swap): a network
 * namespace with a private containerd 1.6 and a real kubelet v1.34 (src/lab/io/kube/kubelet.ts) that registers
 * with a kube-apiserver reachable from that namespace, and a Deployment's pod, placed by the real scheduler, that
 * runs the test bed's busybox image with a configMap volume (the kubelet's mount must be visible to runc), gets an address from
 * the REFERENCE bridge plugin and answers ping. Needs root, containerd and the Kubernetes binaries; skips otherwise.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { startContainerd, type Containerd } from '../../src/lab/io/containerd/containerd.ts';
import { PAUSE_IMAGE_REF } from '../../src/lab/io/containerd/pause-image.ts';
import { startKubelet, type Kubelet } from '../../src/lab/io/kube/kubelet.ts';
import { kubeBinDir, startControlPlane, type ControlPlane } from '../../harness/kube.ts';

const NODE = 'kt-node';
const NODE_IP = '192.0.2.10';
const POD_SUBNET = '10.98.0.0/24';
const ZONE_LABEL = 'topology.kubernetes.io/zone';

function skipReason(): string | false {
  if (process.getuid?.() !== 0) return 'needs root (network namespace, containerd, kubelet)';
  for (const tool of ['/usr/bin/containerd', '/usr/sbin/runc', '/usr/bin/nsenter', '/bin/busybox', '/usr/lib/cni/bridge', '/usr/lib/cni/host-local']) {
    if (!existsSync(tool)) return `missing ${tool} (apt-get install containerd runc util-linux busybox-static containernetworking-plugins)`;
  }
  return false;
}

const ip = (...args: string[]) => execFileSync('ip', args, { encoding: 'utf8' });

/** Polls `check` every 500 ms until it returns a value, or throws `what` with `detail()` after `ms`. */
async function waitFor<T>(what: string, ms: number, check: () => T | undefined, detail: () => string): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = check();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}\n${detail()}`);
    await new Promise((r) => setTimeout(r, 500));
  }
}

test('a real kubelet beside a private containerd registers its node, and the scheduler places a Deployment pod with a volume on it', { skip: skipReason(), timeout: 300_000 }, async () => {
  const id = randomBytes(3).toString('hex');
  const netns = `atoll-kt-${id}`;
  const dir = join(tmpdir(), `atoll-kt-${id}`);
  mkdirSync(join(dir, 'cni-conf'), { recursive: true });
  let cp: ControlPlane | undefined;
  let ctd: Containerd | undefined;
  let kubelet: Kubelet | undefined;
  try {
    ip('netns', 'add', netns);
    ip('-n', netns, 'link', 'set', 'lo', 'up');
    ip('-n', netns, 'link', 'add', 'kt0', 'type', 'veth', 'peer', 'name', 'kt1');
    ip('-n', netns, 'addr', 'add', `${NODE_IP}/24`, 'dev', 'kt0');
    ip('-n', netns, 'link', 'set', 'kt0', 'up');
    ip('-n', netns, 'link', 'set', 'kt1', 'up');
    cp = await startControlPlane(dir, { netns, nodes: [NODE], controllers: true });
    writeFileSync(join(dir, 'cni-conf', '10-kt.conflist'), JSON.stringify({
      cniVersion: '1.0.0', name: `kt-${id}`,
      plugins: [{ type: 'bridge', bridge: 'kt-br0', isGateway: true, ipam: { type: 'host-local', ranges: [[{ subnet: POD_SUBNET }]], dataDir: join(dir, 'ipam') } }],
    }));
    ctd = await startContainerd({ workDir: join(dir, 'containerd'), netns, cniBinDir: '/usr/lib/cni', cniConfDir: join(dir, 'cni-conf'), cgroupPrefix: 'atoll-kt' });
    kubelet = startKubelet({
      binary: join(kubeBinDir(), 'kubelet'), dir: join(dir, 'kubelet'), runtime: ctd, nodeName: NODE, nodeIp: NODE_IP,
      labels: { [ZONE_LABEL]: 'test' }, apiServer: { server: cp.server, ca: cp.ca, token: cp.nodeToken(NODE) },
    });
    const k = kubelet;
    const kubectl = cp.kubectl.bind(cp);
    const getJson = (args: string[]) => {
      try {
        return JSON.parse(kubectl([...args, '-o', 'json'])) as Record<string, never>;
      } catch {
        return undefined;
      }
    };
    const node = await waitFor('the node to register and turn Ready', 90_000, () => {
      const n = getJson(['get', 'node', NODE]) as { metadata: { labels: Record<string, string> }; status: { conditions: { type: string; status: string }[] } } | undefined;
      return n?.status.conditions.some((c) => c.type === 'Ready' && c.status === 'True') ? n : undefined;
    }, () => `kubelet ${k.running ? 'running' : 'exited'}; log tail:\n${k.logTail(30)}`);
    assert.equal(node.metadata.labels[ZONE_LABEL], 'test');

    kubectl(['create', 'configmap', 'kt-cfg', '--from-literal=hello=world']);
    const podTemplate = {
      metadata: { labels: { app: 'kt' } },
      spec: {
        terminationGracePeriodSeconds: 1,
        containers: [{ name: 'c', image: PAUSE_IMAGE_REF, imagePullPolicy: 'Never', command: ['/bin/sh', '-c', 'test "$(cat /cfg/hello)" = world && exec sleep 100000'],
          volumeMounts: [{ name: 'cfg', mountPath: '/cfg' }] }],
        volumes: [{ name: 'cfg', configMap: { name: 'kt-cfg' } }],
      },
    };
    kubectl(['apply', '-f', '-'], JSON.stringify({
      apiVersion: 'apps/v1', kind: 'Deployment', metadata: { name: 'kt' },
      spec: { replicas: 1, selector: { matchLabels: { app: 'kt' } }, template: podTemplate },
    }));
    type PodJson = { spec: { nodeName?: string }; status: { phase: string; podIP?: string; containerStatuses?: { ready: boolean; restartCount: number }[] } };
    const pod = await waitFor('the Deployment\'s pod to run', 90_000, () => {
      const p = (getJson(['get', 'pods', '-l', 'app=kt']) as { items: PodJson[] } | undefined)?.items[0];
      return p?.status.phase === 'Running' && p.status.containerStatuses?.[0]?.ready ? p : undefined;
    }, () => `${kubectl(['describe', 'pods', '-l', 'app=kt'])}\nkubelet log tail:\n${k.logTail(30)}`);
    assert.equal(pod.spec.nodeName, NODE, 'the scheduler placed it');
    assert.equal(pod.status.containerStatuses?.[0]?.restartCount, 0, 'the container read the configMap volume at its first start');
    assert.match(pod.status.podIP ?? '', /^10\.98\.0\./);
    ip('netns', 'exec', netns, 'ping', '-c', '1', '-W', '2', pod.status.podIP as string);

    kubectl(['delete', 'deployment', 'kt', '--cascade=foreground', '--wait=true', '--timeout=60s']);
    await waitFor('the pod to be gone', 60_000, () => ((getJson(['get', 'pods', '-l', 'app=kt']) as { items: unknown[] } | undefined)?.items.length === 0 ? true : undefined),
      () => k.logTail(20));
  } finally {
    await kubelet?.stop();
    await ctd?.stop();
    await cp?.stop();
    try {
      execFileSync('ip', ['netns', 'del', netns], { stdio: 'ignore' });
    } catch {
      // never made
    }
    const left = readFileSync('/proc/self/mounts', 'utf8').split('\n').filter((l) => l.includes(dir));
    rmSync(dir, { recursive: true, force: true });
    assert.deepEqual(left, [], 'nothing left mounted under the test directory');
  }
});
