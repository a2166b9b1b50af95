/**
 * Opening tunnel streams (src/adapters/tunnel/tunnel-stream.ts): dialling a peer's or the relay's listener, hole punching by
 * TCP simultaneous open, joining a circuit through the relay, and listening for peers. Each checks the far end's key
 * against its pin before anything is sent, and hands over a {@link TunnelStream} or rejects with an AtollError naming
 * the address.
 */
import { type AddressInfo, connect as netConnect, type Socket } from 'node:net';
import { createSecureContext, createServer, type SecureContext, type Server, TLSSocket, type TLSSocketOptions } from 'node:tls';
import { atollError } from '../../core/errors.ts';
import { circuitServerName } from '../../core/tunnel/circuit.ts';
import { pollUntil } from '../../core/retry.ts';
import { spkiPin } from '../pki.ts';
import { monotonicClock, sleep } from '../timers.ts';
import type { TunnelCredentials } from './tunnel-credentials.ts';
import { ReadTap, TunnelStream, type TunnelStreamOptions } from './tunnel-stream.ts';

const TLS_BASE = {
  minVersion: 'TLSv1.3',
  maxVersion: 'TLSv1.3',
  // AES-GCM first: AES-NI makes it the fastest suite on servers and most edge CPUs.
  ciphers: 'TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256',
} as const;

/**
 * Our end's TLS context (key, certificate, TLS 1.3, the suites), one per credentials: every dial, punch attempt and
 * circuit would otherwise parse the key and certificate into a context of its own (behind a symmetric NAT the punch
 * is retried for each peer every minute, each attempt a relay connection and a punch socket).
 */
const contexts = new WeakMap<TunnelCredentials, SecureContext>();

function contextOf(credentials: TunnelCredentials): SecureContext {
  let ctx = contexts.get(credentials);
  if (!ctx) {
    ctx = createSecureContext({ ...TLS_BASE, key: credentials.keyPem, cert: credentials.certPem });
    contexts.set(credentials, ctx);
  }
  return ctx;
}

const unreachable = (message: string, cause?: unknown) =>
  atollError('TUNNEL_UNREACHABLE', message, 'the agent retries with backoff; check that the far end runs and its port is reachable', cause);
/** A dial given up because its caller stopped (the agent stopping, the peer's loop restarted). */
const aborted = (what: string) => atollError('TUNNEL_UNREACHABLE', `${what}: given up, the dial was stopped`, 'nothing to do: the agent or the peer\'s loop stopped it');
const untrusted = (message: string) =>
  atollError('TUNNEL_PEER_UNTRUSTED', message, "check the far end's key: a node's tunnelKey in the registry, or the relay's pin in tunnel.relay.pin");

function peerPinOf(socket: TLSSocket): string | undefined {
  const cert = socket.getPeerX509Certificate();
  return cert ? spkiPin(cert.toString()) : undefined;
}

export interface DialTunnelOptions {
  readonly host: string;
  readonly port: number;
  readonly credentials: TunnelCredentials;
  /** The pin (`sha256:<hex>`) the peer's key must have; anything else is refused. */
  readonly peerPin: string;
  readonly timeoutMs?: number;
  /** Bind the connection to this local port (hole punching observes and reuses it). */
  readonly localPort?: number;
  readonly streamOptions?: TunnelStreamOptions;
  /** Gives up at once when it aborts (the agent stopping): a dial in flight does not hold the process. */
  readonly signal?: AbortSignal;
}

/**
 * Connects to a peer's tunnel listener and checks its key against `peerPin` before anything is sent.
 * Rejects with an AtollError naming the address: TUNNEL_UNREACHABLE when the connection or handshake fails or times
 * out, TUNNEL_PEER_UNTRUSTED when the key differs from the pin.
 */
export function dialTunnel(opts: DialTunnelOptions): Promise<TunnelStream> {
  const tap = new ReadTap();
  const socket = tap.connect({
    ...tlsOptionsOf(opts.credentials), host: opts.host, port: opts.port, checkServerIdentity: () => undefined, ...(opts.localPort ? { localPort: opts.localPort } : {}),
  });
  return pinnedHandshake(socket, 'secureConnect', `tunnel to ${opts.host}:${opts.port}`, opts.peerPin, opts.timeoutMs ?? 10_000, opts.streamOptions, tap, opts.signal);
}

/**
 * Waits (bounded) for the TLS handshake of `tls` to finish (`event`: 'secureConnect' for a client, 'secure' for a
 * server) and checks the peer's key against `peerPin` before anything is sent; the stream on success.
 * @throws AtollError TUNNEL_UNREACHABLE (failed, timed out or `signal` aborted), TUNNEL_PEER_UNTRUSTED (another key).
 */
