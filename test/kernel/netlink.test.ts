/**
 * The rtnetlink adapter against the real kernel, in throwaway namespaces: the pod plan's two batches leave what
 * `ip` shows (hairpin included), errors name the operation, the object, the namespace and the errno, deleting a
 * missing link succeeds, concurrent exchanges on one socket get their own answers, and a slow kernel operation does
 * not hold the main thread.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { closeSync, openSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { AtollError } from '../../src/core/errors.ts';
import { type Cidr, parseCidr, parseIpv4 } from '../../src/core/net/ipv4.ts';
import { AF_BRIDGE, AF_INET, decodeLink, delLink, NETLINK_NETFILTER, newDefaultRoute4, newVeth, NUD_PERMANENT } from '../../src/core/net/netlink-codec.ts';
import { hostRequests, planPod, podRequests } from '../../src/core/plan/pod-plan.ts';
import { LinkWatch } from '../../src/adapters/kernel/link-watch.ts';
import { RtnlSocket } from '../../src/adapters/kernel/netlink.ts';
import { inNetns } from '../../src/adapters/kernel/netns.ts';
import { addNetns, delNetns, dumpNetns, leftoverNetns, rootSkipReason, sh } from '../../harness/netns.ts';

const skip = rootSkipReason();
const path = (ns: string) => `/var/run/netns/${ns}`;
const ipJson = <T>(ns: string, args: string[]) => JSON.parse(sh('ip', ['-n', ns, '-j', ...args])) as T[];

describe('rtnetlink adapter', { skip }, () => {
  let node: string;
  let host: RtnlSocket;
  const pods: string[] = [];
  const podNs = (name: string) => {
    const ns = addNetns(`nl-${name}`);
    pods.push(ns);
    return ns;
  };

  before(() => {
    node = addNetns('nl-node');
    sh('ip', ['-n', node, 'link', 'add', 'br-nl', 'type', 'bridge']);
    sh('ip', ['-n', node, 'addr', 'add', '10.76.0.1/24', 'dev', 'br-nl']);
    sh('ip', ['-n', node, 'link', 'set', 'br-nl', 'up']);
    host = inNetns(path(node), () => RtnlSocket.open(`network namespace ${node}`));
  });
  after(() => {
    host.close();
    for (const ns of pods) delNetns(ns);
    delNetns(node);
    assert.deepEqual(leftoverNetns().filter((n) => n.includes('nl-')), []);
  });

  /** Plumbs a pod the way the agent does; returns its plan. */
  async function plumb(name: string, ip: string, containerId = `c-${name}`) {
    const ns = podNs(name);
    const plan = planPod({ containerId, ifName: 'eth0', netns: path(ns), ip: parseIpv4(ip) as number, block: parseCidr('10.76.0.0/24') as Cidr, bridge: 'br-nl', mtu: 1400 });
    const bridge = await host.link({ name: 'br-nl' });
    assert.ok(bridge, 'the bridge reads back');
    const fd = openSync(path(ns), 'r');
    let res;
    try {
      res = await host.run(hostRequests(plan, { bridgeIndex: bridge.index, podNetnsFd: fd }));
    } finally {
      closeSync(fd);
    }
    const peer = decodeLink(res[3]?.replies[0] as Parameters<typeof decodeLink>[0]).link as number;
    const pod = inNetns(path(ns), () => RtnlSocket.open(`network namespace ${ns}`));
    try {
      await pod.run(podRequests(plan, peer));
    } finally {
      pod.close();
    }
    return { ns, plan };
  }

  test('the host and pod batches leave what ip shows: master, hairpin, up, MTU, MACs, address, route', async () => {
    const { ns, plan } = await plumb('a', '10.76.0.5');
    const link = ipJson<{ master?: string; mtu: number; address: string; flags: string[]; linkinfo: { info_slave_data: { hairpin: boolean } } }>(node, ['-d', 'link', 'show', plan.hostIfName])[0];
    assert.ok(link, dumpNetns(node));
    assert.equal(link.master, 'br-nl');
    assert.equal(link.linkinfo.info_slave_data.hairpin, true, 'ip -d link shows hairpin on');
    assert.ok(link.flags.includes('UP'));
    assert.equal(link.mtu, 1400);
    assert.equal(link.address, plan.hostMac);
    assert.match(sh('ip', ['-n', node, '-d', 'link', 'show', plan.hostIfName]), /hairpin on/);
    const eth0 = ipJson<{ address: string; mtu: number; flags: string[]; addr_info: { local: string; prefixlen: number; family: string }[] }>(ns, ['addr', 'show', 'eth0'])[0];
    assert.ok(eth0, dumpNetns(ns));
    assert.equal(eth0.address, '0a:58:0a:4c:00:05');
    assert.equal(eth0.mtu, 1400);
    assert.ok(eth0.flags.includes('UP'));
    assert.deepEqual(eth0.addr_info.filter((a) => a.family === 'inet').map((a) => `${a.local}/${a.prefixlen}`), ['10.76.0.5/24']);
    assert.deepEqual(ipJson<{ dst: string; gateway: string; dev: string }>(ns, ['route', 'show', 'default']).map((r) => [r.gateway, r.dev]), [['10.76.0.1', 'eth0']]);
    assert.equal(sh('ip', ['netns', 'exec', ns, 'ping', '-c1', '-W2', '10.76.0.1']).includes('1 received'), true);
  });

  test('a refused request names the operation, the object, the namespace and the errno', async () => {
    const { ns, plan } = await plumb('b', '10.76.0.6');
    const fd = openSync(path(ns), 'r');
    try {
      const again = newVeth({ name: plan.hostIfName, mac: plan.hostMac, mtu: 1400, peer: { name: 'eth1', mac: plan.podMac, mtu: 1400, netnsFd: fd, netnsPath: path(ns) } });
      await assert.rejects(host.run([again]), (err: unknown) => {
        assert.ok(err instanceof AtollError);
        assert.equal(err.code, 'KERNEL_OP_FAILED');
        assert.match(err.message, new RegExp(`creating veth ${plan.hostIfName} \\(peer eth1 in ${path(ns)}\\) in network namespace ${node} failed: EEXIST \\(file already exists\\)`));
        assert.equal((err as { errno?: number }).errno, 17);
        return true;
      });
    } finally {
      closeSync(fd);
    }
    // The kernel's extended-ack text comes along when it gives one.
    const bridge = await host.link({ name: 'br-nl' });
    const bad = newDefaultRoute4({ gateway: parseIpv4('10.9.9.9') as number, oif: bridge?.index as number, ifName: 'br-nl' });
    await assert.rejects(host.run([bad]), /adding default route via 10\.9\.9\.9 dev br-nl in network namespace .* failed: ENETUNREACH \(network is unreachable\): Nexthop has invalid gateway/);
    const [res] = await host.exchange([delLink({ index: 999_999 })]);
    assert.equal(res?.errno, 19);
  });

  test('deleting a link removes both veth ends; deleting it again succeeds (ENODEV is "already gone")', async () => {
    const { ns, plan } = await plumb('c', '10.76.0.7');
    await host.deleteLink({ name: plan.hostIfName });
    assert.equal(await host.link({ name: plan.hostIfName }), undefined);
    assert.deepEqual(ipJson<{ ifname: string }>(ns, ['link']).map((l) => l.ifname), ['lo']);
    await host.deleteLink({ name: plan.hostIfName });
  });

  test('the link watch announces a deleted veth gone, with its name free, long before the deletion is acked', async () => {
    const watch = inNetns(path(node), () => LinkWatch.open(`network namespace ${node}`));
    try {
      const { ns, plan } = await plumb('w', '10.76.0.9');
      const link = await host.link({ name: plan.hostIfName });
      assert.ok(link);
      const gone = watch.gone(link.index);
      let acked = false;
      const deleted = host.deleteLink({ index: link.index, label: plan.hostIfName }).then(() => (acked = true));
      await gone.promise;
      const ackedWhenGone = acked;
      const look = inNetns(path(node), () => RtnlSocket.open());
      try {
        assert.equal(await look.link({ name: plan.hostIfName }), undefined, 'unlisted when announced');
      } finally {
        look.close();
      }
      assert.deepEqual(ipJson<{ ifname: string }>(ns, ['link']).map((l) => l.ifname), ['lo'], 'the pod end is gone too');
      sh('ip', ['-n', node, 'link', 'add', plan.hostIfName, 'type', 'veth', 'peer', 'name', 'vx1']); // the name is free
      sh('ip', ['-n', node, 'link', 'del', plan.hostIfName]);
      await deleted;
      // Usually the ack is still 15 to 30 ms away when the notice arrives; do not fail on a fast kernel.
      if (ackedWhenGone) process.stderr.write('note: the deletion was acked before its notice was handled\n');
      // Someone else's deletion is announced too.
      sh('ip', ['-n', node, 'link', 'add', 'vw0', 'type', 'veth', 'peer', 'name', 'vw1']);
      const other = await host.link({ name: 'vw0' });
      const otherGone = watch.gone(other?.index as number);
      sh('ip', ['-n', node, 'link', 'del', 'vw0']);
      await otherGone.promise;
    } finally {
      watch.close();
    }
  });

  test('concurrent exchanges on one socket each get their own answers', async () => {
    const names = ['br-nl', 'lo', 'nope0', 'br-nl', 'lo', 'nope1'];
    const got = await Promise.all(Array.from({ length: 30 }, (_, i) => host.link({ name: names[i % names.length] as string })));
    got.forEach((l, i) => assert.equal(l?.name, names[i % names.length]?.startsWith('nope') ? undefined : names[i % names.length]));
  });

  test('slow kernel work (veth deletions) leaves the main thread free', async () => {
    const plumbed = [];
    for (let i = 0; i < 6; i++) plumbed.push(await plumb(`d${i}`, `10.76.0.${20 + i}`));
    // Count the event loop's turns while the deletions run: an immediate runs once per turn, however fast or loaded
    // the machine. Had a deletion's send() run on the main thread, all six (one after another on the socket) would
    // have finished inside microtasks, before the first turn.
    let turns = 0;
    let turn = setImmediate(function count() {
      turns++;
      turn = setImmediate(count);
    });
    const t0 = performance.now();
    await Promise.all(plumbed.map(({ plan }) => host.deleteLink({ name: plan.hostIfName })));
    clearImmediate(turn);
    assert.ok(turns >= 1, `the event loop never turned during ${plumbed.length} veth deletions (${(performance.now() - t0).toFixed(1)} ms)`);
    await sleep(0);
  });
});

