/**
 * The datagram path across a restart of the agent: with a kept region attached (src/adapters/tunnel/datagram-native.ts,
 * KeptRegion; held by the node's keeper) the keys live in it, the peers' keys and addresses are described in it at
 * every change (src/core/tunnel/kept-description.ts), and the agent's next process takes back what is described. The
 * path (src/adapters/tunnel/datagram-path.ts) owns the peers and the native key table, and asks for a description
 * after each change.
 */
import type { Logger } from '../../core/ports.ts';
import { usable } from '../../core/tunnel/datagram-peer.ts';
import { type KeptDescription, type KeptPeer, parseKeptDescription } from '../../core/tunnel/kept-description.ts';
import { KeptRegion, type OpenKeyTable, SealKey } from './datagram-native.ts';
import type { DatagramKeys } from './datagram-keys.ts';
import { type Endpoint, parseEndpoint, type PeerState } from './datagram-peer-state.ts';

/** The size of the kept region's description: room for about a thousand peers. */
export const KEPT_META_BYTES = 256 << 10;
/** Slots of the kept region: a sending key, an offered one and three receiving keys per peer, for 204 peers. */
export const KEPT_SLOTS = 1024;

export interface KeptPeersComponents {
  /** The path's peers, by name. */
  readonly peers: ReadonlyMap<string, PeerState>;
  /** The peers that are not dormant (the path's #awake): only they can be usable (a usable path has a key and an address). */
  readonly awake?: ReadonlySet<PeerState>;
  /** The path's native table of receiving keys: which slot holds which. */
  readonly table: OpenKeyTable;
  /** The receiving keys: taken back into, and their expiry described. */
  readonly keys: Pick<DatagramKeys, 'restore' | 'expiresAt'>;
  readonly log?: Logger | undefined;
}

export interface KeptPeersInit {
  /** The path's dead interval: which peers are described as usable. */
  readonly deadAfterMs: number;
}

export class KeptPeers {
  readonly #c: KeptPeersComponents;
  readonly #init: KeptPeersInit;
  /** The usable peers at the last description of the kept region. */
  #describedUsable = '';

  constructor(components: KeptPeersComponents, init: KeptPeersInit) {
    this.#c = components;
    this.#init = init;
  }

  /**
   * Takes back the peers the kept region describes (`now` steady, `wall` ms since the epoch), each made by `newPeer`,
   * with their keys (counters and replay windows as the previous process left them: no nonce is used twice), and frees
   * the slots it does not describe (keys made just before that process died). A peer whose path was usable is taken
   * as usable still: the keepalives confirm it within {@link DEAD_AFTER_MS} or give it up, as for any path.
   * @returns the peers there are now. Describe them again after.
   */
  restore(newPeer: (id: string, pin: string, endpoint: Endpoint | undefined) => PeerState, now: number, wall: number): number {
    const bytes = KeptRegion.read(KEPT_META_BYTES);
    const kept = bytes && bytes.length > 0 ? parseKeptDescription(Buffer.from(bytes).toString()) : undefined;
    const slots: number[] = [];
    for (const k of kept?.peers ?? []) {
      const p = newPeer(k.id, k.pin, parseEndpoint(k.endpoint));
      p.announced = k.announced;
      const send = k.send && SealKey.restore(k.send.slot);
      if (send && send.id === k.send?.id) {
        p.send = { id: send.id, key: send, createdAt: now - Math.max(0, wall - k.send.createdAt) };
        slots.push(k.send.slot);
      } else send?.release();
      const pending = k.pending && SealKey.restore(k.pending.slot);
      if (pending && pending.id === k.pending?.id) {
        p.pending = { id: pending.id, key: pending, at: now - Math.max(0, wall - k.pending.at) };
        slots.push(k.pending.slot);
      } else pending?.release();
      for (const r of k.recv) {
        const expiresAt = r.expiresAt === null ? Infinity : now + (r.expiresAt - wall);
        if (this.#c.keys.restore(p, r.id, r.slot, expiresAt)) slots.push(r.slot);
      }
      if (k.usable && p.send) {
        p.lastHeard = now;
        p.heardFull = now;
        p.heardByPeer = now;
      } else if (k.heard !== undefined) {
        p.lastHeard = now - Math.max(0, wall - k.heard);
      }
    }
    const swept = KeptRegion.sweep(slots);
    const restored = this.#c.peers.size;
    if (restored > 0 || swept > 0) this.#c.log?.info('datagram path taken back from the kept region', { peers: restored, keys: slots.length, swept });
    return restored;
  }

  /**
   * Describes the peers and their keys' slots in the kept region (`now` steady, `wall` ms since the epoch), after every
   * change of keys or addresses (a key's slot is freed only after the description without it, and described only once
   * made): what {@link restore} reads in the agent's next process.
   */
  describe(now: number, wall: number): void {
    const peers: KeptPeer[] = [];
    for (const p of this.#c.peers.values()) {
      const recv = p.recvIds.map((id) => ({ slot: this.#c.table.slot(id), id, expiresAt: wallOf(this.#c.keys.expiresAt(id), now, wall) }));
      peers.push({
        id: p.id, pin: p.pin, usable: this.#usable(p, now),
        ...(p.lastHeard > -Infinity ? { heard: wall - (now - p.lastHeard) } : {}),
        ...(p.endpoint ? { endpoint: `${p.endpoint.host}:${p.endpoint.port}` } : {}),
        ...(p.announced ? { announced: p.announced } : {}),
        ...(p.send && p.send.key.slot >= 0 ? { send: { slot: p.send.key.slot, id: p.send.id, createdAt: wall - (now - p.send.createdAt) } } : {}),
        ...(p.pending && p.pending.key.slot >= 0 ? { pending: { slot: p.pending.key.slot, id: p.pending.id, at: wall - (now - p.pending.at) } } : {}),
        recv: recv.filter((r) => r.slot >= 0),
      });
    }
    const state: KeptDescription = { v: 1, peers };
    try {
      KeptRegion.write(Buffer.from(JSON.stringify(state)));
    } catch (err) {
      this.#c.log?.error('cannot describe the kept datagram keys: a restart of the agent loses the datagram path for a while', { err });
    }
    this.#describedUsable = this.#usableSet(now);
  }

  /** Whether the peers usable at `now` are other than the last description says: it is then due at once. */
  outdated(now: number): boolean {
    return this.#usableSet(now) !== this.#describedUsable;
  }

  #usableSet(now: number): string {
    const ids: string[] = [];
    for (const p of this.#c.awake ?? this.#c.peers.values()) if (this.#usable(p, now)) ids.push(p.id);
    return ids.join(',');
  }

  #usable(p: PeerState, now: number): boolean {
    return usable(p, now, this.#init.deadAfterMs);
  }
}

/** A steady-clock deadline as wall-clock ms (null: never). */
function wallOf(steady: number, now: number, wall: number): number | null {
  return steady === Infinity ? null : wall + (steady - now);
}
