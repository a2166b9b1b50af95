/**
 * Writing one of the agent's own state files (the cluster state, the tunnel's datagram state, ...) on a disk that may
 * fail. The state lives in memory and the file follows it: a write that fails (a full disk, a read-only file system,
 * an fsync error) is not thrown at whoever changed the state, which goes on from memory; it stays pending and is
 * written at the next change or {@link StateWriter.flush} (the agent's resync). Each distinct failure is logged
 * once with NODE_STATE_WRITE_FAILED, and the first write that works again says so. Before, a failed write of
 * `cluster-state.json` was thrown from a timer and killed the agent, and skipped applying the peers it held.
 */
import { atollError } from '../../core/errors.ts';
import type { Logger } from '../../core/ports.ts';

export const STATE_WRITE_FIX = "free space on the agent's data directory, or remount it read-write; the agent writes the file again by itself";

export interface StateWriterComponents<T> {
  readonly log: Logger;
  /** Writes `value` durably (src/adapters/durable-file.ts); throws when it cannot. */
  readonly write: (value: T) => void;
}

export interface StateWriterInit {
  /** What the file holds, for the log ("the cluster state"). */
  readonly what: string;
  readonly path: string;
  /** What the agent does while the file lags behind, for the log ("peers and blocks are applied from memory"). */
  readonly meanwhile: string;
  /** What to do, when not {@link STATE_WRITE_FIX} (another process's data directory). */
  readonly fix?: string;
}

export class StateWriter<T> {
  readonly #c: StateWriterComponents<T>;
  readonly #init: StateWriterInit;
  #pending: { value: T } | undefined;
  /** The failure last logged (its errno code, or message): the same one again is logged at debug level only. */
  #failing: string | undefined;

  constructor(components: StateWriterComponents<T>, init: StateWriterInit) {
    this.#c = components;
    this.#init = init;
  }

  /** Whether the file lags behind the state in memory. */
  get pending(): boolean {
    return this.#pending !== undefined;
  }

  /** Makes `value` the state to write and writes it. Returns whether it reached the disk; never throws. */
  save(value: T): boolean {
    this.#pending = { value };
    return this.flush();
  }

  /** Writes the pending state, if there is one. Returns whether the file now holds the state; never throws. */
  flush(): boolean {
    const p = this.#pending;
    if (!p) return true;
    const { what, path, meanwhile } = this.#init;
    const log = this.#c.log;
    try {
      this.#c.write(p.value);
    } catch (cause) {
      const err = atollError('NODE_STATE_WRITE_FAILED', `cannot write ${what} ${path}: ${(cause as Error).message}`, this.#init.fix ?? STATE_WRITE_FIX, cause);
      const key = (cause as NodeJS.ErrnoException).code ?? err.message;
      if (key !== this.#failing) log.error(`cannot write ${what}; ${meanwhile}, and the file is written at the next change or resync`, { code: err.code, err: err.message, path, fix: err.fix });
      else log.debug(`${what} still not written`, { code: err.code, err: err.message, path });
      this.#failing = key;
      return false;
    }
    if (this.#pending === p) this.#pending = undefined;
    if (this.#failing !== undefined) log.info(`${what} written again`, { path });
    this.#failing = undefined;
    return true;
  }
}
