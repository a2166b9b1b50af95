/**
 * An edge node's control stream to the relay (src/relay/relay.ts) and what travels on it (docs/api.md, "Tunnel
 * control messages"): it keeps the stream dialled, learns the relay's circuit port, asks for circuits and answers
 * circuit offers, carries punching messages to and from peers, and learns this node's public address for a fresh
 * local port (a short second connection the relay answers with `observed`). Requests carry a nonce and are answered
 * within {@link ASK_TIMEOUT_MS} or fail.
 */
import { type AtollError, atollError } from '../core/errors.ts';
import type { Logger } from '../core/ports.ts';
import { peerIdOfPin, pinOfPeerId } from '../core/tunnel/frame.ts';
import type { CircuitReady, CircuitRefused, ControlMessage, PeerMessage, PunchAck, PunchRequest } from '../core/tunnel/messages.ts';
import type { TunnelCredentials } from '../adapters/tunnel/tunnel-credentials.ts';
import { dialTunnel, joinCircuit } from '../adapters/tunnel/tunnel-dial.ts';
import type { TunnelStream } from '../adapters/tunnel/tunnel-stream.ts';
import { keepDialled } from './keep-dialled.ts';

/** A request to the relay or, through it, to a peer is answered within this long, or it failed. */
const ASK_TIMEOUT_MS = 5000;
/** The relay carries every relayed pair and coordinates punching: an edge retries it at least this often. */
const RELAY_RETRY_MAX_MS = 5000;

/** Where the relay listens and the pin its key must have (`tunnel.relay` of the agent's configuration). */
export interface RelayAddress {
  readonly host: string;
  readonly port: number;
  readonly pin: string;
}

export interface RelayControlComponents {
  readonly log: Logger;
  /** Whether the agent with this key pin is a punch peer of the plan: messages the relay relays from others are dropped. */
  readonly isPunchPeer: (pin: string) => boolean;
  /** A punch peer asks us to punch (we are not the initiator). */
  readonly onPunch: (fromPin: string, msg: PunchRequest) => void;
  /** A punch peer asked the relay for a circuit to us: join it as the TLS server with `token`. */
  readonly onCircuitJoin: (fromPin: string, token: string) => void;
}

export interface RelayControlInit {
  readonly relay: RelayAddress;
  readonly credentials: TunnelCredentials;
  readonly retryMinMs?: number;
  readonly retryMaxMs?: number;
}

/** Our public address for a local port, as the relay saw a connection from it. */
export interface Observed {
  readonly localPort: number;
  readonly host: string;
  readonly port: number;
}

export class RelayControl {
  readonly #c: RelayControlComponents;
  readonly #init: RelayControlInit;
  #stream: TunnelStream | undefined;
  /** The relay's circuit port, as its `observed` message says. */
  #circuitPort: number | undefined;
  /** Our public address as the relay sees our control stream ('' until it said). */
  #publicHost = '';
  /** Answers awaited, by nonce: from the relay (circuit-ready, circuit-refused) and from peers (punch-ack). */
  readonly #circuitAnswers = new Map<string, (msg: CircuitReady | CircuitRefused) => void>();
  readonly #punchAnswers = new Map<string, (msg: PunchAck) => void>();

  constructor(components: RelayControlComponents, init: RelayControlInit) {
    this.#c = components;
    this.#init = init;
  }

  /** The control stream while it is up. */
  get stream(): TunnelStream | undefined {
    return this.#stream;
  }

  /** Whether circuits can be asked for and joined: the stream is up and the relay said its circuit port. */
  get circuitsReady(): boolean {
    return this.#stream !== undefined && this.#circuitPort !== undefined;
  }

  /** Our public host as the relay observed it on our control stream, '' until it said (the datagram path's address). */
  get publicHost(): string {
    return this.#publicHost;
  }

  /** The relay's address, whether its stream is up, and its round trip, for `atoll peers`. */
  status(): { address: string; connected: boolean; rttMs: number | undefined } {
    const { host, port } = this.#init.relay;
    return { address: `${host}:${port}`, connected: this.#stream?.alive ?? false, rttMs: this.#stream?.rttMs };
  }

  /** The relay's host:port, for messages. */
  get #relayAddress(): string {
    return `${this.#init.relay.host}:${this.#init.relay.port}`;
  }

