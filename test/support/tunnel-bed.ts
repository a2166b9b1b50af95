/**
 * The root tests' two-node tunnel bed: two node namespaces joined by a veth underlay (198.51.100.<n>/24), each with a
 * pod behind a veth and a tunnel process (test/support/tunnel-node.ts) with its own pinned key; the tunnel data path
 * and datagram path tests build on it.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { generateKeyPairSync } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { PROJECT_NODE } from '../../src/lab/agent-process.ts';
import { selfSignedTunnelCert, spkiPin } from '../../src/adapters/pki.ts';
import { addNetns, delNetns, sh } from '../../harness/netns.ts';
import type { TunnelNodeSpec } from './tunnel-node.ts';

const SCRIPT = join(import.meta.dirname, 'tunnel-node.ts');

/** One node of the bed: its namespaces, addresses, key files and tunnel process. */
export interface TunnelSide {
  readonly id: string;
  readonly node: string;
  readonly pod: string;
  readonly underlay: string;
  readonly block: string;
  readonly gw: string;
  readonly podIp: string;
  readonly keyFile: string;
  readonly certFile: string;
  readonly pin: string;
  readonly statsFile: string;
  proc?: ChildProcess;
  log: string;
}

/** Side `id`, number `n`: its namespaces (created), a fresh Ed25519 key and certificate in `dir`, pods in `<podNet>.<n>.0/24`. */
export function makeTunnelSide(dir: string, id: string, n: number, podNet: string): TunnelSide {
  const keyPem = generateKeyPairSync('ed25519').privateKey.export({ type: 'pkcs8', format: 'pem' }) as string;
  const certPem = selfSignedTunnelCert(keyPem, `node-${id}`);
  const keyFile = join(dir, `${id}.key`);
  const certFile = join(dir, `${id}.crt`);
  writeFileSync(keyFile, keyPem, { mode: 0o600 });
  writeFileSync(certFile, certPem);
  return {
    id, node: addNetns(`tn${id}`), pod: addNetns(`tp${id}`), underlay: `198.51.100.${n}`, block: `${podNet}.${n}.0/24`, gw: `${podNet}.${n}.1`,
    podIp: `${podNet}.${n}.2`, keyFile, certFile, pin: spkiPin(certPem), statsFile: join(dir, `${id}.stats.json`), log: '',
  };
}

/** The underlay veth between the two nodes, and on each a pod behind a veth (MTU `podMtu` when given) routed to its node. */
export function wireTunnelBed(a: TunnelSide, b: TunnelSide, podMtu?: number): void {
  sh('ip', ['-n', a.node, 'link', 'add', 'ul0', 'type', 'veth', 'peer', 'name', 'ul0', 'netns', b.node]);
  const mtu = podMtu === undefined ? [] : ['mtu', String(podMtu)];
  for (const s of [a, b]) {
    sh('ip', ['-n', s.node, 'addr', 'add', `${s.underlay}/24`, 'dev', 'ul0']);
    sh('ip', ['-n', s.node, 'link', 'set', 'ul0', 'up']);
    sh('ip', ['netns', 'exec', s.node, 'sysctl', '-qw', 'net.ipv4.ip_forward=1']);
    sh('ip', ['-n', s.node, 'link', 'add', 'pod0', ...mtu, 'type', 'veth', 'peer', 'name', 'eth0', ...mtu, 'netns', s.pod]);
    sh('ip', ['-n', s.node, 'addr', 'add', `${s.gw}/24`, 'dev', 'pod0']);
    sh('ip', ['-n', s.node, 'link', 'set', 'pod0', 'up']);
    sh('ip', ['-n', s.pod, 'addr', 'add', `${s.podIp}/24`, 'dev', 'eth0']);
    sh('ip', ['-n', s.pod, 'link', 'set', 'eth0', 'up']);
    sh('ip', ['-n', s.pod, 'route', 'add', 'default', 'via', s.gw]);
  }
}

/** The part of a tunnel node's spec every test gives: its device, key, counters file and its one peer. */
export function tunnelSpecOf(self: TunnelSide, peer: TunnelSide, tun: string): Pick<TunnelNodeSpec, 'tun' | 'keyFile' | 'certFile' | 'statsFile' | 'peer'> {
  return { tun, keyFile: self.keyFile, certFile: self.certFile, statsFile: self.statsFile, peer: { id: peer.id, pin: peer.pin, blocks: [peer.block] } };
}

/** Starts `self`'s tunnel process in its node namespace with `spec`, its output kept in `self.log`. */
export function startTunnelNode(self: TunnelSide, spec: TunnelNodeSpec): void {
  const proc = spawn('ip', ['netns', 'exec', self.node, PROJECT_NODE, '--no-warnings', SCRIPT, JSON.stringify(spec)], { stdio: ['ignore', 'pipe', 'pipe'] });
  proc.stdout?.on('data', (d) => (self.log += d));
  proc.stderr?.on('data', (d) => (self.log += d));
  self.proc = proc;
}

/** The counters `side`'s tunnel process last wrote, or undefined before the first. */
export function tunnelStats<T>(side: TunnelSide): T | undefined {
  try {
    return JSON.parse(readFileSync(side.statsFile, 'utf8')) as T;
  } catch {
    return undefined;
  }
}

/** Kills the sides' tunnel processes (by PID) and deletes their namespaces. */
export function removeTunnelBed(sides: readonly TunnelSide[]): void {
  for (const s of sides) if (s.proc?.pid !== undefined && s.proc.exitCode === null) s.proc.kill('SIGKILL');
  for (const s of sides) {
    delNetns(s.pod);
    delNetns(s.node);
  }
}
