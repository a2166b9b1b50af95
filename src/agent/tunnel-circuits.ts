/**
 * Circuits for an edge node's punch peers (src/relay/circuits.ts): each end asks the relay for a circuit to the other
 * and receives on it as the TLS client (its reads then need no buffer allocation); the circuit the peer asked for is
 * joined as the TLS server, and we send on it. Ours is kept while the pair has no direct stream and closed a little
 * after a direct stream took over; a failed one is asked for again with backoff.
 */
import { AtollError, atollError } from '../core/errors.ts';
import type { Logger } from '../core/ports.ts';
import { Backoff, pollUntil } from '../core/retry.ts';
import type { TunnelPeerPlan } from '../core/tunnel/plan.ts';
import { monotonicClock, sleep } from '../adapters/timers.ts';
import type { StreamKind } from '../adapters/tunnel/tunnel-endpoint.ts';
import type { TunnelStream } from '../adapters/tunnel/tunnel-stream.ts';
import type { RelayControl } from './relay-control.ts';
import { untilClosed } from './keep-dialled.ts';

/** A circuit that failed is asked for again after this long, doubling up to CIRCUIT_RETRY_MAX_MS. */
const CIRCUIT_RETRY_MIN_MS = 250;
const CIRCUIT_RETRY_MAX_MS = 5000;
/** How often a circuit's keeper looks whether a direct stream took over... */
const CIRCUIT_CHECK_MS = 250;
/** ...and how long the circuit stays after that, for the packets already on it. */
const CIRCUIT_LINGER_MS = 2000;
/** While the relay stream is down (or has not said its circuit port), look again this often. */
const RELAY_WAIT_MS = 200;

export interface TunnelCircuitsComponents {
  readonly log: Logger;
  readonly relay: RelayControl;
  /** The peer's direct stream while it is up. */
  readonly directOf: (name: string) => TunnelStream | undefined;
  /** The punch peer of the plan with this key pin, if any. */
  readonly punchPeerOf: (pin: string) => TunnelPeerPlan | undefined;
  /** Whether `name` is still a peer of the plan. */
  readonly inPlan: (name: string) => boolean;
  /** Makes `stream` one of the peer's paths. */
  readonly attach: (peer: TunnelPeerPlan, stream: TunnelStream, kind: StreamKind) => void;
}

export class TunnelCircuits {
  readonly #c: TunnelCircuitsComponents;

  constructor(components: TunnelCircuitsComponents) {
    this.#c = components;
  }

  /**
   * Our circuit to a punch peer (we receive on it), until `signal` aborts: while the pair has no direct stream, keep
   * one through the relay (ask, join as the TLS client, wait for it to close); a little after a direct stream took
   * over, close it.
   */
  async keep(peer: TunnelPeerPlan, signal: AbortSignal): Promise<void> {
    const relay = this.#c.relay;
    const backoff = new Backoff({ minMs: CIRCUIT_RETRY_MIN_MS, maxMs: CIRCUIT_RETRY_MAX_MS }, sleep);
    let lastError = '';
    while (!signal.aborted) {
      const direct = this.#c.directOf(peer.name);
      if (direct) {
        await untilClosed(direct, signal);
        continue;
      }
      const stream = relay.stream;
      if (!stream || !relay.circuitsReady) {
        await sleep(RELAY_WAIT_MS, signal);
        continue;
      }
      try {
        const answer = await relay.askCircuit(stream, peer.pin);
        if (answer.t === 'circuit-refused') {
          throw atollError('TUNNEL_UNREACHABLE', `the relay refused a circuit to ${peer.name}: ${answer.reason}`,
            'the relay joins only pairs it may connect (one community, or a cloud node) whose ends are both on it: check the peer\'s agent runs and the nodes\' community labels');
        }
        const circuit = await relay.joinCircuit(answer.token, peer.pin, 'client', signal);
        if (signal.aborted) {
          circuit.close();
          return;
        }
        this.#c.attach(peer, circuit, 'circuitIn');
        backoff.reset();
        lastError = '';
        await pollUntil(() => !circuit.alive || this.#c.directOf(peer.name) !== undefined, { intervalMs: CIRCUIT_CHECK_MS, signal }, { clock: monotonicClock, sleep });
        if (circuit.alive) {
          await sleep(CIRCUIT_LINGER_MS, signal); // packets in flight on it still arrive
          circuit.close();
        }
      } catch (err) {
        if (signal.aborted) return; // stopped mid-join: not a failure
        const message = err instanceof Error ? err.message : String(err);
        if (message !== lastError) {
          this.#c.log.warn('circuit through the relay failed; retrying with backoff', { peer: peer.name, err: message, ...(err instanceof AtollError ? { code: err.code } : {}), retryInMs: backoff.delayMs });
        }
        lastError = message;
        await backoff.wait(signal);
      }
    }
  }

  /** A circuit the peer `fromPin` asked for (it receives on it, we send): join it as the TLS server, unless `stopped`. */
  async join(fromPin: string, token: string, stopped: AbortSignal): Promise<void> {
    const peer = this.#c.punchPeerOf(fromPin);
    if (!peer || !this.#c.relay.circuitsReady) return;
    try {
      const circuit = await this.#c.relay.joinCircuit(token, peer.pin, 'server', stopped);
      if (stopped.aborted || !this.#c.inPlan(peer.name)) {
        circuit.close();
        return;
      }
      this.#c.attach(peer, circuit, 'circuitOut');
    } catch (err) {
      if (stopped.aborted) return;
      this.#c.log.warn('joining a circuit through the relay failed; the peer asks again', { peer: peer.name, err: err instanceof Error ? err.message : String(err) });
    }
  }
}
