/**
 * A private containerd 1.6 instance for end-to-end tests of the CNI plugin, `atoll demo` and the lab (one per lab
 * node), driven through the real CRI API. `binDir` runs containerd 2.x instead (scripts/containerd2.sh: the one that
 * sends CRI container events, for a kubelet's evented PLEG); same config (version 2, migrated by 2.x at start), same
 * namespaces; it runs pods on this machine's cgroup v1 hierarchy as 1.6 does.
 *
 * Why this shape:
 * - containerd runs inside the test's own network namespace, so the bridges, veths and iptables rules that CNI
 *   plugins create (containerd calls them in its own netns) never reach the host.
 * - It also runs in a private mount namespace (slave of the host's), created by a holder process (`sleep`, alive
 *   until `stop()`) and set up before containerd starts in it:
 *   `/sys` is remounted from inside the test netns (so `/sys/class/net` shows the test netns, as with
 *   `ip netns exec`), the host's `/sys/fs/cgroup` tree is moved back on top (runc needs it; plain `ip netns exec`
 *   drops it and runc then fails with "no cgroup mount found in mountinfo"), and `/run/containerd` is a private
 *   tmpfs (containerd 1.6 hard-codes its shim sockets under `/run/containerd/s`), and so is `/var/lib/cni` (the
 *   CNI result cache libcni keeps for DEL: an instance that is killed instead of stopped leaves nothing in the
 *   host's cache). Every overlay, shm and netns mount containerd makes stays in that namespace and disappears with
 *   its last process.
 * - Pod netns mounts live under the instance's state dir (`netns_mounts_under_state_dir`), not `/var/run/netns`,
 *   unless `netnsUnderStateDir: false`. They are visible only in containerd's mount namespace: use
 *   {@link Containerd.execInNetns} (or `/proc/<sandbox pid>/ns/net`) to run commands in a pod's netns.
 * - Processes are stopped by PID, never by name; leftovers are found by mount-namespace identity.
 *
 * Commands run and processes stopped, bounded: commands.ts. Its files and the config it runs with: config.ts. Its
 * mount namespace: mount-namespace.ts. What it may leave behind, and removing that without it: leftovers.ts.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, existsSync, openSync } from 'node:fs';
import { mkdir, readFile, readlink, writeFile } from 'node:fs/promises';
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { atollError } from '../../../core/errors.ts';
import { connectCri, type CriClient } from '../../../adapters/node/cri-runtime.ts';
import { buildPauseImage, PAUSE_IMAGE_REF } from './pause-image.ts';
import { type ExecResult, run, runAll, terminate, waitFor } from './commands.ts';
import { layout, type Paths, renderConfig } from './config.ts';
import { prepareMountNamespace, startHolder, unmountUnder } from './mount-namespace.ts';
import { type ContainerdLeftovers, killLeftovers, removeCgroupParent } from './leftovers.ts';

/** Where `ip netns add` puts named network namespaces. */
export const NETNS_RUN_DIR = '/var/run/netns';

/** Log line of containerd 1.6 when the CRI plugin failed to load: the socket answers, CRI never will. */
const CRI_LOAD_FAILURE = 'failed to load plugin io.containerd.grpc.v1.cri';

/** Unix socket paths longer than this do not fit `sockaddr_un` (108 bytes with the terminator and margin). */
const MAX_SOCKET_PATH = 100;

