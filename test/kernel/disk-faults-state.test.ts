/**
 * The agent's own state files on a disk that fails (issue #39): a real agent with a controller, its data directory a
 * throwaway tmpfs made here, filled to ENOSPC or remounted read-only while the controller sends it peer and block
 * changes. The agent must stay up, apply each change from memory (routes to a new peer's block, a spare block in its
 * IPAM), say once with NODE_STATE_WRITE_FAILED that it cannot write `cluster-state.json`, and write the file by
 * itself once the disk takes writes again. Before, the failed write was thrown from a timer and killed the agent.
 * Every mount is unmounted in `after`, also when a test fails.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { TestAgent } from '../../harness/agent.ts';
import { type ControllerProc, TestCloud } from '../../harness/cloud.ts';
import { fill, mountTmpfs, remount, unmount } from '../../harness/disk.ts';
import { leftoverNetns, rootSkipReason, sh } from '../../harness/netns.ts';
import { until } from '../../harness/wait.ts';
import { statusSocketOf } from '../../src/adapters/ops/status-socket.ts';
import type { AgentStatus } from '../../src/core/ops/agent-status.ts';
import { vtepMacOf } from '../../src/adapters/node/vtep-state.ts';

const MAIN = new URL('../../src/cli/main.ts', import.meta.url).pathname;

/** The agent's status from its status socket (what `atoll status --json` prints). */
function status(agent: TestAgent): AgentStatus {
  const r = spawnSync(process.execPath, [MAIN, 'status', '--socket', statusSocketOf(agent.socket), '--json'], { encoding: 'utf8', timeout: 30_000 });
  assert.equal(r.status, 0, `atoll status: ${r.stderr}`);
  return JSON.parse(r.stdout) as AgentStatus;
}

/** The agent's routes of ours (protocol 44), one per line. */
const routes = (agent: TestAgent) => sh('ip', ['-n', agent.netns, 'route', 'show', 'proto', '44']);

/** The agent's log lines (parsed) with `code`, at `level`, since byte `from`. */
function logged(agent: TestAgent, code: string, level: string, from = 0): { msg: string; err: string; path: string }[] {
  return readFileSync(agent.logPath, 'utf8').slice(from).split('\n').filter((l) => l.includes(`"code":"${code}"`))
    .map((l) => JSON.parse(l) as { level: string; msg: string; err: string; path: string }).filter((l) => l.level === level);
}

