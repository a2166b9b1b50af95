/**
 * A node as the kubelet sees it: a real agent and a private containerd 1.6 sharing one node namespace, the agent in
 * containerd's mount namespace (so it sees the pods' netns mounts and containerd's socket), and pods made through CRI
 * RunPodSandbox.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, symlinkSync } from 'node:fs';
import { join } from 'node:path';
import { TestAgent } from '../../harness/agent.ts';
import { rootSkipReason } from '../../harness/netns.ts';
import { startContainerd, type Containerd } from '../../src/lab/io/containerd/containerd.ts';

export const criSkipReason = (): string | false => rootSkipReason() || (existsSync('/usr/bin/containerd') && existsSync('/bin/busybox') ? false : 'needs containerd, runc and busybox-static');

export interface CriNode {
  readonly agent: TestAgent;
  readonly ctd: Containerd;
}

export interface CriPod {
  readonly id: string;
  readonly ip: string;
  readonly netnsPath: string;
  /** The sandbox's network namespace as seen from the machine (`/proc/<pause pid>/ns/net`). */
  readonly netns: string;
}

/** The nsenter prefix that runs the node's agent in containerd's mount namespace and the node's netns. */
export function agentLauncher(n: CriNode): string[] {
  return ['nsenter', `--mount=/proc/${n.ctd.pid}/ns/mnt`, `--net=/var/run/netns/${n.agent.netns}`, '--'];
}

/**
 * Starts containerd and the agent (portmap chained). `configure` may rewrite the agent's configuration once
 * containerd is up (its socket known), before the agent starts.
 */
export async function startCriNode(name: string, podCidrs: string[], configure?: (n: CriNode) => void): Promise<CriNode> {
  const agent = new TestAgent({ name, podCidrs, config: { chainedPlugins: [{ type: 'portmap', capabilities: { portMappings: true } }] } });
  mkdirSync(agent.binDir, { recursive: true });
  for (const p of ['loopback', 'portmap']) symlinkSync(`/usr/lib/cni/${p}`, join(agent.binDir, p));
  const ctd = await startContainerd({ workDir: join(agent.dir, 'containerd'), netns: agent.netns, cniBinDir: agent.binDir, cniConfDir: agent.confDir });
  const node = { agent, ctd };
  try {
    configure?.(node);
    await agent.start(15_000, agentLauncher(node));
  } catch (err) {
    await ctd.stop();
    await agent.cleanup();
    throw err;
  }
  return node;
}

export async function stopCriNode(n: CriNode | undefined): Promise<void> {
  if (!n) return;
  try {
    await n.ctd.stop();
  } finally {
    await n.agent.cleanup();
  }
}

/** Runs a sandbox as the kubelet would (`labels` on it as the kubelet puts them); asserts it is ready with a netns. */
export async function runPod(ctd: Containerd, name: string, namespace = 'default', labels: Record<string, string> = {}): Promise<CriPod> {
  const uid = randomBytes(8).toString('hex');
  const id = await ctd.cri.runPodSandbox({ name, namespace, uid, labels: { ...labels, 'io.kubernetes.pod.name': name, 'io.kubernetes.pod.namespace': namespace, 'io.kubernetes.pod.uid': uid } });
  const status = await ctd.cri.podSandboxStatus(id);
  assert.equal(status.state, 'SANDBOX_READY');
  assert.ok(status.netnsPath && status.pid);
  return { id, ip: status.ip, netnsPath: status.netnsPath, netns: `/proc/${status.pid}/ns/net` };
}

export async function removePod(ctd: Containerd, pod: CriPod): Promise<void> {
  await ctd.cri.stopPodSandbox(pod.id);
  await ctd.cri.removePodSandbox(pod.id);
}