/** Options of {@link startContainerd}. */
export interface ContainerdInit {
  /** Private, existing, empty-ish directory; root, state, sockets, config and logs all go below it. */
  workDir: string;
  /** Name of an existing network namespace under /var/run/netns, created by the test; containerd runs in it. */
  netns: string;
  /** CNI_PATH for containerd: the plugin binaries (must include `loopback`). */
  cniBinDir: string;
  /** Directory with the CNI conflist. Write files in place; containerd 1.6 may miss a file moved in. */
  cniConfDir: string;
  /** Bound for containerd to answer CRI after spawn; default 30 s. */
  startTimeoutMs?: number;
  /** Bound for containerd to exit after SIGTERM before SIGKILL; default 10 s. */
  stopTimeoutMs?: number;
  /** containerd log level; default `info` (`debug` shows each CNI invocation in more detail). */
  logLevel?: 'debug' | 'info' | 'warn' | 'error';
  /**
   * Keep pod netns mounts under the state dir (default true). With false, containerd uses /var/run/netns/cni-<uuid>
   * like a real node: the files then show in the host's `ip netns list` while pods exist, but their mounts do not
   * (they live in containerd's mount namespace), so enter them with `execInNetns` only.
   */
  netnsUnderStateDir?: boolean;
  /** Deadline of each CRI call; default from src/adapters/node/cri-runtime.ts. */
  criDeadlineMs?: number;
  /**
   * A folder holding another `containerd` and its `containerd-shim-runc-v2` (e.g. containerd 2.x from
   * `sh scripts/containerd2.sh`) to run instead of the machine's; the folder goes first on containerd's PATH, where
   * it looks its shim up. The config stays version 2, which containerd 2.x migrates at start. Default: the
   * machine's (containerd 1.6 from Debian).
   */
  binDir?: string;
  /**
   * Directories of this node bind-mounted over machine paths inside containerd's mount namespace (where its runc
   * and a kubelet that joins it resolve hostPath volumes), as a real node has its own `/opt/cni/bin`,
   * `/etc/cni/net.d`, `/var/run/netns`... Each is made a shared mount, so what containerd mounts below it later
   * (a pod's netns under `/var/run/netns`) reaches containers that mount it with HostToContainer propagation.
   * A missing target is created on the machine as an empty mount point (nothing is ever written into it there).
   */
  hostDirs?: readonly { readonly source: string; readonly target: string }[];
  /**
   * A pause image tarball built already ({@link buildPauseImage}), imported instead of building one: several
   * instances share one build.
   */
  pauseImageTarball?: string;
  /**
   * Where containerd serves its API and CRI (its ttrpc socket beside it); default `<workDir>/containerd.sock`. The
   * lab's Kubernetes nodes put it in their own `/run/containerd` (one of `hostDirs`), where a real node has it and
   * the agent's chart mounts it from (the NetworkPolicy's `criSocket`).
   */
  socket?: string;
  /** Start of the sandboxes' cgroup parent's name (a random suffix follows); default `atoll-e2e`. */
  cgroupPrefix?: string;
  /**
   * Called as soon as containerd's process exists (before it answers), with what a crash clean-up needs to find
   * everything of this instance again (removeContainerdLeftovers in leftovers.ts).
   */
  onSpawn?: (leftovers: ContainerdLeftovers) => void;
}

/** A running private containerd. */
export interface Containerd {
  /** CRI client connected to this instance. */
  readonly cri: CriClient;
  /** gRPC unix socket (also for `ctr -a`). */
  readonly socket: string;
  /** containerd's combined stdout/stderr. */
  readonly logPath: string;
  /** cgroup parent of this instance's sandboxes (removed by `stop()`). */
  readonly cgroupParent: string;
  /** PID of the containerd process. */
  readonly pid: number;
  /** What a clean-up by another process needs (removeContainerdLeftovers in leftovers.ts). */
  readonly leftovers: ContainerdLeftovers;
  /**
   * Runs `argv` inside the network namespace at `netnsPath` (a pod's CNI_NETNS as reported by PodSandboxStatus),
   * entering containerd's mount namespace first so that the path resolves. Rejects with stderr on non-zero exit.
   */
  execInNetns(netnsPath: string, argv: readonly string[]): Promise<ExecResult>;
  /** Last `lines` lines of containerd's log, for failure messages. */
  logTail(lines?: number): Promise<string>;
  /**
   * Stops and removes every pod sandbox (so CNI DEL runs), stops containerd (SIGTERM, then SIGKILL), kills any
   * process still in its mount namespace, and unmounts whatever is left under workDir. Idempotent; runs every
   * step even if one fails, then rejects with all failures.
   */
  stop(): Promise<void>;
}

/** Checks what the harness cannot work without and names the fix. */
function checkPreconditions(init: ContainerdInit, p: Paths): string {
  const netnsPath = join(NETNS_RUN_DIR, init.netns);
  if (!existsSync(netnsPath)) {
    throw atollError('LAB_STEP_FAILED', `containerd harness: network namespace "${init.netns}" not found at ${netnsPath}; create it first (ip netns add)`);
  }
  if (p.socket.length > MAX_SOCKET_PATH) {
    throw atollError('LAB_STEP_FAILED', `containerd harness: socket path ${p.socket} is longer than ${MAX_SOCKET_PATH} bytes; use a shorter workDir`);
  }
  for (const b of init.binDir === undefined ? [] : ['containerd', 'containerd-shim-runc-v2']) {
    if (!existsSync(join(init.binDir as string, b))) {
      throw atollError('LAB_PREREQUISITE_MISSING', `containerd harness: binDir ${init.binDir} has no ${b}; build it (sh scripts/containerd2.sh) or leave binDir out`);
    }
  }
  return netnsPath;
}

/**
 * Spawns containerd in the holder's mount and network namespaces; `nsenter` execs it, so the PID is containerd's.
 * With `binDir`, that folder's containerd runs, with the folder first on its PATH (its shim).
 */
