/**
 * `kill -9` of the agent in the middle of 50 concurrent ADDs, then a restart: no address is held by two pods, and
 * after the runtime's DELs of the failed ADDs and a GC, no allocation is left without a pod.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { TestAgent } from '../../harness/agent.ts';
import { rootSkipReason } from '../../harness/netns.ts';

const N = 50;

function add(agent: TestAgent, i: number, ns: string): Promise<{ code: number; out: string }> {
  return new Promise((resolve) => {
    const p = spawn(join(agent.binDir, 'atoll-cni'), [], { env: agent.env('ADD', `k${i}`, ns, { namespace: 'crash', name: `p${i}` }) });
    let out = '';
    p.stdout.on('data', (d) => (out += d));
    p.on('close', (code) => resolve({ code: code ?? -1, out }));
    p.stdin.end(agent.netconf());
  });
}

/** The IPv4 address of eth0 in each pod namespace that has one. */
function podAddresses(agent: TestAgent, namespaces: readonly string[]): Map<string, string> {
  const out = new Map<string, string>();
  for (const ns of namespaces) {
    const res = agent.execIn(ns, 'ip', ['-j', '-4', 'addr', 'show', 'dev', 'eth0']);
    if (res.code !== 0) continue;
    const ip = (JSON.parse(res.out)[0]?.addr_info?.[0]?.local as string | undefined);
    if (ip) out.set(ns, ip);
  }
  return out;
}

describe('agent killed during concurrent ADDs', { skip: rootSkipReason() }, () => {
  test('no address held twice; nothing leaked after DEL and GC', async () => {
    const agent = new TestAgent({ name: 'kx', podCidrs: ['10.82.0.0/24'] });
    try {
      await agent.start();
      const namespaces = Array.from({ length: N }, (_, i) => agent.podNetns(`k${i}`));
      const pending = namespaces.map((ns, i) => add(agent, i, ns));
      // kill as soon as a few ADDs have completed, so others are mid-flight
      const dataDir = join(agent.dataDir, 'atoll');
      const deadline = Date.now() + 10_000;
      while (readdirSync(dataDir).length < 8 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 2));
      await agent.stop('SIGKILL');
      const results = await Promise.all(pending);
      const ok = results.map((r, i) => (r.code === 0 ? i : -1)).filter((i) => i >= 0);
      const failed = results.map((r, i) => (r.code !== 0 ? i : -1)).filter((i) => i >= 0);
      assert.ok(failed.length > 0, 'the kill landed after every ADD finished; the test proved nothing');
      for (const i of failed) assert.equal(JSON.parse(results[i]?.out ?? '{}').code, 11, 'a cut-off ADD answers "try again later"');

      await agent.start();
      const held = podAddresses(agent, namespaces);
      const ips = [...held.values()];
      assert.equal(new Set(ips).size, ips.length, `an address is configured in two pods: ${ips.sort().join(' ')}`);
      for (const i of ok) {
        const want = JSON.parse(results[i]?.out ?? '{}').ips[0].address.split('/')[0];
        assert.equal(held.get(namespaces[i] as string), want, `pod ${i} lost its address`);
      }

      // the runtime follows each failed ADD with a DEL, then garbage-collects
      for (const i of failed) assert.equal(agent.cni(agent.env('DEL', `k${i}`, namespaces[i] as string, { namespace: 'crash', name: `p${i}` }), agent.netconf()).code, 0);
      const valid = ok.map((i) => ({ containerID: `k${i}`, ifname: 'eth0' }));
      assert.equal(agent.cni({ CNI_COMMAND: 'GC', CNI_PATH: '/usr/lib/cni' }, agent.netconf('1.1.0', { 'cni.dev/valid-attachments': valid })).code, 0);

      const active = readdirSync(dataDir).map((f) => ({ f, lines: readFileSync(join(dataDir, f), 'utf8').trim().split('\n') })).filter((r) => r.lines.length === 2);
      assert.deepEqual(active.map((r) => r.lines[0]).sort(), ok.map((i) => `k${i}`).sort(), 'active allocations are exactly the pods that exist');
      const recIps = readdirSync(dataDir).map((f) => f.split('_')[0]);
      assert.equal(new Set(recIps).size, recIps.length, 'one record per address');
      // every failed pod can now be added again and gets a working, unique address
      const retried = await Promise.all(failed.map((i) => add(agent, i, namespaces[i] as string)));
      for (const r of retried) assert.equal(r.code, 0, r.out);
      const all = [...podAddresses(agent, namespaces).values()];
      assert.equal(all.length, N);
      assert.equal(new Set(all).size, N);
    } catch (err) {
      console.error(agent.dump());
      throw err;
    } finally {
      await agent.cleanup();
    }
  });
});
