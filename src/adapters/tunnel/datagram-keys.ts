/**
 * The datagram path's keys over the pinned TLS streams (`udp-key`, `udp-key-ack`, docs/api.md), and the receiving
 * keys it holds per peer (src/adapters/tunnel/datagram-path.ts owns the peers, the socket and the native key table).
 *
 * Keys: each node picks its own sending key per peer, announces it with a random 32-bit id and 128-bit salt on a
 * tunnel stream of the pair (direct or a circuit), and both ends derive it as HKDF-SHA256 of that stream's TLS 1.3
 * exported keying material, the salt and the id. So a key is known only to the two pinned ends of a TLS session
 * (the relay under a circuit included: it sees ciphertext only), no new trust is added, and each direction has its
 * own key with its own counter as nonce. The sender uses it once the peer acknowledged it, and replaces it after
 * {@link REKEY_AFTER_PACKETS} datagrams or {@link REKEY_AFTER_MS}; the receiver keeps the previous key for
 * {@link OLD_KEY_GRACE_MS} for the datagrams in flight. A restarted peer has no keys: a new stream brings new ones.
 */
import { hkdfSync, randomBytes } from 'node:crypto';
import { OLD_KEY_GRACE_MS } from '../../core/tunnel/datagram.ts';
import type { UdpKeyAck, UdpKeyMessage } from '../../core/tunnel/messages.ts';
import { type OpenKeyTable, SealKey } from './datagram-native.ts';
import { endpointOf, type PeerState } from './datagram-peer-state.ts';
import type { TunnelStream } from './tunnel-stream.ts';
import { steadyClock } from '../timers.ts';

/** The TLS exporter label datagram keys are derived from. */
export const DATAGRAM_EXPORTER_LABEL = 'EXPORTER-atoll-datagram-v1';
/** Receiving keys kept per peer at most. */
const MAX_RECV_KEYS = 3;

/** A receiving key: its crypto and replay window live in the native table ({@link OpenKeyTable}) under its id. */
interface RecvKey {
  readonly peer: string;
  expiresAt: number;
}

export interface DatagramKeysComponents {
  /** The receiving keys' crypto and replay windows, by id: the path's native table, which opens the datagrams. */
  readonly table: OpenKeyTable;
  /** The path's peers, by name. */
  readonly peers: ReadonlyMap<string, PeerState>;
  /** Our public host as seen from outside, '' when unknown, and our UDP port: where an offer asks for datagrams. */
  readonly publicHost: () => string;
  readonly port: () => number;
  /** Describes the kept region again (datagram-kept-peers.ts): after every change of keys or addresses. */
  readonly describe: () => void;
}

export interface DatagramKeysInit {
  /** The path's dead interval: an announced address replaces one not heard from for this long. */
  readonly deadAfterMs: number;
}

export class DatagramKeys {
  readonly #c: DatagramKeysComponents;
  readonly #init: DatagramKeysInit;
  readonly #recv = new Map<number, RecvKey>();

  constructor(components: DatagramKeysComponents, init: DatagramKeysInit) {
    this.#c = components;
    this.#init = init;
  }

