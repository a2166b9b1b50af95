/**
 * Removing lab runs: `atoll lab down`, the removal of one run (its processes by PID, its containerds' leftovers, its
 * namespaces, its state file), the leftovers of runs whose lab process died, and the handlers that remove the run
 * being built or running on SIGINT, SIGTERM and crashes; {@link LabRuns}, the runs and removals of one process.
 *
 * Processes are stopped by PID only, and only when their command line carries the run's directory (or they live in
 * one of the run's namespaces, or in the mount namespace or sandbox cgroup of one of the run's containerds).
 */
import { asAtollError } from '../core/errors.ts';
import { LAB_NETNS_PREFIX, labPrefix, runIdOfNetns } from './plan/plan.ts';
import { removeContainerdLeftovers } from './io/containerd/leftovers.ts';
import { IpRoute2 } from '../adapters/kernel/iproute2.ts';
import { type LabState, LabStateStore } from './io/lab-state.ts';
import { commandLine, isAlive, listNetns, pidsInNetns, stopPid } from './io/processes.ts';
import type { LabPodRuntime } from './lab-pods.ts';
import { requireRoot } from './lab-preflight.ts';
import { type LabOptions, mapLimit, secs, since } from './running-lab.ts';

const ip = new IpRoute2();

export interface DownSummary {
  readonly runId: string;
  readonly processes: readonly { role: string; pid: number; outcome: string }[];
  readonly namespacesRemoved: number;
  /** Namespaces of the run still present afterwards (should be none). */
  readonly leftovers: readonly string[];
}

/** The run a process is building or running: what its clean-up handlers remove. */
export interface ActiveRun {
  readonly store: LabStateStore;
  state: LabState;
  readonly say: (l: string) => void;
  /** containerds being started: told to stop starting more, and awaited, before the run is removed. */
  starting?: { abort: AbortController; settled: Promise<unknown> };
}

/**
 * The lab runs of one process: the run being built or running (what SIGINT, SIGTERM and crashes remove), the pod
 * runtime of each live run (closed when it goes) and the removals under way (one per run). The caller makes one per
 * process and passes it to the clean-up handlers and to `labUp`.
 */
export class LabRuns {
  active: ActiveRun | undefined;
  /** The removal the clean-up handlers started. */
  cleaning: Promise<unknown> | undefined;
  readonly runtimes = new Map<string, LabPodRuntime>();
  readonly removals = new Map<string, Promise<DownSummary>>();
}

/**
 * Removes one run: its recorded processes (by PID, checked against the run's directory), any process left in its
 * namespaces, its namespaces (recorded, and any with its prefix), its directory and its state file. Idempotent;
 * each step runs even when an earlier one failed.
 */
export function destroyRun(runs: LabRuns, run: { readonly store: LabStateStore; readonly state: LabState }, say: (l: string) => void): Promise<DownSummary> {
  // one removal per run at a time: a Ctrl-C during the normal teardown joins it instead of racing it
  const { store, state } = run;
  let removal = runs.removals.get(state.runId);
  if (!removal) {
    removal = removeRun(runs, store, state, say).finally(() => runs.removals.delete(state.runId));
    runs.removals.set(state.runId, removal);
  }
  return removal;
}

async function removeRun(runs: LabRuns, store: LabStateStore, state: LabState, say: (l: string) => void): Promise<DownSummary> {
  const t = performance.now();
  runs.runtimes.get(state.runId)?.close();
  runs.runtimes.delete(state.runId);
  const processes = await Promise.all(state.processes.map(async (p) => ({ ...p, outcome: await stopPid(p.pid, { tag: state.dir, graceMs: 3000 }) })));
  // containerd, its shims and sandboxes, their mounts (in containerd's own mount namespace) and cgroups
  await Promise.all((state.containerds ?? []).map((c) => removeContainerdLeftovers(c).catch((e: unknown) => {
    say(`  (containerd of ${c.node}, pid ${c.pid}: ${asAtollError(e).message})`);
  })));
  const present = new Set(listNetns());
  const names = [...new Set([...state.namespaces, ...[...present].filter((n) => n.startsWith(state.prefix))])].filter((n) => present.has(n));
  for (const [ns, pids] of pidsInNetns(names)) {
    for (const pid of pids) processes.push({ role: `process in ${ns}`, pid, outcome: await stopPid(pid, { graceMs: 1000 }) });
  }
  // pods first: deleting them deletes their veths while the nodes still exist
  const order = (n: string) => (n.includes('-p') && /-p\d+$/.test(n) ? 0 : 1);
  const sorted = [...names].sort((a, b) => order(a) - order(b));
  await mapLimit(sorted, 8, (n) => ip.batch([`netns del ${n}`]).catch((e: unknown) => {
    if (listNetns().includes(n)) say(`  (could not delete namespace ${n}: ${asAtollError(e).message})`);
  }));
  const leftovers = listNetns().filter((n) => n.startsWith(state.prefix));
  if (leftovers.length === 0) store.remove(state.runId);
  if (runs.active?.state.runId === state.runId) runs.active = undefined;
  const stopped = processes.filter((p) => p.outcome !== 'gone' && p.outcome !== 'not ours').length;
  const ctds = state.containerds?.length ?? 0;
  say(`  removed lab ${state.runId}: ${stopped} process${stopped === 1 ? '' : 'es'} stopped, ${ctds ? `${ctds} containerd${ctds === 1 ? '' : 's'} with their pods removed, ` : ''}${names.length - leftovers.length} namespaces deleted`
    + `${leftovers.length ? `, ${leftovers.length} LEFT: ${leftovers.join(' ')}` : ''} (${secs(since(t))})`);
  for (const p of processes.filter((x) => x.outcome === 'not ours' || x.outcome === 'survived')) say(`  (pid ${p.pid}, ${p.role}: ${p.outcome})`);
  return { runId: state.runId, processes, namespacesRemoved: names.length - leftovers.length, leftovers };
}

