/**
 * The datagram path's hellos: how it rebuilds itself without a stream (the relay and the controller unreachable, or
 * the peer restarted while they were). A peer whose path is not usable and that has no stream it answers on gets
 * hellos at its last address (src/core/tunnel/hello.ts: signed X25519 with the pinned tunnel keys; the cryptography in
 * src/adapters/tunnel/datagram-hello.ts), and the keys they agree on replace the stream's. The port, the hello
 * generation and every peer's last address are kept on the node (src/adapters/tunnel/datagram-state-file.ts), so a
 * restarted agent binds the port its NAT mapping belongs to and finds its peers where they were. What cannot heal so:
 * both ends' addresses changed while the coordinators were away (a NAT that re-mapped the port on both sides); the
 * pair then waits for a stream, as before.
 *
 * The path (src/adapters/tunnel/datagram-path.ts) owns the socket, the peers and the timer, and hands hellos in.
 */
import type { Logger } from '../../core/ports.ts';
import { answerHello, helloStep, onHandshake } from '../../core/tunnel/datagram-peer.ts';
import { equalBytes, type HelloDrop, judgeHello, parseHello } from '../../core/tunnel/hello.ts';
import { SealKey } from './datagram-native.ts';
import { type Ephemeral, HelloCrypto } from './datagram-hello.ts';
import type { DatagramKeys } from './datagram-keys.ts';
import type { DatagramOutbox } from './datagram-outbox.ts';
import type { DatagramPathStats } from './datagram-path-types.ts';
import { endpointOf, type PeerState } from './datagram-peer-state.ts';
import type { DatagramLocalState, DatagramPeerMemory } from './datagram-state-file.ts';
import { StateWriter } from '../node/state-writer.ts';
import type { TunnelStream } from './tunnel-stream.ts';
import type { UdpSource } from './udp-batch.ts';
import { steadyClock } from '../timers.ts';

/** Signature checks of hellos per second at most: a flood of forged hellos costs a bounded share of a core. */
const HELLO_VERIFY_PER_S = 200;

export interface HelloExchangeComponents {
  /** The path's peers, by name. */
  readonly peers: ReadonlyMap<string, PeerState>;
  /** The peers that are not dormant (the path's #awake): only they can need hellos or change what is remembered. */
  readonly awake: ReadonlySet<PeerState>;
  /** Wakes a peer a hello came from. */
  readonly wake: (p: PeerState) => void;
  /** Whether the path's peers were set once: before that, an empty peer set is not what to remember. */
  readonly peersSet: () => boolean;
  /** The receiving keys: a pair's keys agreed by hellos join them. */
  readonly keys: Pick<DatagramKeys, 'add' | 'has'>;
  /** Describes the kept region again (datagram-kept-peers.ts): after every change of keys or addresses. */
  readonly describe: () => void;
  /** Where hellos go out, after what the path queued. */
  readonly out: Pick<DatagramOutbox, 'sendRaw'>;
  /** Any live stream of the peer (direct or a circuit): while it is not silent, hellos are not needed. */
  readonly streamOf: (peerId: string) => Pick<TunnelStream, 'silentMs'> | undefined;
  /**
   * Where the hellos' memory lives (src/adapters/tunnel/datagram-state-file.ts): `save` throws when the disk refuses
   * the write; `path` names the file in the log.
   */
  readonly state: { load(): DatagramLocalState; save(state: DatagramLocalState): void; readonly path?: string };
  readonly stats: Pick<DatagramPathStats, 'hellosSent' | 'hellosReceived' | 'helloKeys' | 'dropped'>;
  /** Keys agreed by hellos and paths being rebuilt are logged here. */
  readonly log?: Logger | undefined;
}

export interface HelloExchangeInit {
  /** The node's tunnel key (PEM): hellos are signed with it. */
  readonly identityKeyPem: string;
  /** The path's dead interval. */
  readonly deadAfterMs: number;
}

export class HelloExchange {
  readonly #c: HelloExchangeComponents;
  readonly #init: HelloExchangeInit;
  readonly #crypto: HelloCrypto;
  /** The hellos' memory (as last saved, unless {@link #file} is pending). */
  #state: DatagramLocalState;
  /** Writes {@link #state}; a failed write is logged once (NODE_STATE_WRITE_FAILED) and retried at each tick. */
  readonly #file: StateWriter<DatagramLocalState>;
  /** Signature checks left in this second, and when it started (steady). */
  #verifyBudget = { left: HELLO_VERIFY_PER_S, since: 0 };

