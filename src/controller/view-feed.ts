/**
 * The registry's nodes as this controller replica serves them to watchers: one watch on the store feeds
 * {@link NodeViews} (src/core/cluster/view.ts), whatever the number of agents watching. The store sees one listing at
 * start (and after it compacted what the feed missed) and one watch per replica; each change is parsed once.
 */
import { AtollError, asAtollError } from '../core/errors.ts';
import type { Logger } from '../core/ports.ts';
import type { ClusterRegistry } from '../core/cluster/registry.ts';
import { NodeViews } from '../core/cluster/view.ts';
import { Backoff } from '../core/retry.ts';
import { sleep } from '../adapters/timers.ts';

export interface ViewFeedComponents {
  readonly registry: ClusterRegistry;
  readonly log: Logger;
}

/** Changes kept for agents that resume a watch: enough for every node of a large cluster to change once or twice. */
export const VIEW_HISTORY = 200_000;

export class ViewFeed {
  readonly views: NodeViews;
  readonly #c: ViewFeedComponents;
  readonly #abort = new AbortController();
  #loop: Promise<void> | undefined;
  #loaded = false;

  constructor(c: ViewFeedComponents, historyLength = VIEW_HISTORY) {
    this.#c = c;
    this.views = new NodeViews(historyLength);
  }

  /** Starts following the store. */
  start(): void {
    this.#loop ??= this.#run();
  }

  /** Whether the views hold a listing of the store yet. */
  get loaded(): boolean {
    return this.#loaded;
  }

  async stop(): Promise<void> {
    this.#abort.abort();
    await this.#loop;
  }

  async #run(): Promise<void> {
    const signal = this.#abort.signal;
    const backoff = new Backoff({ minMs: 200, maxMs: 10_000 }, sleep);
    let listed = false;
    while (!signal.aborted) {
      try {
        if (!listed) {
          const { nodes, revision } = await this.#c.registry.snapshot();
          this.views.load(nodes, revision);
          listed = true;
          this.#loaded = true;
        }
        await this.#c.registry.watchNodes(this.views.revision, (events) => {
          backoff.reset();
          this.views.apply(events.map((e) => (e.type === 'put'
            ? { revision: e.revision, name: e.node.name, after: e.node }
            : { revision: e.revision, name: e.name, after: undefined })));
        }, signal);
      } catch (e) {
        if (signal.aborted) break;
        if (e instanceof AtollError && e.code === 'STORE_COMPACTED') {
          // the store no longer has the changes since our revision: list it again (every watcher gets a snapshot)
          this.#c.log.warn('node views fell behind the store\'s history; listing it again', { revision: this.views.revision });
          listed = false;
          continue;
        }
        this.#c.log.warn('watching the store for node changes failed; retrying', { err: asAtollError(e).message, retryMs: backoff.delayMs });
        await backoff.wait(signal);
      }
    }
  }
}
