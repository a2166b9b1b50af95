/**
 * The same-site overlay on namespaces: three nodes of one site (an underlay bridge), two pods each, every pod
 * reaching every other by PodIP over VXLAN; the VTEP MAC kept across restarts with the controller down and across a
 * "reboot"; a deleted route of ours repaired; a foreign route untouched.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { TestAgent } from '../../harness/agent.ts';
import { type ControllerProc, TestCloud } from '../../harness/cloud.ts';
import { leftoverNetns, rootSkipReason, sh } from '../../harness/netns.ts';
import { PROJECT_NODE } from '../../src/lab/agent-process.ts';
import { until } from '../../harness/wait.ts';

interface Pod {
  readonly node: TestAgent;
  readonly ns: string;
  readonly ip: string;
}



function vtepMac(agent: TestAgent): string {
  return JSON.parse(sh('ip', ['-n', agent.netns, '-j', 'link', 'show', 'atoll.1']))[0].address;
}

function pingable(from: Pod, to: string): boolean {
  return from.node.execIn(from.ns, 'ping', ['-c1', '-W1', to]).code === 0;
}

/**
 * One TCP round trip from the pod namespace `fromNs` to `toIp`, served by a one-shot server in namespace `serverNs`
 * that answers with the source address it saw. Returns that address, or undefined when the connection failed.
 */
async function tcpSeenSource(fromNs: string, serverNs: string, toIp: string): Promise<string | undefined> {
  const server = spawn('ip', ['netns', 'exec', serverNs, PROJECT_NODE, '-e', "require('net').createServer((s)=>{s.end(s.remoteAddress.replace('::ffff:',''));process.exit(0)}).listen(7007);setTimeout(()=>process.exit(2),5000)"]);
  await until(`the server in ${serverNs} listening`, () => sh('ss', ['-N', serverNs, '-Hltn', 'sport', '=', ':7007']).trim() !== '', 10_000, 20);
  const client = spawnSync('ip', ['netns', 'exec', fromNs, PROJECT_NODE, '-e',
    `const s=require('net').connect(7007,'${toIp}');let d='';s.on('data',x=>d+=x);s.on('end',()=>{process.stdout.write(d,()=>process.exit(0))});s.on('error',()=>process.exit(1));setTimeout(()=>process.exit(3),3000)`], { encoding: 'utf8' });
  server.kill('SIGKILL');
  return client.status === 0 && client.stdout ? client.stdout : undefined;
}

const nsName = (p: Pod) => p.ns.split('/').pop() as string;