/** A state for a run known only by its namespaces (its state file is gone). */
function orphanState(store: LabStateStore, runId: string): LabState {
  return { runId, prefix: labPrefix(runId), dir: store.runDir(runId), labPid: 0, detached: true, startedAt: '', namespaces: [], processes: [] };
}

/**
 * `atoll lab down`: with a run id, that run; without, every run whose lab process is gone or detached, and every
 * lab namespace without a state file; with `all`, live runs too.
 */
export async function labDown(target: { runId: string } | { all: boolean }, opts: LabOptions): Promise<DownSummary[]> {
  requireRoot();
  const store = opts.store ?? new LabStateStore();
  const say = opts.say;
  const runs = new LabRuns();
  if ('runId' in target) return [await destroyRun(runs, { store, state: store.load(target.runId) ?? orphanState(store, target.runId) }, say)];
  const out: DownSummary[] = [];
  for (const id of store.list()) {
    const s = store.load(id) ?? orphanState(store, id);
    if (!target.all && isLive(s)) {
      say(`  lab ${id} is live (lab process ${s.labPid}): left alone; stop it with Ctrl-C there, or \`atoll lab down ${id}\``);
      continue;
    }
    out.push(await destroyRun(runs, { store, state: s }, say));
  }
  const known = new Set(store.list());
  const orphans = [...new Set(listNetns().filter((n) => n.startsWith(LAB_NETNS_PREFIX)).map(runIdOfNetns).filter((x): x is string => x !== undefined && !known.has(x)))];
  for (const id of orphans) out.push(await destroyRun(runs, { store, state: orphanState(store, id) }, say));
  if (out.length === 0) say('  no lab to remove');
  return out;
}

/** Removes runs whose `atoll lab` process is gone without detaching (it crashed or was killed). */
export async function removeStaleRuns(runs: LabRuns, store: LabStateStore, say: (l: string) => void): Promise<void> {
  for (const id of store.list()) {
    const s = store.load(id);
    if (!s || s.detached || isLive(s)) continue;
    say(`  removing the leftovers of lab ${id} (its lab process ${s.labPid} is gone)`);
    await destroyRun(runs, { store, state: s }, say);
  }
}

function isLive(s: LabState): boolean {
  return !s.detached && s.labPid !== process.pid && isAlive(s.labPid) && (commandLine(s.labPid) ?? '').includes(' lab ');
}

/**
 * Removes the active run; containerds still starting are told to stop starting more and awaited first (each is
 * recorded in the state as it spawns, so the removal reads the state after they settled).
 */
async function removeActive(runs: LabRuns, run: ActiveRun): Promise<unknown> {
  if (run.starting) {
    run.starting.abort.abort();
    await run.starting.settled;
  }
  return destroyRun(runs, run, run.say);
}

/**
 * Removes the active run of `runs` on SIGINT, SIGTERM or an uncaught error, then exits (130, 143 or 1). Returns a
 * function that uninstalls the handlers.
 */
export function installCleanupHandlers(runs: LabRuns): () => void {
  const onSignal = (signal: NodeJS.Signals) => {
    const run = runs.active;
    if (runs.cleaning) {
      run?.say(`  (${signal}: still removing the lab)`);
      return;
    }
    if (run) run.say(`\n${signal}: removing lab ${run.state.runId}`);
    runs.cleaning = (run ? removeActive(runs, run) : Promise.resolve()).finally(() => process.exit(signal === 'SIGINT' ? 130 : 143));
  };
  const onCrash = (err: unknown) => {
    const run = runs.active;
    process.stderr.write(`atoll lab crashed: ${asAtollError(err).message}\n`);
    if (runs.cleaning) return;
    runs.cleaning = (run ? removeActive(runs, run) : Promise.resolve()).finally(() => process.exit(1));
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  process.on('uncaughtException', onCrash);
  process.on('unhandledRejection', onCrash);
  return () => {
    process.removeListener('SIGINT', onSignal);
    process.removeListener('SIGTERM', onSignal);
    process.removeListener('uncaughtException', onCrash);
    process.removeListener('unhandledRejection', onCrash);
  };
}
