/**
 * Circuits: the relay's data path. Two nodes that cannot reach each other directly (a symmetric NAT, or while hole
 * punching has not succeeded yet) each open a TCP connection to the relay's circuit port and present a one-time
 * token the relay gave them over their control streams; the relay then joins the two connections byte for byte, and
 * the nodes run TLS 1.3 end to end over the joined pair, each pinning the other's key, exactly as on a direct stream.
 * The end that runs TLS as the client presents its token as the server name (SNI) of its ClientHello, so it can let
 * Node open the connection and read into a buffer of its own (src/adapters/tunnel/tunnel-stream.ts, ReadTap); the TLS
 * server end, which speaks second, sends a token line (32 hex digits and a newline) before anything else.
 *
 * Why not carry the packets inside the nodes' TLS streams to the relay (as Atoll first did): the relay then decrypted
 * and re-encrypted every packet and saw the pods' traffic in clear. Joined connections cost the relay no
 * cryptography, and the relay cannot read or alter what it carries (libp2p's circuit relay makes the same choice).
 * They are joined in the kernel (src/adapters/tunnel/splice-native.ts: splice(2) by a C library's epoll threads), so the
 * bytes never enter the relay's process and no JavaScript runs per chunk. Only pairs the relay may connect get tokens
 * (src/relay/relay.ts checks); a token is random (128 bits), good for one connection and {@link JOIN_WITHIN_MS}. No
 * time or byte limits once joined (the circuit-relay-v2 defaults of 2 min and 128 KiB cut long flows).
 */
import { randomBytes } from 'node:crypto';
import { createServer, type Server, type Socket } from 'node:net';
import { type SpliceJoin, SpliceJoins } from '../adapters/tunnel/splice-native.ts';
import type { Logger } from '../core/ports.ts';
import { lineToken, sniToken, TLS_HANDSHAKE, TOKEN_LINE_LEN } from '../core/tunnel/circuit.ts';

/** Both ends must connect this long after the offer, or it lapses. */
export const JOIN_WITHIN_MS = 10_000;
/** The largest ClientHello record we read to find the token in. */
const MAX_HELLO = 16_384 + 5;
/** A connection that has not sent its token within this long is closed. */
const TOKEN_WITHIN_MS = 5000;

export interface CircuitStats {
  /** Circuits joined and still open. */
  open: number;
  /** Circuits joined since the start. */
  joined: number;
  /** Offers that lapsed with an end missing. */
  lapsed: number;
  /** Connections with an unknown, used or malformed token. */
  badToken: number;
  /** Bytes carried, both directions. */
  bytes: number;
}

interface Offer {
  readonly label: string;
  readonly tokens: readonly [string, string];
  readonly ends: [Socket | undefined, Socket | undefined];
  readonly timer: NodeJS.Timeout;
}

export class CircuitBroker {
  readonly #counts = { joined: 0, lapsed: 0, badToken: 0 };
  /** Bytes carried by circuits that closed. */
  #closedBytes = 0;
  readonly #log: Logger;
  /** Offers waiting for their ends, by token. */
  readonly #offers = new Map<string, Offer>();
  readonly #joins: SpliceJoins;
  #server: Server | undefined;

  constructor(log: Logger) {
    this.#log = log;
    this.#joins = new SpliceJoins((j) => this.#closed(j));
  }

  get stats(): CircuitStats {
    return { ...this.#counts, open: this.#joins.size, bytes: this.#closedBytes + this.#joins.openBytes };
  }

  /** Listens for circuit connections. */
  async listen(host: string, port: number): Promise<void> {
    const server = createServer((socket) => this.#onConnection(socket));
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(port, host, () => {
        server.off('error', reject);
        resolve();
      });
    });
    this.#server = server;
  }