describe('same-site overlay over VXLAN', { skip: rootSkipReason(), timeout: 300_000 }, () => {
  let cloud: TestCloud;
  let controller: ControllerProc;
  const agents: TestAgent[] = [];
  const pods: Pod[] = [];

  before(async () => {
    cloud = new TestCloud();
    controller = await cloud.startController('ctl', { port: 17461 });
    for (const name of ['v1', 'v2', 'v3']) {
      const agent = new TestAgent({ name, podCidrs: [] });
      const ip = cloud.connect(agent.netns);
      agent.rewriteConfig({ controller: cloud.controllerConfig([controller]), underlayAddresses: [ip], overlay: {}, resyncPeriod: 2 });
      agents.push(agent);
    }
    await Promise.all(agents.map((a) => a.start()));
    await until('every node to know both peers with their blocks and VTEP MACs', () =>
      agents.every((a) => a.clusterState().peers.filter((p) => p.blocks.length > 0 && p.vtepMac).length === 3));
    for (const a of agents) {
      for (const suffix of ['x', 'y']) {
        const ns = a.podNetns(`${a.netns.split('-').at(-2)}${suffix}`);
        const res = a.cni(a.env('ADD', `c-${ns.split('/').pop()}`, ns, { namespace: 'default', name: `pod-${ns.split('/').pop()}` }), a.netconf());
        assert.equal(res.code, 0, res.stdout + a.dump());
        pods.push({ node: a, ns, ip: ((res.json?.ips as { address: string }[])[0]?.address as string).split('/')[0] as string });
      }
    }
  });

  after(async () => {
    for (const a of agents) await a.cleanup();
    await cloud?.cleanup();
    assert.deepEqual(leftoverNetns(), []);
  });

  test('every pod reaches every other by PodIP (ping and TCP), with MTU underlay minus 50', async () => {
    await until('overlay routes on every node', () => agents.every((a) => sh('ip', ['-n', a.netns, 'route', 'show', 'proto', '44']).trim().split('\n').length >= 2));
    const failures: string[] = [];
    for (const a of pods) for (const b of pods) if (a !== b && !pingable(a, b.ip)) failures.push(`${a.ip} -> ${b.ip}`);
    assert.deepEqual(failures, [], agents.map((a) => a.dump()).join('\n'));
    const [p0, p5] = [pods[0] as Pod, pods[5] as Pod];
    assert.equal(await tcpSeenSource(nsName(p0), nsName(p5), p5.ip), p0.ip, 'TCP across nodes, pod source address kept (no masquerade)');
    // pod traffic leaving the cluster ranges is masqueraded to the node's underlay address
    const nodeIp = JSON.parse(readFileSync(p0.node.configPath, 'utf8')).underlayAddresses[0];
    assert.equal(await tcpSeenSource(nsName(p0), cloud.netns, '192.0.2.1'), nodeIp, 'egress masqueraded by the ip atoll table');
    assert.equal(JSON.parse(sh('ip', ['-n', (agents[0] as TestAgent).netns, '-j', 'link', 'show', 'atoll.1']))[0].mtu, 1450);
    const podLink = (pods[0] as Pod).node.execIn((pods[0] as Pod).ns, 'ip', ['-j', 'link', 'show', 'eth0']);
    assert.equal(JSON.parse(podLink.out)[0].mtu, 1450);
    // the largest unfragmented datagram passes: 1450 - 28 bytes of ICMP and IP headers
    const big = (pods[0] as Pod).node.execIn((pods[0] as Pod).ns, 'ping', ['-c1', '-W2', '-M', 'do', '-s', '1422', (pods[3] as Pod).ip]);
    assert.equal(big.code, 0, big.out);
  });

  test("each node's VTEP is advertised in flannel's annotation shape", () => {
    const show = cloud.cli(['ipam', 'show', '--json', '--controller-config', controller.configPath]);
    assert.equal(show.code, 0, show.out);
    const peers = JSON.parse(readFileSync(join((agents[0] as TestAgent).dataDir, 'cluster-state.json'), 'utf8')).peers as { name: string; vtepMac: string; addresses: string[]; annotations: Record<string, string> }[];
    for (const p of peers) {
      assert.deepEqual(JSON.parse(p.annotations['flannel.alpha.coreos.com/backend-data'] ?? '{}'), { VNI: 1, VtepMAC: p.vtepMac });
      assert.equal(p.annotations['flannel.alpha.coreos.com/public-ip'], p.addresses[0]);
    }
  });

  test('restart with the controller down: same VTEP MAC; a continuous ping loses packets only inside the restart window', async () => {
    const a = agents[1] as TestAgent;
    const before = vtepMac(a);
    await cloud.stopController(controller, 'SIGKILL');
    const from = pods[0] as Pod;
    const ping = spawn('ip', ['netns', 'exec', from.ns.split('/').pop() as string, 'ping', '-i', '0.05', '-w', '4', '-W', '1', (pods[2] as Pod).ip]);
    let out = '';
    ping.stdout.on('data', (d) => (out += d));
    const done = new Promise((r) => ping.on('close', r));
    await until('the ping answered before the restart', () => out.includes('bytes from'), 10_000, 10);
    const t0 = Date.now();
    await a.stop('SIGKILL');
    await a.start();
    const windowMs = Date.now() - t0;
    await done;
    const m = /(\d+) packets transmitted, (\d+) received/.exec(out);
    assert.ok(m, out);
    const lost = Number(m[1]) - Number(m[2]);
    assert.ok(lost * 50 <= windowMs, `lost ${lost} pings (${lost * 50} ms) outside a ${windowMs} ms restart window`);
    assert.equal(vtepMac(a), before);
  });

  test("a neighbour's probe while an agent is down moves nothing: the direct path is kept and carries traffic", async () => {
    const [v1, v2] = agents as [TestAgent, TestAgent];
    const from = pods[0] as Pod;
    const to = pods[2] as Pod;
    assert.equal(to.node, v2);
    const routes = () => sh('ip', ['-n', v1.netns, 'route', 'show', 'proto', '44']).trim();
    const before = routes();
    const logFrom = readFileSync(v1.logPath, 'utf8').length;
    await v2.stop('SIGKILL');
    try {
      // v1 probes v2 again once its last answer is a probe period (60 s) old: the probe meets v2's agent down
      await until("v1's probe of v2 unanswered (or v1 moving v2 off its direct path)", () => readFileSync(v1.logPath, 'utf8').slice(logFrom).includes('peer missed a reachability probe') || routes() !== before, 90_000, 500);
      await sleep(3_000); // a resync (2 s here) after the probe
      assert.equal(routes(), before, 'the same-site routes to v2 stay');
      assert.equal(pingable(from, to.ip), true, `kernel VXLAN still carries v1's pod to v2's with v2's agent down${v1.dump()}`);
    } finally {
      await v2.start();
    }
  });

  test('"reboot" with the controller down: devices and rules gone, agent restarted: same MAC, nothing changed on peers', async () => {
    const a = agents[2] as TestAgent;
    const before = vtepMac(a);
    const peerState = sh('ip', ['-n', (agents[0] as TestAgent).netns, 'neigh', 'show', 'dev', 'atoll.1']);
    await a.stop('SIGKILL');
    for (const dev of ['atoll.1', a.bridge]) sh('ip', ['-n', a.netns, 'link', 'del', dev]);
    sh('ip', ['netns', 'exec', a.netns, 'nft', 'delete', 'table', 'ip', 'atoll']);
    await a.start();
    assert.equal(vtepMac(a), before);
    assert.equal(sh('ip', ['-n', (agents[0] as TestAgent).netns, 'neigh', 'show', 'dev', 'atoll.1']), peerState);
    // the pods' veths died with the bridge in this "reboot": re-create one pod (same name: same IP) and reach it
    const old = pods[4] as Pod;
    const ns = a.podNetns('reborn');
    const res = a.cni(a.env('ADD', 'c-reborn', ns, { namespace: 'default', name: `pod-${old.ns.split('/').pop()}` }), a.netconf());
    assert.equal(res.code, 0, res.stdout);
    assert.match(res.stdout, new RegExp(`"${old.ip.replaceAll('.', '\\.')}/`));
    await until('traffic to the re-created pod', () => pingable(pods[0] as Pod, old.ip), 10_000);
    assert.match(sh('ip', ['netns', 'exec', a.netns, 'nft', 'list', 'table', 'ip', 'atoll']), /masquerade/);
  });

  test('a resync that finds everything in place starts no process; a deleted nft table, fdb entry and bridge address come back', async () => {
    const a = agents[0] as TestAgent;
    // `ip`, `bridge` and `nft` on the agent's PATH log each call, then run the real tool
    const wrapDir = mkdtempSync(join(tmpdir(), 'atoll-spawns-'));
    const log = join(wrapDir, 'calls.log');
    for (const tool of ['ip', 'bridge', 'nft']) {
      const real = sh('sh', ['-c', `command -v ${tool}`]).trim();
      writeFileSync(join(wrapDir, tool), `#!/bin/sh\necho "${tool} $*" >> ${log}\ncase "$*" in *batch*|*-f*) tee -a ${log} | ${real} "$@"; exit $? ;; esac\nexec ${real} "$@"\n`, { mode: 0o755 });
    }
    writeFileSync(log, '');
    try {
      await a.stop();
      await a.start(15_000, ['ip', 'netns', 'exec', a.netns, 'env', `PATH=${wrapDir}:${process.env.PATH ?? ''}`]);
      await sleep(3000); // the start-up's own checks may spawn
      writeFileSync(log, '');
      await sleep(7000); // three resyncs at resyncPeriod 2 s
      assert.equal(readFileSync(log, 'utf8'), '', 'processes started by resyncs that had nothing to change');

      const fdb = (JSON.parse(sh('ip', ['netns', 'exec', a.netns, 'bridge', '-json', 'fdb', 'show', 'dev', 'atoll.1'])) as { mac: string; dst?: string }[])
        .find((f) => f.dst && f.mac !== '00:00:00:00:00:00');
      assert.ok(fdb, 'an fdb entry of a peer');
      const gateway = (JSON.parse(sh('ip', ['-n', a.netns, '-j', 'addr', 'show', 'dev', a.bridge])) as { addr_info: { family: string; local: string; prefixlen: number }[] }[])[0]
        ?.addr_info.find((i) => i.family === 'inet');
      assert.ok(gateway, 'the bridge holds a gateway address');
      sh('ip', ['netns', 'exec', a.netns, 'nft', 'delete', 'table', 'ip', 'atoll']);
      sh('ip', ['netns', 'exec', a.netns, 'bridge', 'fdb', 'del', fdb.mac, 'dev', 'atoll.1', 'dst', fdb.dst as string]);
      sh('ip', ['-n', a.netns, 'addr', 'del', `${gateway.local}/${gateway.prefixlen}`, 'dev', a.bridge]);
      await until('the table, the fdb entry and the address repaired', () =>
        sh('ip', ['netns', 'exec', a.netns, 'nft', 'list', 'tables']).includes('table ip atoll') &&
        sh('ip', ['netns', 'exec', a.netns, 'bridge', 'fdb', 'show', 'dev', 'atoll.1']).includes(`${fdb.mac} dst ${fdb.dst}`) &&
        sh('ip', ['-n', a.netns, 'addr', 'show', 'dev', a.bridge]).includes(`${gateway.local}/${gateway.prefixlen}`), 15_000);
      const calls = readFileSync(log, 'utf8');
      assert.match(calls, /^nft -f -$/m);
      assert.match(calls, /^bridge -batch -$/m);
      assert.match(calls, /^ip -batch -$/m);
    } finally {
      await a.stop();
      await a.start();
      rmSync(wrapDir, { recursive: true, force: true });
    }
  });

  test('resync repairs deleted routes of ours and never takes over a foreign route', async () => {
    const a = agents[0] as TestAgent;
    const ours = sh('ip', ['-n', a.netns, 'route', 'show', 'proto', '44']).trim().split('\n').map((l) => l.split(' ')[0] as string);
    assert.ok(ours.length >= 2, ours.join(' | '));
    const [taken, repaired] = ours as [string, string];
    sh('ip', ['-n', a.netns, 'route', 'add', '198.18.0.0/24', 'via', '192.0.2.1']);
    for (const dst of [taken, repaired]) sh('ip', ['-n', a.netns, 'route', 'del', dst, 'proto', '44']);
    sh('ip', ['-n', a.netns, 'route', 'add', taken, 'via', '192.0.2.1', 'proto', 'static']); // someone else's now
    await until('the other route to be repaired', () => sh('ip', ['-n', a.netns, 'route', 'show', 'proto', '44']).includes(repaired), 15_000);
    assert.match(sh('ip', ['-n', a.netns, 'route', 'show', taken]), /via 192\.0\.2\.1 dev \S+ proto static/, 'the foreign route for the same prefix is left alone');
    assert.match(sh('ip', ['-n', a.netns, 'route', 'show', '198.18.0.0/24']), /via 192\.0\.2\.1/);
  });
});

