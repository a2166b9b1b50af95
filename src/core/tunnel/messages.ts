/**
 * The tunnel's control protocol: every message agents and the relay exchange in control frames, and agents exchange
 * through the relay in relayed control frames (src/core/tunnel/frame.ts), as one discriminated union on `t`, with
 * the one decoder that turns a frame's JSON into a typed message. Pure: no I/O, no `node:` imports. docs/api.md
 * ("Tunnel control messages") lists them with their direction and fields.
 *
 * Which messages travel where (the frame kind is the channel):
 * - control frames, any stream: `ping`, `pong` (keepalive and round trip, answered by the stream itself);
 * - control frames, agent -> relay: `hello` (this is my relay stream), `circuit` (ask for a circuit);
 * - control frames, relay -> agent: `observed` (your address, my circuit port), `circuit-ready`, `circuit-refused`
 *   (answers to `circuit`), `circuit-join` (a peer asked for a circuit to you);
 * - relayed control frames, agent -> agent through the relay: `punch`, `punch-ack` (hole punching);
 * - control frames, agent -> agent on any tunnel stream of the pair (direct or a circuit): `udp-key`, `udp-key-ack`
 *   (the datagram path's keys and addresses, src/adapters/tunnel/datagram-keys.ts).
 *
 * Decoding validates every field a handler reads (types, port ranges, key pins, circuit tokens) and keeps only
 * those; keys it does not know are ignored. Whatever fails is an error: the stream that carried it is closed, as for
 * a framing error.
 */
import { AtollError, atollError } from '../errors.ts';

/**
 * Keepalive, sent every second on every stream; `at` is the sender's monotonic clock in ms. `quiet`: not to be
 * answered (each end's own pings keep the stream alive; one in ten asks for a pong, for the round trip).
 */
export interface PingMessage { readonly t: 'ping'; readonly at: number; readonly quiet?: true }
/** The answer to a ping, echoing its `at`: the round trip. */
export interface PongMessage { readonly t: 'pong'; readonly at: number }
/** Agent -> relay: this stream is the node's relay stream (not a short connection that only observes its address). */
export interface HelloMessage { readonly t: 'hello' }
/** Relay -> agent, on every connection: the address the connection came from, and where circuits join. */
export interface ObservedMessage { readonly t: 'observed'; readonly host: string; readonly port: number; readonly circuitPort: number }
/** Agent -> relay: a circuit to the node with key pin `to`, please; answered with nonce `n`. */
export interface CircuitRequest { readonly t: 'circuit'; readonly to: string; readonly n: string }
/** Relay -> agent: the circuit asked for with nonce `n`; join it with `token` (as the TLS client). */
export interface CircuitReady { readonly t: 'circuit-ready'; readonly n: string; readonly token: string }
/** Relay -> agent: no circuit for nonce `n` (the peer is not there or the pair may not be connected). */
export interface CircuitRefused { readonly t: 'circuit-refused'; readonly n: string; readonly reason: string }
/** Relay -> agent: the node with key pin `from` asked for a circuit to us; join it with `token` (as the TLS server). */
export interface CircuitJoin { readonly t: 'circuit-join'; readonly from: string; readonly token: string }
/** Agent -> agent (relayed), from the initiator: my public address for the punch; answer with nonce `n`. */
export interface PunchRequest { readonly t: 'punch'; readonly n: string; readonly host: string; readonly port: number }
/** Agent -> agent (relayed), the answer to punch `n`: my public address; both ends connect now. */
export interface PunchAck { readonly t: 'punch-ack'; readonly n: string; readonly host: string; readonly port: number }

/**
 * Agent -> agent, on a tunnel stream of the pair: I will send you datagrams under key `id`, derived from this stream's
 * TLS exported keying material and `salt` (32 hex digits); send yours to `host`:`port` (`host` '' for the address
 * this stream reaches me at). Answered with `udp-key-ack`; a new one rotates the key.
 */
export interface UdpKeyMessage { readonly t: 'udp-key'; readonly id: number; readonly salt: string; readonly host: string; readonly port: number }
/** Agent -> agent: key `id` is installed; datagrams under it are accepted from now on. */
export interface UdpKeyAck { readonly t: 'udp-key-ack'; readonly id: number }

/** What travels in control frames. */
export type ControlMessage = PingMessage | PongMessage | HelloMessage | ObservedMessage | CircuitRequest | CircuitReady | CircuitRefused | CircuitJoin
  | UdpKeyMessage | UdpKeyAck;
/** What travels in relayed control frames, between two agents. */
export type PeerMessage = PunchRequest | PunchAck;
/** Every message of the protocol. */
export type TunnelMessage = ControlMessage | PeerMessage;

/** The frame kind a message came in: a control frame, or a relayed control frame. */
export type MessageChannel = 'control' | 'relayed';
type MessageOn<C extends MessageChannel> = C extends 'control' ? ControlMessage : PeerMessage;

export type DecodeResult<T> = { readonly ok: true; readonly message: T } | { readonly ok: false; readonly error: AtollError };

