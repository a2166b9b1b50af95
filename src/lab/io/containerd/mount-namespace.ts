/**
 * The private mount namespace a containerd of the test bed (containerd.ts beside it) runs in, made by a holder
 * process (`sleep`, slave of the host's mounts) before containerd starts in it: `/sys` remounted from inside the test
 * netns with the host's cgroup tree moved back on top, private tmpfs on `/run/containerd` and `/var/lib/cni`, and the
 * node's own directories bind-mounted over machine paths (shared mounts). Every mount made there stays there and
 * goes with its last process; what is mounted below workDir in the host's namespace is unmounted at teardown.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdir, readFile, readlink } from 'node:fs/promises';
import { atollError } from '../../../core/errors.ts';
import { run, terminate, waitFor } from './commands.ts';
import type { Paths } from './config.ts';
import type { ContainerdInit } from './containerd.ts';

/** containerd 1.6 creates shim sockets here whatever its config says; the harness hides it behind a tmpfs. */
const SHIM_SOCKET_ROOT = '/run/containerd';

/** libcni's default result cache, which containerd 1.6 uses; private (a tmpfs) to each instance. */
const CNI_CACHE_DIR = '/var/lib/cni';

/**
 * Starts the holder: a `sleep` in a new mount namespace (slave propagation) and in the test netns. Resolves once it
 * has exec'd `sleep`, i.e. after `unshare` set the propagation, so no later mount can leak into the host.
 */
export async function startHolder(netnsPath: string): Promise<ChildProcess> {
  const holder = spawn('nsenter', [`--net=${netnsPath}`, '--', 'unshare', '--mount', '--propagation', 'slave', '--', 'sleep', 'infinity'], {
    stdio: 'ignore',
  });
  holder.unref();
  const isSleeping = async (): Promise<boolean> => {
    if (holder.exitCode !== null) throw atollError('LAB_STEP_FAILED', `mount-namespace holder exited with status ${holder.exitCode}; is util-linux installed?`);
    const exe = await readlink(`/proc/${holder.pid}/exe`).catch(() => '');
    return exe.endsWith('/sleep');
  };
  try {
    await waitFor(isSleeping, 5_000, 'the mount-namespace holder (nsenter/unshare/sleep) to start');
  } catch (err) {
    await terminate(holder, 'mount-namespace holder', 1_000).catch(() => undefined);
    throw err;
  }
  return holder;
}

/** True if `path` is a mount point in the caller's mount namespace. */
async function isMountPoint(path: string): Promise<boolean> {
  return (await readMounts()).includes(path);
}

/**
 * Prepares the holder's mount namespace: netns-correct /sys with the host's cgroup tree back on top, and a private
 * tmpfs on /run/containerd for shim sockets. All mounts happen inside the holder's namespace only.
 */
export async function prepareMountNamespace(holderPid: number, p: Paths, hostDirs: ContainerdInit['hostDirs'] = []): Promise<void> {
  const inNs = (args: string[], what: string) => run('nsenter', ['-t', String(holderPid), '-m', ...args], what);
  const keepCgroups = await isMountPoint('/sys/fs/cgroup');
  if (keepCgroups) {
    await mkdir(p.cgroupKeep, { recursive: true });
    await inNs(['--', 'mount', '--rbind', '/sys/fs/cgroup', p.cgroupKeep], 'keeping the cgroup tree');
  }
  await inNs(['--', 'umount', '-l', '/sys'], 'detaching the host /sys');
  await inNs(['-n', '--', 'mount', '-t', 'sysfs', 'sysfs', '/sys'], 'mounting sysfs of the test netns');
  if (keepCgroups) await inNs(['--', 'mount', '--move', p.cgroupKeep, '/sys/fs/cgroup'], 'restoring the cgroup tree');
  await mkdir(SHIM_SOCKET_ROOT, { recursive: true, mode: 0o711 });
  await inNs(['--', 'mount', '-t', 'tmpfs', '-o', 'mode=0711', 'tmpfs', SHIM_SOCKET_ROOT], 'mounting a private /run/containerd');
  await mkdir(CNI_CACHE_DIR, { recursive: true, mode: 0o700 });
  await inNs(['--', 'mount', '-t', 'tmpfs', '-o', 'mode=0700', 'tmpfs', CNI_CACHE_DIR], 'mounting a private CNI result cache');
  if (hostDirs.length > 0) {
    // hostPath volumes with mount propagation need their mount shared or slave, and containerd 1.6 looks the mount up
    // without resolving symlinks (`/var/run/netns` is found on `/`): `/` is shared on a real (systemd) node; here the
    // machine's is private, so its copy in this namespace becomes shared, a peer group of this namespace alone
    await inNs(['--', 'mount', '--make-shared', '/'], 'making / shared in the node\'s mount namespace');
  }
  for (const d of hostDirs) {
    await mkdir(d.source, { recursive: true, mode: 0o755 });
    await mkdir(d.target, { recursive: true, mode: 0o755 });
    await inNs(['--', 'mount', '--bind', d.source, d.target], `bind-mounting ${d.source} over ${d.target}`);
    await inNs(['--', 'mount', '--make-shared', d.target], `making ${d.target} a shared mount`);
  }
}

/** Mount points in the caller's mount namespace, octal escapes (`\040`) decoded. */
async function readMounts(): Promise<string[]> {
  const text = await readFile('/proc/self/mounts', 'utf8');
  return text
    .split('\n')
    .filter((line) => line !== '')
    .map((line) => (line.split(' ')[1] ?? '').replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8))));
}

/** Unmounts everything mounted at or below `dir` in the host mount namespace, deepest first, lazily if busy. */
export async function unmountUnder(dir: string): Promise<void> {
  const targets = (await readMounts())
    .filter((m) => m === dir || m.startsWith(`${dir}/`))
    .sort((a, b) => b.split('/').length - a.split('/').length);
  for (const target of targets) {
    await run('umount', [target], `unmounting ${target}`).catch(() => run('umount', ['-l', target], `lazily unmounting ${target}`));
  }
}
