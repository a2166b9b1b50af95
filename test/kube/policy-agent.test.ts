/**
 * NetworkPolicy end to end on one node: a real kube-apiserver (in the cloud namespace), the controller following it,
 * and an agent with `networkPolicy: true` whose pods are added through the CNI plugin and published as Pods. A policy
 * created with kubectl is enforced on the node; then with the controller stopped: the agent restarted on a kernel
 * whose tables were removed enforces the kept view before it serves; a pod re-created while cut off (same name, its
 * sticky address) is enforced on at once; a kept view that cannot be read leaves the kernel's ruleset in force. A
 * deleted pod's address is not marked reusable while a second enforcing node (another real agent) has not applied a
 * view since the controller restarted, and is once it has.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { TestAgent } from '../../harness/agent.ts';
import { type ControllerProc, TestCloud } from '../../harness/cloud.ts';
import { startControlPlane, type ControlPlane } from '../../harness/kube.ts';
import { rootSkipReason, sh } from '../../harness/netns.ts';
import { until } from '../../harness/wait.ts';
import { answersTcp, servePod } from '../support/pod-probe.ts';
import { readAgentStatus, readPolicyTrace, statusSocketOf } from '../../src/adapters/ops/status-socket.ts';
import { renderStatus } from '../../src/core/ops/agent-status.ts';

interface Pod {
  readonly name: string;
  ns: string;
  ip: string;
  server?: ChildProcess;
}

describe('NetworkPolicy from the API to the kernel, kept while the controller is away', { skip: rootSkipReason(), timeout: 300_000 }, () => {
  let cloud: TestCloud;
  let cp: ControlPlane;
  let controller: ControllerProc;
  let agent: TestAgent;
  let peer: TestAgent | undefined;
  const pods: Pod[] = [];

  const serve = async (p: Pod) => {
    p.server?.kill('SIGKILL');
    p.server = await servePod(p.ns, 80, p.name);
  };
  const add = (p: Pod, containerId: string) => {
    p.ns = agent.podNetns(`${p.name}${containerId.slice(-1)}`);
    const res = agent.cni(agent.env('ADD', containerId, p.ns, { namespace: 'default', name: p.name }), agent.netconf());
    assert.equal(res.code, 0, res.stdout + agent.dump());
    p.ip = ((res.json?.ips as { address: string }[])[0]?.address as string).split('/')[0] as string;
  };
  /** Which of `to` answer TCP 80 from pod `from`, as `from->to` lines with yes or no. */
  const reach = (pairs: readonly [Pod, Pod][]) => pairs.map(([from, to]) => `${from.name}->${to.name}: ${answersTcp(from.ns, to.ip, 80) ? 'yes' : 'no'}`);
  const [a, b, c] = ['a', 'b', 'c'].map((name) => ({ name, ns: '', ip: '' })) as [Pod, Pod, Pod];
  const matrix = () => reach([[b, a], [c, a], [a, c], [b, c]]);
  const ENFORCED = ['b->a: yes', 'c->a: no', 'a->c: yes', 'b->c: yes'];
  const nftTables = () => sh('ip', ['netns', 'exec', agent.netns, 'nft', 'list', 'tables']);

  before(async () => {
    cloud = new TestCloud();
    cp = await startControlPlane(cloud.dir, { netns: cloud.netns });
    // the install manifest brings the CRDs the controller follows (Communities); nothing of it runs without kubelets
    cp.kubectl(['create', 'namespace', 'atoll-system']);
    cp.kubectl(['apply', '--server-side', '-f', 'deploy/atoll.yaml']);
    cp.kubectl(['wait', '--for=condition=Established', '--timeout=60s', 'crd/communities.atoll.dev']);
    cp.kubectl(['apply', '-f', '-'], 'apiVersion: v1\nkind: Node\nmetadata: {name: pol1}\n');
    controller = await cloud.startController('ctl', { port: 17471, extra: { kubernetes: { kubeconfig: cp.kubeconfig() } } });
    agent = new TestAgent({ name: 'pol1', podCidrs: [] });
    const ip = cloud.connect(agent.netns);
    agent.rewriteConfig({ controller: cloud.controllerConfig([controller]), underlayAddresses: [ip], networkPolicy: true, resyncPeriod: 2 });
    await agent.start();
    await until('a block leased', () => agent.clusterState().blocks.length > 0, 20_000);
    for (const p of [a, b, c]) {
      add(p, `c-${p.name}-1`);
      await serve(p);
      cp.kubectl(['apply', '-f', '-'], `apiVersion: v1\nkind: Pod\nmetadata: {name: ${p.name}, namespace: default, labels: {pod: ${p.name}}}\nspec: {nodeName: pol1, containers: [{name: c, image: agnhost}]}\n`);
      cp.kubectl(['patch', 'pod', p.name, '--subresource=status', '--type=merge', '-p', JSON.stringify({ status: { phase: 'Running', podIP: p.ip, podIPs: [{ ip: p.ip }] } })]);
      pods.push(p);
    }
  });

  after(async () => {
    for (const p of pods) p.server?.kill('SIGKILL');
    await agent?.cleanup();
    await peer?.cleanup();
    await cp?.stop();
    await cloud?.cleanup();
  });

  test('a policy created with kubectl is enforced on the node', async () => {
    assert.deepEqual(matrix(), ['b->a: yes', 'c->a: yes', 'a->c: yes', 'b->c: yes'], 'no policy yet: all open');
    cp.kubectl(['apply', '-f', '-'], 'apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: a-from-b, namespace: default}\nspec: {podSelector: {matchLabels: {pod: a}}, ingress: [{from: [{podSelector: {matchLabels: {pod: b}}}], ports: [{port: 80}]}]}\n');
    await until('the policy enforced', () => matrix().join() === ENFORCED.join(), 20_000, 200);
    assert.match(readFileSync(join(agent.dataDir, 'policy-view.json'), 'utf8'), /"a-from-b"/, 'the view kept on disk');
    const st = await readAgentStatus(statusSocketOf(agent.socket));
    assert.match(st.policy?.revision ?? '', /^[0-9a-f]{12}$/);
    assert.deepEqual({ ...st.policy, appliedAt: typeof st.policy?.appliedAt, revision: 'hash' }, { policies: 1, names: ['default/a-from-b'], revision: 'hash', isolatedPods: 1, hasView: true, appliedAt: 'number' });
    assert.match(renderStatus(st).join('\n'), new RegExp(`^policy {4}1 policies for this node's pods \\(default/a-from-b\\), revision ${st.policy?.revision}, 1 pods isolated, applied \\d+s ago$`, 'm'));
  });

  test('controller away: an agent restarted on a kernel without our tables enforces the kept view before it serves', async () => {
    await cloud.stopController(controller, 'SIGKILL');
    // the agent's NetworkPolicy worker (a child process) goes with it, even when the agent is killed
    const workers = childrenOf(agent.pid ?? 0).filter((pid) => readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes('policy-worker'));
    assert.equal(workers.length, 1, 'the agent runs one NetworkPolicy worker');
    await agent.stop('SIGKILL');
    await until('the worker to leave with its agent', () => workers.every((pid) => !existsSync(`/proc/${pid}`)), 5_000, 50);
    sh('ip', ['netns', 'exec', agent.netns, 'nft', 'delete', 'table', 'inet', 'atoll_policy']);
    sh('ip', ['netns', 'exec', agent.netns, 'nft', 'delete', 'table', 'bridge', 'atoll_policy']);
    assert.deepEqual(matrix(), ['b->a: yes', 'c->a: yes', 'a->c: yes', 'b->c: yes'], 'without the tables, open');
    await agent.start(); // resolves once the CNI socket serves
    assert.match(nftTables(), /inet atoll_policy/, 'the ruleset is in before the socket serves');
    assert.deepEqual(matrix(), ENFORCED);
  });

  test('controller away: a pod re-created by its kubelet (same name, sticky address) is enforced on at once', async () => {
    const oldIp = a.ip;
    const del = agent.cni(agent.env('DEL', 'c-a-1', a.ns, { namespace: 'default', name: 'a' }), agent.netconf());
    assert.equal(del.code, 0, del.stdout);
    add(a, 'c-a-2');
    assert.equal(a.ip, oldIp, 'sticky');
    await serve(a);
    await until('the re-created pod enforced on', () => matrix().join() === ENFORCED.join(), 5_000, 100);
  });

  test('controller away: a kept view that cannot be read leaves the ruleset in the kernel in force', async () => {
    await agent.stop('SIGKILL');
    writeFileSync(join(agent.dataDir, 'policy-view.json'), '{"type":"snapshot","policies":[');
    await agent.start();
    assert.deepEqual(matrix(), ENFORCED);
    assert.match(readFileSync(agent.logPath, 'utf8'), /POLICY_STATE_INVALID/);
  });

  test('controller back: the policy deleted meanwhile opens the pod again', async () => {
    cp.kubectl(['delete', 'networkpolicy', 'a-from-b']);
    await cloud.restartController(controller);
    await until('the deletion enforced', () => matrix().join() === ['b->a: yes', 'c->a: yes', 'a->c: yes', 'b->c: yes'].join(), 30_000, 250);
    assert.doesNotMatch(readFileSync(join(agent.dataDir, 'policy-view.json'), 'utf8'), /a-from-b/);
  });

  test('a deleted pod\'s address goes to another pod only once every peer that enforces policy has applied a view without it', async () => {
    // a second node enforcing NetworkPolicy, cut off since before the controller (re)started: it may hold anything
    cp.kubectl(['apply', '-f', '-'], 'apiVersion: v1\nkind: Node\nmetadata: {name: pol2}\n');
    peer = new TestAgent({ name: 'pol2', podCidrs: [] });
    peer.rewriteConfig({ controller: cloud.controllerConfig([controller]), underlayAddresses: [cloud.connect(peer.netns)], networkPolicy: true, resyncPeriod: 2 });
    await peer.start();
    await until('pol2 registered', () => (peer as TestAgent).clusterState().blocks.length > 0, 20_000);
    await peer.stop('SIGKILL');
    await cloud.stopController(controller);
    await cloud.restartController(controller);
    const del = agent.cni(agent.env('DEL', 'c-c-1', c.ns, { namespace: 'default', name: 'c' }), agent.netconf());
    assert.equal(del.code, 0, del.stdout);
    cp.kubectl(['delete', 'pod', 'c', '--grace-period=0', '--force']);
    const reservation = async () => (await readAgentStatus(statusSocketOf(agent.socket))).ipam.pods.find((p) => p.name === 'c');
    assert.equal(typeof (await reservation())?.releasedAt, 'number', 'the address is kept for the pod');
    // the agent asks every 5 s; over three questions the answer stays no
    await new Promise((r) => setTimeout(r, 15_000));
    assert.equal((await reservation())?.reusable, undefined, 'pol2 may still hold c');
    await peer.start();
    await until('c\'s address reusable once pol2 applied its view', async () => (await reservation())?.reusable === true, 30_000, 500);
    assert.equal((await reservation())?.releasedAt !== undefined, true, 'still kept for c itself until its TTL');
  });

  test('a NetworkPolicy worker that dies: the ruleset in the kernel stays, the agent says so once and keeps serving CNI', async () => {
    const [worker] = childrenOf(agent.pid ?? 0).filter((pid) => readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes('policy-worker'));
    assert.ok(worker, 'the agent runs its NetworkPolicy worker');
    const before = sh('ip', ['netns', 'exec', agent.netns, 'nft', 'list', 'table', 'inet', 'atoll_policy']);
    process.kill(worker, 'SIGKILL');
    await until('the agent to log the worker gone', () => /"code":"POLICY_ENGINE_FAILED"/.test(readFileSync(agent.logPath, 'utf8')), 5_000, 50);
    const d = { name: 'd', ns: '', ip: '' };
    add(d, 'c-d-1'); // the CNI keeps working; its sync fails, coded, and changes nothing
    await new Promise((r) => setTimeout(r, 500));
    assert.equal(sh('ip', ['netns', 'exec', agent.netns, 'nft', 'list', 'table', 'inet', 'atoll_policy']), before, 'the ruleset stays as it was');
    const log = readFileSync(agent.logPath, 'utf8');
    assert.equal(log.match(/NetworkPolicy changes are no longer applied/g)?.length, 1, 'said once');
    const trace = await readPolicyTrace(statusSocketOf(agent.socket), { from: b.ip, to: a.ip }).catch((e: unknown) => String(e));
    assert.match(String(trace), /HTTP 500/, 'trace answers with the coded failure');
  });
});

/** The PIDs of `pid`'s children. */
function childrenOf(pid: number): number[] {
  return readdirSync(`/proc/${pid}/task`).flatMap((tid) => readFileSync(`/proc/${pid}/task/${tid}/children`, 'utf8').trim().split(/\s+/).filter(Boolean).map(Number));
}
