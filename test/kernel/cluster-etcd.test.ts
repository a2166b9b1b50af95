/**
 * Three agents and two controller replicas over a three-member etcd cluster, all in namespaces: one leader, pods
 * with cluster-unique IPs, and `kill -9` of the leader: the other replica takes over and agents carry on.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { TestAgent } from '../../harness/agent.ts';
import { type ControllerProc, TestCloud } from '../../harness/cloud.ts';
import { type EtcdCluster, etcdSkipReason, startEtcdCluster } from '../../harness/etcd.ts';
import { leftoverNetns, rootSkipReason } from '../../harness/netns.ts';
import { until } from '../../harness/wait.ts';



describe('agents with two controllers over etcd', { skip: rootSkipReason() || etcdSkipReason(), timeout: 300_000 }, () => {
  let cloud: TestCloud;
  let etcd: EtcdCluster;
  const controllers: ControllerProc[] = [];
  const agents: TestAgent[] = [];

  before(async () => {
    cloud = new TestCloud();
    etcd = await startEtcdCluster({ members: 3, dir: cloud.dir, netns: cloud.netns });
    const store = { type: 'etcd', endpoints: etcd.endpoints, prefix: `/atoll-${randomBytes(3).toString('hex')}/`, leaseTtlSeconds: 2 };
    const pkiDir = join(cloud.dir, 'shared-pki');
    for (const [name, port] of [['ctl-a', 17451], ['ctl-b', 17452]] as const) {
      controllers.push(await cloud.startController(name, { port, store, extra: { pkiDir } }));
    }
    assert.equal(controllers[0]?.caCertHash, controllers[1]?.caCertHash, 'replicas share one CA');
    for (const name of ['e1', 'e2', 'e3']) {
      const agent = new TestAgent({ name, podCidrs: [] });
      const ip = cloud.connect(agent.netns);
      agent.rewriteConfig({ controller: cloud.controllerConfig(controllers), underlayAddresses: [ip] });
      agents.push(agent);
    }
    await Promise.all(agents.map((a) => a.start()));
  });

  after(async () => {
    for (const a of agents) await a.cleanup();
    await etcd?.stop();
    await cloud?.cleanup();
    assert.deepEqual(leftoverNetns(), []);
  });

  /** The replica that answers /v1/health as leader, asked from inside the cloud namespace. */
  function leader(): ControllerProc | undefined {
    return controllers.find((c) => c.proc?.exitCode === null && cloud.health(c)?.leader === true);
  }

  test('one replica leads; pods on every node get cluster-unique IPs', async () => {
    await until('a leader', () => leader() !== undefined);
    for (const a of agents) await until(`${a.netns} to get a block`, () => a.clusterState().blocks.length > 0);
    const blocks = agents.flatMap((a) => a.clusterState().blocks);
    assert.equal(new Set(blocks).size, blocks.length);
    const ips = agents.flatMap((a, i) => [a.addPod(`q${i}a`), a.addPod(`q${i}b`)]);
    assert.equal(new Set(ips).size, ips.length);
  });

  test('kill -9 of the leader: the other replica takes over; agents get new blocks from it', async () => {
    const old = leader() as ControllerProc;
    await cloud.stopController(old, 'SIGKILL');
    const other = controllers.find((c) => c !== old) as ControllerProc;
    await until('the other replica to lead', () => cloud.health(other)?.leader === true, 20_000);
    const a = agents[1] as TestAgent;
    const before = a.clusterState().blocks.length;
    for (let i = 0; i < 24; i++) a.addPod(`after${i}`); // run low: a spare block must come from the new leader
    await until('a spare block from the new leader', () => a.clusterState().blocks.length > before);
    const check = cloud.cli(['ipam', 'check', '--controller-config', other.configPath]);
    assert.equal(check.code, 0, check.out);
  });
});