describe('netlink dumps: what the resync reads instead of spawning ip, bridge and nft', { skip }, () => {
  let ns: string;
  let sock: RtnlSocket;

  before(() => {
    ns = addNetns('nl-dump');
    const batch = [
      'link add dm-up type veth peer name dm-peer', 'link set dm-peer up', 'addr add 172.31.9.2/24 dev dm-up', 'link set dm-up up',
      'link add br-dump type bridge', 'addr add 10.76.1.1/26 dev br-dump', 'addr add 10.76.2.1/26 dev br-dump', 'link set br-dump up',
      'link add vx-dump address 0e:00:00:00:00:09 mtu 1400 type vxlan id 4097 dstport 8473 local 172.31.9.2 dev dm-up nolearning',
      'link set vx-dump up', 'addr add 10.76.1.0/32 dev vx-dump',
      'neigh add 10.76.3.0 lladdr 0e:00:00:00:00:0a dev vx-dump nud permanent',
      'neigh add 10.76.4.0 lladdr 0e:00:00:00:00:0b dev vx-dump nud permanent',
      'neigh add 172.31.9.7 lladdr 0e:00:00:00:00:0c dev dm-up nud reachable',
      'route add 10.76.3.0/26 via 10.76.3.0 dev vx-dump onlink proto 44',
      'route add 10.76.4.5/32 via 172.31.9.8 dev dm-up proto 44',
      'route add 10.76.5.0/24 dev dm-up proto 44 table 1000',
      'route add 10.76.6.0/24 via 172.31.9.9 dev dm-up',
    ];
    sh('ip', ['-n', ns, '-batch', '-'], batch.join('\n') + '\n');
    sh('ip', ['netns', 'exec', ns, 'bridge', 'fdb', 'append', '0e:00:00:00:00:0a', 'dev', 'vx-dump', 'dst', '172.31.9.3']);
    sh('ip', ['netns', 'exec', ns, 'bridge', 'fdb', 'append', '0e:00:00:00:00:0b', 'dev', 'vx-dump', 'dst', '172.31.9.4']);
    sh('ip', ['netns', 'exec', ns, 'bridge', 'fdb', 'append', '00:00:00:00:00:00', 'dev', 'vx-dump', 'dst', '172.31.9.5']);
    sock = inNetns(path(ns), () => RtnlSocket.open(`network namespace ${ns}`));
  });
  after(() => {
    try {
      sock.close();
    } finally {
      delNetns(ns); // also when the set-up failed before the socket was opened
    }
  });

  test('links: every one ip lists, with index, MTU, MAC, master, kind, UP and the VXLAN device\'s VNI, local address, port, learning', async () => {
    const links = await sock.links();
    const ours = ipJson<{ ifindex: number; ifname: string; mtu: number; address: string; flags: string[]; linkinfo?: { info_kind?: string } }>(ns, ['-d', 'link', 'show']);
    assert.deepEqual(links.map((l) => [l.index, l.name, l.mtu, l.mac, (l.flags & 1) === 1, l.kind]),
      ours.map((l) => [l.ifindex, l.ifname, l.mtu, l.address, l.flags.includes('UP'), l.linkinfo?.info_kind]));
    const vx = links.find((l) => l.name === 'vx-dump');
    assert.deepEqual(vx?.vxlan, { id: 4097, local: '172.31.9.2', port: 8473, learning: false });
    assert.equal(vx?.mac, '0e:00:00:00:00:09');
    sh('ip', ['-n', ns, 'link', 'set', 'vx-dump', 'type', 'vxlan', 'learning']);
    assert.equal((await sock.links()).find((l) => l.name === 'vx-dump')?.vxlan?.learning, true);
    sh('ip', ['-n', ns, 'link', 'set', 'vx-dump', 'type', 'vxlan', 'nolearning']);
  });

  test('addresses: the IPv4 addresses ip lists, per interface', async () => {
    const got = (await sock.addresses()).map((a) => `${a.index} ${a.local}/${a.prefixLen}`).sort();
    const want = ipJson<{ ifindex: number; addr_info: { family: string; local: string; prefixlen: number }[] }>(ns, ['addr', 'show'])
      .flatMap((l) => l.addr_info.filter((i) => i.family === 'inet').map((i) => `${l.ifindex} ${i.local}/${i.prefixlen}`)).sort();
    assert.deepEqual(got, want);
    assert.ok(got.includes(`${(await sock.link({ name: 'br-dump' }))?.index} 10.76.2.1/26`));
  });

  test('routes: every table, with protocol, gateway, device and onlink, as ip lists them', async () => {
    const byIndex = new Map((await sock.links()).map((l) => [l.index, l.name]));
    const got = (await sock.routes()).filter((r) => r.type === 1 && r.table !== 255)
      .map((r) => `${r.dst} ${r.gateway ?? '-'} ${byIndex.get(r.oif ?? 0)} ${r.protocol} ${r.table} ${r.onlink}`).sort();
    const protoNumber: Record<string, number> = { kernel: 2, boot: 3, static: 4 };
    const want = ipJson<{ dst: string; gateway?: string; dev: string; protocol?: string; table?: string; flags: string[]; type?: string }>(ns, ['-4', '-N', 'route', 'show', 'table', 'all'])
      .filter((r) => (r.type ?? 'unicast') === 'unicast' && r.table !== 'local')
      .map((r) => `${r.dst === 'default' ? '0.0.0.0/0' : r.dst.includes('/') ? r.dst : `${r.dst}/32`} ${r.gateway ?? '-'} ${r.dev} ${protoNumber[r.protocol ?? 'boot'] ?? Number(r.protocol)} ${r.table ?? 254} ${r.flags.includes('onlink')}`).sort();
    assert.deepEqual(got, want);
    assert.ok(got.includes('10.76.3.0/26 10.76.3.0 vx-dump 44 254 true'), got.join('\n'));
    assert.ok(got.includes('10.76.5.0/24 - dm-up 44 1000 false'), got.join('\n'));
  });

  test('neighbours and fdb entries: the permanent ones on the VXLAN device, as ip neigh and bridge fdb list them', async () => {
    const vx = (await sock.link({ name: 'vx-dump' }))?.index;
    const neigh = (await sock.neighbours(AF_INET)).filter((n) => n.index === vx && n.state & NUD_PERMANENT).map((n) => `${n.dst} ${n.lladdr}`).sort();
    const wantNeigh = ipJson<{ dst: string; lladdr: string }>(ns, ['neigh', 'show', 'dev', 'vx-dump', 'nud', 'permanent']).map((n) => `${n.dst} ${n.lladdr}`).sort();
    assert.deepEqual(neigh, wantNeigh);
    assert.equal(neigh.length, 2);
    const fdb = (await sock.neighbours(AF_BRIDGE)).filter((n) => n.index === vx && n.dst).map((n) => `${n.lladdr} ${n.dst}`).sort();
    const wantFdb = (JSON.parse(sh('ip', ['netns', 'exec', ns, 'bridge', '-json', 'fdb', 'show', 'dev', 'vx-dump'])) as { mac: string; dst?: string }[])
      .filter((f) => f.dst).map((f) => `${f.mac} ${f.dst}`).sort();
    assert.deepEqual(fdb, wantFdb);
    assert.equal(fdb.length, 3);
  });

  test('a dump larger than one part: 600 routes come back whole', async () => {
    const lines = Array.from({ length: 600 }, (_, i) => `route add 10.${80 + (i >> 8)}.${i & 255}.0/24 via 172.31.9.9 dev dm-up proto 45`);
    sh('ip', ['-n', ns, '-batch', '-'], lines.join('\n') + '\n');
    try {
      const routes = (await sock.routes()).filter((r) => r.protocol === 45);
      assert.equal(routes.length, 600);
      assert.equal(new Set(routes.map((r) => r.dst)).size, 600);
    } finally {
      sh('ip', ['-n', ns, 'route', 'flush', 'proto', '45']);
    }
  });

  test('the nftables generation rises by one per committed transaction, and not for reads', async () => {
    const nf = inNetns(path(ns), () => RtnlSocket.open(`network namespace ${ns}`, NETLINK_NETFILTER));
    try {
      const g0 = await nf.nftGeneration();
      sh('ip', ['netns', 'exec', ns, 'nft', '-f', '-'], 'table ip nl-dump\ndelete table ip nl-dump\ntable ip nl-dump {\n  set s { type ipv4_addr; }\n}\n');
      assert.equal(await nf.nftGeneration(), g0 + 1);
      sh('ip', ['netns', 'exec', ns, 'nft', 'list', 'ruleset']);
      assert.equal(await nf.nftGeneration(), g0 + 1);
      sh('ip', ['netns', 'exec', ns, 'nft', 'delete', 'table', 'ip', 'nl-dump']);
      assert.equal(await nf.nftGeneration(), g0 + 2);
    } finally {
      nf.close();
    }
  });
});
