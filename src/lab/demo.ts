/**
 * `atoll demo`: the single-node demo. A throwaway node namespace, a private containerd in it, an Atoll agent as
 * that node's CNI, two pods created through CRI, their IPs, a ping between them, and everything removed again.
 */
import { existsSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startContainerd, type Containerd } from './io/containerd/containerd.ts';
import { IpRoute2 } from '../adapters/kernel/iproute2.ts';
import { NETNS_DIR } from './io/processes.ts';
import { AgentProcess } from './agent-process.ts';

const REQUIRED = [
  ['/usr/bin/containerd', 'containerd (apt-get install containerd)'],
  ['/usr/sbin/runc', 'runc (apt-get install runc)'],
  ['/usr/lib/cni/loopback', 'the loopback CNI plugin (apt-get install containernetworking-plugins)'],
  ['/bin/busybox', 'busybox-static, for the pause image (apt-get install busybox-static)'],
] as const;

function say(line: string): void {
  process.stdout.write(`${line}\n`);
}

/** Why the demo cannot run here, or undefined. */
export function demoPrerequisites(): string | undefined {
  if (process.getuid?.() !== 0) return 'atoll demo must run as root: it creates network namespaces and runs containerd';
  const missing = REQUIRED.filter(([path]) => !existsSync(path)).map(([, what]) => what);
  if (missing.length > 0) return `atoll demo needs ${missing.join(', ')}; run the set-up (make setup)`;
  return undefined;
}

export async function runDemo(): Promise<number> {
  const why = demoPrerequisites();
  if (why) {
    process.stderr.write(`${why}\n`);
    return 1;
  }
  const id = randomBytes(3).toString('hex');
  const netns = `atoll-demo-${id}`;
  const dir = mkdtempSync(join(tmpdir(), `atoll-demo-${id}-`));
  const binDir = join(dir, 'cni-bin');
  const confDir = join(dir, 'cni-conf');
  const socketPath = join(dir, 'agent.sock');
  const configPath = join(dir, 'agent.json');
  const ip = new IpRoute2();
  let ctd: Containerd | undefined;
  const agent = new AgentProcess({ configPath, socketPath, logPath: join(dir, 'agent.log') });
  const cleanup = async () => {
    // containerd first: removing its sandboxes calls DEL, which needs the agent
    await ctd?.stop().catch((e: Error) => say(`  (containerd stop: ${e.message})`));
    await agent.stop().catch(() => undefined);
    await ip.batch([`netns del ${netns}`]).catch(() => undefined); // already gone
    rmSync(dir, { recursive: true, force: true });
  };
  const onSignal = () => {
    say('\ninterrupted: cleaning up');
    void cleanup().then(() => process.exit(130));
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  try {
    say(`atoll demo: one node (network namespace ${netns}), a private containerd, the Atoll agent as its CNI`);
    await ip.batch([`netns add ${netns}`]);
    await ip.batch(['link set lo up'], { netns: join(NETNS_DIR, netns) });
    mkdirSync(binDir);
    symlinkSync('/usr/lib/cni/loopback', join(binDir, 'loopback'));
    writeFileSync(configPath, JSON.stringify({
      nodeName: 'demo-node', podCidrs: ['10.88.0.0/24'], cniBinDir: binDir, cniConfDir: confDir,
      dataDir: join(dir, 'data'), socketPath, bridge: 'atoll0',
    }, null, 2));
    ctd = await startContainerd({ workDir: join(dir, 'containerd'), netns, cniBinDir: binDir, cniConfDir: confDir });
    say(`  containerd ${(await ctd.cri.version()).runtimeVersion} is up (pid ${ctd.pid})`);
    await agent.start(['nsenter', `--mount=/proc/${ctd.pid}/ns/mnt`, `--net=/var/run/netns/${netns}`, '--']);
    say(`  atoll agent is up (pid ${agent.pid}); it installed atoll-cni and ${confDir}/10-atoll.conflist`);
    const pods = [];
    for (const name of ['web', 'db']) {
      const started = performance.now();
      const sandbox = await ctd.cri.runPodSandbox({ name, namespace: 'demo', uid: randomBytes(8).toString('hex') });
      const status = await ctd.cri.podSandboxStatus(sandbox);
      pods.push({ name, sandbox, ...status });
      say(`  pod demo/${name}: IP ${status.ip}  (RunPodSandbox ${Math.round(performance.now() - started)} ms)`);
    }
    const [a, b] = pods as [(typeof pods)[0], (typeof pods)[0]];
    const ping = await ctd.execInNetns(a.netnsPath as string, ['ping', '-c', '3', '-i', '0.2', '-W', '2', b.ip]);
    say(`  ping from demo/${a.name} (${a.ip}) to demo/${b.name} (${b.ip}):`);
    for (const line of ping.stdout.trim().split('\n').slice(-2)) say(`    ${line}`);
    await ctd.cri.stopPodSandbox(a.sandbox);
    await ctd.cri.removePodSandbox(a.sandbox);
    const again = await ctd.cri.runPodSandbox({ name: a.name, namespace: 'demo', uid: randomBytes(8).toString('hex') });
    const againIp = (await ctd.cri.podSandboxStatus(again)).ip;
    say(`  pod demo/${a.name} deleted and re-created: IP ${againIp} (${againIp === a.ip ? 'the same, sticky' : `CHANGED from ${a.ip}`})`);
    say('  cleaning up');
    return againIp === a.ip ? 0 : 1;
  } catch (err) {
    process.stderr.write(`atoll demo failed: ${(err as Error).message}\n--- agent log (tail)\n${agent.logTail(20)}\n`);
    return 1;
  } finally {
    await cleanup();
    process.removeListener('SIGINT', onSignal);
    process.removeListener('SIGTERM', onSignal);
    say('  done: namespace, containerd, agent and files removed');
  }
}
