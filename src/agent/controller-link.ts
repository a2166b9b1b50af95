/**
 * The agent's link to the controller: join (bootstrap token + node key), keep the node's blocks, report usage so a
 * spare block arrives before the node runs out, and follow the peer stream, saving all of it locally. It runs in
 * the background and never blocks pod networking: while the controller is unreachable the agent works from its
 * saved state and retries with backoff. The stream's lines are applied in batches ({@link PEERS_SETTLE_MS}).
 */
import { existsSync, readFileSync } from 'node:fs';
import { asAtollError, atollError } from '../core/errors.ts';
import type { NodeFields, NodeRecord } from '../core/cluster/model.ts';
import type { IpamUsage } from '../core/ipam/sticky-pool.ts';
import type { Clock, Logger } from '../core/ports.ts';
import type { ClusterState, ClusterStateFile } from '../adapters/node/cluster-state-file.ts';
import { ControllerClient, type WatchLine } from '../adapters/node/controller-client.ts';
import { WatchBatch } from '../adapters/node/watch-batch.ts';
import { writeFileDurably } from '../adapters/durable-file.ts';
import type { NodeIdentity } from '../adapters/node/node-identity.ts';
import { STATE_WRITE_FIX, StateWriter } from '../adapters/node/state-writer.ts';
import { discoverPinnedCa } from '../adapters/pki.ts';
import { sleep } from '../adapters/timers.ts';
import { Backoff } from '../core/retry.ts';

export interface ControllerLinkComponents {
  readonly log: Logger;
  readonly clock: Clock;
  /**
   * The node key, loaded or created on first use (src/adapters/node/node-identity.ts). It throws when it cannot be
   * created (a full or read-only disk): the link then does not join, since a key that is not on disk would be
   * replaced at the next start and the controller would refuse it; it tries again at each retry.
   */
  readonly identity: () => NodeIdentity;
  readonly stateFile: ClusterStateFile;
  /** What the agent already read from `stateFile` at its start (read again when absent: with 100,000 peers it is 60 MB). */
  readonly saved?: ClusterState;
  /** Called with the node's blocks whenever they change. */
  readonly onBlocks: (blocks: readonly string[]) => Promise<void>;
  readonly usage: () => IpamUsage;
  /** Called with the peer set whenever it changes. */
  readonly onPeers?: (peers: readonly NodeRecord[]) => void;
  /** Follows another stream of the controller (NetworkPolicy) with the session's client until the signal aborts. */
  readonly followPolicy?: (client: ControllerClient, signal: AbortSignal) => Promise<void>;
}

export interface ControllerLinkInit {
  readonly urls: readonly string[];
  readonly token: string;
  readonly caCertHash: string;
  /** Where the discovered (pinned) controller CA is kept. */
  readonly caPath: string;
  readonly nodeName: string;
  readonly fields: NodeFields;
  readonly usagePeriodMs: number;
  readonly retryMinMs?: number;
  readonly retryMaxMs?: number;
}

export type LinkState = 'connecting' | 'connected' | 'offline';

/** Watch lines that come within this of each other are applied, saved and handed on once (src/adapters/node/watch-batch.ts). */
export const PEERS_SETTLE_MS = 50;

export class ControllerLink {
  readonly #c: ControllerLinkComponents;
  readonly #init: ControllerLinkInit;
  readonly #abort = new AbortController();
  #state: ClusterState;
  #status: LinkState = 'connecting';
  #lastError = '';
  /** Since when the agent has had no controller session (ms since epoch; the start until the first one). */
  #offlineSince: number | undefined;
  #loop: Promise<void> | undefined;
  readonly #lines: WatchBatch;
  /** `stateFile`, following {@link #state}: a write the disk refuses is retried, never thrown at the change. */
  readonly #file: StateWriter<ClusterState>;
  #identity: NodeIdentity | undefined;
  /** The pinned CA once discovered, when its file could not be written. */
  #caPem: string | undefined;

