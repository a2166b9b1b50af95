/**
 * Atoll under the real container runtime: a private containerd 1.6 calls the real `atoll-cni` (installed by a real
 * agent) through CRI RunPodSandbox / StopPodSandbox / RemovePodSandbox, as the kubelet would.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { TestAgent } from '../../harness/agent.ts';
import { leftoverNetns, sh } from '../../harness/netns.ts';
import { criSkipReason, type CriNode, type CriPod as Pod, removePod, runPod, startCriNode as startNode, stopCriNode as stopNode } from '../support/cri-node.ts';

const skip = criSkipReason();

function records(agent: TestAgent): Map<string, string[]> {
  const dir = join(agent.dataDir, 'atoll');
  return new Map(readdirSync(dir).map((f) => [f, readFileSync(join(dir, f), 'utf8').trim().split('\n')]));
}

function ourVeths(agent: TestAgent): string[] {
  return (JSON.parse(sh('ip', ['-n', agent.netns, '-j', 'link'])) as { ifname: string }[]).map((l) => l.ifname).filter((n) => /^atl[0-9a-f]{12}$/.test(n));
}

describe('atoll-cni driven by containerd CRI', { skip, timeout: 300_000 }, () => {
  let node: CriNode | undefined;
  before(async () => {
    node = await startNode('cri', ['10.83.0.0/26']);
  });
  after(async () => {
    if (node) await stopNode(node);
    assert.deepEqual(leftoverNetns().filter((n) => n.includes('cri-')), []);
  });

  test('pods get IPs from the node block and reach each other and the gateway; stop/remove release them', async () => {
    const { agent, ctd } = node!;
    const a = await runPod(ctd, 'web-a');
    const b = await runPod(ctd, 'web-b');
    for (const p of [a, b]) assert.match(p.ip, /^10\.83\.0\.(\d+)$/);
    assert.notEqual(a.ip, b.ip);
    await ctd.execInNetns(a.netnsPath, ['ping', '-c1', '-W2', b.ip]);
    await ctd.execInNetns(b.netnsPath, ['ping', '-c1', '-W2', '10.83.0.1']);
    assert.equal(ourVeths(agent).length, 2);
    await removePod(ctd, a);
    await removePod(ctd, b);
    assert.equal(ourVeths(agent).length, 0, 'stop and remove delete the veths');
    const recs = [...records(agent).values()];
    assert.ok(recs.every((lines) => /^released \d+$/.test(lines[2] ?? '')), 'both addresses are released (kept as reservations)');
  });

  test('a sandbox re-run under the same namespace/name gets the same IP', async () => {
    const { ctd } = node!;
    const first = await runPod(ctd, 'db-0', 'prod');
    const other = await runPod(ctd, 'db-1', 'prod');
    await removePod(ctd, first);
    const again = await runPod(ctd, 'db-0', 'prod');
    assert.equal(again.ip, first.ip);
    await removePod(ctd, again);
    await removePod(ctd, other);
  });

  test('30 sandboxes started at once get 30 distinct IPs and all reach each other', async () => {
    const { ctd } = node!;
    const pods = await Promise.all(Array.from({ length: 30 }, (_, i) => runPod(ctd, `burst-${i}`, 'burst')));
    const ips = pods.map((p) => p.ip);
    assert.equal(new Set(ips).size, 30);
    const script = `for ip in ${ips.join(' ')}; do ping -c1 -W2 -q $ip >/dev/null 2>&1 || echo "unreachable $ip"; done`;
    for (const p of pods) {
      const { stdout } = await ctd.execInNetns(p.netnsPath, ['sh', '-c', script]);
      assert.equal(stdout.trim(), '', `from ${p.ip}: ${stdout}`);
    }
    await Promise.all(pods.map((p) => removePod(ctd, p)));
  });
});

describe('a failed ADD under containerd', { skip, timeout: 300_000 }, () => {
  test('pool exhausted: RunPodSandbox fails and leaves no veth, allocation or sandbox behind', async () => {
    const node = await startNode('cre', ['10.84.0.0/29']); // five pod addresses
    try {
      const { agent, ctd } = node;
      const pods: Pod[] = [];
      for (let i = 0; i < 5; i++) pods.push(await runPod(ctd, `full-${i}`, 'full'));
      const before = records(agent);
      const vethsBefore = ourVeths(agent);
      await assert.rejects(ctd.cri.runPodSandbox({ name: 'one-too-many', namespace: 'full', uid: 'u-extra' }), /are allocated|Atoll|atoll/);
      assert.deepEqual(records(agent), before, 'no allocation was added or changed');
      assert.deepEqual(ourVeths(agent), vethsBefore, 'no veth was left');
      const ready = (await ctd.cri.listPodSandbox()).filter((s) => s.state === 'SANDBOX_READY');
      assert.equal(ready.length, 5);
      for (const p of pods) await removePod(ctd, p);
    } finally {
      await stopNode(node);
    }
  });
});
