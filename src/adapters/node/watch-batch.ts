/**
 * The controller's watch lines, applied in batches: lines that come within `settleMs` of each other (a snapshot,
 * then a burst of changes as thousands of nodes join) are applied to one map and handed on once, sorted by name.
 * Applied one by one, each line cost a sort, a rewrite of the saved state and a plan of every peer: work that grew
 * with the cluster per line, so with its square per burst. Used by the agent's controller link and by the relay.
 */
import type { NodeRecord } from '../../core/cluster/model.ts';
import { compareText } from '../../core/order.ts';
import type { WatchLine } from '../../config/watch-line.ts';

export class WatchBatch {
  readonly #settleMs: number;
  readonly #current: () => readonly NodeRecord[];
  readonly #onSettled: (nodes: NodeRecord[], revision: number) => void;
  #open: { nodes: Map<string, NodeRecord>; revision: number; timer: NodeJS.Timeout } | undefined;

  /**
   * @param current the node list the lines apply to (what was last handed on, or loaded from disk)
   * @param onSettled gets the node list and the revision of the last line applied
   */
  constructor(settleMs: number, current: () => readonly NodeRecord[], onSettled: (nodes: NodeRecord[], revision: number) => void) {
    this.#settleMs = settleMs;
    this.#current = current;
    this.#onSettled = onSettled;
  }

  /** Applies a line to the open batch (opening one, which settles `settleMs` later). */
  add(line: Exclude<WatchLine, { type: 'ping' }>): void {
    this.#open ??= { nodes: new Map(this.#current().map((n) => [n.name, n])), revision: line.revision, timer: setTimeout(() => this.settle(), this.#settleMs) };
    const { nodes } = this.#open;
    if (line.type === 'snapshot') {
      nodes.clear();
      for (const n of line.nodes) nodes.set(n.name, n);
    } else if (line.type === 'put') nodes.set(line.node.name, line.node);
    else nodes.delete(line.name);
    this.#open.revision = line.revision;
  }

  /** Hands the open batch on now, if there is one (a stream that ended, a stop). */
  settle(): void {
    const open = this.#open;
    if (!open) return;
    clearTimeout(open.timer);
    this.#open = undefined;
    this.#onSettled([...open.nodes.values()].sort((a, b) => compareText(a.name, b.name)), open.revision);
  }
}