function spawnContainerd(holderPid: number, p: Paths, binDir?: string): ChildProcess {
  const logFd = openSync(p.log, 'a');
  try {
    const binary = binDir === undefined ? 'containerd' : join(binDir, 'containerd');
    const env = binDir === undefined ? process.env : { ...process.env, PATH: `${binDir}:${process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin'}` };
    const child = spawn('nsenter', ['-t', String(holderPid), '-m', '-n', '--', binary, '--config', p.config], {
      stdio: ['ignore', logFd, logFd],
      env,
    });
    child.unref();
    return child;
  } finally {
    closeSync(logFd);
  }
}

/** Last `lines` lines of a log file, or a note that it cannot be read. */
async function tail(path: string, lines: number): Promise<string> {
  try {
    return (await readFile(path, 'utf8')).trimEnd().split('\n').slice(-lines).join('\n');
  } catch (err) {
    return `(cannot read ${path}: ${(err as Error).message})`;
  }
}

/** Throws if containerd has exited or its log says the CRI plugin did not load (waiting longer cannot help). */
async function assertStarting(child: ChildProcess, p: Paths): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) {
    throw atollError('LAB_STEP_FAILED', `containerd exited (${child.exitCode ?? child.signalCode}) during start-up`, `read ${p.log}`);
  }
  if ((await readFile(p.log, 'utf8').catch(() => '')).includes(CRI_LOAD_FAILURE)) {
    throw atollError('LAB_STEP_FAILED', `the CRI plugin failed to load (check ${p.config})`, `read ${p.log}`);
  }
}

/** Polls the CRI Version RPC until it answers; fails fast if start-up cannot succeed. Errors include the log tail. */
async function waitForCri(child: ChildProcess, p: Paths, timeoutMs: number): Promise<void> {
  const probe = connectCri({ socket: p.socket, logRoot: p.podLogs, deadlineMs: 1_000 });
  const answers = (): Promise<boolean> => probe.version().then(() => true, () => false);
  try {
    const ready = async (): Promise<boolean> => {
      if (await answers()) return true;
      await assertStarting(child, p);
      return false;
    };
    await waitFor(ready, timeoutMs, `containerd CRI on ${p.socket}`, 100);
  } catch (cause) {
    const msg = `containerd did not come up: ${(cause as Error).message}; see ${p.log}. Log tail:\n${await tail(p.log, 30)}`;
    throw atollError('LAB_STEP_FAILED', msg, 'containerd says why in the log tail quoted', cause);
  } finally {
    probe.close();
  }
}

/** Imports the pause image tarball (built here unless given) into the k8s.io namespace that the CRI plugin uses. */
async function importPauseImage(p: Paths, prebuilt?: string): Promise<void> {
  const tarball = prebuilt ?? await buildPauseImage(p.pauseImageDir);
  await run('ctr', ['-a', p.socket, '-n', 'k8s.io', 'images', 'import', tarball], `importing ${PAUSE_IMAGE_REF}`, 60_000);
}

/** Stops and removes every sandbox, trying all of them; throws one error naming each sandbox that failed. */
async function removeAllSandboxes(cri: CriClient): Promise<void> {
  const failures: Error[] = [];
  for (const { id, namespace, name } of await cri.listPodSandbox()) {
    try {
      await cri.stopPodSandbox(id);
      await cri.removePodSandbox(id);
    } catch (err) {
      // only a cause: gathered into the LAB_STEP_FAILED below
      failures.push(new Error(`sandbox ${namespace}/${name} (${id}): ${(err as Error).message}`, { cause: err }));
    }
  }
  if (failures.length > 0) {
    const message = failures.map((f) => f.message).join('; ');
    throw atollError('LAB_STEP_FAILED', message, 'read the containerd log: removing a sandbox calls CNI DEL, which needs the agent', new AggregateError(failures, message));
  }
}

/** Everything a running instance owns, for {@link makeInstance} and teardown. */
interface Parts {
  p: Paths;
  init: ContainerdInit;
  cgroupParent: string;
  holder: ChildProcess;
  mountNs: string;
  child?: ChildProcess;
  cri?: CriClient;
}

