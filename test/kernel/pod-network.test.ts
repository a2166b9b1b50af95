/**
 * The agent and the real atoll-cni binary on real namespaces: plumbing, sticky IPs across DEL/ADD, restarts and
 * "reboots", rollback of a failed ADD, GC, and concurrent ADDs.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { TestAgent } from '../../harness/agent.ts';
import { leftoverNetns, rootSkipReason, sh } from '../../harness/netns.ts';

const skip = rootSkipReason();

function ipOf(res: { json: Record<string, unknown> | undefined; stdout: string }): string {
  const ips = res.json?.ips as { address: string }[] | undefined;
  assert.ok(ips?.[0], `no IP in result: ${res.stdout}`);
  return ips[0].address.split('/')[0] as string;
}

describe('pod network on one node', { skip }, () => {
  let agent: TestAgent;
  before(async () => {
    agent = new TestAgent({ name: 'pn', podCidrs: ['10.77.0.0/28'] });
    await agent.start();
  });
  after(async () => {
    await agent.cleanup();
    assert.deepEqual(leftoverNetns().filter((n) => n.includes('pn-')), []);
  });

  test('ADD plumbs the pod: address, route, MTU, hairpin; pods reach each other and the gateway', async () => {
    const a = agent.podNetns('a');
    const b = agent.podNetns('b');
    const ra = agent.cni(agent.env('ADD', 'ca', a, { namespace: 'default', name: 'a' }), agent.netconf());
    const rb = agent.cni(agent.env('ADD', 'cb', b, { namespace: 'default', name: 'b' }), agent.netconf());
    assert.equal(ra.code, 0, ra.stdout + agent.dump());
    assert.equal(rb.code, 0, rb.stdout);
    const ipA = ipOf(ra);
    const ipB = ipOf(rb);
    assert.notEqual(ipA, ipB);
    assert.equal(agent.execIn(a, 'ping', ['-c1', '-W2', ipB]).code, 0, agent.dump());
    assert.equal(agent.execIn(b, 'ping', ['-c1', '-W2', '10.77.0.1']).code, 0);
    const host = (ra.json?.interfaces as { name: string }[])[0]?.name as string;
    const link = JSON.parse(sh('ip', ['-n', agent.netns, '-j', '-d', 'link', 'show', host]))[0];
    assert.equal(link.master, agent.bridge);
    assert.equal(link.linkinfo.info_slave_data.hairpin, true);
    assert.equal(agent.execIn(a, 'cat', ['/proc/sys/net/ipv4/conf/eth0/arp_notify']).out.trim(), '1');
    const prevResult = ra.json;
    assert.equal(agent.cni(agent.env('CHECK', 'ca', a, { namespace: 'default', name: 'a' }), agent.netconf('1.0.0', { prevResult })).code, 0);
    // CHECK notices a missing route
    agent.execIn(a, 'ip', ['route', 'del', 'default']);
    const chk = agent.cni(agent.env('CHECK', 'ca', a, { namespace: 'default', name: 'a' }), agent.netconf('1.0.0', { prevResult }));
    assert.equal(chk.code, 1);
    assert.match(String(chk.json?.msg), /default route/);
  });

  test('a pod re-created under the same name gets its IP back, across DEL/ADD, restart and reboot', async () => {
    const p1 = agent.podNetns('s1');
    const pod = { namespace: 'prod', name: 'db-0' };
    const first = ipOf(agent.cni(agent.env('ADD', 'c-s1', p1, pod), agent.netconf()));
    agent.cni(agent.env('ADD', 'c-other', agent.podNetns('o1'), { namespace: 'prod', name: 'other' }), agent.netconf());
    assert.equal(agent.cni(agent.env('DEL', 'c-s1', p1, pod), agent.netconf()).code, 0);
    assert.equal(agent.cni(agent.env('DEL', 'c-s1', '', pod), agent.netconf()).code, 0, 'second DEL with empty netns');
    const p2 = agent.podNetns('s2');
    assert.equal(ipOf(agent.cni(agent.env('ADD', 'c-s2', p2, pod), agent.netconf())), first);

    await agent.stop();
    await agent.start();
    assert.equal(agent.cni(agent.env('DEL', 'c-s2', p2, pod), agent.netconf()).code, 0);
    const p3 = agent.podNetns('s3');
    assert.equal(ipOf(agent.cni(agent.env('ADD', 'c-s3', p3, pod), agent.netconf())), first);

    // "reboot": every device of ours gone while the agent is down
    await agent.stop('SIGKILL');
    for (const l of JSON.parse(sh('ip', ['-n', agent.netns, '-j', 'link'])) as { ifname: string }[]) {
      if (l.ifname !== 'lo') sh('ip', ['-n', agent.netns, 'link', 'del', l.ifname]);
    }
    await agent.start();
    const p4 = agent.podNetns('s4');
    const again = agent.cni(agent.env('ADD', 'c-s4', p4, pod), agent.netconf());
    assert.equal(ipOf(again), first, agent.dump());
    assert.equal(agent.execIn(p4, 'ping', ['-c1', '-W2', '10.77.0.1']).code, 0, agent.dump());
  });

  test('an ADD the kernel refuses leaves nothing behind and says which step failed, on either side of the veth', async () => {
    const files = () => readdirSync(join(agent.dataDir, 'atoll')).sort();
    const hostLinks = () => sh('ip', ['-n', agent.netns, '-br', 'link']);
    const cases = [
      // host side: the veth's pod end cannot be created, its name is taken in the pod namespace
      { name: 'k1', prepare: (ns: string) => sh('ip', ['-n', ns, 'link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'eth9']), want: /creating veth atl[0-9a-f]{12} \(peer eth0 in .*\) .*failed: EEXIST/ },
      // pod side: the default route exists already
      { name: 'k2', prepare: (ns: string) => sh('ip', ['-n', ns, 'route', 'add', 'default', 'dev', 'lo']), want: /adding default route via 10\.77\.0\.1 dev eth0 in network namespace .* failed: EEXIST/ },
    ];
    for (const c of cases) {
      const nsPath = agent.podNetns(c.name);
      const ns = nsPath.split('/').pop() as string;
      c.prepare(ns);
      const podBefore = sh('ip', ['-n', ns, '-br', 'link']);
      const [filesBefore, linksBefore] = [files(), hostLinks()];
      const res = agent.cni(agent.env('ADD', `c-${c.name}`, nsPath, { namespace: 'kernel', name: c.name }), agent.netconf());
      assert.equal(res.code, 1, res.stdout);
      assert.match(String(res.json?.msg), c.want);
      assert.deepEqual(files(), filesBefore, `${c.name}: no IPAM record left`);
      assert.equal(hostLinks(), linksBefore, `${c.name}: no host link left`);
      assert.equal(sh('ip', ['-n', ns, '-br', 'link']), podBefore, `${c.name}: nothing left in the pod namespace`);
    }
  });

  test('a failed ADD (pool exhausted) leaves nothing behind; STATUS says 50', async () => {
    const files = () => readdirSync(join(agent.dataDir, 'atoll')).sort();
    const links = () => sh('ip', ['-n', agent.netns, '-br', 'link']);
    // fill the /28 (13 addresses) with live pods
    let n = 0;
    for (;;) {
      const res = agent.cni(agent.env('ADD', `fill${n}`, agent.podNetns(`f${n}`), { namespace: 'fill', name: `p${n}` }), agent.netconf('1.1.0'));
      if (res.code !== 0) {
        assert.match(String(res.json?.msg), /allocated|free/);
        break;
      }
      n++;
      assert.ok(n < 20, 'pool never ran out');
    }
    const beforeFiles = files();
    const beforeLinks = links();
    const res = agent.cni(agent.env('ADD', 'extra', agent.podNetns('x'), { namespace: 'fill', name: 'extra' }), agent.netconf('1.1.0'));
    assert.equal(res.code, 1);
    assert.deepEqual(files(), beforeFiles);
    assert.equal(links(), beforeLinks);
    const status = agent.cni({ CNI_COMMAND: 'STATUS' }, agent.netconf('1.1.0'));
    assert.equal(status.json?.code, 50);
  });

  test('GC releases every attachment not listed and removes its veth', async () => {
    const before = readdirSync(join(agent.dataDir, 'atoll')).length;
    const gc = agent.cni({ CNI_COMMAND: 'GC', CNI_PATH: '/usr/lib/cni' }, agent.netconf('1.1.0', { 'cni.dev/valid-attachments': [{ containerID: 'fill0', ifname: 'eth0' }] }));
    assert.equal(gc.code, 0, gc.stdout);
    const vethsLeft = (JSON.parse(sh('ip', ['-n', agent.netns, '-j', 'link'])) as { ifname: string }[]).filter((l) => l.ifname.startsWith('atl') && l.ifname.length === 15);
    assert.equal(vethsLeft.length, 1);
    assert.equal(readdirSync(join(agent.dataDir, 'atoll')).length, before, 'sticky records stay as reservations');
    assert.equal(agent.cni({ CNI_COMMAND: 'STATUS' }, agent.netconf('1.1.0')).code, 0);
  });
});

describe('concurrent ADDs', { skip }, () => {
  test('30 ADDs at once get 30 distinct IPs', async () => {
    const agent = new TestAgent({ name: 'cc', podCidrs: ['10.78.0.0/24'] });
    try {
      await agent.start();
      const { spawn } = await import('node:child_process');
      const run = (i: number) => new Promise<string>((resolve) => {
        const ns = agent.podNetns(`c${i}`);
        const p = spawn(join(agent.binDir, 'atoll-cni'), [], { env: agent.env('ADD', `cc${i}`, ns, { namespace: 'cc', name: `p${i}` }) });
        let out = '';
        p.stdout.on('data', (d) => (out += d));
        p.on('close', () => resolve(out));
        p.stdin.end(agent.netconf());
      });
      const outs = await Promise.all(Array.from({ length: 30 }, (_, i) => run(i)));
      const ips = outs.map((o) => (JSON.parse(o).ips[0].address as string));
      assert.equal(new Set(ips).size, 30);
      // Kernel waits run on libuv's pool, which src/adapters/kernel/netlink.ts sizes to 32 before it starts (a burst of DELs
      // would otherwise delete 4 veths at a time): a bundling change that loaded it too late would show here. (This
      // file must not import that module: its setting would reach the agent through the environment.)
      if (process.env.UV_THREADPOOL_SIZE === undefined) { // else the operator's setting wins, as it should
        const threads = Number(/^Threads:\s+(\d+)$/m.exec(readFileSync(`/proc/${agent.pid}/status`, 'utf8'))?.[1]);
        assert.ok(threads > 32, `the agent runs ${threads} threads, fewer than its thread pool should have`);
      }
      // bin/atoll runs an agent without V8's compilers, unless told otherwise (docs/architecture.md, "Memory")
      if (process.env.ATOLL_AGENT_NODE_FLAGS === undefined) {
        const argv = readFileSync(`/proc/${agent.pid}/cmdline`, 'utf8').split('\0');
        assert.ok(argv.includes('--jitless'), `the agent runs as ${argv.join(' ')}`);
      }
    } finally {
      await agent.cleanup();
    }
  });
});
