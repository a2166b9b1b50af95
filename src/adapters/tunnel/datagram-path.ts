/**
 * The tunnel's datagram path: every packet (or segment of a TCP superpacket) to a peer sealed into its own UDP
 * datagram (src/core/tunnel/datagram.ts), on one UDP socket per node. The pinned TLS streams stay: they carry the
 * keys and addresses (`udp-key`, `udp-key-ack`, docs/api.md) and every packet the datagram path cannot take. This
 * class holds the socket, the timers, the counters and the peers; what the socket receives is handed on in
 * src/adapters/tunnel/datagram-receive.ts, and what goes out leaves through src/adapters/tunnel/datagram-outbox.ts.
 *
 * Keys: each node picks its own sending key per peer and announces it on a tunnel stream of the pair, both ends
 * deriving it from that stream's TLS session (src/adapters/tunnel/datagram-keys.ts, which holds the receiving keys).
 *
 * Addresses and liveness: `udp-key` says where the peer wants datagrams (its public address as the relay observed it,
 * or the address of the stream, and its UDP port). Every second each end sends a keepalive with a flag saying whether
 * it heard the other lately; a peer's path is usable only while both hold (we hear it, it hears us), so a path that
 * drops our datagrams (UDP blocked, a NAT mapping gone) falls back to the streams within {@link DEAD_AFTER_MS}. A
 * keepalive is one byte, but every {@link FULL_KEEPALIVE_EVERY}th per peer (and every one while the path is not usable)
 * is padded to the full datagram size, and "heard" counts only while a full one came within ten dead intervals: a path
 * that drops full-size datagrams (a smaller path MTU) falls back too, within 30 s. Padding every keepalive cost about
 * 1.5 kB/s per peer and direction on an idle path (130 MB a day), on edge links that are often metered; now it is about
 * 0.2 kB/s. One keepalive in {@link ECHO_EVERY} per peer asks for an echo, which the peer answers at once with a
 * one-byte keepalive: the path's round trip (`atoll peers`; an agent from before does not answer, and shows none).
 * An authentic keepalive from a new address moves the peer there (a NAT rebinding, or a port the NAT did not
 * preserve); an authentic data datagram from anywhere but the peer's address is dropped. Sending both ways at once
 * opens both NATs: this is the hole punching.
 *
 * Bad input is dropped before any answer and counted by reason: too short, not our type, an unknown or expired key,
 * a counter seen before (replay window), a tag that does not verify. Nothing received is ever answered.
 *
 * Without a stream (the relay and the controller unreachable, or the peer restarted while they were), the path
 * rebuilds itself with hellos (src/adapters/tunnel/datagram-hello-exchange.ts). Across a restart of the agent, a kept
 * region holds the keys and describes the peers (src/adapters/tunnel/datagram-kept-peers.ts).
 *
 * MTU: the socket sets IP_PMTUDISC_DO, so no datagram is fragmented on the underlay; a packet whose datagram would
 * exceed the underlay MTU is left to the stream (the TUN device's MTU keeps pods below it, see src/agent/tunnel.ts).
 */
import { DATAGRAM_TYPE, innerMtu, REKEY_AFTER_MS, REKEY_AFTER_PACKETS } from '../../core/tunnel/datagram.ts';
import { DEAD_AFTER_MS, HELLO_FAST_MS, KEEPALIVE_MS, keepaliveSent, lastResort, newPeerTimes, planTick, usable } from '../../core/tunnel/datagram-peer.ts';
import type { UdpKeyAck, UdpKeyMessage } from '../../core/tunnel/messages.ts';
import { VNET_HDR_LEN } from '../../core/tunnel/routing.ts';
import { OpenKeyTable } from './datagram-native.ts';
import { HelloExchange } from './datagram-hello-exchange.ts';
import { KeptPeers } from './datagram-kept-peers.ts';
import { DatagramKeys } from './datagram-keys.ts';
import { DatagramOutbox } from './datagram-outbox.ts';
import type { DatagramPathComponents, DatagramPathInit, DatagramPathStats, DatagramPeerStatus } from './datagram-path-types.ts';
import { type Endpoint, parseEndpoint, type PeerState } from './datagram-peer-state.ts';
import { DatagramReceiver } from './datagram-receive.ts';
import { UdpBatchSocket } from './udp-batch.ts';
import type { TunnelStream } from './tunnel-stream.ts';
import { steadyClock } from '../timers.ts';

