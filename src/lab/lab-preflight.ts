/**
 * What `atoll lab` needs before it creates anything: root, the tools it runs, the CNI shim the set-up builds, and
 * the kernel features of its topology, each tried for real in a throwaway namespace (a feature listed in a kernel
 * config can still be missing in a container or a trimmed kernel; trying is the only sure test). Refuses with
 * LAB_PREREQUISITE_MISSING naming every missing piece.
 */
import { accessSync, constants, existsSync } from 'node:fs';
import { join } from 'node:path';
import { atollError, asAtollError } from '../core/errors.ts';
import type { LabDelayBy } from './plan/plan.ts';
import { natRuleset } from './plan/setup.ts';
import type { LabSpec } from './plan/spec.ts';
import { IpRoute2 } from '../adapters/kernel/iproute2.ts';
import { Nft } from '../adapters/kernel/nft.ts';
import { NETNS_DIR } from './io/processes.ts';
import { Tc } from './io/tc.ts';
import { DELAY_BIN, REPO_ROOT } from './agent-process.ts';

const TOOLS = [
  ['ip', 'iproute2'],
  ['nft', 'nftables'],
  ['tc', 'iproute2'],
  ['ping', 'iputils-ping'],
] as const;

const SEARCH = ['/usr/local/sbin', '/usr/local/bin', '/usr/sbin', '/usr/bin', '/sbin', '/bin'];

function onPath(tool: string): boolean {
  const dirs = [...(process.env.PATH ?? '').split(':').filter(Boolean), ...SEARCH];
  return dirs.some((d) => {
    try {
      accessSync(join(d, tool), constants.X_OK);
      return true;
    } catch {
      return false;
    }
  });
}

/** The kernel's complaint inside an adapter's error message: `tc -batch failed in X: Error: ... (batch: ...)`. */
function kernelSaid(message: string): string {
  const text = message.replace(/^.*? failed(?: in \S+)?: /, '').split(' (batch:')[0] ?? '';
  return `"${text.split('\n').filter((l) => !/^Command failed/.test(l)).join(' ').trim()}"`;
}

interface Feature {
  readonly name: string;
  readonly config: string;
  readonly why: string;
  readonly fix?: string;
  readonly tryIt: (netnsPath: string) => Promise<void>;
}

/** @throws AtollError LAB_PREREQUISITE_MISSING when not root. */
export function requireRoot(): void {
  if (process.getuid?.() !== 0) {
    throw atollError('LAB_PREREQUISITE_MISSING', 'atoll lab must run as root: it creates network namespaces, links, nftables rules and qdiscs',
      'run it as root (sudo bin/atoll lab ...)');
  }
}

/**
 * Checks everything; returns the names of the kernel features it tried, for the terminal.
 * @param probeNetns a namespace name of the run (created and deleted here) to try kernel features in.
 * @throws AtollError LAB_PREREQUISITE_MISSING naming each missing piece and its fix.
 */
