/**
 * One long-lived encrypted stream per tunnel peer: TLS 1.3 over TCP, each side with its own key pair and a
 * self-signed certificate, each side pinning the other's public key (sha256 of its SubjectPublicKeyInfo DER).
 *
 * Why TLS with pins and not a CA: the registry already holds each node's tunnel public key, so the pin is the whole
 * trust decision, and there is no CA to run or rotate. TLS 1.3 proves the peer holds the private key of the pinned
 * public key (CertificateVerify) even with chain validation off; nothing is sent before the pin matched. Why TLS and
 * not a hand-made AEAD framing: OpenSSL's AES-GCM runs on AES-NI inside Node's TLS, while an AEAD per frame from
 * JavaScript (a cipher object per 64 KB frame) moved 3.4 Gbit/s on loopback where TLS moved 7.5 (same harness, one
 * process), and it would be a protocol of our own to get right.
 *
 * Packets travel as frames (src/core/tunnel/frame.ts). Writes of one event-loop turn go out corked, so a batch of
 * TUN packets becomes one TLS write. Reconnecting is the caller's business: a stream that ends or fails is dead.
 */
import { createHash, createPrivateKey, createPublicKey, generateKeyPairSync, X509Certificate } from 'node:crypto';
import { spawnSync } from 'node:child_process';
import { EventEmitter } from 'node:events';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type AddressInfo, connect as netConnect, type Socket } from 'node:net';
import { type ConnectionOptions, connect, createSecureContext, createServer, type Server, TLSSocket, type TLSSocketOptions } from 'node:tls';
import { atollError } from '../core/errors.ts';
import { encodeFrame, FRAME_HEADER, FRAME_KIND, FrameDecoder, type FrameKind, PEER_ID_LEN, writeFrameHeader } from '../core/tunnel/frame.ts';
import { type ControlMessage, decodeTunnelMessage, type PeerMessage } from '../core/tunnel/messages.ts';
import { writeFileDurably } from './durable-file.ts';
import { circuitServerName } from '../core/tunnel/circuit.ts';
import { pollUntil } from '../core/retry.ts';
import { monotonicClock, sleep } from './timers.ts';

/** A node's tunnel credentials: its private key and the self-signed certificate of its public key (both PEM). */
export interface TunnelCredentials {
  readonly keyPem: string;
  readonly certPem: string;
}

/** `sha256:<hex>` of the SubjectPublicKeyInfo DER of a PEM public key, private key or certificate. */
export function spkiPin(pem: string): string {
  const key = pem.includes('CERTIFICATE') ? new X509Certificate(pem).publicKey : createPublicKey(pem);
  return `sha256:${createHash('sha256').update(key.export({ type: 'spki', format: 'der' })).digest('hex')}`;
}

/**
 * Issues a self-signed certificate for `keyPem` (Ed25519, P-256 or RSA) with the `openssl` CLI (Node cannot issue
 * certificates). The certificate only carries the key to the peer: its fields and dates are not checked by peers.
 * @throws AtollError PKI_FAILED when openssl is missing or refuses the key.
 */