/**
 * The socket's receive and send buffers asked for (the kernel doubles them for its bookkeeping): as much as a TCP
 * receiver may queue with the benchmark's tcp_rmem. A datagram queued takes up to 4.5 KB of that (its buffer's true
 * size), so 32 MB holds about 7000, 80 ms at 1 Gbit/s: a burst (a link or delay line that stalled and caught up) or a
 * pause of the agent (a GC, a busy CPU) loses nothing. Measured on the lab at 1% loss: with 4 MiB, bursts of about
 * 1800 datagrams dropped at once (UdpRcvbufErrors) several times per 10 s run, and the inner TCP fell to 0.4 to 0.5 of
 * plain TCP. The memory is taken only while datagrams wait.
 */
export const SOCKET_BUFFER_BYTES = 16 << 20;

/** Every this many ticks the timers' peers are checked against all peers ({@link DatagramPath.#sweep}). */
const SWEEP_EVERY_TICKS = 60;

export class DatagramPath {
  readonly stats: DatagramPathStats = {
    sent: 0, received: 0, keepalivesSent: 0, keepalivesReceived: 0, fallbacks: 0, sentAnyway: 0, endpointMoves: 0, lastSendErrno: 0, hellosSent: 0, hellosReceived: 0, helloKeys: 0,
    copiesSent: 0, copiesSpared: 0,
    dropped: {
      truncated: 0, badType: 0, unknownKey: 0, replayed: 0, badTag: 0, unknownAddress: 0, badPayload: 0, sendFailed: 0,
      helloMalformed: 0, helloUnknownPeer: 0, helloBadSignature: 0, helloReplayed: 0, helloLimited: 0, helloUnsaved: 0,
    },
  };
  readonly #c: DatagramPathComponents;
  readonly #init: DatagramPathInit;
  #socket: UdpBatchSocket | undefined;
  readonly #peers = new Map<string, PeerState>();
  /**
   * The peers the timers look at: all but the dormant ones, which have no address, no key, no offer and no stream
   * (a cloud node's edge peers that never connected). For those the per-second work (keepalives, offers, hellos, the
   * memory) has nothing to do, and with 100,000 peers walking them all cost a core. A peer wakes when it gets a stream
   * ({@link offerKey}, {@link onControl}, {@link setPeers}), a hello, or is taken back with an address or keys, and
   * stays awake until it is removed; {@link #sweep} wakes any other that is not dormant, once a minute.
   */
  readonly #awake = new Set<PeerState>();
  /** Peers were added or removed since the last tick: the memory is compared in full. */
  #membersChanged = true;
  /** Peers by their tag in the native key table. */
  readonly #tags = new Map<number, PeerState>();
  #nextTag = 0;
  /** The receiving keys' crypto and replay windows, by id. */
  readonly #table = new OpenKeyTable();
  /** The keys offered and taken on the streams, and the receiving keys' ids, peers and expiry. */
  readonly #keys: DatagramKeys;
  /** With a tunnel key and a state store: the hellos, which rebuild paths without a stream. */
  readonly #hellos: HelloExchange | undefined;
  /** With a kept region: its description of the peers and their keys. */
  readonly #kept: KeptPeers | undefined;
  /** Seals and sends, through the socket. */
  readonly #out: DatagramOutbox;
  /** Opens and hands on what the socket received. */
  readonly #receiver: DatagramReceiver;
  /** The largest IP packet one datagram carries. */
  readonly #maxIp: number;
  readonly #keepalive: Uint8Array;
  #timer: NodeJS.Timeout | undefined;
  #helloTimer: NodeJS.Timeout | undefined;
  /** Whether the peers were set once: before that, an empty peer set is not what to remember. */
  #peersSet = false;
  #port = 0;
  /** The peers taken back from the kept region (before the first {@link setPeers}), and how many. */
  #restored = 0;
  /** Keepalive ticks so far: which peers' keepalives this tick pads. */
  #ticks = 0;