export async function labPreflight(spec: LabSpec, probeNetns: string): Promise<string[]> {
  requireRoot();
  const missingTools = TOOLS.filter(([tool]) => !onPath(tool));
  if (missingTools.length > 0) {
    throw atollError('LAB_PREREQUISITE_MISSING', `atoll lab needs ${missingTools.map(([t, pkg]) => `\`${t}\` (package ${pkg})`).join(', ')}, not found on PATH`,
      `install ${[...new Set(missingTools.map(([, pkg]) => pkg))].join(' ')}`);
  }
  const shim = join(REPO_ROOT, 'bin', 'atoll-cni');
  if (!existsSync(shim)) throw atollError('LAB_PREREQUISITE_MISSING', `the CNI shim ${shim} is missing`, 'run the set-up (make setup), which builds it');

  const ip = new IpRoute2();
  const nft = new Nft();
  const tc = new Tc();
  const features: Feature[] = [
    { name: 'veth', config: 'CONFIG_VETH', why: 'the links of the topology', tryIt: (ns) => ip.batch(['link add lpv0 type veth peer name lpv1'], { netns: ns }) },
    { name: 'bridge', config: 'CONFIG_BRIDGE', why: 'site LANs and the pod bridges', tryIt: (ns) => ip.batch(['link add lpbr0 type bridge'], { netns: ns }) },
    { name: 'vxlan', config: 'CONFIG_VXLAN', why: 'the same-site overlay', tryIt: (ns) => ip.batch(['link add lpvx0 type vxlan id 42 dstport 8472 nolearning'], { netns: ns }) },
  ];
  const symmetric = spec.edges.some((e) => e.nat === 'symmetric');
  if (spec.edges.length > 0) {
    features.push({
      name: `nf_tables NAT${symmetric ? ' (masquerade fully-random)' : ''}`, config: 'CONFIG_NF_TABLES, CONFIG_NFT_NAT, CONFIG_NFT_MASQ, CONFIG_NFT_CT', why: 'the NAT routers of edge sites',
      tryIt: (ns) => nft.apply(natRuleset({ site: 'probe', type: symmetric ? 'symmetric' : 'endpoint-independent', lan: '172.16.0.0/24', uplink: 'lpv0', lanDev: 'lpbr0' }), { netns: ns }),
    });
  }
  if (spec.edges.some((e) => e.uplink.rateMbit !== undefined)) {
    features.push({ name: 'tbf qdisc', config: 'CONFIG_NET_SCH_TBF', why: '--rate on edge uplinks', fix: 'drop --rate', tryIt: (ns) => tc.batch(['qdisc replace dev lpv0 root tbf rate 100mbit burst 32768 latency 50ms'], { netns: ns }) });
  }

  try {
    await ip.batch([`netns add ${probeNetns}`]);
  } catch (cause) {
    throw atollError('LAB_PREREQUISITE_MISSING', `cannot create a network namespace (${asAtollError(cause).message})`,
      'run on a kernel with CONFIG_NET_NS and a writable /var/run/netns', cause);
  }
  const missing: Feature[] = [];
  const reasons: string[] = [];
  try {
    for (const f of features) {
      try {
        await f.tryIt(join(NETNS_DIR, probeNetns));
      } catch (cause) {
        missing.push(f);
        reasons.push(`${f.name} (${f.config}), needed for ${f.why}: ${kernelSaid(asAtollError(cause).message)}`);
      }
    }
  } finally {
    await ip.batch([`netns del ${probeNetns}`]).catch(() => undefined);
  }
  if (missing.length > 0) {
    const fixes = missing.map((f) => f.fix).filter(Boolean);
    throw atollError('LAB_PREREQUISITE_MISSING', `this kernel lacks what the lab needs: ${reasons.join('; ')}`,
      `${fixes.length === missing.length ? `${fixes.join(' and ')}, or ` : ''}run on a kernel with ${missing.map((f) => f.config).join(', ')}`);
  }
  return features.map((f) => f.name);
}

/**
 * How the lab can delay edge uplinks here: tc netem when the kernel has it (tried in `probeNetns`, created and
 * deleted here), else the lab's own delay line (TAP devices and `bin/atoll-delay`, native/atoll-delay.c).
 * @throws AtollError LAB_PREREQUISITE_MISSING when neither is there.
 */
export async function uplinkDelayMethod(probeNetns: string): Promise<LabDelayBy> {
  requireRoot();
  const ip = new IpRoute2();
  const ns = join(NETNS_DIR, probeNetns);
  await ip.batch([`netns add ${probeNetns}`]);
  try {
    await ip.batch(['link add lpv0 type veth peer name lpv1'], { netns: ns });
    try {
      await new Tc().batch(['qdisc replace dev lpv1 root netem delay 1ms'], { netns: ns });
      return 'netem';
    } catch {
      // no netem: the delay line needs its program and TAP devices
    }
    if (!existsSync(DELAY_BIN)) {
      throw atollError('LAB_PREREQUISITE_MISSING', `this kernel has no netem (CONFIG_NET_SCH_NETEM) and the lab's delay line ${DELAY_BIN} is missing`,
        'run the set-up (make setup), which builds it, or drop --delay');
    }
    try {
      await ip.batch(['tuntap add dev lptap0 mode tap vnet_hdr'], { netns: ns });
    } catch (cause) {
      throw atollError('LAB_PREREQUISITE_MISSING', `this kernel has no netem (CONFIG_NET_SCH_NETEM) nor TAP devices (CONFIG_TUN) for the lab's delay line: ${kernelSaid(asAtollError(cause).message)}`,
        'drop --delay, or run on a kernel with either', cause);
    }
    return 'delay-line';
  } finally {
    await ip.batch([`netns del ${probeNetns}`]).catch(() => undefined);
  }
}