  constructor(components: ControllerLinkComponents, init: ControllerLinkInit) {
    this.#c = components;
    this.#init = init;
    this.#state = components.saved ?? components.stateFile.load();
    this.#offlineSince = components.clock();
    this.#file = new StateWriter({ log: components.log, write: (s) => components.stateFile.save(s) },
      { what: 'the cluster state', path: components.stateFile.path, meanwhile: 'peers and blocks are applied from memory (a restart meanwhile starts from the older file)' });
    this.#lines = new WatchBatch(PEERS_SETTLE_MS, () => this.#state.peers, (peers, revision) => {
      this.#save({ ...this.#state, peers, revision });
      this.#c.onPeers?.(peers);
    });
  }

  get state(): ClusterState {
    return this.#state;
  }

  /** The link now; `offlineSince` (ms since epoch) is set while it is not connected. */
  get status(): { state: LinkState; lastError: string; offlineSince: number | undefined } {
    return { state: this.#status, lastError: this.#lastError, offlineSince: this.#offlineSince };
  }

  get peers(): readonly NodeRecord[] {
    return this.#state.peers;
  }

  start(): void {
    this.#loop ??= this.#run();
  }

  /** Writes the cluster state if an earlier write failed (the agent's resync calls it). Never throws. */
  flush(): void {
    this.#file.flush();
  }

  async stop(): Promise<void> {
    this.#abort.abort();
    await this.#loop;
    this.#lines.settle();
  }

  async #run(): Promise<void> {
    // jittered: when a controller replica goes, its agents must not all come back to the next one at one instant
    const backoff = new Backoff({ minMs: this.#init.retryMinMs ?? 500, maxMs: this.#init.retryMaxMs ?? 30_000, jitter: { fraction: 0.5, random: Math.random } }, sleep);
    while (!this.#abort.signal.aborted) {
      try {
        await this.#session(() => backoff.reset());
      } catch (e) {
        const err = asAtollError(e);
        if (this.#abort.signal.aborted) break;
        if (this.#status !== 'offline' || this.#lastError !== err.message) {
          const why = err.code === 'NODE_STATE_WRITE_FAILED' ? 'no node key on disk to join with' : 'controller unreachable';
          this.#c.log.warn(`${why}; working from local state`, { err: err.message, code: err.code, retryInMs: backoff.delayMs });
        }
        if (this.#status === 'connected') this.#offlineSince = this.#c.clock();
        this.#status = 'offline';
        this.#lastError = err.message;
      }
      await backoff.wait(this.#abort.signal);
    }
  }

  /** One connected session: join, then report usage and follow the peer stream until it breaks. */
  async #session(onConnected: () => void): Promise<void> {
    const identity = (this.#identity ??= this.#c.identity());
    const client = new ControllerClient({ urls: this.#init.urls, caPem: await this.#ca(), identity, nodeName: this.#init.nodeName });
    try {
      const joined = await client.join(this.#init.token, identity.publicKey, this.#init.fields);
      await this.#applyBlocks(joined.blocks);
      if (this.#status !== 'connected') this.#c.log.info('connected to the controller', { url: client.url, blocks: joined.blocks });
      this.#status = 'connected';
      this.#offlineSince = undefined;
      onConnected();
      const session = new AbortController();
      const stopSession = () => session.abort();
      this.#abort.signal.addEventListener('abort', stopSession);
      const reporter = this.#reportUsage(client, session.signal);
      const policy = this.#c.followPolicy?.(client, session.signal);
      try {
        await this.#reportOnce(client);
        await client.watch(this.#state.revision, (line) => this.#onLine(line), session.signal);
      } finally {
        session.abort();
        this.#lines.settle();
        this.#abort.signal.removeEventListener('abort', stopSession);
        await reporter;
        await policy;
      }
    } finally {
      client.close();
    }
  }

  async #reportUsage(client: ControllerClient, signal: AbortSignal): Promise<void> {
    while (!signal.aborted) {
      await sleep(this.#init.usagePeriodMs, signal);
      if (signal.aborted) return;
      try {
        await this.#reportOnce(client);
      } catch (e) {
        this.#c.log.debug('usage report failed', { err: asAtollError(e).message });
      }
    }
  }

  async #reportOnce(client: ControllerClient): Promise<void> {
    const { capacity, allocated, reserved, free } = this.#c.usage();
    const { blocks } = await client.reportUsage({ capacity, allocated, reserved, free });
    await this.#applyBlocks(blocks);
  }

  #onLine(line: WatchLine): void {
    if (line.type !== 'ping') this.#lines.add(line);
  }

  async #applyBlocks(blocks: readonly string[]): Promise<void> {
    if (blocks.join(',') === this.#state.blocks.join(',')) return;
    this.#save({ ...this.#state, blocks: [...blocks] });
    this.#c.log.info('node blocks changed', { blocks });
    await this.#c.onBlocks(blocks);
  }

  /** Takes `state`, then writes it; a failed write is logged and retried (the state is applied anyway). */
  #save(state: ClusterState): void {
    this.#state = state;
    this.#file.save(state);
  }

  /** The pinned controller CA: from disk, or discovered from the first controller that presents the pinned one. */
  async #ca(): Promise<string> {
    if (this.#caPem !== undefined) return this.#caPem;
    if (existsSync(this.#init.caPath)) return readFileSync(this.#init.caPath, 'utf8');
    let lastErr: unknown;
    for (const url of this.#init.urls) {
      let pem: string;
      try {
        pem = await discoverPinnedCa(url, this.#init.caCertHash);
      } catch (err) {
        lastErr = err;
        continue;
      }
      this.#c.log.info('pinned the controller CA', { url, caCertHash: this.#init.caCertHash });
      try {
        writeFileDurably(this.#init.caPath, pem, { mode: 0o644 });
      } catch (cause) {
        // it was checked against the pin: used from memory, and discovered (checked) again after a restart
        this.#caPem = pem;
        const err = atollError('NODE_STATE_WRITE_FAILED', `cannot write the pinned controller CA ${this.#init.caPath}: ${(cause as Error).message}`, STATE_WRITE_FIX, cause);
        this.#c.log.warn('cannot keep the controller CA on disk; using it from memory (a restart discovers it again)', { code: err.code, err: err.message, fix: err.fix });
      }
      return pem;
    }
    throw lastErr;
  }
}
