/**
 * One long-lived encrypted stream per tunnel peer: TLS 1.3 over TCP, each side with its own key pair and a
 * self-signed certificate, each side pinning the other's public key (sha256 of its SubjectPublicKeyInfo DER). This
 * file is the stream once the connection is up; connecting (dial, punch, circuits, listen) is in tunnel-dial.ts, the
 * keys and certificates in tunnel-credentials.ts.
 *
 * Why TLS with pins and not a CA: the registry already holds each node's tunnel public key, so the pin is the whole
 * trust decision, and there is no CA to run or rotate. TLS 1.3 proves the peer holds the private key of the pinned
 * public key (CertificateVerify) even with chain validation off; nothing is sent before the pin matched. Why TLS and
 * not a hand-made AEAD framing: OpenSSL's AES-GCM runs on AES-NI inside Node's TLS, while an AEAD per frame from
 * JavaScript (a cipher object per 64 KB frame) moved 3.4 Gbit/s on loopback where TLS moved 7.5 (same harness, one
 * process), and it would be a protocol of our own to get right.
 *
 * Packets travel as frames (src/core/tunnel/frame.ts), control messages as src/core/tunnel/messages.ts defines them.
 * Writes of one event-loop turn go out corked, so a batch of TUN packets becomes one TLS write. Reconnecting is the
 * caller's business: a stream that ends or fails is dead.
 */
import { EventEmitter } from 'node:events';
import { type ConnectionOptions, connect, type TLSSocket } from 'node:tls';
import { encodeFrame, FRAME_HEADER, FRAME_KIND, FrameDecoder, type FrameKind, PEER_ID_LEN, writeFrameHeader } from '../../core/tunnel/frame.ts';
import { atollError } from '../../core/errors.ts';
import { type ControlMessage, decodeTunnelMessage, type PeerMessage } from '../../core/tunnel/messages.ts';
import { steadyClock } from '../timers.ts';

/** Bytes queued on a stream above which its owner should stop feeding it (see {@link TunnelStream.congested}). */
const HIGH_WATER = 1024 * 1024;
/** Bytes queued on a stream above which packets are dropped rather than queued. */
const DROP_ABOVE = 8 * 1024 * 1024;
/** A stream sends a keepalive ping this often... */
const KEEPALIVE_MS = 1000;
/**
 * ...and one ping in this many asks for an answer, which gives the round trip (`atoll peers`); the others are `quiet`.
 * Each end's own pings keep the stream alive at the other: answering each one doubled the records an idle stream
 * sends (with their TCP acknowledgements, about 300 bytes a second each way per stream).
 */
const PONG_EVERY = 10;
/**
 * ...and is declared dead when nothing at all arrived for this long (a cut link, a NAT mapping gone, a peer gone
 * without a FIN). Long enough that a short cut passes (TCP queues and retransmits, nothing is lost); a stream with a
 * fallback (a punched one: the relay) sets it shorter. Counted on the steady clock (src/adapters/timers.ts): a clock
 * jump is not silence, the keepalives after it decide.
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
export class ReadTap {
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
  /** Pings sent: which ones ask for a pong. */
  private pings = 0;
  private lastHeard = steadyClock();
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
      this.lastHeard = steadyClock();
      try {
        this.decoder.push(chunk, (payload, kind) => this.onFrame(payload, kind));
      } catch (err) {
        // cannot happen: the decoder and this stream's listeners throw Errors only; String() keeps close()'s type
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
      if (steadyClock() - this.lastHeard > deadAfter) {
        this.close(atollError('TUNNEL_UNREACHABLE', `nothing heard from the peer ${this.remote.host}:${this.remote.port} for ${deadAfter} ms`,
          'the far end stopped or the path to it drops packets: the stream is closed, and the dialling end reconnects with backoff'));
      }
      else this.sendControl(this.pings++ % PONG_EVERY === 0 ? { t: 'ping', at: steadyClock() } : { t: 'ping', at: steadyClock(), quiet: true });
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
        if (msg.t === 'ping') {
          if (!msg.quiet) this.sendControl({ t: 'pong', at: msg.at });
        }
        else if (msg.t === 'pong') this.rttMs = Math.max(0, steadyClock() - msg.at);
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

  /** How long nothing has come from the peer, ms (its keepalives come every second). */
  get silentMs(): number {
    return steadyClock() - this.lastHeard;
  }

  get alive(): boolean {
    return !this.dead;
  }

  /**
   * Queues packets. Each must have {@link FRAME_HEADER} writable bytes in front of it in its buffer (the TUN reader
   * leaves them), and must not be changed afterwards: it is written without a copy. Writes of one event-loop turn
   * leave together, and packets that lie back to back in one buffer with their headroom between them (consecutive
   * reads of the TUN device do: src/adapters/tunnel/slab-pool.ts) leave as one write of their frames, so the stream's
   * per-write work is paid per run and not per packet. `sent` is called once, when the stream is done with all of
   * them (encrypted, or the stream failed), only when this returns true.
   * @returns false when all were dropped (stream dead or its queue full).
   */
  sendAll(pkts: readonly Buffer[], sent: () => void): boolean {
    if (this.dead) return false;
    if (this.socket.writableLength > DROP_ABOVE) {
      this.stats.droppedQueueFull += pkts.length;
      return false;
    }
    let bytes: Uint8Array | undefined;
    let start = 0;
    let end = 0;
    for (const pkt of pkts) {
      const at = pkt.byteOffset - FRAME_HEADER;
      if (at < 0) throw new RangeError('tunnel packet has no headroom for its frame header');
      if (bytes === undefined || bytes.buffer !== pkt.buffer || at !== end) {
        if (bytes !== undefined) this.write(Buffer.from(bytes.buffer, start, end - start));
        bytes = new Uint8Array(pkt.buffer);
        start = at;
      }
      writeFrameHeader(bytes, at, pkt.length, FRAME_KIND.packet);
      end = pkt.byteOffset + pkt.length;
      this.stats.framesSent++;
      this.stats.bytesSent += pkt.length;
    }
    if (bytes === undefined) sent();
    else this.write(Buffer.from(bytes.buffer, start, end - start), sent);
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

  /**
   * `length` bytes of keying material exported from this stream's TLS 1.3 session (RFC 8446 7.5) under `label`: the
   * same at both ends of the stream, known to nobody else (a circuit's relay included), bound to both pinned keys.
   */
  exportKeyingMaterial(length: number, label: string): Buffer {
    return this.socket.exportKeyingMaterial(length, label, Buffer.alloc(0));
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