function pinnedHandshake(tls: TLSSocket, event: 'secureConnect' | 'secure', what: string, peerPin: string, timeoutMs: number,
  streamOptions: TunnelStreamOptions | undefined, tap?: ReadTap, signal?: AbortSignal): Promise<TunnelStream> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => fail(unreachable(`${what}: no TLS handshake within ${timeoutMs} ms`)), timeoutMs);
    const onAbort = () => fail(aborted(what));
    const fail = (err: Error) => {
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
      tls.destroy();
      reject(err);
    };
    if (signal?.aborted) return fail(aborted(what));
    signal?.addEventListener('abort', onAbort, { once: true });
    tls.once('error', (err) => fail(unreachable(`${what} failed: ${err.message}`, err)));
    tls.once(event, () => {
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
      const pin = peerPinOf(tls);
      if (pin !== peerPin) {
        fail(untrusted(`${what}: the peer's key ${pin ?? '(none)'} is not the pinned ${peerPin}; refused`));
        return;
      }
      tls.removeAllListeners('error');
      resolve(new TunnelStream(tls, pin, streamOptions, tap));
    });
  });
}

export interface PunchTunnelOptions {
  /** The peer's address as the relay observed it (its NAT's public side). */
  readonly host: string;
  readonly port: number;
  /** Our local port whose public mapping the peer was told (observed through the relay). */
  readonly localPort: number;
  readonly credentials: TunnelCredentials;
  readonly peerPin: string;
  /** Which end runs TLS as the client: the initiator; the other end is the TLS server. */
  readonly tlsRole: 'client' | 'server';
  /** Give up after this long. */
  readonly deadlineMs: number;
  readonly streamOptions?: TunnelStreamOptions;
  /** Gives up at once when it aborts. */
  readonly signal?: AbortSignal;
}

/** Pause between connection attempts while punching (a refused or reset attempt is retried until the deadline). */
const PUNCH_RETRY_MS = 150;

/**
 * TCP hole punching by simultaneous open: both ends connect to each other's observed public address from the local
 * port that mapping belongs to, at about the same time, so each NAT has seen an outgoing SYN before the other's
 * arrives. Attempts the far NAT refuses or resets (its mapping not there yet) are repeated until `deadlineMs`. The
 * one TCP connection that results carries TLS 1.3 with both keys pinned, as any tunnel stream.
 * Rejects when no connection comes up in time (a symmetric NAT: the peer's mapping for us is not the observed one).
 */
export async function punchTunnel(opts: PunchTunnelOptions): Promise<TunnelStream> {
  const where = `${opts.host}:${opts.port}`;
  const deadline = performance.now() + opts.deadlineMs;
  let last = 'no attempt';
  let stream: TunnelStream | undefined;
  const attempt = () => new Promise<TunnelStream | undefined>((resolve) => {
    const tap = new ReadTap();
    const tls = punchSocket(opts, tap);
    // neither is thrown: `failed` keeps only the message, as the last attempt's outcome in TUNNEL_PUNCH_FAILED below
    const timer = setTimeout(() => failed(new Error('timed out')), Math.max(1, deadline - performance.now()));
    const onAbort = () => failed(new Error('aborted'));
    const failed = (err: Error) => {
      clearTimeout(timer);
      opts.signal?.removeEventListener('abort', onAbort);
      last = err.message;
      tls.destroy();
      resolve(undefined);
    };
    opts.signal?.addEventListener('abort', onAbort, { once: true });
    tls.once('error', failed);
    tls.once('connect', () => {
      clearTimeout(timer);
      opts.signal?.removeEventListener('abort', onAbort);
      tls.off('error', failed);
      const client = opts.tlsRole === 'client';
      resolve(pinnedHandshake(tls, client ? 'secureConnect' : 'secure', `punched tunnel to ${where}`, opts.peerPin,
        Math.max(1000, deadline - performance.now()), opts.streamOptions, tap, opts.signal));
    });
  });
  // no attempt starts after the deadline, or once aborted
  await pollUntil(async () => opts.signal?.aborted === true || (performance.now() < deadline && (stream = await attempt()) !== undefined),
    { intervalMs: PUNCH_RETRY_MS, timeoutMs: opts.deadlineMs }, { clock: monotonicClock, sleep });
  if (opts.signal?.aborted) throw aborted(`hole punching to ${where}`);
  if (stream) return stream;
  throw atollError('TUNNEL_PUNCH_FAILED', `hole punching to ${where} from local port ${opts.localPort} failed within ${opts.deadlineMs} ms (${last})`,
    'nothing to do behind a symmetric NAT: the relay carries the pair; punching is retried with backoff');
}

/**
 * One connection attempt of a punch: a TLS socket in the given role that opens the TCP connection itself (so its
 * reads go through `tap`), from the observed local port to the peer's observed address.
 */
function punchSocket(opts: PunchTunnelOptions, tap: ReadTap): TLSSocket {
  const tlsOpts = tlsOptionsOf(opts.credentials);
  const to = { host: opts.host, port: opts.port, localPort: opts.localPort };
  if (opts.tlsRole === 'client') return tap.connect({ ...tlsOpts, ...to, checkServerIdentity: () => undefined });
  // a TLS server that dials: Node's TLSSocket takes `onread` when it has no socket yet, and connects like net.Socket
  const server = new TLSSocket(undefined as unknown as Socket, {
    ...tlsOpts, isServer: true, requestCert: true, onread: tap.onread,
  } as TLSSocketOptions);
  return server.connect(to);
}