export function selfSignedTunnelCert(keyPem: string, commonName: string): string {
  // The key goes through a private temporary file: openssl cannot read a key from a pipe on stdin.
  const dir = mkdtempSync(join(tmpdir(), 'atoll-tunnel-cert-'));
  let r;
  try {
    const keyFile = join(dir, 'key.pem');
    writeFileSync(keyFile, keyPem, { mode: 0o600 });
    r = spawnSync('openssl', ['req', '-x509', '-new', '-key', keyFile, '-subj', `/CN=${commonName.replace(/[^A-Za-z0-9.-]/g, '-')}`, '-days', '36500'],
      { encoding: 'utf8', timeout: 10_000 });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  if (r.status !== 0 || !r.stdout.includes('BEGIN CERTIFICATE')) {
    throw atollError('PKI_FAILED', `could not issue the tunnel certificate for ${commonName}: ${(r.stderr || String(r.error ?? '')).trim()}`,
      'install openssl and check that the tunnel key file holds a private key');
  }
  return r.stdout;
}

const TLS_BASE = {
  minVersion: 'TLSv1.3',
  maxVersion: 'TLSv1.3',
  // AES-GCM first: AES-NI makes it the fastest suite on servers and most edge CPUs.
  ciphers: 'TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256',
} as const;

/** Bytes queued on a stream above which its owner should stop feeding it (see {@link TunnelStream.congested}). */
const HIGH_WATER = 1024 * 1024;
/** Bytes queued on a stream above which packets are dropped rather than queued. */
const DROP_ABOVE = 8 * 1024 * 1024;
/** A stream sends a keepalive ping this often (it also measures the round-trip time)... */
const KEEPALIVE_MS = 1000;
/**
 * ...and is declared dead when nothing at all arrived for this long (a cut link, a NAT mapping gone, a peer gone
 * without a FIN). Long enough that a short cut passes (TCP queues and retransmits, nothing is lost); a stream with a
 * fallback (a punched one: the relay) sets it shorter.
 */
const DEAD_AFTER_MS = 20_000;

/** Size of the buffer a {@link ReadTap} reads into (larger than one TLS record's 16 KB of plaintext). */
const READ_BUFFER = 64 * 1024;

/**
 * Plaintext reads of a TLS socket delivered into one buffer of ours, through Node's `onread` option, instead of a
 * freshly allocated buffer per read. Measured: at a few Gbit/s those buffers (hundreds of MB a second outside the
 * JavaScript heap) kept V8's full mark-compact collector running many times a second; one TLS stream on loopback
 * received 13.2 Gbit/s this way against 9.0 with Node's own buffers. Node honours `onread` only for a TLS socket that
 * opens its own TCP connection, so connections we make use it; connections we accept (a listener's) read as usual.
 * A chunk is valid only during the call that hands it out: the next read overwrites it.
 */
class ReadTap {
  private readonly buffer = Buffer.allocUnsafe(READ_BUFFER);
  private sink: ((chunk: Buffer) => void) | undefined;
  /** Reads that arrived before the stream took over (copied: the buffer is reused). */
  private early: Buffer[] = [];
  /** The `onread` option to give the TLS socket. */
  readonly onread = {
    buffer: this.buffer,
    callback: (n: number): boolean => {
      const chunk = this.buffer.subarray(0, n);
      if (this.sink) this.sink(chunk);
      else this.early.push(Buffer.from(chunk));
      return true;
    },
  };

  /** From now on every read goes to `sink`, the ones that came before first. */
  attach(sink: (chunk: Buffer) => void): void {
    this.sink = sink;
    for (const chunk of this.early.splice(0)) sink(chunk);
  }

  /** A TLS client connection (tls.connect) reading through this tap. */
  connect(opts: ConnectionOptions): TLSSocket {
    // `onread` is a documented option of tls.connect that @types/node lacks
    return connect({ ...opts, onread: this.onread } as ConnectionOptions);
  }
}

export interface TunnelStreamStats {
  framesSent: number;
  bytesSent: number;
  framesReceived: number;
  bytesReceived: number;
  /** Packets dropped because the stream's queue was over its limit. */
  droppedQueueFull: number;
}

export interface TunnelStreamOptions {
  readonly keepaliveMs?: number;
  readonly deadAfterMs?: number;
}

/**
 * An established, pinned stream to one peer. Events: `frame` (payload: Uint8Array, a view valid during the call: a
 * split payload is assembled in a buffer reused for the next), `control` (msg: ControlMessage, never a ping or pong),
 * `relayed-control` (peerId, msg: PeerMessage, its bytes; views valid during the call), `drain` (the queue fell below
 * the high-water mark), `close` (err?: Error; the stream is dead). Keepalive pings and their answers are handled
 * here; {@link rttMs} is the last round trip. Messages are decoded by src/core/tunnel/messages.ts: one that does not
 * decode closes the stream with its TUNNEL_MESSAGE_INVALID error.
 */
export class TunnelStream extends EventEmitter {
  readonly peerPin: string;
  readonly stats: TunnelStreamStats = { framesSent: 0, bytesSent: 0, framesReceived: 0, bytesReceived: 0, droppedQueueFull: 0 };
  /** Round-trip time of the last keepalive, ms; undefined until one came back. */
  rttMs: number | undefined;
  /** The peer's address as this end sees it. */
  readonly remote: { readonly host: string; readonly port: number };
  private readonly socket: TLSSocket;
  private readonly decoder: FrameDecoder;
  private readonly keepalive: NodeJS.Timeout;
  private lastHeard = performance.now();
  private corked = false;
  private dead = false;

  /** `tap`: the socket's reads come through it (a socket opened with its `onread`), not as `data` events. */
  constructor(socket: TLSSocket, peerPin: string, opts: TunnelStreamOptions = {}, tap?: ReadTap) {
    super();
    this.socket = socket;
    this.peerPin = peerPin;
    this.decoder = new FrameDecoder({ reuse: true });
    this.remote = { host: (socket.remoteAddress ?? '').replace(/^::ffff:/, ''), port: socket.remotePort ?? 0 };
    socket.setNoDelay(true);
    const onChunk = (chunk: Buffer) => {
      this.lastHeard = performance.now();
      try {
        this.decoder.push(chunk, (payload, kind) => this.onFrame(payload, kind));
      } catch (err) {
        this.close(err instanceof Error ? err : new Error(String(err)));
      }
    };
    if (tap) tap.attach(onChunk);
    else socket.on('data', onChunk);
    socket.on('drain', () => this.emit('drain'));
    socket.on('error', (err) => this.close(err));
    socket.on('close', () => this.close());
    const deadAfter = opts.deadAfterMs ?? DEAD_AFTER_MS;
    this.keepalive = setInterval(() => {
      if (performance.now() - this.lastHeard > deadAfter) this.close(new Error(`nothing heard from the peer for ${deadAfter} ms`));
      else this.sendControl({ t: 'ping', at: performance.now() });
    }, opts.keepaliveMs ?? KEEPALIVE_MS);
    this.keepalive.unref();
  }

  private onFrame(payload: Uint8Array, kind: FrameKind): void {
    switch (kind) {
      case FRAME_KIND.packet:
        this.stats.framesReceived++;
        this.stats.bytesReceived += payload.length;
        this.emit('frame', payload);
        return;
      case FRAME_KIND.control: {
        const r = decodeTunnelMessage(payload, 'control');
        if (!r.ok) throw r.error;
        const msg = r.message;
        if (msg.t === 'ping') this.sendControl({ t: 'pong', at: msg.at });
        else if (msg.t === 'pong') this.rttMs = Math.max(0, performance.now() - msg.at);
        else this.emit('control', msg);
        return;
      }
      case FRAME_KIND.relayedControl: {
        const body = payload.subarray(PEER_ID_LEN);
        const r = decodeTunnelMessage(body, 'relayed');
        if (!r.ok) throw r.error;
        this.emit('relayed-control', payload.subarray(0, PEER_ID_LEN), r.message, body);
        return;
      }
    }
  }

  /** Whether the queue is over the high-water mark: the owner should pause its source until `drain`. */
  get congested(): boolean {
    return this.socket.writableLength > HIGH_WATER;
  }

  get alive(): boolean {
    return !this.dead;
  }

  /**
   * Queues one packet. `pkt` must have {@link FRAME_HEADER} writable bytes in front of it in its buffer (the TUN
   * reader leaves them), and must not be changed afterwards: it is written without a copy. Writes
   * of one event-loop turn leave together. `sent` is called once the stream is done with the packet's bytes
   * (encrypted, or the stream failed), only when this returns true.
   * @returns false when the packet was dropped (stream dead or its queue full).
   */
  send(pkt: Buffer, sent?: () => void): boolean {
    if (this.dead) return false;
    if (this.socket.writableLength > DROP_ABOVE) {
      this.stats.droppedQueueFull++;
      return false;
    }
    if (pkt.byteOffset < FRAME_HEADER) throw new RangeError('tunnel packet has no headroom for its frame header');
    const frame = Buffer.from(pkt.buffer, pkt.byteOffset - FRAME_HEADER, pkt.length + FRAME_HEADER);
    writeFrameHeader(frame, 0, pkt.length, FRAME_KIND.packet);
    this.write(frame, sent);
    this.stats.framesSent++;
    this.stats.bytesSent += pkt.length;
    return true;
  }

  /**
   * Passes on a relayed control message this relay received on another stream from the peer `fromId` (`body`: its
   * bytes, as the `relayed-control` event gave them), naming its origin. @returns false when dropped (stream dead or
   * its queue full).
   */
  relay(fromId: Uint8Array, body: Uint8Array): boolean {
    if (this.dead) return false;
    if (this.socket.writableLength > DROP_ABOVE) {
      this.stats.droppedQueueFull++;
      return false;
    }
    this.write(relayedControlFrame(fromId, body));
    return true;
  }

  /** Sends a control message to the peer at the other end of this stream. */
  sendControl(msg: ControlMessage): boolean {
    if (this.dead) return false;
    this.write(Buffer.from(encodeFrame(Buffer.from(JSON.stringify(msg)), FRAME_KIND.control).buffer));
    return true;
  }

  /** Sends a control message through the relay (this stream goes to it) to the peer `peerId`. */
  sendRelayedControl(peerId: Uint8Array, msg: PeerMessage): boolean {
    if (this.dead) return false;
    this.write(relayedControlFrame(peerId, Buffer.from(JSON.stringify(msg))));
    return true;
  }

  private write(frame: Buffer, done?: () => void): void {
    if (!this.corked) {
      this.corked = true;
      this.socket.cork();
      process.nextTick(() => {
        this.corked = false;
        this.socket.uncork();
      });
    }
    if (done) this.socket.write(frame, done);
    else this.socket.write(frame);
  }

  /** Ends the stream (idempotent); `close` is emitted once. */
  close(err?: Error): void {
    if (this.dead) return;
    this.dead = true;
    clearInterval(this.keepalive);
    this.socket.destroy();
    this.emit('close', err);
  }
}

/** A relayed control frame: the other end's id, then the message's bytes. */
function relayedControlFrame(peerId: Uint8Array, body: Uint8Array): Buffer {
  const frame = Buffer.allocUnsafe(FRAME_HEADER + PEER_ID_LEN + body.length);
  writeFrameHeader(frame, 0, PEER_ID_LEN + body.length, FRAME_KIND.relayedControl);
  frame.set(peerId, FRAME_HEADER);
  frame.set(body, FRAME_HEADER + PEER_ID_LEN);
  return frame;
}

const unreachable = (message: string, cause?: unknown) =>
  atollError('TUNNEL_UNREACHABLE', message, 'the agent retries with backoff; check that the far end runs and its port is reachable', cause);
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
}

