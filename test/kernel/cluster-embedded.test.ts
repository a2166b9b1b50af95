/**
 * Three agents and one controller (embedded store) on an underlay of namespaces: cluster-unique pod IPs from
 * controller blocks, a spare block before the node runs out, and agents that keep creating and deleting pods,
 * restart and reconnect while the controller is down.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { TestAgent } from '../../harness/agent.ts';
import { type ControllerProc, TestCloud } from '../../harness/cloud.ts';
import { leftoverNetns, rootSkipReason } from '../../harness/netns.ts';
import { until } from '../../harness/wait.ts';

const OUTAGE_MS = Number(process.env.ATOLL_OUTAGE_SECONDS ?? '8') * 1000;



describe('agents with an embedded-store controller', { skip: rootSkipReason(), timeout: 240_000 }, () => {
  let cloud: TestCloud;
  let controller: ControllerProc;
  const agents: TestAgent[] = [];

  before(async () => {
    cloud = new TestCloud();
    controller = await cloud.startController('ctl', { port: 17443 });
    for (const name of ['n1', 'n2', 'n3']) {
      const agent = new TestAgent({ name, podCidrs: [] });
      const ip = cloud.connect(agent.netns);
      agent.rewriteConfig({ controller: cloud.controllerConfig([controller]), underlayAddresses: [ip] });
      agents.push(agent);
    }
    await Promise.all(agents.map((a) => a.start()));
  });

  after(async () => {
    for (const a of agents) await a.cleanup();
    await cloud.cleanup();
    assert.deepEqual(leftoverNetns(), []);
  });

  test('every node gets a block, and pods on every node get cluster-unique IPs', async () => {
    for (const a of agents) await until(`${a.netns} to get a block`, () => a.clusterState().blocks.length > 0);
    const all = new Set(agents.flatMap((a) => a.clusterState().blocks));
    assert.equal(all.size, 3, 'three distinct blocks');
    const ips = agents.flatMap((a, i) => [a.addPod(`p${i}a`), a.addPod(`p${i}b`)]);
    assert.equal(new Set(ips).size, ips.length);
    const show = cloud.cli(['ipam', 'show', '--json', '--controller-config', controller.configPath]);
    assert.equal(show.code, 0, show.out);
    assert.equal((JSON.parse(show.out).nodes as unknown[]).length, 3);
  });

  test('a node running low gets a spare block before it runs out', async () => {
    const a = agents[0] as TestAgent;
    for (let i = 0; i < 22; i++) a.addPod(`fill${i}`); // a /27 has 29 pod addresses; refill below 8 free
    await until('a spare block', () => a.clusterState().blocks.length === 2);
  });

  test('controller down: pods are created past the first block, deleted, the agent restarts; then it reconnects', async () => {
    const a = agents[0] as TestAgent;
    await cloud.stopController(controller, 'SIGKILL');
    const started = Date.now();
    const ips: string[] = [];
    for (let i = 0; i < 10; i++) ips.push(a.addPod(`off${i}`)); // 2 + 22 + 10 > 29: into the spare block
    const spare = a.clusterState().blocks[1] as string;
    assert.ok(ips.some((ip) => ip.startsWith(spare.split('.').slice(0, 3).join('.'))), `no pod in the spare block ${spare}: ${ips.join(' ')}`);
    assert.equal(a.cni(a.env('DEL', 'c-off0', '', { namespace: 'default', name: 'off0' }), a.netconf()).code, 0);
    await a.stop();
    await a.start();
    ips.push(a.addPod('off-after-restart'));
    assert.equal(new Set(ips).size, ips.length);
    while (Date.now() - started < OUTAGE_MS) await new Promise((r) => setTimeout(r, 200));
    await cloud.restartController(controller);
    await until('the agent to report to the controller again', () => {
      const show = cloud.cli(['ipam', 'show', '--json', '--controller-config', controller.configPath]);
      if (show.code !== 0) return false;
      const node = (JSON.parse(show.out).nodes as { name: string; usage?: { allocated: number } }[]).find((n) => n.name === 'n1');
      return (node?.usage?.allocated ?? 0) >= 33;
    }, 30_000);
    const check = cloud.cli(['ipam', 'check', '--controller-config', controller.configPath]);
    assert.equal(check.code, 0, check.out);
  });

  test('deregistering a node that is gone releases its blocks', async () => {
    // a running agent joins again with its token (the documented way back), so the node goes first, as an operator does
    await (agents[2] as TestAgent).stop();
    const res = cloud.cli(['node', 'deregister', 'n3', '--controller-config', controller.configPath]);
    assert.equal(res.code, 0, res.out);
    assert.match(res.out, /released 10\.100\./);
    const show = JSON.parse(cloud.cli(['ipam', 'show', '--json', '--controller-config', controller.configPath]).out);
    assert.equal((show.nodes as { name: string }[]).some((n) => n.name === 'n3'), false);
  });
});