  constructor(components: DatagramPathComponents, init: DatagramPathInit) {
    this.#c = components;
    this.#init = init;
    this.#maxIp = innerMtu(init.underlayMtu);
    this.#keepalive = new Uint8Array(VNET_HDR_LEN + this.#maxIp);
    const deadAfterMs = init.deadAfterMs ?? DEAD_AFTER_MS;
    const { log } = components;
    const describe = () => this.#describe();
    const table = this.#table;
    const out = new DatagramOutbox(this.stats, this.#maxIp);
    const keys = new DatagramKeys({ table, peers: this.#peers, publicHost: components.publicHost, port: () => this.#port, describe }, { deadAfterMs });
    const awake = this.#awake;
    const kept = init.kept ? new KeptPeers({ peers: this.#peers, awake, table, keys, log }, { deadAfterMs }) : undefined;
    const hellos = init.identityKeyPem && components.state ? new HelloExchange({
      peers: this.#peers, awake, wake: (p) => awake.add(p), peersSet: () => this.#peersSet, keys, describe, out, streamOf: components.streamOf,
      state: components.state, stats: this.stats, log,
    }, { identityKeyPem: init.identityKeyPem, deadAfterMs }) : undefined;
    this.#out = out;
    this.#keys = keys;
    this.#kept = kept;
    this.#hellos = hellos;
    this.#receiver = new DatagramReceiver({ table, tags: this.#tags, hellos, kept, describe, out, onPacket: components.onPacket, stats: this.stats }, { deadAfterMs });
  }

  /** The largest inner IP packet a datagram carries: what the TUN device's MTU may be at most. */
  get innerMtu(): number {
    return this.#maxIp;
  }

  /** The bound port (after {@link start}). */
  get port(): number {
    return this.#port;
  }

  /** The socket's descriptor (after {@link bind}), for the keeper. */
  get socketFd(): number {
    // cannot happen: the tunnel binds the path before it reads its socket's descriptor
    if (!this.#socket) throw new Error('the datagram path is not bound');
    return this.#socket.fd;
  }

  /** The peers a previous process of the agent left in the kept region, taken back by {@link bind}. */
  get restored(): number {
    return this.#restored;
  }

  /** {@link bind} and {@link run}. @throws AtollError TUNNEL_UNREACHABLE when the port cannot be bound. */
  async start(): Promise<number> {
    const port = this.bind();
    this.run();
    return port;
  }

  /**
   * Binds the socket (src/adapters/tunnel/udp-batch.ts: received in batches on a pool thread), or takes `socket`, bound by a
   * previous process of the agent; with a kept region, takes back the keys and peers that process left there.
   * Nothing is received or sent before {@link run}.
   * @throws AtollError TUNNEL_UNREACHABLE when the port cannot be bound.
   */
  bind(socket?: UdpBatchSocket): number {
    const { host, port } = this.#init;
    const s = socket ?? new UdpBatchSocket({ host, port, bufferBytes: SOCKET_BUFFER_BYTES });
    this.#socket = s;
    this.#out.attach(s.fd);
    this.#port = s.port;
    if (this.#kept) this.#restore(this.#kept);
    return this.#port;
  }

  /** Starts receiving, the keepalives (the first at once when peers were taken back) and the hellos. */
  run(): void {
    const socket = this.#socket;
    if (!socket || this.#timer) return;
    this.#helloPins();
    socket.start((n) => this.#receiver.onMessages(socket, n));
    this.#timer = setInterval(() => this.#tick(), this.#init.keepaliveMs ?? KEEPALIVE_MS);
    this.#timer.unref();
    const hellos = this.#hellos;
    if (hellos) {
      hellos.keepPort(this.#port);
      this.#helloTimer = setInterval(() => hellos.pass(steadyClock(), Date.now()), HELLO_FAST_MS);
      this.#helloTimer.unref();
    }
    // the peers still count on our keepalives: they give the path up DEAD_AFTER_MS after the last one they heard
    if (this.#restored > 0) this.#tick();
  }

  /** Takes back what the kept region describes ({@link KeptPeers.restore}), and describes it again. */
  #restore(kept: KeptPeers): void {
    this.#restored = kept.restore((id, pin, endpoint) => this.#newPeer(id, pin, endpoint), steadyClock(), Date.now());
    this.#peersSet = this.#restored > 0;
    this.#sweep(); // the keys came after the peers
    this.#describe();
  }

  /** Describes the peers in the kept region, if any ({@link KeptPeers.describe}): after a change of keys or addresses. */
  #describe(): void {
    this.#kept?.describe(steadyClock(), Date.now());
  }

  #newPeer(id: string, pin: string, endpoint: Endpoint | undefined): PeerState {
    const mem = this.#hellos?.memoryOf(id, pin);
    const p: PeerState = {
      ...newPeerTimes(), id, tag: this.#nextTag++, endpoint: endpoint ?? parseEndpoint(mem?.endpoint), announced: undefined, send: undefined, pending: undefined, recvIds: [],
      pin, seenGeneration: mem?.seenGeneration ?? -1, theirEph: undefined, myEph: undefined, myEphUsedWith: undefined,
    };
    this.#peers.set(id, p);
    this.#tags.set(p.tag, p);
    this.#membersChanged = true;
    this.#wakeIfNotDormant(p);
    return p;
  }

  /** Wakes `p` unless it is dormant (no address, key, offer, stream nor hello seen): see {@link #awake}. */
  #wakeIfNotDormant(p: PeerState): void {
    if (p.endpoint || p.send || p.pending || p.seenGeneration >= 0 || this.#c.streamOf(p.id)) this.#awake.add(p);
  }

  /** Wakes every peer that is not dormant: a net under the wake-ups at the places a peer gets a stream, key or address. */
  #sweep(): void {
    for (const p of this.#peers.values()) if (!this.#awake.has(p)) this.#wakeIfNotDormant(p);
  }

  /**
   * Keeps state for exactly these peers (by name, with their pins): the others' keys are dropped and freed, as are a
   * peer's whose pin changed. A new peer starts from what the node remembers of it (its last address).
   */
  setPeers(peers: readonly { readonly id: string; readonly pin: string }[]): void {
    this.#peersSet = peers.length > 0 || this.#peersSet;
    const keep = new Map(peers.map((p) => [p.id, p.pin]));
    const gone: PeerState[] = [];
    for (const [id, p] of this.#peers) {
      if (keep.get(id) === p.pin) continue;
      gone.push(p);
      this.#peers.delete(id);
      this.#tags.delete(p.tag);
      this.#awake.delete(p);
      this.#membersChanged = true;
    }
    for (const [id, pin] of keep) if (!this.#peers.has(id)) this.#newPeer(id, pin, undefined);
    this.#helloPins();
    // described without them before their keys' slots are freed
    if (gone.length > 0) this.#describe();
    for (const p of gone) {
      p.send?.key.free();
      p.pending?.key.free();
      for (const k of [...p.recvIds]) this.#keys.drop(k, false);
    }
  }

  /** Offers a new sending key to `peerId` on `stream` (a live tunnel stream of the pair). */
  offerKey(peerId: string, stream: TunnelStream): void {
    this.#wake(peerId);
    this.#keys.offer(peerId, stream);
  }

  /** A `udp-key` or `udp-key-ack` from `peerId`, on `stream`. */
  onControl(peerId: string, stream: TunnelStream, msg: UdpKeyMessage | UdpKeyAck): void {
    this.#wake(peerId);
    this.#keys.onControl(peerId, stream, msg);
  }

  #wake(peerId: string): void {
    const p = this.#peers.get(peerId);
    if (p) this.#awake.add(p);
  }

  /** Hellos on, for the peers' keys alone (a node without a tunnel key takes none): the native table drops the rest. */
  #helloPins(): void {
    if (this.#hellos) this.#table.setHelloPins([...this.#peers.values()]);
  }

  /** Whether packets to `peerId` take the datagram path now. */
  usable(peerId: string): boolean {
    const p = this.#peers.get(peerId);
    return p !== undefined && this.#usable(p, steadyClock());
  }

  #usable(p: PeerState, now: number): boolean {
    return usable(p, now, this.#init.deadAfterMs ?? DEAD_AFTER_MS);
  }

  /**
   * Queues `pkt` (virtio header first, as read from the TUN device) for `peerId` in datagrams, a superpacket split into
   * its segments; they leave at the next {@link flush} (or sooner, when the run they join is full). The bytes are
   * copied: `pkt` may be reused at once. Call {@link flush} after each batch of packets: equal-sized datagrams to one
   * peer leave in one system call (UDP GSO), so a batch of a flow's ACKs costs one send, not one each.
   * @returns false when the datagram path cannot take it (not usable now, or too big and not splittable): the caller
   *   sends it on a stream. What was queued before it leaves first, so a flow's packets keep their order.
   */
  send(peerId: string, pkt: Uint8Array): boolean {
    const p = this.#peers.get(peerId);
    const n = p && this.#usable(p, steadyClock()) ? this.#out.queue(p, DATAGRAM_TYPE.data, pkt) : -1;
    if (n < 0) {
      this.flush();
      this.stats.fallbacks++;
      return false;
    }
    this.stats.sent += n;
    return true;
  }

  /**
   * Queues `pkt` for `peerId` on a path that is not usable, when nothing else reaches the peer: the caller has no
   * stream or circuit to it (`stream` undefined), or only one silent for a dead interval (a circuit whose relay cannot
   * see that the peer's end went: its site cut off from the relay). The peer's agent may be restarting, its keeper's
   * socket queueing what comes until the next process reads it, which then answers with its keepalives and makes the
   * path usable again. Only with the peer's key and address, and within {@link LAST_RESORT_MS} of the last authentic
   * datagram from it; packets to a peer that moved or went are lost, as they would be without it. Leaves with the next
   * {@link flush}, like {@link send}'s.
   * @returns false when it was not queued: the caller sends the packet on `stream`, or drops it without one.
   */
  sendAnyway(peerId: string, pkt: Uint8Array, stream?: Pick<TunnelStream, 'silentMs'>): boolean {
    const p = this.#peers.get(peerId);
    const now = steadyClock();
    if (!p || !lastResort(p, now, stream?.silentMs, this.#init)) return false;
    const n = this.#out.queue(p, DATAGRAM_TYPE.data, pkt);
    if (n < 0) return false;
    this.stats.sent += n;
    this.stats.sentAnyway += n;
    return true;
  }

  /** Sends what {@link send} queued. */
  flush(): void {
    this.#out.flush();
  }

  /** Every second: keepalives, key rotation, offers that went unanswered, expired receiving keys. */
  #tick(): void {
    const now = steadyClock();
    const limits = this.#init.rekey ?? { packets: REKEY_AFTER_PACKETS, ms: REKEY_AFTER_MS };
    if (this.#ticks % SWEEP_EVERY_TICKS === 0) this.#sweep();
    for (const p of this.#awake) {
      const plan = planTick(p, now, this.#ticks, p.tag, { deadAfterMs: this.#init.deadAfterMs, rekey: limits });
      if (plan.offer) {
        const stream = this.#c.streamOf(p.id);
        if (stream) this.offerKey(p.id, stream);
      }
      const keepalive = plan.keepalive;
      if (keepalive) {
        this.#keepalive[0] = keepalive.flags;
        const at = steadyClock();
        if (this.#out.queue(p, DATAGRAM_TYPE.keepalive, keepalive.full ? this.#keepalive : this.#keepalive.subarray(0, 1)) > 0) {
          this.stats.keepalivesSent++;
          keepaliveSent(p, keepalive, at);
        }
        this.flush();
      }
    }
    this.#ticks++;
    this.#keys.dropExpired(now);
    if (this.#kept?.outdated(now)) this.#describe();
    this.#hellos?.remember(this.#membersChanged ? 'all' : 'awake');
    this.#membersChanged = false;
  }

  /** The datagram path of `peerId`, for `atoll peers`. */
  statusOf(peerId: string): DatagramPeerStatus | undefined {
    const p = this.#peers.get(peerId);
    if (!p) return undefined;
    return {
      usable: this.#usable(p, steadyClock()), endpoint: p.endpoint ? `${p.endpoint.host}:${p.endpoint.port}` : undefined,
      ...(p.rebuildingSince !== undefined ? { rebuildingSince: p.rebuildingSince } : {}),
      ...(p.rttMs !== undefined ? { rttMs: p.rttMs } : {}),
    };
  }

  /** Stops the keepalives, closes the socket, frees every key. Idempotent. */
  close(): void {
    this.#stopTimers();
    this.setPeers([]);
    this.#socket?.close();
    this.#out.free();
    this.#table.free();
  }

  /**
   * Stops, leaving the data plane to the agent's next process (a keeper holds the socket and the kept region): the
   * socket's last ring is still opened and handed on (src/adapters/tunnel/udp-batch.ts, closeKeeping), what is queued sent,
   * and the keys' slots and the description stay as they are. Without a kept region, {@link close}.
   */
  async closeKeeping(): Promise<void> {
    if (!this.#init.kept) return this.close();
    this.#stopTimers();
    await this.#socket?.closeKeeping();
    this.flush();
    for (const p of this.#peers.values()) {
      p.send?.key.release();
      p.pending?.key.release();
    }
    this.#peers.clear();
    this.#tags.clear();
    this.#keys.forget();
    this.#out.free();
    this.#table.free(true);
  }

  #stopTimers(): void {
    if (this.#timer) clearInterval(this.#timer);
    if (this.#helloTimer) clearInterval(this.#helloTimer);
    this.#timer = undefined;
    this.#helloTimer = undefined;
  }
}

