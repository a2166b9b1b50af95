/**
 * Atoll first in a conflist, followed by the reference portmap, tuning and bandwidth plugins, driven the way libcni drives a
 * chain: each plugin gets the previous result as prevResult; DEL runs in reverse order.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { TestAgent } from '../../harness/agent.ts';
import { rootSkipReason, sh } from '../../harness/netns.ts';

const REF = '/usr/lib/cni';
const skip = rootSkipReason() || (existsSync(`${REF}/portmap`) ? false : 'needs containernetworking-plugins (portmap, bandwidth)');

interface Plugin {
  readonly conf: Record<string, unknown>;
  readonly bin: string;
}

describe('chaining with portmap, tuning and bandwidth', { skip }, () => {
  let agent: TestAgent;
  let chain: Plugin[];
  before(async () => {
    agent = new TestAgent({ name: 'ch', podCidrs: ['10.81.0.0/24'] });
    await agent.start();
    chain = [
      { bin: `${agent.binDir}/atoll-cni`, conf: { type: 'atoll-cni', agentSocket: agent.socket } },
      { bin: `${REF}/portmap`, conf: { type: 'portmap', capabilities: { portMappings: true }, runtimeConfig: { portMappings: [{ hostPort: 18080, containerPort: 80, protocol: 'tcp' }] } } },
      { bin: `${REF}/tuning`, conf: { type: 'tuning', sysctl: { 'net.ipv4.conf.eth0.accept_redirects': '0' } } },
      { bin: `${REF}/bandwidth`, conf: { type: 'bandwidth', capabilities: { bandwidth: true }, runtimeConfig: { bandwidth: { ingressRate: 100_000_000, ingressBurst: 1_000_000, egressRate: 100_000_000, egressBurst: 1_000_000 } } } },
    ];
  });
  after(async () => {
    await agent.cleanup();
  });

  /** Runs one plugin in the node namespace (as the runtime on that node would). */
  function invoke(p: Plugin, verb: string, netns: string, prevResult?: unknown, allowed?: RegExp) {
    const conf = { cniVersion: '1.0.0', name: 'atoll', ...p.conf, ...(prevResult ? { prevResult } : {}) };
    const env = { ...agent.env(verb, 'chain1', netns, { namespace: 'default', name: 'web' }), PATH: process.env.PATH ?? '' };
    const res = spawnSync('nsenter', [`--net=/var/run/netns/${agent.netns}`, p.bin], { env, input: JSON.stringify(conf), encoding: 'utf8', timeout: 30_000 });
    if (res.status !== 0 && allowed?.test(res.stdout)) return undefined;
    assert.equal(res.status, 0, `${verb} ${p.conf.type}: ${res.stdout} ${res.stderr}\n${agent.dump()}`);
    return res.stdout.trim() ? JSON.parse(res.stdout) : undefined;
  }

  test('ADD, CHECK and DEL through the whole chain', () => {
    const pod = agent.podNetns('web');
    let result: unknown;
    for (const p of chain) result = invoke(p, 'ADD', pod, result) ?? result;
    const ips = (result as { ips: { address: string }[] }).ips;
    assert.match(ips[0]?.address ?? '', /^10\.81\.0\.\d+\/24$/);
    const host = (result as { interfaces: { name: string; sandbox?: string }[] }).interfaces.find((i) => !i.sandbox)?.name as string;
    assert.match(sh('ip', ['netns', 'exec', agent.netns, 'tc', 'qdisc', 'show', 'dev', host]), /tbf/, 'bandwidth shaped the host veth');
    assert.match(sh('ip', ['netns', 'exec', agent.netns, 'iptables-save', '-t', 'nat']), /18080/, 'portmap installed its DNAT');
    assert.equal(agent.execIn(pod, 'cat', ['/proc/sys/net/ipv4/conf/eth0/accept_redirects']).out.trim(), '0', 'tuning set its sysctl');
    // Debian's portmap (plugins 1.1.1) fails CHECK on IPv4-only results looking for an IPv6 chain it never made
    // (containernetworking/plugins#819, fixed upstream later); any other failure still fails this test.
    for (const p of chain) invoke(p, 'CHECK', pod, result, p.conf.type === 'portmap' ? /could not check ipv6 dnat/ : undefined);
    for (const p of [...chain].reverse()) invoke(p, 'DEL', pod, result);
    assert.doesNotMatch(sh('ip', ['netns', 'exec', agent.netns, 'iptables-save', '-t', 'nat']), /18080/, 'portmap removed its DNAT');
    assert.equal(sh('ip', ['-n', agent.netns, '-br', 'link']).includes(host), false);
  });
});