/** TLS options of our end of a stream: our context (key and certificate); the peer's key is checked against its pin after. */
function tlsOptionsOf(credentials: TunnelCredentials) {
  return { secureContext: contextOf(credentials), rejectUnauthorized: false };
}

export interface JoinCircuitOptions {
  /** The relay's circuit port (it says which in its `observed` message). */
  readonly host: string;
  readonly port: number;
  /** Our end's one-time token, from the relay's offer. */
  readonly token: string;
  readonly credentials: TunnelCredentials;
  /** The peer at the other end: its key is pinned end to end, the relay only joins bytes. */
  readonly peerPin: string;
  /** The end that asked for the circuit runs TLS as the client (and receives on it), the other as the server. */
  readonly tlsRole: 'client' | 'server';
  readonly timeoutMs?: number;
  readonly streamOptions?: TunnelStreamOptions;
  /** Gives up at once when it aborts. */
  readonly signal?: AbortSignal;
}

/**
 * Our end of a circuit through the relay (src/relay/circuits.ts): a TCP connection to the relay's circuit port, the
 * token, then TLS 1.3 end to end with the peer, its key pinned; the relay sees only ciphertext. The TLS client end
 * sends its token as the server name of its ClientHello, so Node opens the connection and its reads go through a
 * ReadTap; the server end sends a token line first, over a socket we open (its reads use Node's own buffers: that
 * end of a circuit is the one that sends, see src/agent/tunnel-circuits.ts). Rejects as {@link dialTunnel} does.
 */
export function joinCircuit(opts: JoinCircuitOptions): Promise<TunnelStream> {
  const what = `circuit through ${opts.host}:${opts.port} to ${opts.peerPin.slice(0, 19)}...`;
  const timeoutMs = opts.timeoutMs ?? 10_000;
  if (opts.tlsRole === 'client') {
    const tap = new ReadTap();
    const tls = tap.connect({
      ...tlsOptionsOf(opts.credentials), host: opts.host, port: opts.port, servername: circuitServerName(opts.token),
      checkServerIdentity: () => undefined,
    });
    return pinnedHandshake(tls, 'secureConnect', what, opts.peerPin, timeoutMs, opts.streamOptions, tap, opts.signal);
  }
  return new Promise((resolve, reject) => {
    const socket = netConnect({ host: opts.host, port: opts.port });
    const fail = (err: Error) => {
      clearTimeout(timer);
      opts.signal?.removeEventListener('abort', onAbort);
      socket.destroy();
      reject(err);
    };
    const timer = setTimeout(() => fail(unreachable(`${what}: no connection within ${timeoutMs} ms`)), timeoutMs);
    const onAbort = () => fail(aborted(what));
    if (opts.signal?.aborted) return fail(aborted(what));
    opts.signal?.addEventListener('abort', onAbort, { once: true });
    socket.once('error', (err) => fail(unreachable(`${what} failed: ${err.message}`, err)));
    socket.once('connect', () => {
      clearTimeout(timer);
      opts.signal?.removeEventListener('abort', onAbort);
      socket.removeAllListeners('error');
      socket.setNoDelay(true);
      socket.write(`${opts.token}\n`);
      const tls = new TLSSocket(socket, { ...tlsOptionsOf(opts.credentials), isServer: true, requestCert: true });
      resolve(pinnedHandshake(tls, 'secure', what, opts.peerPin, timeoutMs, opts.streamOptions, undefined, opts.signal));
    });
  });
}

export interface ListenTunnelOptions {
  readonly host: string;
  /** 0 for any free port (see the returned address). */
  readonly port: number;
  readonly credentials: TunnelCredentials;
  /** Whether a peer with this pin may connect (a registered peer's tunnel key). */
  readonly acceptPin: (pin: string) => boolean;
  /** A pinned peer connected. */
  readonly onStream: (stream: TunnelStream) => void;
  /** A connection was refused (unknown key, no certificate, failed handshake). */
  readonly onRefused?: (reason: string) => void;
  readonly streamOptions?: TunnelStreamOptions;
}

/** Listens for peers' tunnel streams, accepting only clients whose key is pinned by `acceptPin`. */
export async function listenTunnel(opts: ListenTunnelOptions): Promise<{ server: Server; port: number }> {
  const server = createServer({
    ...TLS_BASE, key: opts.credentials.keyPem, cert: opts.credentials.certPem, requestCert: true, rejectUnauthorized: false,
    handshakeTimeout: 10_000,
  });
  server.on('secureConnection', (socket: TLSSocket) => {
    const pin = peerPinOf(socket);
    if (pin === undefined || !opts.acceptPin(pin)) {
      opts.onRefused?.(`client ${socket.remoteAddress}:${socket.remotePort} with key ${pin ?? '(none)'} is not a registered peer`);
      socket.destroy();
      return;
    }
    opts.onStream(new TunnelStream(socket, pin, opts.streamOptions));
  });
  server.on('tlsClientError', (err, socket) => {
    opts.onRefused?.(`TLS handshake from ${socket.remoteAddress} failed: ${err.message}`);
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts.port, opts.host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  return { server, port: (server.address() as AddressInfo).port };
}