  constructor(components: HelloExchangeComponents, init: HelloExchangeInit) {
    this.#c = components;
    this.#init = init;
    this.#crypto = new HelloCrypto(init.identityKeyPem);
    this.#state = components.state.load();
    this.#file = new StateWriter({ log: components.log ?? SILENT, write: (st) => components.state.save(st) }, {
      what: "the tunnel's datagram state", path: components.state.path ?? '(the datagram state)',
      meanwhile: "no hello of a new generation is sent, nor one of a peer's taken, until it is written (a replay could pass otherwise); paths in use go on",
    });
  }

  /** What the node remembers of peer `id` if its pin is still `pin`: its last address, the highest generation seen. */
  memoryOf(id: string, pin: string): DatagramPeerMemory | undefined {
    return this.#state.peers[id]?.pin === pin ? this.#state.peers[id] : undefined;
  }

  /** The path is bound to `port`: saved when it is another than last time. */
  keepPort(port: number): void {
    if (this.#state.port !== port) this.#save({ ...this.#state, port });
  }

  /**
   * A hello (src/core/tunnel/hello.ts) from the peer `p` (undefined: the tag the native table gave has no peer).
   * Checked cheaply first (its layout and that its key is a peer's: in C, see the path's #helloPins), then, within a
   * budget of signature checks per second, its signature; then judged against what we remember of its sender.
   */
  onHello(buf: Uint8Array, from: UdpSource, p: PeerState | undefined): void {
    const crypto = this.#crypto;
    const h = parseHello(buf);
    if (typeof h === 'string') return this.#drop(h);
    if (!p) return this.#drop('helloUnknownPeer');
    this.#c.wake(p);
    const peerId = p.id;
    const now = steadyClock();
    const budget = this.#verifyBudget;
    if (now - budget.since >= 1000) {
      budget.since = now;
      budget.left = HELLO_VERIFY_PER_S;
    }
    if (budget.left <= 0) return this.#drop('helloLimited');
    budget.left--;
    if (!crypto.verify(h.spki, h.signed, h.signature)) return this.#drop('helloBadSignature');
    const v = judgeHello({ seenGeneration: p.seenGeneration, theirEph: p.theirEph, myEph: p.myEph?.pub, myEphUsedWith: p.myEphUsedWith }, h);
    if (v.replayed) return this.#drop('helloReplayed');
    this.#c.stats.hellosReceived++;
    if (v.newHandshake) {
      const was = { endpoint: p.endpoint, seenGeneration: p.seenGeneration, theirEph: p.theirEph };
      // only a generation above the one on record moves the peer (a replay of its current hello after our restart
      // makes us answer its known address, never the replayer's)
      if (h.generation > p.seenGeneration || !p.endpoint) p.endpoint = endpointOf(from.address, from.port);
      p.seenGeneration = h.generation;
      p.theirEph = h.eph.slice();
      if (!this.remember()) {
        // taken without its generation on disk, a replay of this hello after a restart would pass: not taken
        Object.assign(p, was);
        return this.#drop('helloUnsaved');
      }
    }
    if (v.renewMyEph && !this.#renewEph(p)) return this.#drop('helloUnsaved');
    const mine = p.myEph as Ephemeral;
    if (v.derive && !(p.myEphUsedWith && equalBytes(p.myEphUsedWith, h.eph))) {
      const keys = crypto.derive(mine, h.eph, p.pin);
      if (!keys || this.#c.keys.has(keys.recv.id)) return this.#drop('helloMalformed');
      p.myEphUsedWith = h.eph.slice();
      const was = p.send;
      // an offer made before this handshake is stale: its key may reach the peer after the handshake's, and the peer
      // keeps its newest receiving keys only (the older expire), so a late ack of it would switch us to a key the peer
      // lets go of while we use it (the lab's NAT reboot showed it: one end sending under a key the other had dropped)
      const stale = p.pending;
      p.pending = undefined;
      p.send = { id: keys.send.id, key: new SealKey(keys.send.key, keys.send.id), createdAt: now };
      this.#c.keys.add(peerId, p, keys.recv.id, keys.recv.key);
      this.#c.describe();
      was?.key.free();
      stale?.key.free();
      keys.send.key.fill(0);
      keys.recv.key.fill(0);
      this.#c.stats.helloKeys++;
      this.#c.log?.info('datagram keys agreed by hellos', { peer: peerId, endpoint: `${from.address}:${from.port}`, rebuildingForMs: p.rebuildingSince === undefined ? 0 : Date.now() - p.rebuildingSince });
    }
    // it echoed our key: it hears us, and we hear it (the full-size keepalives confirm the path's MTU later)
    if (v.derive) onHandshake(p, now);
    if (v.answer && answerHello(p, now)) this.#send(p);
  }

  /**
   * Every {@link HELLO_FAST_MS} (the path's timer; `now` steady, `wall` ms since the epoch): a peer whose path is not
   * usable and that has no stream to bring keys, or only a silent one (the relay and the controller away, or a peer
   * that restarted) gets hellos at its last address, fast at first, then every second, until the path is usable
   * again. Both ends do the same, so whichever restarted, the pair finds itself again as long as one of the two
   * addresses still holds.
   */
  pass(now: number, wall: number): void {
    const dead = this.#init.deadAfterMs;
    for (const p of this.#c.awake) {
      // without an address there is nowhere to send hellos (helloStep would say so); dormant peers have none
      const step = helloStep(p, now, wall, this.#c.streamOf(p.id)?.silentMs, dead);
      if (step.started) {
        this.#c.log?.info('rebuilding the datagram path with hellos (no usable path, no stream the peer answers on)', { peer: p.id, endpoint: `${p.endpoint?.host}:${p.endpoint?.port}` });
        // a key already used to derive is spent: a rebuild starts a new handshake
        if (p.myEphUsedWith) p.myEph = undefined;
      }
      if (step.send) this.#send(p);
    }
  }

  /**
   * Saves the peers' addresses when one changed since the last save. `which`: the peers compared, all of them (after
   * peers were added or removed) or only the awake ones (dormant peers' memory changes only when peers are set).
   * A write that failed before is tried again. Returns whether the file holds what is remembered.
   */
  remember(which: 'all' | 'awake' = 'all'): boolean {
    if (!this.#c.peersSet()) return this.#file.flush();
    const state = this.#state;
    let changed = which === 'all' ? Object.keys(state.peers).length !== this.#c.peers.size : false;
    for (const p of which === 'all' ? this.#c.peers.values() : this.#c.awake) {
      if (changed) break;
      const was = state.peers[p.id];
      const endpoint = p.endpoint ? `${p.endpoint.host}:${p.endpoint.port}` : undefined;
      changed = was?.pin !== p.pin || was.endpoint !== endpoint || (was.seenGeneration ?? -1) !== p.seenGeneration;
    }
    if (!changed) return this.#file.flush();
    const peers: Record<string, DatagramPeerMemory> = {};
    for (const [id, p] of this.#c.peers) {
      const endpoint = p.endpoint ? `${p.endpoint.host}:${p.endpoint.port}` : undefined;
      peers[id] = { pin: p.pin, ...(endpoint ? { endpoint } : {}), ...(p.seenGeneration >= 0 ? { seenGeneration: p.seenGeneration } : {}) };
    }
    return this.#save({ ...state, peers });
  }

  /**
   * A new ephemeral key for `p`, under a new generation saved before any hello carries it. Returns false, leaving
   * `p` without one, when the generation cannot be saved: a hello of it sent unsaved could be sent again after a
   * restart with another key, which its peer takes for a replay, and below what a peer may have seen.
   */
  #renewEph(p: PeerState): boolean {
    const state = this.#state;
    const generation = state.generation + 1;
    p.myEph = undefined;
    p.myEphUsedWith = undefined;
    if (!this.#save({ ...state, generation })) return false;
    p.myEph = { ...this.#crypto.newEphemeral(), generation };
    return true;
  }

  #send(p: PeerState): void {
    if (!p.endpoint) return;
    if (!p.myEph && !this.#renewEph(p)) return;
    const mine = p.myEph as Ephemeral & { generation: number };
    const derived = p.myEphUsedWith !== undefined && p.theirEph !== undefined && equalBytes(p.myEphUsedWith, p.theirEph);
    const hello = this.#crypto.hello(p.pin, mine.generation, mine.pub, p.theirEph, derived);
    this.#c.out.sendRaw(p.endpoint, hello);
    this.#c.stats.hellosSent++;
  }

  #drop(reason: HelloDrop): void {
    this.#c.stats.dropped[reason]++;
  }

  /**
   * Keeps `state` and writes it; returns whether it reached the disk. A failed write (a full disk) is logged once,
   * not thrown, and retried at the next change or tick; meanwhile no generation that is not on disk is used.
   */
  #save(state: DatagramLocalState): boolean {
    this.#state = state;
    return this.#file.save(state);
  }
}

/** The log when the path was given none. */
const SILENT: Logger = { debug: () => {}, info: () => {}, warn: () => {}, error: () => {}, child: () => SILENT };