  /** Keeps the control stream to the relay up until `signal` aborts (reconnecting with backoff up to 5 s). */
  run(signal: AbortSignal): Promise<void> {
    const { relay, credentials } = this.#init;
    const where = `${relay.host}:${relay.port}`;
    const backoff = { minMs: this.#init.retryMinMs ?? 500, maxMs: Math.min(RELAY_RETRY_MAX_MS, this.#init.retryMaxMs ?? RELAY_RETRY_MAX_MS) };
    return keepDialled(this.#c.log, { label: { what: 'relay', relay: where }, to: relay, credentials, backoff }, signal, (stream) => {
      stream.sendControl({ t: 'hello' });
      this.#stream = stream;
      stream.on('control', (msg: ControlMessage) => this.#onControl(msg));
      stream.on('relayed-control', (id: Uint8Array, msg: PeerMessage) => this.#onRelayed(pinOfPeerId(id), msg));
      this.#c.log.info('relay stream up', { relay: where });
      return () => {
        this.#stream = undefined;
        if (!signal.aborted) this.#c.log.warn('relay stream closed; reconnecting', { relay: where });
      };
    });
  }

  /** The relay's own messages: its circuit port, answers to our circuit requests, and circuits peers asked for. */
  #onControl(msg: ControlMessage): void {
    if (msg.t === 'observed') {
      this.#circuitPort = msg.circuitPort;
      this.#publicHost = msg.host;
    }
    else if (msg.t === 'circuit-ready' || msg.t === 'circuit-refused') this.#circuitAnswers.get(msg.n)?.(msg);
    else if (msg.t === 'circuit-join') this.#c.onCircuitJoin(msg.from, msg.token);
  }

  #onRelayed(fromPin: string, msg: PeerMessage): void {
    if (!this.#c.isPunchPeer(fromPin)) return; // not (or no longer) a peer we may reach: the relay should not have sent it
    if (msg.t === 'punch-ack') this.#punchAnswers.get(msg.n)?.(msg);
    else this.#c.onPunch(fromPin, msg);
  }

  /** Asks the relay, on `stream`, for a circuit to the peer `toPin`. @throws when the relay does not answer in time. */
  askCircuit(stream: TunnelStream, toPin: string): Promise<CircuitReady | CircuitRefused> {
    return this.#ask(this.#circuitAnswers, (n) => stream.sendControl({ t: 'circuit', to: toPin, n }), () => atollError('TUNNEL_UNREACHABLE',
      `the relay ${this.#relayAddress} did not answer the circuit request within ${ASK_TIMEOUT_MS / 1000} s`, 'the agent asks again with backoff; check that the relay runs and is not overloaded'));
  }

  /**
   * Sends our public address to the peer `peerPin` through the relay, on `stream`. @throws when it does not answer in
   * time; TUNNEL_PIN_INVALID (before anything is sent or awaited) when `peerPin` is not a pin.
   */
  askPunch(stream: TunnelStream, peerPin: string, me: Observed): Promise<PunchAck> {
    // the id first: a throw from inside #ask's send would leave its timer to reject a promise nobody holds
    const peerId = peerIdOfPin(peerPin);
    return this.#ask(this.#punchAnswers, (n) => stream.sendRelayedControl(peerId, { t: 'punch', n, host: me.host, port: me.port }),
      () => atollError('TUNNEL_PUNCH_FAILED', `the peer ${peerPin} did not answer the punch request through the relay within ${ASK_TIMEOUT_MS / 1000} s`,
        'the relay carries the pair meanwhile and punching is retried with backoff; check that the peer\'s agent runs and is connected to the relay'));
  }

  /** Answers the punch request `n` of the peer `peerPin` with our public address (dropped while the stream is down). */
  answerPunch(peerPin: string, n: string, me: Observed): void {
    this.#stream?.sendRelayedControl(peerIdOfPin(peerPin), { t: 'punch-ack', n, host: me.host, port: me.port });
  }

  /**
   * Our end of a circuit offered with `token`, to the peer `peerPin`, at the relay's circuit port.
   * @throws when the relay has not said its circuit port yet, or as joinCircuit does.
   */
  joinCircuit(token: string, peerPin: string, tlsRole: 'client' | 'server', signal?: AbortSignal): Promise<TunnelStream> {
    // cannot happen: callers check circuitsReady first, and the circuit port, once the relay said it, is kept
    if (this.#circuitPort === undefined) return Promise.reject(new Error('the relay has not said its circuit port yet'));
    return joinCircuit({ host: this.#init.relay.host, port: this.#circuitPort, token, credentials: this.#init.credentials, peerPin, tlsRole, ...(signal ? { signal } : {}) });
  }

  /** Sends a request with a fresh nonce `n` (`send`) and waits (bounded) for the answer in `answers` carrying that nonce. */
  #ask<A>(answers: Map<string, (msg: A) => void>, send: (n: string) => void, timedOut: () => AtollError): Promise<A> {
    const n = Math.random().toString(16).slice(2, 14);
    const answered = new Promise<A>((resolve, reject) => {
      const t = setTimeout(() => {
        answers.delete(n);
        reject(timedOut());
      }, ASK_TIMEOUT_MS);
      answers.set(n, (m) => {
        clearTimeout(t);
        answers.delete(n);
        resolve(m);
      });
    });
    send(n);
    return answered;
  }

  /**
   * Our public address for a fresh local port, as the relay sees it: a short connection from that port. Under an
   * endpoint-independent NAT the peer can reach us there from now on (once we send to it). Three ports are tried.
   */
  async observe(): Promise<Observed> {
    const { relay, credentials } = this.#init;
    let last: unknown;
    for (let i = 0; i < 3; i++) {
      const localPort = 20_000 + Math.floor(Math.random() * 40_000);
      try {
        const stream = await dialTunnel({ host: relay.host, port: relay.port, credentials, peerPin: relay.pin, timeoutMs: 3000, localPort });
        try {
          const msg = await new Promise<ControlMessage>((resolve, reject) => {
            const t = setTimeout(() => reject(atollError('TUNNEL_UNREACHABLE', `the relay ${this.#relayAddress} did not say our address within 3 s`,
              'hole punching is retried with backoff (the relay carries the pair meanwhile); check that the relay runs')), 3000);
            stream.once('control', (m: ControlMessage) => {
              clearTimeout(t);
              resolve(m);
            });
          });
          if (msg.t !== 'observed') {
            throw atollError('TUNNEL_MESSAGE_INVALID', `the relay ${this.#relayAddress} answered a new connection with ${msg.t}, not observed`,
              'run the same Atoll version on the agents and the relay');
          }
          return { localPort, host: msg.host, port: msg.port };
        } finally {
          stream.close();
        }
      } catch (err) {
        last = err;
      }
    }
    throw last;
  }
}