/**
 * Connects to a peer's tunnel listener and checks its key against `peerPin` before anything is sent.
 * Rejects with an AtollError naming the address: TUNNEL_UNREACHABLE when the connection or handshake fails or times
 * out, TUNNEL_PEER_UNTRUSTED when the key differs from the pin.
 */
export function dialTunnel(opts: DialTunnelOptions): Promise<TunnelStream> {
  const tap = new ReadTap();
  const socket = tap.connect({
    ...TLS_BASE, host: opts.host, port: opts.port, key: opts.credentials.keyPem, cert: opts.credentials.certPem,
    rejectUnauthorized: false, checkServerIdentity: () => undefined, ...(opts.localPort ? { localPort: opts.localPort } : {}),
  });
  return pinnedHandshake(socket, 'secureConnect', `tunnel to ${opts.host}:${opts.port}`, opts.peerPin, opts.timeoutMs ?? 10_000, opts.streamOptions, tap);
}

/**
 * Waits (bounded) for the TLS handshake of `tls` to finish (`event`: 'secureConnect' for a client, 'secure' for a
 * server) and checks the peer's key against `peerPin` before anything is sent; the stream on success.
 * @throws AtollError TUNNEL_UNREACHABLE (failed or timed out), TUNNEL_PEER_UNTRUSTED (another key).
 */
