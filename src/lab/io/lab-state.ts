/**
 * The lab's state files: one JSON file per run under /run/atoll-lab (a tmpfs: gone after a reboot, as are the
 * namespaces it lists), written before anything is created and updated as processes start, so `atoll lab down`
 * can remove what an interrupted or killed run left: its processes (by PID, checked against the run's directory in
 * their command line), its containerds (with their shims, sandboxes, mounts and cgroups), its namespaces (by
 * recorded name, and by the run's name prefix) and its directory.
 */
import { mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { LAB_RUN_ID } from '../plan/plan.ts';
import type { ContainerdLeftovers } from './containerd/leftovers.ts';

export const LAB_STATE_DIR = '/run/atoll-lab';

export interface LabStateProcess {
  /** What it is: `controller`, `agent a-1`, ... */
  readonly role: string;
  readonly pid: number;
}

export interface LabState {
  readonly runId: string;
  /** Every namespace of the run starts with it. */
  readonly prefix: string;
  /** The run's directory; every process of the run has it in its command line. */
  readonly dir: string;
  /** The `atoll lab` process that built it. */
  readonly labPid: number;
  /** True after `atoll lab up --detach` returned: the lab stays up without its builder. */
  readonly detached: boolean;
  readonly startedAt: string;
  readonly namespaces: readonly string[];
  readonly processes: readonly LabStateProcess[];
  /** The private containerd of each node, when pods go through CRI (absent in runs of older versions). */
  readonly containerds?: readonly (ContainerdLeftovers & { readonly node: string })[];
}

export class LabStateStore {
  readonly dir: string;

  constructor(dir = LAB_STATE_DIR) {
    this.dir = dir;
  }

  path(runId: string): string {
    return join(this.dir, `${runId}.json`);
  }

  /** The directory for a run's files, next to its state file. */
  runDir(runId: string): string {
    return join(this.dir, runId);
  }

  /** Writes the state file (write, then rename: never half a file). */
  save(state: LabState): void {
    mkdirSync(this.dir, { recursive: true, mode: 0o700 });
    const tmp = `${this.path(state.runId)}.tmp`;
    writeFileSync(tmp, JSON.stringify(state, null, 2) + '\n', { mode: 0o600 });
    renameSync(tmp, this.path(state.runId));
  }

  /** The state of `runId`, or undefined when there is none or it is unreadable. */
  load(runId: string): LabState | undefined {
    try {
      const s = JSON.parse(readFileSync(this.path(runId), 'utf8')) as LabState;
      return s.runId === runId && Array.isArray(s.namespaces) && Array.isArray(s.processes) ? s : undefined;
    } catch {
      return undefined;
    }
  }

  /** Run ids with a state file. */
  list(): string[] {
    try {
      return readdirSync(this.dir).flatMap((f) => {
        const id = f.endsWith('.json') ? f.slice(0, -5) : '';
        return LAB_RUN_ID.test(id) ? [id] : [];
      });
    } catch {
      return [];
    }
  }

  /** Removes the state file and the run's directory. */
  remove(runId: string): void {
    rmSync(this.runDir(runId), { recursive: true, force: true });
    rmSync(this.path(runId), { force: true });
  }
}
