/**
 * What the agent learned from the controller, kept on the node so it can start, allocate and (later) program peers
 * while the controller is unreachable: its blocks, the peer set and the revision to resume the peer stream from.
 */
import { existsSync, mkdirSync, readFileSync } from 'node:fs';
import { dirname } from 'node:path';
import { atollError } from '../../core/errors.ts';
import type { NodeRecord } from '../../core/cluster/model.ts';
import { writeFileDurably } from '../durable-file.ts';

export interface ClusterState {
  readonly blocks: readonly string[];
  readonly revision: number;
  readonly peers: readonly NodeRecord[];
}

export const EMPTY_CLUSTER_STATE: ClusterState = Object.freeze({ blocks: [], revision: 0, peers: [] });

export class ClusterStateFile {
  readonly path: string;

  constructor(path: string) {
    this.path = path;
  }

  /** The saved state, or the empty state on a node that never reached the controller. */
  load(): ClusterState {
    return existsSync(this.path) ? decodeClusterState(readFileSync(this.path, 'utf8'), this.path) : EMPTY_CLUSTER_STATE;
  }

  save(state: ClusterState): void {
    mkdirSync(dirname(this.path), { recursive: true, mode: 0o700 });
    writeFileDurably(this.path, encodeClusterState(state));
  }
}

/** The text of the cluster state file holding `state`. */
export function encodeClusterState(state: ClusterState): string {
  return JSON.stringify(state);
}

/** The state in the text of the cluster state file at `path`. @throws AtollError CONFIG_FILE_INVALID when it is damaged. */
export function decodeClusterState(text: string, path: string): ClusterState {
  try {
    const s = JSON.parse(text) as ClusterState;
    // only a cause: the catch below throws CONFIG_FILE_INVALID with it
    if (!Array.isArray(s.blocks) || typeof s.revision !== 'number' || !Array.isArray(s.peers)) throw new Error('missing blocks, revision or peers');
    return s;
  } catch (cause) {
    throw atollError('CONFIG_FILE_INVALID', `the agent's cluster state ${path} is unreadable`,
      'if the controller is reachable, move the file away and restart the agent: it re-learns everything', cause);
  }
}
