/**
 * One long-lived encrypted stream per tunnel peer: TLS 1.3 over TCP, each side with its own key pair and a
 * self-signed certificate, each side pinning the other's public key (sha256 of its SubjectPublicKeyInfo DER).
 *
 * Why TLS with pins and not a CA: the registry already holds each node's tunnel public key, so the pin is the whole
 * trust decision, and there is no CA to run or rotate. TLS 1.3 proves the peer holds the private key of the pinned
 * public key (CertificateVerify) even with chain validation off; nothing is sent before the pin matched. Why TLS and
 * not a hand-made AEAD framing: OpenSSL's AES-GCM runs on AES-NI, and in the namespace test bed (2 CPUs) the same
 * data path over plain unencrypted TCP was only about 10% faster (2.3 against 2.1 Gbit/s in one run), so a custom
 * X25519 + AES-GCM framing could win at most that, for a protocol of our own to get right.
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
import { type AddressInfo } from 'node:net';
import { connect, createServer, type Server, type TLSSocket } from 'node:tls';
import { atollError } from '../core/errors.ts';
import { FRAME_HEADER, FrameDecoder, writeFrameHeader } from '../core/tunnel/frame.ts';
import { writeFileDurably } from './durable-file.ts';

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

export interface TunnelStreamStats {
  framesSent: number;
  bytesSent: number;
  framesReceived: number;
  bytesReceived: number;
  /** Packets dropped because the stream's queue was over its limit. */
  droppedQueueFull: number;
}

/**
 * An established, pinned stream to one peer. Events: `frame` (payload: Uint8Array, a view valid during the call),
 * `drain` (the queue fell below the high-water mark), `close` (err?: Error; the stream is dead).
 */
export class TunnelStream extends EventEmitter {
  readonly peerPin: string;
  readonly stats: TunnelStreamStats = { framesSent: 0, bytesSent: 0, framesReceived: 0, bytesReceived: 0, droppedQueueFull: 0 };
  private readonly socket: TLSSocket;
  private readonly decoder = new FrameDecoder();
  private corked = false;
  private dead = false;

  constructor(socket: TLSSocket, peerPin: string) {
    super();
    this.socket = socket;
    this.peerPin = peerPin;
    socket.setNoDelay(true);
    socket.on('data', (chunk: Buffer) => {
      try {
        this.decoder.push(chunk, (payload) => {
          this.stats.framesReceived++;
          this.stats.bytesReceived += payload.length;
          this.emit('frame', payload);
        });
      } catch (err) {
        this.close(err instanceof Error ? err : new Error(String(err)));
      }
    });
    socket.on('drain', () => this.emit('drain'));
    socket.on('error', (err) => this.close(err));
    socket.on('close', () => this.close());
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
   * reader leaves that headroom), and must not be changed afterwards: it is written without a copy. Writes of one
   * event-loop turn leave together.
   * @returns false when the packet was dropped (stream dead or its queue full).
   */
  send(pkt: Buffer): boolean {
    if (this.dead) return false;
    if (this.socket.writableLength > DROP_ABOVE) {
      this.stats.droppedQueueFull++;
      return false;
    }
    if (pkt.byteOffset < FRAME_HEADER) throw new RangeError('tunnel packet has no headroom for its frame header');
    const frame = Buffer.from(pkt.buffer, pkt.byteOffset - FRAME_HEADER, pkt.length + FRAME_HEADER);
    writeFrameHeader(frame, 0, pkt.length);
    if (!this.corked) {
      this.corked = true;
      this.socket.cork();
      process.nextTick(() => {
        this.corked = false;
        this.socket.uncork();
      });
    }
    this.socket.write(frame);
    this.stats.framesSent++;
    this.stats.bytesSent += pkt.length;
    return true;
  }

  /** Ends the stream (idempotent); `close` is emitted once. */
  close(err?: Error): void {
    if (this.dead) return;
    this.dead = true;
    this.socket.destroy();
    this.emit('close', err);
  }
}

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
}

/**
 * Connects to a peer's tunnel listener and checks its key against `peerPin` before anything is sent.
 * Rejects with an Error naming the address when the connection or handshake fails, times out, or the key differs
 * from the pin (the catalogue gets tunnel error codes when the agent wires this in).
 */
export function dialTunnel(opts: DialTunnelOptions): Promise<TunnelStream> {
  const where = `${opts.host}:${opts.port}`;
  return new Promise((resolve, reject) => {
    const socket = connect({
      ...TLS_BASE, host: opts.host, port: opts.port, key: opts.credentials.keyPem, cert: opts.credentials.certPem,
      rejectUnauthorized: false, checkServerIdentity: () => undefined,
    });
    const timer = setTimeout(() => fail(new Error(`tunnel to ${where}: no TLS handshake within ${opts.timeoutMs ?? 10_000} ms`)), opts.timeoutMs ?? 10_000);
    const fail = (err: Error) => {
      clearTimeout(timer);
      socket.destroy();
      reject(err);
    };
    socket.once('error', (err) => fail(new Error(`tunnel to ${where} failed: ${err.message}`, { cause: err })));
    socket.once('secureConnect', () => {
      clearTimeout(timer);
      const pin = peerPinOf(socket);
      if (pin !== opts.peerPin) {
        fail(new Error(`tunnel to ${where}: the peer's key ${pin ?? '(none)'} is not the pinned ${opts.peerPin}; refused`));
        return;
      }
      socket.removeAllListeners('error');
      resolve(new TunnelStream(socket, pin));
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
    opts.onStream(new TunnelStream(socket, pin));
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