describe("the agent's cluster state on a disk that fails", { skip: rootSkipReason(), timeout: 240_000 }, () => {
  let cloud: TestCloud;
  let controller: ControllerProc;
  /** The agent under test, on a 512 KiB tmpfs. */
  let a: TestAgent;
  /** A peer whose arrival and departure are the changes `a` must apply. */
  let b: TestAgent;

  before(async () => {
    cloud = new TestCloud();
    controller = await cloud.startController('ctl', { port: 17481 });
    a = new TestAgent({ name: 'sfa', podCidrs: [] });
    b = new TestAgent({ name: 'sfb', podCidrs: [] });
    for (const agent of [a, b]) {
      const ip = cloud.connect(agent.netns);
      agent.rewriteConfig({ controller: cloud.controllerConfig([controller]), underlayAddresses: [ip], overlay: {}, resyncPeriod: 2 });
    }
    mountTmpfs(a.dataDir, 512 * 1024);
    await a.start();
    await until('a to get its block', () => a.clusterState().blocks.length === 1);
  });

  after(async () => {
    try {
      await a?.stop('SIGKILL');
    } finally {
      if (a) unmount(a.dataDir);
      await a?.cleanup();
      await b?.cleanup();
      await cloud?.cleanup();
    }
    assert.deepEqual(leftoverNetns().filter((n) => /sf[abc]-/.test(n)), []);
  });

  test('disk full: a peer joins; the agent stays up, routes to it, says once why it cannot save, and saves once space is back', async () => {
    let filler: string | undefined;
    try {
      filler = fill(a.dataDir);
      await b.start();
      await until('b to get its block', () => b.clusterState().blocks.length === 1);
      const block = b.clusterState().blocks[0] as string;
      await until(`a to route to b's block ${block}`, () => !a.running || routes(a).includes(block), 20_000);
      assert.ok(a.running, 'the agent died on a full disk');
      // the failure is said once, however many resyncs retry it (each retry is a debug line)
      await until('two retries of the save', () => logged(a, 'NODE_STATE_WRITE_FAILED', 'debug').length >= 2, 20_000);
      const errors = logged(a, 'NODE_STATE_WRITE_FAILED', 'error');
      assert.equal(errors.length, 1, JSON.stringify(errors));
      assert.match(errors[0]?.err ?? '', /cluster-state\.json.*ENOSPC/);
      assert.ok(!a.clusterState().peers.some((p) => p.name === 'sfb'), 'the file could not hold b yet');
      assert.ok(status(a).nodes.some((n) => n.name === 'sfb'), 'the agent knows b (from memory)');
      rmSync(filler);
      filler = undefined;
      await until('the cluster state saved with b at a resync', () => a.clusterState().peers.some((p) => p.name === 'sfb'), 20_000);
      assert.match(readFileSync(a.logPath, 'utf8'), /the cluster state written again/);
    } catch (err) {
      console.error(a.dump());
      throw err;
    } finally {
      if (filler) rmSync(filler, { force: true });
    }
  });

  test('disk full: a spare block arrives; the agent takes it into its IPAM and saves it once space is back', async () => {
    let filler: string | undefined;
    try {
      // the controller away while the node fills its block (its records still fit), then the disk fills
      await cloud.stopController(controller, 'SIGKILL');
      for (let i = 0; i < 22; i++) a.addPod(`f${i}`); // a /27 holds 29 pod addresses; the controller refills below 8 free
      filler = fill(a.dataDir);
      const from = readFileSync(a.logPath, 'utf8').length;
      await cloud.restartController(controller);
      await until('a spare block in the agent\'s IPAM', () => !a.running || status(a).ipam.blocks.length === 2, 30_000);
      assert.ok(a.running, 'the agent died on a full disk');
      assert.equal(a.clusterState().blocks.length, 1, 'the file could not hold the spare block yet');
      assert.ok(logged(a, 'NODE_STATE_WRITE_FAILED', 'error', from).some((l) => /ENOSPC/.test(l.err)), 'the failure is logged with its code');
      assert.equal(status(a).controller?.state, 'connected', 'the link is not taken for a controller outage');
      rmSync(filler);
      filler = undefined;
      await until('the cluster state saved with the spare block', () => a.clusterState().blocks.length === 2, 20_000);
    } catch (err) {
      console.error(a.dump());
      throw err;
    } finally {
      if (filler) rmSync(filler, { force: true });
    }
  });

  test('read-only: a peer leaves; the agent removes its routes, and saves once the disk is read-write', async () => {
    try {
      const block = b.clusterState().blocks[0] as string;
      remount(a.dataDir, 'ro');
      await b.stop();
      const res = cloud.cli(['node', 'deregister', 'sfb', '--controller-config', controller.configPath]);
      assert.equal(res.code, 0, res.out);
      await until(`a to drop its route to ${block}`, () => !a.running || !routes(a).includes(block), 20_000);
      assert.ok(a.running, 'the agent died on a read-only disk');
      assert.ok(logged(a, 'NODE_STATE_WRITE_FAILED', 'error').some((l) => /EROFS/.test(l.err)), 'the failure is logged with its code');
      assert.ok(a.clusterState().peers.some((p) => p.name === 'sfb'), 'the file could not drop b yet');
      remount(a.dataDir, 'rw', a.pid);
      await until('the cluster state saved without b', () => !a.clusterState().peers.some((p) => p.name === 'sfb'), 20_000);
    } catch (err) {
      console.error(a.dump());
      throw err;
    }
  });

  test('first start on a read-only disk: the agent starts with the VTEP MAC its name gives, does not join without a node key on disk, and joins once the disk is read-write', async () => {
    // a third node, never started: its data directory a fresh tmpfs, read-only from the first start
    const c = new TestAgent({ name: 'sfc', podCidrs: [] });
    try {
      const ip = cloud.connect(c.netns);
      c.rewriteConfig({ controller: cloud.controllerConfig([controller]), underlayAddresses: [ip], overlay: {}, resyncPeriod: 2 });
      mountTmpfs(c.dataDir, 256 * 1024);
      remount(c.dataDir, 'ro');
      await c.start();
      const mac = vtepMacOf('sfc');
      assert.equal(JSON.parse(sh('ip', ['-n', c.netns, '-j', 'link', 'show', 'atoll.1']))[0].address, mac, 'the VXLAN device has the derived MAC');
      await until('the link to say it has no node key', () => /no node key on disk to join with/.test(readFileSync(c.logPath, 'utf8')), 20_000);
      assert.ok(c.running);
      const vtep = logged(c, 'NODE_STATE_WRITE_FAILED', 'error');
      assert.ok(vtep.some((l) => /vtep\.json.*EROFS/.test(l.err)), JSON.stringify(vtep));
      assert.ok(logged(c, 'NODE_STATE_WRITE_FAILED', 'warn').some((l) => /node\.key.*EROFS/.test(l.err)));
      const st = status(c);
      assert.equal(st.controller?.state, 'offline');
      assert.equal(st.ipam.blocks.length, 0, 'no block without joining');
      const show = JSON.parse(cloud.cli(['ipam', 'show', '--json', '--controller-config', controller.configPath]).out) as { nodes: { name: string }[] };
      assert.ok(!show.nodes.some((n) => n.name === 'sfc'), 'the node joined with a key that is not on disk');
      remount(c.dataDir, 'rw', c.pid);
      await until('c to join and get a block', () => c.clusterState().blocks.length === 1, 30_000);
      // vtep.json is written at a resync (every 2 s here), not with the join: it may come a little after the block
      await until('vtep.json written at a resync', () => existsSync(join(c.dataDir, 'vtep.json')), 10_000);
      assert.equal(JSON.parse(readFileSync(join(c.dataDir, 'vtep.json'), 'utf8')).vtepMac, mac, 'the derived MAC is the one written');
      assert.ok(existsSync(join(c.dataDir, 'node.key')));
      c.addPod('c1'); // the IPAM directory it could not make at the start is made at the first write
      assert.ok(c.running);
    } catch (err) {
      console.error(c.dump());
      throw err;
    } finally {
      await c.stop('SIGKILL');
      unmount(c.dataDir);
      await c.cleanup();
    }
  });
});
