/**
 * What a private containerd of the test bed (containerd.ts beside it) may leave behind when its owner cannot stop it
 * (crashed, killed, or another process cleans up), found by identity rather than by name: the processes of its mount
 * namespace and their descendants, the processes and cgroups of its sandboxes' cgroup parent (unique to the instance)
 * and of its tasks without a parent (a kubelet's pods, found by the task ids in its state dir), and the mounts under
 * its workDir. {@link removeContainerdLeftovers} removes them all; the instance's own teardown uses the same steps.
 */
import { existsSync } from 'node:fs';
import { readFile, readdir, readlink, rmdir } from 'node:fs/promises';
import { join } from 'node:path';
import { runAll, waitFor } from './commands.ts';
import { layout } from './config.ts';
import { unmountUnder } from './mount-namespace.ts';

/** What identifies everything an instance may leave when its owner dies: see {@link removeContainerdLeftovers}. */
export interface ContainerdLeftovers {
  /** The containerd process. */
  readonly pid: number;
  /** The mount-namespace holder (`sleep infinity`). */
  readonly holderPid: number;
  /** Its private mount namespace, as `/proc/<pid>/ns/mnt` reads (`mnt:[4026532...]`). */
  readonly mountNs: string;
  /** The cgroup parent of its sandboxes (unique to the instance). */
  readonly cgroupParent: string;
  readonly workDir: string;
}

/** One row of the process table: parent PID, mount namespace id, zombie flag. */
interface ProcInfo {
  ppid: number;
  mountNs: string;
  zombie: boolean;
}

/** Reads /proc into a PID → {@link ProcInfo} map; processes that vanish while reading are skipped. */
async function processTable(): Promise<Map<number, ProcInfo>> {
  const table = new Map<number, ProcInfo>();
  for (const name of await readdir('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = await readFile(`/proc/${name}/stat`, 'utf8');
      const [state, ppid] = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      const mountNs = await readlink(`/proc/${name}/ns/mnt`);
      table.set(Number(name), { ppid: Number(ppid), mountNs, zombie: state === 'Z' });
    } catch {
      // gone, or a kernel thread without namespaces
    }
  }
  return table;
}

/** Live PIDs in mount namespace `mountNs` plus all their descendants, excluding this process. */
async function processesInMountNs(mountNs: string): Promise<number[]> {
  const table = await processTable();
  const found = new Set<number>([...table].filter(([, info]) => info.mountNs === mountNs).map(([pid]) => pid));
  for (let grew = true; grew; ) {
    grew = false;
    for (const [pid, info] of table) {
      if (!found.has(pid) && found.has(info.ppid)) {
        found.add(pid);
        grew = true;
      }
    }
  }
  found.delete(process.pid);
  return [...found].filter((pid) => table.get(pid)?.zombie === false);
}

/** SIGKILLs every process left in containerd's mount namespace (shims, sandboxes) and waits for them to go. */
export async function killLeftovers(mountNs: string): Promise<void> {
  const pids = await processesInMountNs(mountNs);
  for (const pid of pids) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // already gone
    }
  }
  await waitFor(async () => (await processesInMountNs(mountNs)).length === 0, 5_000, `processes ${pids.join(',')} to exit`);
}

/** Mount points of every cgroup hierarchy (v1 controllers and/or the v2 tree) in the caller's mount namespace. */
async function cgroupMounts(): Promise<string[]> {
  const text = await readFile('/proc/self/mounts', 'utf8');
  return text
    .split('\n')
    .map((line) => line.split(' '))
    .filter((f) => f[2] === 'cgroup' || f[2] === 'cgroup2')
    .map((f) => f[1] ?? '');
}

/** Directories at and below `dir`, deepest first (in a cgroup tree every directory is a cgroup). */
async function cgroupTree(dir: string): Promise<string[]> {
  const entries = await readdir(dir, { withFileTypes: true }).catch(() => []);
  const children = entries.filter((e) => e.isDirectory()).map((e) => join(dir, e.name));
  const nested = await Promise.all(children.map(cgroupTree));
  return [...nested.flat(), dir];
}

/** rmdir that reports success (or absence) as true and any other failure as false. */
function rmdirQuiet(dir: string): Promise<boolean> {
  return rmdir(dir).then(
    () => true,
    (err: NodeJS.ErrnoException) => err.code === 'ENOENT',
  );
}

/**
 * Removes this instance's cgroup parent and any sandbox cgroups left in it (after a crash) from every hierarchy.
 * rmdir only, so a cgroup that still has tasks is never forced; retried briefly because the kernel frees a cgroup
 * shortly after its last task exits. The parent's name is unique to this instance.
 */
export async function removeCgroupParent(cgroupParent: string): Promise<void> {
  for (const mount of await cgroupMounts()) {
    const root = join(mount, cgroupParent);
    if (!existsSync(root)) continue;
    for (const dir of await cgroupTree(root)) {
      await waitFor(() => rmdirQuiet(dir), 5_000, `cgroup ${dir} to be removable (rmdir)`, 100);
    }
  }
}