describe('direct routes and site labels', { skip: rootSkipReason(), timeout: 300_000 }, () => {
  let cloud: TestCloud;
  const agents: TestAgent[] = [];
  after(async () => {
    for (const a of agents) await a.cleanup();
    await cloud?.cleanup();
  });

  test('same-site peers on one L2 segment get plain routes; a peer labelled another site gets none', async () => {
    cloud = new TestCloud();
    const controller = await cloud.startController('ctl', { port: 17462 });
    for (const [name, site] of [['d1', 'a'], ['d2', 'a'], ['d3', 'b']] as const) {
      const agent = new TestAgent({ name, podCidrs: [] });
      const ip = cloud.connect(agent.netns);
      agent.rewriteConfig({ controller: cloud.controllerConfig([controller]), underlayAddresses: [ip], site, overlay: { directRouting: 'auto' }, resyncPeriod: 2 });
      agents.push(agent);
    }
    await Promise.all(agents.map((a) => a.start()));
    const [d1, d2, d3] = agents as [TestAgent, TestAgent, TestAgent];
    await until('peers with blocks', () => agents.every((a) => a.clusterState().peers.filter((p) => p.blocks.length > 0).length === 3));
    const block = (a: TestAgent) => (d1.clusterState().peers.find((p) => p.name === a.netns.split('-').at(-2))?.blocks[0]) as string;
    await until('a direct route to d2', () => sh('ip', ['-n', d1.netns, 'route', 'show', 'proto', '44']).includes(block(d2)));
    const routes = sh('ip', ['-n', d1.netns, 'route', 'show', 'proto', '44']);
    assert.match(routes, new RegExp(`${block(d2).replace('.', '\\.')} via 192\\.0\\.2\\.\\d+ dev uplink0`));
    assert.ok(!routes.includes(block(d3)), `no route to another site's block: ${routes}`);
    const pa = d1.podNetns('da');
    const pb = d2.podNetns('db');
    const ra = d1.cni(d1.env('ADD', 'c-da', pa, { namespace: 'default', name: 'da' }), d1.netconf());
    const rb = d2.cni(d2.env('ADD', 'c-db', pb, { namespace: 'default', name: 'db' }), d2.netconf());
    assert.equal(ra.code + rb.code, 0);
    const ipB = ((rb.json?.ips as { address: string }[])[0]?.address as string).split('/')[0] as string;
    assert.equal(d1.execIn(pa, 'ping', ['-c1', '-W2', ipB]).code, 0, d1.dump());
    // a deregistered peer's routes go away
    const gone = block(d2);
    const res = cloud.cli(['node', 'deregister', 'd2', '--controller-config', controller.configPath]);
    assert.equal(res.code, 0, res.out);
    await until('the route to the deregistered peer to go', () => !sh('ip', ['-n', d1.netns, 'route', 'show', 'proto', '44']).includes(gone));
  });
});
