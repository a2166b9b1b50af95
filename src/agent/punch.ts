/**
 * Hole punching for an edge node's punch peers (DCUtR's idea over TCP simultaneous open): the initiator (the name
 * sorting first) learns its public address for a fresh local port from the relay, sends it to the peer through the
 * relay (`punch`); the peer does the same and answers (`punch-ack`); both then connect to each other's public
 * address from those ports until one TCP connection comes up through both NATs, and run TLS on it with both keys
 * pinned (the initiator as TLS client). A failed punch (symmetric NAT) is retried with backoff up to
 * {@link PUNCH_RETRY_MAX_MS}; the circuits carry the pair meanwhile (src/agent/tunnel-circuits.ts).
 */
import { AtollError } from '../core/errors.ts';
import type { Logger } from '../core/ports.ts';
import { Backoff } from '../core/retry.ts';
import type { TunnelPeerPlan } from '../core/tunnel/plan.ts';
import type { PunchRequest } from '../core/tunnel/messages.ts';
import { sleep } from '../adapters/timers.ts';
import type { TunnelCredentials } from '../adapters/tunnel/tunnel-credentials.ts';
import { punchTunnel } from '../adapters/tunnel/tunnel-dial.ts';
import type { TunnelStream } from '../adapters/tunnel/tunnel-stream.ts';
import type { RelayControl } from './relay-control.ts';
import { untilClosed } from './keep-dialled.ts';

/**
 * A punched stream is declared dead after 3 s without a byte from the peer (its keepalives come every second whatever
 * our send queue holds), so a broken direct path falls back to the relay within about 3 s. Streams without a
 * fallback keep the longer default: a short cut then costs nothing.
 */
const PUNCHED_STREAM = { deadAfterMs: 3000 } as const;
/** One hole-punching attempt: both ends connecting to each other until this deadline. */
const PUNCH_TIMEOUT_MS = 5000;
const PUNCH_RETRY_MIN_MS = 2000;
/** A pair that cannot punch (symmetric NAT) tries again this often at most; meanwhile the relay carries it. */
const PUNCH_RETRY_MAX_MS = 60_000;
/** After a direct stream closed, wait this long before punching again (the relay carries packets meanwhile). */
const PUNCH_AFTER_CLOSE_MS = 1000;
/** While the relay stream is down, look again this often. */
const RELAY_WAIT_MS = 500;

/** Punching counts of one peer, for `atoll peers`. */
export interface PunchState {
  attempts: number;
  successes: number;
  lastError: string;
}

export interface PuncherComponents {
  readonly log: Logger;
  readonly relay: RelayControl;
  /** The peer's direct stream while it is up. */
  readonly directOf: (name: string) => TunnelStream | undefined;
  /** Whether `name` is still a peer of the plan. */
  readonly inPlan: (name: string) => boolean;
  /** Makes `stream` the peer's direct path. */
  readonly attach: (peer: TunnelPeerPlan, stream: TunnelStream) => void;
}

export interface PuncherInit {
  readonly credentials: TunnelCredentials;
  /** How long one hole-punching attempt may take. */
  readonly punchTimeoutMs?: number;
}

export class Puncher {
  readonly #c: PuncherComponents;
  readonly #init: PuncherInit;
  readonly #states = new Map<string, PunchState>();

  constructor(components: PuncherComponents, init: PuncherInit) {
    this.#c = components;
    this.#init = init;
  }

  /** The punching counts of peer `name`, once it was tried. */
  stateOf(name: string): PunchState | undefined {
    return this.#states.get(name);
  }

  #state(name: string): PunchState {
    let st = this.#states.get(name);
    if (!st) this.#states.set(name, (st = { attempts: 0, successes: 0, lastError: '' }));
    return st;
  }

  /** The initiator's side, until `signal` aborts: while the peer has no direct stream, punch (through the relay's help), with backoff. */
  async initiate(peer: TunnelPeerPlan, signal: AbortSignal): Promise<void> {
    const backoff = new Backoff({ minMs: PUNCH_RETRY_MIN_MS, maxMs: PUNCH_RETRY_MAX_MS }, sleep);
    while (!signal.aborted) {
      const direct = this.#c.directOf(peer.name);
      if (direct) {
        await untilClosed(direct, signal);
        backoff.reset();
        await sleep(PUNCH_AFTER_CLOSE_MS, signal);
        continue;
      }
      const relay = this.#c.relay.stream;
      if (!relay) {
        await sleep(RELAY_WAIT_MS, signal);
        continue;
      }
      const st = this.#state(peer.name);
      st.attempts++;
      try {
        const me = await this.#c.relay.observe();
        const ack = await this.#c.relay.askPunch(relay, peer.pin, me);
        await this.#punchTo(peer, { host: ack.host, port: ack.port }, me.localPort, 'client', signal);
      } catch (err) {
        const message = err instanceof Error ? err.message : String(err);
        if (message !== st.lastError) {
          this.#c.log.info('hole punching failed; the relay carries the traffic meanwhile', { peer: peer.name, err: message, ...(err instanceof AtollError ? { code: err.code } : {}), retryInMs: backoff.delayMs });
        }
        st.lastError = message;
        await backoff.wait(signal);
      }
    }
  }

  /** The responder's side of a punch request: learn our public address, answer, and connect at the same time. */
  async answer(peer: TunnelPeerPlan, msg: PunchRequest, stopped: AbortSignal): Promise<void> {
    const st = this.#state(peer.name);
    st.attempts++;
    try {
      const me = await this.#c.relay.observe();
      this.#c.relay.answerPunch(peer.pin, msg.n, me);
      await this.#punchTo(peer, { host: msg.host, port: msg.port }, me.localPort, 'server', stopped);
    } catch (err) {
      st.lastError = err instanceof Error ? err.message : String(err);
    }
  }

  /**
   * Connects to `peer` at its public address from `localPort` (both ends at once), and on success makes the stream
   * the peer's direct path, unless we stopped or the peer left the plan meanwhile. @throws when punching failed.
   */
  async #punchTo(peer: TunnelPeerPlan, at: { host: string; port: number }, localPort: number, tlsRole: 'client' | 'server', signal: AbortSignal): Promise<void> {
    const stream = await punchTunnel({
      ...at, localPort, credentials: this.#init.credentials, peerPin: peer.pin, tlsRole, deadlineMs: this.#init.punchTimeoutMs ?? PUNCH_TIMEOUT_MS, streamOptions: PUNCHED_STREAM, signal,
    });
    if (signal.aborted || !this.#c.inPlan(peer.name)) {
      stream.close();
      return;
    }
    const st = this.#state(peer.name);
    st.successes++;
    st.lastError = '';
    this.#c.attach(peer, stream);
  }
}