/**
 * containerd's default cgroup of a container whose sandbox has no cgroup parent (what a kubelet without per-QOS
 * cgroups asks for): `/<namespace>/<container id>` in every hierarchy, the CRI namespace being `k8s.io`.
 */
const DEFAULT_CGROUP_PARENT = '/k8s.io';

/** The ids of the tasks (sandboxes and containers) an instance's runc shims hold, from its state dir. */
async function taskIds(workDir: string): Promise<string[]> {
  const dir = join(layout(workDir).state, 'io.containerd.runtime.v2.task', 'k8s.io');
  return (await readdir(dir).catch(() => [])).filter((id) => /^[0-9a-f]{64}$/.test(id));
}

/**
 * Removes the default-parent cgroups of tasks `ids` (see {@link DEFAULT_CGROUP_PARENT}) from every hierarchy, once
 * their processes are gone: killing an instance instead of removing its pods leaves them, as runc never deletes
 * them then. Only the given ids: other instances' containers share the parent.
 */
async function removeTaskCgroups(ids: readonly string[]): Promise<void> {
  for (const mount of await cgroupMounts()) {
    for (const id of ids) {
      const dir = join(mount, DEFAULT_CGROUP_PARENT, id);
      if (!existsSync(dir)) continue;
      for (const d of await cgroupTree(dir)) await waitFor(() => rmdirQuiet(d), 5_000, `cgroup ${d} to be removable (rmdir)`, 100);
    }
  }
}

/** PIDs in every cgroup at or below `cgroupParent`, in every hierarchy. */
async function processesInCgroup(cgroupParent: string): Promise<number[]> {
  const pids = new Set<number>();
  for (const mount of await cgroupMounts()) {
    for (const dir of await cgroupTree(join(mount, cgroupParent))) {
      const text = await readFile(join(dir, 'cgroup.procs'), 'utf8').catch(() => '');
      for (const line of text.split('\n')) if (/^\d+$/.test(line)) pids.add(Number(line));
    }
  }
  pids.delete(process.pid);
  return [...pids];
}

/** True if `pid` lives and is in mount namespace `mountNs`. */
async function inMountNs(pid: number, mountNs: string): Promise<boolean> {
  return pid > 0 && (await readlink(`/proc/${pid}/ns/mnt`).catch(() => '')) === mountNs;
}

/**
 * Removes what an instance left when its owner could not `stop()` it (crashed, killed, or another process cleans
 * up): containerd (SIGTERM, then SIGKILL), every process of its mount namespace and their descendants (holder,
 * shims), every process in its sandboxes' cgroup parent (the pause processes) and in its tasks' cgroups that had no
 * parent (a kubelet's pods, under /k8s.io: found by the task ids in its state dir), those cgroups, and any mount under
 * workDir. Sandboxes are not removed
 * through CRI, so no CNI DEL runs: use it when the pod network goes away anyway. The mount namespace is entered only
 * while its holder or containerd is still in it (a reused namespace id is never trusted alone); the cgroup parent's
 * name is unique to the instance. Idempotent; runs every step, then rejects with all failures.
 */
export async function removeContainerdLeftovers(l: ContainerdLeftovers, stopTimeoutMs = 3_000): Promise<void> {
  const ours = (await inMountNs(l.pid, l.mountNs)) || (await inMountNs(l.holderPid, l.mountNs));
  const kill = (pids: readonly number[]) => {
    for (const pid of pids) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // already gone
      }
    }
  };
  const tasks = await taskIds(l.workDir);
  await runAll(
    [
      ['stopping containerd', async () => {
        if (!(await inMountNs(l.pid, l.mountNs))) return;
        process.kill(l.pid, 'SIGTERM');
        await waitFor(async () => !(await inMountNs(l.pid, l.mountNs)), stopTimeoutMs, `containerd (pid ${l.pid}) to exit`, 25).catch(() => kill([l.pid]));
      }],
      ['killing the processes of its mount namespace', async () => (ours ? killLeftovers(l.mountNs) : undefined)],
      ['killing the sandboxes', async () => {
        kill(await processesInCgroup(l.cgroupParent));
        await waitFor(async () => (await processesInCgroup(l.cgroupParent)).length === 0, 5_000, `the processes of cgroup ${l.cgroupParent} to exit`);
      }],
      ['removing the sandboxes\' cgroup parent', () => removeCgroupParent(l.cgroupParent)],
      // a kubelet's pods have no parent: their processes live in their own mount namespaces, under /k8s.io/<task id>
      ['killing the tasks without a parent (kubelet pods)', async () => {
        const pids = async () => (await Promise.all(tasks.map((id) => processesInCgroup(join(DEFAULT_CGROUP_PARENT, id))))).flat();
        kill(await pids());
        await waitFor(async () => (await pids()).length === 0, 5_000, 'the processes of the kubelet pods\' tasks to exit');
      }],
      ['removing the cgroups of tasks without a parent (kubelet pods)', () => removeTaskCgroups(tasks)],
      ['unmounting under workDir', () => unmountUnder(l.workDir)],
    ],
    `containerd leftovers (pid ${l.pid}, ${l.workDir})`,
  );
}