  /**
   * A new circuit between two nodes: one token for each (`label` names them in logs). Each must connect with its
   * token within {@link JOIN_WITHIN_MS}.
   */
  offer(label: string): readonly [string, string] {
    const tokens = [randomBytes(16).toString('hex'), randomBytes(16).toString('hex')] as const;
    const offer: Offer = { label, tokens, ends: [undefined, undefined], timer: setTimeout(() => this.#lapse(offer), JOIN_WITHIN_MS) };
    offer.timer.unref();
    for (const t of tokens) this.#offers.set(t, offer);
    return tokens;
  }

  #lapse(offer: Offer): void {
    for (const t of offer.tokens) this.#offers.delete(t);
    for (const end of offer.ends) end?.destroy();
    this.#counts.lapsed++;
    this.#log.info('circuit offer lapsed', { circuit: offer.label });
  }

  /**
   * Reads the token (a token line, or the server name of a ClientHello, which is put back to go to the far end),
   * paused, so what follows stays queued for the far end; then files the connection.
   */
  #onConnection(socket: Socket): void {
    socket.setNoDelay(true);
    socket.on('error', () => socket.destroy());
    const timer = setTimeout(() => socket.destroy(), TOKEN_WITHIN_MS);
    let hello: Buffer | undefined;
    const onReadable = () => {
      let token: string | undefined;
      if (hello === undefined) {
        const first = socket.read(1) as Buffer | null;
        if (first === null) return;
        if (first[0] !== TLS_HANDSHAKE) {
          socket.unshift(first);
          hello = Buffer.alloc(0);
        } else {
          hello = first;
        }
      }
      if (hello.length === 0) {
        const line = socket.read(TOKEN_LINE_LEN) as Buffer | null;
        if (line === null) return;
        token = lineToken(line.toString('latin1')) ?? '';
      } else {
        const header = hello.length < 5 ? (socket.read(5 - hello.length) as Buffer | null) : null;
        if (header) hello = Buffer.concat([hello, header]);
        if (hello.length < 5) return;
        const recordLen = Math.min(hello.readUInt16BE(3), MAX_HELLO);
        const rest = socket.read(recordLen) as Buffer | null;
        if (rest === null) return;
        hello = Buffer.concat([hello, rest]);
        token = sniToken(hello) ?? '';
        socket.unshift(hello); // the ClientHello goes on to the TLS server end
      }
      socket.off('readable', onReadable);
      clearTimeout(timer);
      this.#file(socket, token);
    };
    socket.on('readable', onReadable);
  }

  #file(socket: Socket, token: string): void {
    const offer = token === '' ? undefined : this.#offers.get(token);
    if (!offer) {
      this.#counts.badToken++;
      socket.destroy();
      return;
    }
    this.#offers.delete(token); // one connection per token
    offer.ends[offer.tokens.indexOf(token)] = socket;
    const [a, b] = offer.ends;
    if (a && b) {
      clearTimeout(offer.timer);
      this.#join(offer.label, a, b);
    }
  }

  /** Joins two connections both ways; either one closing closes the other. */
  #join(label: string, a: Socket, b: Socket): void {
    this.#counts.joined++;
    if (a.destroyed || b.destroyed) {
      // an end left while it waited for the other
      a.destroy();
      b.destroy();
      this.#log.info('circuit closed', { circuit: label });
      return;
    }
    try {
      this.#joins.join(a, b, label);
    } catch (err) {
      this.#log.warn('circuit failed', { circuit: label, error: err instanceof Error ? err.message : String(err) });
      return;
    }
    this.#log.info('circuit joined', { circuit: label });
  }

  #closed(j: SpliceJoin): void {
    this.#closedBytes += j.bytes;
    this.#log.info('circuit closed', { circuit: j.label });
  }

  /** Stops listening and closes every circuit and waiting connection. */
  close(): void {
    this.#server?.close();
    for (const offer of new Set(this.#offers.values())) {
      clearTimeout(offer.timer);
      for (const end of offer.ends) end?.destroy();
    }
    this.#offers.clear();
    this.#joins.close();
  }
}