function pinnedHandshake(tls: TLSSocket, event: 'secureConnect' | 'secure', what: string, peerPin: string, timeoutMs: number,
  streamOptions: TunnelStreamOptions | undefined, tap?: ReadTap): Promise<TunnelStream> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => fail(unreachable(`${what}: no TLS handshake within ${timeoutMs} ms`)), timeoutMs);
    const fail = (err: Error) => {
      clearTimeout(timer);
      tls.destroy();
      reject(err);
    };
    tls.once('error', (err) => fail(unreachable(`${what} failed: ${err.message}`, err)));
    tls.once(event, () => {
      clearTimeout(timer);
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
    const timer = setTimeout(() => {
      last = 'timed out';
      tls.destroy();
      resolve(undefined);
    }, Math.max(1, deadline - performance.now()));
    const failed = (err: Error) => {
      clearTimeout(timer);
      last = err.message;
      tls.destroy();
      resolve(undefined);
    };
    tls.once('error', failed);
    tls.once('connect', () => {
      clearTimeout(timer);
      tls.off('error', failed);
      const client = opts.tlsRole === 'client';
      resolve(pinnedHandshake(tls, client ? 'secureConnect' : 'secure', `punched tunnel to ${where}`, opts.peerPin,
        Math.max(1000, deadline - performance.now()), opts.streamOptions, tap));
    });
  });
  // no attempt starts after the deadline
  await pollUntil(async () => performance.now() < deadline && (stream = await attempt()) !== undefined,
    { intervalMs: PUNCH_RETRY_MS, timeoutMs: opts.deadlineMs }, { clock: monotonicClock, sleep });
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
    isServer: true, requestCert: true, secureContext: createSecureContext(tlsOpts), rejectUnauthorized: false, onread: tap.onread,
  } as TLSSocketOptions);
  return server.connect(to);
}