const PIN = /^sha256:[0-9a-f]{64}$/;
const TOKEN = /^[0-9a-f]{32}$/;
const utf8 = new TextDecoder();

/**
 * The message in a control frame's payload (`channel` 'control') or in a relayed control frame's message bytes
 * ('relayed'). Never throws.
 * @returns the typed message, or an AtollError TUNNEL_MESSAGE_INVALID saying what is wrong (not JSON, not an object,
 *   a kind unknown on that channel, a missing or malformed field).
 */
export function decodeTunnelMessage<C extends MessageChannel>(payload: Uint8Array, channel: C): DecodeResult<MessageOn<C>> {
  let v: unknown;
  try {
    v = JSON.parse(utf8.decode(payload));
  } catch {
    return invalid(`a ${channel} frame is not JSON`);
  }
  if (typeof v !== 'object' || v === null || Array.isArray(v)) return invalid(`a ${channel} frame is not a JSON object`);
  const o = v as Record<string, unknown>;
  if (typeof o.t !== 'string') return invalid(`a ${channel} frame has no type`);
  const fields = new Fields(o);
  const message = channel === 'control' ? controlMessage(o.t, fields) : peerMessage(o.t, fields);
  if (message === undefined) return invalid(`${JSON.stringify(o.t)} is not a message kind of ${channel} frames`);
  if (fields.bad.length > 0) return invalid(`a ${JSON.stringify(o.t)} message has ${fields.bad.join(', ')}`);
  return { ok: true, message: message as MessageOn<C> };
}

function controlMessage(t: string, f: Fields): ControlMessage | undefined {
  switch (t) {
    case 'ping':
      return f.flag('quiet') ? { t, at: f.number('at'), quiet: true } : { t, at: f.number('at') };
    case 'pong':
      return { t, at: f.number('at') };
    case 'hello':
      return { t };
    case 'observed':
      return { t, host: f.string('host'), port: f.port('port'), circuitPort: f.port('circuitPort') };
    case 'circuit':
      return { t, to: f.pin('to'), n: f.string('n') };
    case 'circuit-ready':
      return { t, n: f.string('n'), token: f.token('token') };
    case 'circuit-refused':
      return { t, n: f.string('n'), reason: f.string('reason') };
    case 'circuit-join':
      return { t, from: f.pin('from'), token: f.token('token') };
    case 'udp-key':
      return { t, id: f.u32('id'), salt: f.salt('salt'), host: f.string('host'), port: f.port('port') };
    case 'udp-key-ack':
      return { t, id: f.u32('id') };
    default:
      return undefined;
  }
}

function peerMessage(t: string, f: Fields): PeerMessage | undefined {
  switch (t) {
    case 'punch':
    case 'punch-ack':
      return { t, n: f.string('n'), host: f.string('host'), port: f.port('port') };
    default:
      return undefined;
  }
}

/** Reads typed fields of a message, noting each one that is missing or malformed. */
class Fields {
  readonly bad: string[] = [];
  readonly #o: Record<string, unknown>;

  constructor(o: Record<string, unknown>) {
    this.#o = o;
  }

  number(key: string): number {
    return this.#check(key, 'a finite number', (v) => typeof v === 'number' && Number.isFinite(v)) as number;
  }

  /** An optional boolean: true only when present and true. */
  flag(key: string): boolean {
    return this.#check(key, 'true or false', (v) => v === undefined || typeof v === 'boolean') === true;
  }

  u32(key: string): number {
    return this.#check(key, 'an integer 0 to 4294967295', (v) => Number.isInteger(v) && (v as number) >= 0 && (v as number) <= 0xffff_ffff) as number;
  }

  string(key: string): string {
    return this.#check(key, 'a string', (v) => typeof v === 'string') as string;
  }

  port(key: string): number {
    return this.#check(key, 'a port (0 to 65535)', (v) => Number.isInteger(v) && (v as number) >= 0 && (v as number) <= 65_535) as number;
  }

  pin(key: string): string {
    return this.#check(key, 'a key pin (sha256:<64 hex digits>)', (v) => typeof v === 'string' && PIN.test(v)) as string;
  }

  token(key: string): string {
    return this.#check(key, 'a circuit token (32 hex digits)', (v) => typeof v === 'string' && TOKEN.test(v)) as string;
  }

  salt(key: string): string {
    return this.#check(key, 'a salt (32 hex digits)', (v) => typeof v === 'string' && TOKEN.test(v)) as string;
  }

  #check(key: string, what: string, ok: (v: unknown) => boolean): unknown {
    const v = this.#o[key];
    if (!ok(v)) this.bad.push(v === undefined ? `no ${key}` : `${key} ${JSON.stringify(v)}, not ${what}`);
    return v;
  }
}

function invalid(message: string): { ok: false; error: AtollError } {
  return {
    ok: false,
    error: atollError('TUNNEL_MESSAGE_INVALID', message, 'the far end speaks another tunnel protocol or is broken: run the same Atoll version on agents and relay'),
  };
}