/** Tears down whatever `parts` holds; safe on a half-started instance. */
async function teardown(parts: Parts): Promise<void> {
  const { p, init, holder, mountNs, child, cri, cgroupParent } = parts;
  const stopTimeout = init.stopTimeoutMs ?? 10_000;
  await runAll(
    [
      ['removing pod sandboxes', async () => (cri ? removeAllSandboxes(cri) : undefined)],
      ['closing the CRI client', async () => cri?.close()],
      ['stopping containerd', async () => (child ? terminate(child, 'containerd', stopTimeout) : undefined)],
      ['stopping the mount-namespace holder', () => terminate(holder, 'mount-namespace holder', 2_000)],
      ['killing processes left in containerd\'s mount namespace', () => killLeftovers(mountNs)],
      ['removing the sandboxes\' cgroup parent', () => removeCgroupParent(cgroupParent)],
      ['unmounting under workDir', () => unmountUnder(init.workDir)],
    ],
    `containerd at ${p.socket}`,
  );
}

/** Builds the {@link Containerd} object around started parts. */
function makeInstance(parts: Parts & { child: ChildProcess; cri: CriClient }): Containerd {
  let stopping: Promise<void> | undefined;
  const pid = parts.child.pid ?? -1;
  return {
    cri: parts.cri,
    socket: parts.p.socket,
    logPath: parts.p.log,
    cgroupParent: parts.cgroupParent,
    pid,
    leftovers: { pid, holderPid: parts.holder.pid ?? -1, mountNs: parts.mountNs, cgroupParent: parts.cgroupParent, workDir: parts.init.workDir },
    execInNetns: (netnsPath, argv) =>
      run('nsenter', [`--mount=/proc/${pid}/ns/mnt`, '--', 'nsenter', `--net=${netnsPath}`, '--', ...argv], `running ${argv[0]} in netns ${netnsPath}`),
    logTail: (lines = 40) => tail(parts.p.log, lines),
    stop: () => (stopping ??= teardown(parts)),
  };
}

/**
 * Imports an image tarball (docker-archive or OCI, e.g. `make image`'s) into the k8s.io namespace of a running
 * instance, as `ctr -n k8s.io images import` does on a real node. Idempotent (an image present is replaced).
 * @throws AtollError LAB_STEP_FAILED with ctr's output when the import fails.
 */
export async function importImage(ctd: Pick<Containerd, 'socket'>, tarball: string, timeoutMs = 180_000): Promise<void> {
  await run('ctr', ['-a', ctd.socket, '-n', 'k8s.io', 'images', 'import', tarball], `importing ${tarball}`, timeoutMs);
}

/** SIGKILLs the task (a sandbox's or a container's process) `id` of a running instance, as a crash would end it. */
export async function killTask(ctd: Pick<Containerd, 'socket'>, id: string): Promise<void> {
  await run('ctr', ['-a', ctd.socket, '-n', 'k8s.io', 'tasks', 'kill', '-s', 'SIGKILL', id], `killing task ${id}`);
}

/**
 * Starts a private containerd (CRI enabled, overlayfs, runc) inside network namespace `init.netns`, waits until its
 * CRI socket answers (bounded by `startTimeoutMs`), and imports the sandbox image {@link PAUSE_IMAGE_REF}.
 *
 * Preconditions: root; containerd, runc, ctr, nsenter/unshare (util-linux) and busybox-static installed; the netns
 * exists; `workDir` is private to this instance. On any start-up failure everything started so far is torn down
 * and the error includes the tail of containerd's log. Callers must `await stop()` (e.g. in `finally`).
 */
export async function startContainerd(init: ContainerdInit): Promise<Containerd> {
  const p = { ...layout(init.workDir), ...(init.socket ? { socket: init.socket, ttrpcSocket: `${init.socket}.ttrpc` } : {}) };
  const netnsPath = checkPreconditions(init, p);
  await mkdir(p.podLogs, { recursive: true });
  await writeFile(p.config, renderConfig(p, init));
  const holder = await startHolder(netnsPath);
  const holderPid = holder.pid ?? -1;
  const cgroupParent = `/${init.cgroupPrefix ?? 'atoll-e2e'}-${randomBytes(6).toString('hex')}`;
  const parts: Parts = { p, init, cgroupParent, holder, mountNs: await readlink(`/proc/${holderPid}/ns/mnt`) };
  try {
    await prepareMountNamespace(holderPid, p, init.hostDirs);
    parts.child = spawnContainerd(holderPid, p, init.binDir);
    init.onSpawn?.({ pid: parts.child.pid ?? -1, holderPid, mountNs: parts.mountNs, cgroupParent, workDir: init.workDir });
    await waitForCri(parts.child, p, init.startTimeoutMs ?? 30_000);
    parts.cri = connectCri({ socket: p.socket, logRoot: p.podLogs, deadlineMs: init.criDeadlineMs, cgroupParent });
    await importPauseImage(p, init.pauseImageTarball);
    return makeInstance({ ...parts, child: parts.child, cri: parts.cri });
  } catch (err) {
    await teardown(parts).catch(() => undefined);
    throw err;
  }
}