  /** Offers a new sending key to `peerId` on `stream` (a live tunnel stream of the pair). */
  offer(peerId: string, stream: TunnelStream): void {
    const p = this.#c.peers.get(peerId);
    if (!p || !stream.alive) return;
    const id = randomBytes(4).readUInt32BE(0);
    const salt = randomBytes(16).toString('hex');
    const was = p.pending;
    const key = deriveDatagramKey(stream, salt, id);
    p.pending = { id, key: new SealKey(key, id), at: steadyClock() };
    key.fill(0);
    this.#c.describe();
    was?.key.free();
    stream.sendControl({ t: 'udp-key', id, salt, host: this.#c.publicHost(), port: this.#c.port() });
  }

  /** A `udp-key` or `udp-key-ack` from `peerId`, on `stream`. */
  onControl(peerId: string, stream: TunnelStream, msg: UdpKeyMessage | UdpKeyAck): void {
    const p = this.#c.peers.get(peerId);
    if (!p) return;
    if (msg.t === 'udp-key-ack') {
      // the ack of an offer we no longer hold (made stale by keys the hellos agreed on): the peer may now expire the
      // key we send under in favour of that one, so a fresh offer brings both ends to one key (once: not while one waits)
      if (!p.pending && p.send?.id !== msg.id && stream.alive) return this.offer(peerId, stream);
      if (p.pending?.id !== msg.id) return;
      const was = p.send;
      p.send = { id: msg.id, key: p.pending.key, createdAt: steadyClock() };
      p.pending = undefined;
      this.#c.describe();
      was?.key.free();
      return;
    }
    const had = this.#recv.get(msg.id);
    if (had && had.peer !== peerId) return; // another peer's id: no ack, the sender offers another
    if (!had) {
      const key = deriveDatagramKey(stream, msg.salt, msg.id);
      this.add(peerId, p, msg.id, key);
      key.fill(0);
    }
    // A new announced address (the peer restarted, on another port) is taken at once: sending there opens our NAT for
    // its keepalives. The same address again (a rotation) leaves the one authentic datagrams come from lately (a NAT
    // that did not keep the peer's port: a rotation must not undo what the keepalives taught).
    const announced = { host: msg.host || stream.remote.host, port: msg.port };
    const again = p.announced?.host === announced.host && p.announced.port === announced.port;
    if (!p.endpoint || !again || steadyClock() - p.lastHeard >= this.#init.deadAfterMs) p.endpoint = endpointOf(announced.host, announced.port);
    p.announced = announced;
    this.#c.describe();
    stream.sendControl({ t: 'udp-key-ack', id: msg.id });
  }

  /**
   * A new receiving key of `p`: the older ones stay for {@link OLD_KEY_GRACE_MS} (datagrams in flight), three at most
   * (a rotation's two, and one more: an offer and keys agreed by hellos may cross).
   */
  add(peerId: string, p: PeerState, id: number, key: Uint8Array): void {
    const now = steadyClock();
    const table = this.#c.table;
    for (const old of p.recvIds) {
      const k = this.#recv.get(old);
      if (k) {
        k.expiresAt = Math.min(k.expiresAt, now + OLD_KEY_GRACE_MS);
        table.expire(old, k.expiresAt);
      }
    }
    while (p.recvIds.length >= MAX_RECV_KEYS) this.drop(p.recvIds[0] as number, true);
    if (!table.add(id, p.tag, key)) return;
    this.#recv.set(id, { peer: peerId, expiresAt: Infinity });
    p.recvIds.push(id);
  }

  /** Whether receiving key `id` is held (for any peer). */
  has(id: number): boolean {
    return this.#recv.has(id);
  }

  /** When receiving key `id` expires (steady; Infinity: not before a newer one comes, or not held). */
  expiresAt(id: number): number {
    return this.#recv.get(id)?.expiresAt ?? Infinity;
  }

  /**
   * Takes back receiving key `id` of `p` from the kept region's `slot` (src/adapters/tunnel/datagram-kept-peers.ts),
   * expiring at `expiresAt` (steady). @returns false when it is not there: held already, or the slot holds another key.
   */
  restore(p: PeerState, id: number, slot: number, expiresAt: number): boolean {
    const table = this.#c.table;
    if (this.#recv.has(id) || !table.restore(slot, p.tag)) return false;
    if (table.slot(id) !== slot) {
      table.remove(id);
      return false;
    }
    if (expiresAt !== Infinity) table.expire(id, expiresAt);
    this.#recv.set(id, { peer: p.id, expiresAt });
    p.recvIds.push(id);
    return true;
  }

  /** Drops the receiving keys expired before `now`, each described without it first. */
  dropExpired(now: number): void {
    for (const [id, k] of [...this.#recv]) if (k.expiresAt < now) this.drop(id, true);
  }

  /** Drops receiving key `id`; `describe`: described without it first (its peer stays). */
  drop(id: number, describe: boolean): void {
    const k = this.#recv.get(id);
    if (!k) return;
    this.#recv.delete(id);
    const p = this.#c.peers.get(k.peer);
    const i = p?.recvIds.indexOf(id) ?? -1;
    if (i >= 0) p?.recvIds.splice(i, 1);
    if (describe) this.#c.describe();
    this.#c.table.remove(id);
  }

  /** Forgets every receiving key, its slot in the kept region left as it is (the agent's next process takes it back). */
  forget(): void {
    this.#recv.clear();
  }
}

/** The key `id` announced with `salt` on `stream`: HKDF-SHA256 over the stream's exported keying material. */
export function deriveDatagramKey(stream: Pick<TunnelStream, 'exportKeyingMaterial'>, salt: string, id: number): Uint8Array {
  const ikm = stream.exportKeyingMaterial(32, DATAGRAM_EXPORTER_LABEL);
  return new Uint8Array(hkdfSync('sha256', ikm, Buffer.from(salt, 'hex'), `atoll datagram key ${id >>> 0}`, 32));
}