/** TLS options of our end of a stream: our key and certificate; the peer's key is checked against its pin after. */
function tlsOptionsOf(credentials: TunnelCredentials) {
  return { ...TLS_BASE, key: credentials.keyPem, cert: credentials.certPem, rejectUnauthorized: false };
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
}

/**
 * Our end of a circuit through the relay (src/relay/circuits.ts): a TCP connection to the relay's circuit port, the
 * token, then TLS 1.3 end to end with the peer, its key pinned; the relay sees only ciphertext. The TLS client end
 * sends its token as the server name of its ClientHello, so Node opens the connection and its reads go through a
 * ReadTap; the server end sends a token line first, over a socket we open (its reads use Node's own buffers: that
 * end of a circuit is the one that sends, see src/agent/tunnel.ts). Rejects as {@link dialTunnel} does.
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
    return pinnedHandshake(tls, 'secureConnect', what, opts.peerPin, timeoutMs, opts.streamOptions, tap);
  }
  return new Promise((resolve, reject) => {
    const socket = netConnect({ host: opts.host, port: opts.port });
    const timer = setTimeout(() => {
      socket.destroy();
      reject(unreachable(`${what}: no connection within ${timeoutMs} ms`));
    }, timeoutMs);
    socket.once('error', (err) => {
      clearTimeout(timer);
      socket.destroy();
      reject(unreachable(`${what} failed: ${err.message}`, err));
    });
    socket.once('connect', () => {
      clearTimeout(timer);
      socket.removeAllListeners('error');
      socket.setNoDelay(true);
      socket.write(`${opts.token}\n`);
      const tls = new TLSSocket(socket, { isServer: true, requestCert: true, secureContext: createSecureContext(tlsOptionsOf(opts.credentials)), rejectUnauthorized: false });
      resolve(pinnedHandshake(tls, 'secure', what, opts.peerPin, timeoutMs, opts.streamOptions));
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

/**
 * The node's tunnel credentials kept in `dir` (`tunnel.key`, PKCS#8 Ed25519, mode 0600; `tunnel.crt`, self-signed):
 * loaded when present, created once otherwise. The pin peers check ({@link spkiPin}) stays the same across restarts.
 * A certificate missing beside an existing key is re-issued for that key (the pin does not change).
 * @throws AtollError PKI_FAILED when the key file is not a private key or the certificate cannot be issued.
 */
export function loadOrCreateTunnelCredentials(dir: string, commonName: string): TunnelCredentials {
  const keyPath = join(dir, 'tunnel.key');
  const certPath = join(dir, 'tunnel.crt');
  let keyPem: string;
  if (existsSync(keyPath)) {
    keyPem = readFileSync(keyPath, 'utf8');
  } else {
    keyPem = generateKeyPairSync('ed25519').privateKey.export({ type: 'pkcs8', format: 'pem' }) as string;
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    writeFileDurably(keyPath, keyPem, { mode: 0o600 });
  }
  try {
    createPrivateKey(keyPem);
  } catch (cause) {
    throw atollError('PKI_FAILED', `the tunnel key ${keyPath} is not a PEM private key`, 'delete it (peers learn the new key from the controller)', cause);
  }
  let certPem = existsSync(certPath) ? readFileSync(certPath, 'utf8') : '';
  if (!certPem || spkiPin(certPem) !== spkiPin(keyPem)) {
    certPem = selfSignedTunnelCert(keyPem, commonName);
    writeFileDurably(certPath, certPem, { mode: 0o644 });
  }
  return { keyPem, certPem };
}
