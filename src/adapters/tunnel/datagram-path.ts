/**
 * The tunnel's datagram path: every packet (or segment of a TCP superpacket) to a peer sealed into its own UDP
 * datagram (src/core/tunnel/datagram.ts), on one UDP socket per node. The pinned TLS streams stay: they carry the
 * keys and addresses (`udp-key`, `udp-key-ack`, docs/api.md) and every packet the datagram path cannot take.
 *
 * Keys: each node picks its own sending key per peer, announces it with a random 32-bit id and 128-bit salt on a
 * tunnel stream of the pair (direct or a circuit), and both ends derive it as HKDF-SHA256 of that stream's TLS 1.3
 * exported keying material, the salt and the id. So a key is known only to the two pinned ends of a TLS session
 * (the relay under a circuit included: it sees ciphertext only), no new trust is added, and each direction has its
 * own key with its own counter as nonce. The sender uses it once the peer acknowledged it, and replaces it after
 * {@link REKEY_AFTER_PACKETS} datagrams or {@link REKEY_AFTER_MS}; the receiver keeps the previous key for
 * {@link OLD_KEY_GRACE_MS} for the datagrams in flight. A restarted peer has no keys: a new stream brings new ones.
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
 * rebuilds itself: a peer whose path is not usable and that has no stream it answers on gets hellos at its last address
 * (src/core/tunnel/hello.ts: signed X25519 with the pinned tunnel keys), and the keys they agree on replace the
 * stream's. The port, the hello generation and every peer's last address are kept on the node
 * (src/adapters/tunnel/datagram-state-file.ts), so a restarted agent binds the port its NAT mapping belongs to and finds its
 * peers where they were. What cannot heal so: both ends' addresses changed while the coordinators were away (a NAT
 * that re-mapped the port on both sides); the pair then waits for a stream, as before.
 *
 * MTU: the socket sets IP_PMTUDISC_DO, so no datagram is fragmented on the underlay; a packet whose datagram would
 * exceed the underlay MTU is left to the stream (the TUN device's MTU keeps pods below it, see src/agent/tunnel.ts).
 */
import { hkdfSync, randomBytes } from 'node:crypto';
import { DATAGRAM_TYPE, type DatagramDrop, innerMtu, OLD_KEY_GRACE_MS, REKEY_AFTER_MS, REKEY_AFTER_PACKETS } from '../../core/tunnel/datagram.ts';
import {
  answerHello, DEAD_AFTER_MS, HELLO_FAST_MS, helloStep, KEEPALIVE_MS, keepaliveSent, lastResort, newPeerTimes, onHandshake, onKeepalive, onPacket,
  type PeerTimes, planTick, usable,
} from '../../core/tunnel/datagram-peer.ts';
import { equalBytes, HELLO_TYPE, type HelloDrop, judgeHello, parseHello } from '../../core/tunnel/hello.ts';
import type { UdpKeyAck, UdpKeyMessage } from '../../core/tunnel/messages.ts';
import { type KeptDescription, type KeptPeer, parseKeptDescription } from '../../core/tunnel/kept-description.ts';
import { VNET_HDR_LEN } from '../../core/tunnel/routing.ts';
import type { Logger } from '../../core/ports.ts';
import { DatagramSender, ipv4Number, KeptRegion, OpenKeyTable, RESULT_INTS, SealKey } from './datagram-native.ts';
import { type Ephemeral, HelloCrypto } from './datagram-hello.ts';
import type { DatagramLocalState, DatagramPeerMemory } from './datagram-state-file.ts';
import { UdpBatchSocket, type UdpSource } from './udp-batch.ts';
import type { TunnelStream } from './tunnel-stream.ts';
import { steadyClock } from '../timers.ts';

/** The TLS exporter label datagram keys are derived from. */
export const DATAGRAM_EXPORTER_LABEL = 'EXPORTER-atoll-datagram-v1';
/** Receiving keys kept per peer at most. */
const MAX_RECV_KEYS = 3;
/**
 * The socket's receive and send buffers asked for (the kernel doubles them for its bookkeeping): as much as a TCP
 * receiver may queue with the benchmark's tcp_rmem. A datagram queued takes up to 4.5 KB of that (its buffer's true
 * size), so 32 MB holds about 7000, 80 ms at 1 Gbit/s: a burst (a link or delay line that stalled and caught up) or a
 * pause of the agent (a GC, a busy CPU) loses nothing. Measured on the lab at 1% loss: with 4 MiB, bursts of about
 * 1800 datagrams dropped at once (UdpRcvbufErrors) several times per 10 s run, and the inner TCP fell to 0.4 to 0.5 of
 * plain TCP. The memory is taken only while datagrams wait.
 */
export const SOCKET_BUFFER_BYTES = 16 << 20;

export type DatagramDropReason = DatagramDrop | HelloDrop | 'sendFailed';

/** Signature checks of hellos per second at most: a flood of forged hellos costs a bounded share of a core. */
const HELLO_VERIFY_PER_S = 200;

export interface DatagramPathStats {
  sent: number;
  received: number;
  keepalivesSent: number;
  keepalivesReceived: number;
  /**
   * Packets the datagram path could not take (no usable path, or too big and not splittable): the streams carried them,
   * or with no stream {@link DatagramPath.sendAnyway} may have sent them all the same (`sentAnyway`).
   */
  fallbacks: number;
  /** Datagrams sent on a path that was not usable, as nothing else reached their peer ({@link DatagramPath.sendAnyway}). */
  sentAnyway: number;
  /** Authentic keepalives from a new address of their peer: the peer's address moved there. */
  endpointMoves: number;
  /** The errno of the last failed send (0: none). */
  lastSendErrno: number;
  /** Hellos sent and authentic ones received; pairs of keys the hellos agreed on. */
  hellosSent: number;
  hellosReceived: number;
  helloKeys: number;
  /**
   * Second copies of datagrams sent (a flow's retransmissions and SACK acknowledgements go twice), and copies that
   * came when their original had too, set aside uncounted in `received` (native/atoll-dp.c, atoll_dp_send).
   */
  copiesSent: number;
  copiesSpared: number;
  readonly dropped: Record<DatagramDropReason, number>;
}

export interface DatagramPathComponents {
  /** The stream a key is offered on when rotating: any live stream of the peer (direct or a circuit). */
  readonly streamOf: (peerId: string) => TunnelStream | undefined;
  /** Our public host as seen from outside (the relay's `observed`), '' when unknown: peers then use the stream's. */
  readonly publicHost: () => string;
  /**
   * An authentic packet from `peerId`: its source check and the TUN device are the caller's. A view valid during the
   * call; `datagrams` of `bytes` (their plaintexts) came merged into it (TCP segments into a superpacket), else 1.
   */
  readonly onPacket: (peerId: string, pkt: Uint8Array, datagrams: number, bytes: number) => void;
  /** Keys agreed by hellos and paths being rebuilt are logged here. */
  readonly log?: Logger;
  /** Where the hellos' memory lives (src/adapters/tunnel/datagram-state-file.ts); with {@link DatagramPathInit.identityKeyPem}. */
  readonly state?: { load(): DatagramLocalState; save(state: DatagramLocalState): void };
}

export interface DatagramPathInit {
  /** Address and port to bind ('0.0.0.0' for all; port 0 for any free one). */
  readonly host: string;
  readonly port: number;
  /** The underlay's MTU: no datagram is larger. */
  readonly underlayMtu: number;
  readonly keepaliveMs?: number;
  readonly deadAfterMs?: number;
  /** {@link LAST_RESORT_MS}, for tests. */
  readonly lastResortMs?: number;
  readonly rekey?: { readonly packets: number; readonly ms: number };
  /** The node's tunnel key (PEM): with it and a state store, the hellos rebuild paths without a stream. */
  readonly identityKeyPem?: string;
  /**
   * A kept region is attached (src/adapters/tunnel/datagram-native.ts, KeptRegion; held by the node's keeper): the keys
   * live in it, the peers' keys and addresses are described in it at every change, and {@link DatagramPath.bind}
   * takes back what a previous process of the agent left there.
   */
  readonly kept?: boolean;
}

/** The size of the kept region's description: room for about a thousand peers. */
export const KEPT_META_BYTES = 256 << 10;
/** Slots of the kept region: a sending key, an offered one and three receiving keys per peer, for 204 peers. */
export const KEPT_SLOTS = 1024;

interface SendKey {
  readonly id: number;
  /** The key and its counter (native: src/adapters/tunnel/datagram-native.ts). */
  readonly key: SealKey;
  readonly createdAt: number;
}

/** A receiving key: its crypto and replay window live in the native table ({@link OpenKeyTable}) under its id. */
interface RecvKey {
  readonly peer: string;
  expiresAt: number;
}

/** A peer's address, with the numbers the native side and the receive ring use. */
interface Endpoint {
  readonly host: string;
  readonly port: number;
  /** IPv4, host order. */
  readonly addr: number;
  /** addr * 65536 + port, as {@link UdpBatchSocket.sourceKey}. */
  readonly key: number;
}

/** A peer: its keys and address here, its times in the core's terms (src/core/tunnel/datagram-peer.ts). */
interface PeerState extends PeerTimes {
  readonly id: string;
  /** Its tag in the native key table. */
  readonly tag: number;
  endpoint: Endpoint | undefined;
  /** The address its last `udp-key` announced. */
  announced: { host: string; port: number } | undefined;
  send: SendKey | undefined;
  pending: { readonly id: number; readonly key: SealKey; readonly at: number } | undefined;
  /** Its receiving keys' ids, oldest first. */
  readonly recvIds: number[];
  readonly pin: string;
  /** The hello handshake (src/core/tunnel/hello.ts): what we remember of the peer's and our ephemeral keys. */
  seenGeneration: number;
  theirEph: Uint8Array | undefined;
  myEph: (Ephemeral & { generation: number }) | undefined;
  myEphUsedWith: Uint8Array | undefined;
}

/** What `atoll peers` shows of one peer's datagram path. */
export interface DatagramPeerStatus {
  readonly usable: boolean;
  readonly endpoint: string | undefined;
  /** Since when (ms since the epoch) hellos are rebuilding the path, with no stream and no relay to help. */
  readonly rebuildingSince?: number;
  /** The round trip of the last echo answered (ms); absent until one was (a peer from before never answers). */
  readonly rttMs?: number;
}

export class DatagramPath {
  readonly stats: DatagramPathStats = {
    sent: 0, received: 0, keepalivesSent: 0, keepalivesReceived: 0, fallbacks: 0, sentAnyway: 0, endpointMoves: 0, lastSendErrno: 0, hellosSent: 0, hellosReceived: 0, helloKeys: 0,
    copiesSent: 0, copiesSpared: 0,
    dropped: {
      truncated: 0, badType: 0, unknownKey: 0, replayed: 0, badTag: 0, unknownAddress: 0, badPayload: 0, sendFailed: 0,
      helloMalformed: 0, helloUnknownPeer: 0, helloBadSignature: 0, helloReplayed: 0, helloLimited: 0,
    },
  };
  readonly #c: DatagramPathComponents;
  readonly #init: DatagramPathInit;
  #socket: UdpBatchSocket | undefined;
  readonly #peers = new Map<string, PeerState>();
  /** Peers by their tag in the native key table. */
  readonly #tags = new Map<number, PeerState>();
  #nextTag = 0;
  readonly #recv = new Map<number, RecvKey>();
  /** The receiving keys' crypto and replay windows, by id. */
  readonly #table = new OpenKeyTable();
  /** The largest IP packet one datagram carries. */
  readonly #maxIp: number;
  readonly #keepalive: Uint8Array;
  /** An echo's answer: a one-byte keepalive. */
  readonly #echoReply = new Uint8Array(1);
  #timer: NodeJS.Timeout | undefined;
  #helloTimer: NodeJS.Timeout | undefined;
  readonly #hello: HelloCrypto | undefined;
  /** The hellos' memory as last saved. */
  #state: DatagramLocalState | undefined;
  /** Whether the peers were set once: before that, an empty peer set is not what to remember. */
  #peersSet = false;
  /** Signature checks left in this second, and when it started (steady). */
  #verifyBudget = { left: HELLO_VERIFY_PER_S, since: 0 };
  #port = 0;
  /** Seals and sends runs of datagrams (UDP GSO). */
  #sender: DatagramSender | undefined;
  /** The peers taken back from the kept region (before the first {@link setPeers}), and how many. */
  #restored = 0;
  /** The usable peers at the last description of the kept region. */
  #describedUsable = '';
  /** Keepalive ticks so far: which peers' keepalives this tick pads. */
  #ticks = 0;

  constructor(components: DatagramPathComponents, init: DatagramPathInit) {
    this.#c = components;
    this.#init = init;
    this.#maxIp = innerMtu(init.underlayMtu);
    this.#keepalive = new Uint8Array(VNET_HDR_LEN + this.#maxIp);
    if (init.identityKeyPem && components.state) {
      this.#hello = new HelloCrypto(init.identityKeyPem);
      this.#state = components.state.load();
    }
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
    this.#sender = new DatagramSender(s.fd);
    this.#port = s.port;
    if (this.#init.kept) this.#restore();
    return this.#port;
  }

  /** Starts receiving, the keepalives (the first at once when peers were taken back) and the hellos. */
  run(): void {
    const socket = this.#socket;
    if (!socket || this.#timer) return;
    this.#helloPins();
    socket.start((n) => this.#onMessages(socket, n));
    this.#timer = setInterval(() => this.#tick(), this.#init.keepaliveMs ?? KEEPALIVE_MS);
    this.#timer.unref();
    if (this.#hello && this.#state) {
      if (this.#state.port !== this.#port) this.#save({ ...this.#state, port: this.#port });
      this.#helloTimer = setInterval(() => this.#helloPass(), HELLO_FAST_MS);
      this.#helloTimer.unref();
    }
    // the peers still count on our keepalives: they give the path up DEAD_AFTER_MS after the last one they heard
    if (this.#restored > 0) this.#tick();
  }

  /**
   * Takes back the peers the kept region describes, with their keys (counters and replay windows as the previous
   * process left them: no nonce is used twice), and frees the slots it does not describe (keys made just before that
   * process died). A peer whose path was usable is taken as usable still: the keepalives confirm it within
   * {@link DEAD_AFTER_MS} or give it up, as for any path.
   */
  #restore(): void {
    const bytes = KeptRegion.read(KEPT_META_BYTES);
    const kept = bytes && bytes.length > 0 ? parseKeptDescription(Buffer.from(bytes).toString()) : undefined;
    const now = steadyClock();
    const wall = Date.now();
    const slots: number[] = [];
    for (const k of kept?.peers ?? []) {
      const p = this.#newPeer(k.id, k.pin, parseEndpoint(k.endpoint));
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
        if (this.#recv.has(r.id) || !this.#table.restore(r.slot, p.tag)) continue;
        if (this.#table.slot(r.id) !== r.slot) {
          this.#table.remove(r.id);
          continue;
        }
        const expiresAt = r.expiresAt === null ? Infinity : now + (r.expiresAt - wall);
        if (expiresAt !== Infinity) this.#table.expire(r.id, expiresAt);
        this.#recv.set(r.id, { peer: k.id, expiresAt });
        p.recvIds.push(r.id);
        slots.push(r.slot);
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
    this.#restored = this.#peers.size;
    this.#peersSet = this.#peers.size > 0;
    if (this.#restored > 0 || swept > 0) this.#c.log?.info('datagram path taken back from the kept region', { peers: this.#restored, keys: slots.length, swept });
    this.#describe();
  }

  /**
   * Describes the peers and their keys' slots in the kept region, after every change of keys or addresses (a key's
   * slot is freed only after the description without it, and described only once made): what {@link #restore} reads
   * in the agent's next process.
   */
  #describe(): void {
    if (!this.#init.kept) return;
    const now = steadyClock();
    const wall = Date.now();
    const peers: KeptPeer[] = [];
    for (const p of this.#peers.values()) {
      const recv = p.recvIds.map((id) => ({ slot: this.#table.slot(id), id, expiresAt: wallOf(this.#recv.get(id)?.expiresAt ?? Infinity, now, wall) }));
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

  #usableSet(now: number): string {
    return [...this.#peers.values()].filter((p) => this.#usable(p, now)).map((p) => p.id).join(',');
  }

  #newPeer(id: string, pin: string, endpoint: Endpoint | undefined): PeerState {
    const mem: DatagramPeerMemory | undefined = this.#state?.peers[id]?.pin === pin ? this.#state.peers[id] : undefined;
    const p: PeerState = {
      ...newPeerTimes(), id, tag: this.#nextTag++, endpoint: endpoint ?? parseEndpoint(mem?.endpoint), announced: undefined, send: undefined, pending: undefined, recvIds: [],
      pin, seenGeneration: mem?.seenGeneration ?? -1, theirEph: undefined, myEph: undefined, myEphUsedWith: undefined,
    };
    this.#peers.set(id, p);
    this.#tags.set(p.tag, p);
    return p;
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
    }
    for (const [id, pin] of keep) if (!this.#peers.has(id)) this.#newPeer(id, pin, undefined);
    this.#helloPins();
    // described without them before their keys' slots are freed
    if (gone.length > 0) this.#describe();
    for (const p of gone) {
      p.send?.key.free();
      p.pending?.key.free();
      for (const k of [...p.recvIds]) this.#dropRecv(k, false);
    }
  }

  /** Offers a new sending key to `peerId` on `stream` (a live tunnel stream of the pair). */
  offerKey(peerId: string, stream: TunnelStream): void {
    const p = this.#peers.get(peerId);
    if (!p || !stream.alive) return;
    const id = randomBytes(4).readUInt32BE(0);
    const salt = randomBytes(16).toString('hex');
    const was = p.pending;
    const key = deriveDatagramKey(stream, salt, id);
    p.pending = { id, key: new SealKey(key, id), at: steadyClock() };
    key.fill(0);
    this.#describe();
    was?.key.free();
    stream.sendControl({ t: 'udp-key', id, salt, host: this.#c.publicHost(), port: this.#port });
  }

  /** A `udp-key` or `udp-key-ack` from `peerId`, on `stream`. */
  onControl(peerId: string, stream: TunnelStream, msg: UdpKeyMessage | UdpKeyAck): void {
    const p = this.#peers.get(peerId);
    if (!p) return;
    if (msg.t === 'udp-key-ack') {
      // the ack of an offer we no longer hold (made stale by keys the hellos agreed on): the peer may now expire the
      // key we send under in favour of that one, so a fresh offer brings both ends to one key (once: not while one waits)
      if (!p.pending && p.send?.id !== msg.id && stream.alive) return this.offerKey(peerId, stream);
      if (p.pending?.id !== msg.id) return;
      const was = p.send;
      p.send = { id: msg.id, key: p.pending.key, createdAt: steadyClock() };
      p.pending = undefined;
      this.#describe();
      was?.key.free();
      return;
    }
    const had = this.#recv.get(msg.id);
    if (had && had.peer !== peerId) return; // another peer's id: no ack, the sender offers another
    if (!had) {
      const key = deriveDatagramKey(stream, msg.salt, msg.id);
      this.#addRecvKey(peerId, p, msg.id, key);
      key.fill(0);
    }
    // A new announced address (the peer restarted, on another port) is taken at once: sending there opens our NAT for
    // its keepalives. The same address again (a rotation) leaves the one authentic datagrams come from lately (a NAT
    // that did not keep the peer's port: a rotation must not undo what the keepalives taught).
    const announced = { host: msg.host || stream.remote.host, port: msg.port };
    const again = p.announced?.host === announced.host && p.announced.port === announced.port;
    if (!p.endpoint || !again || steadyClock() - p.lastHeard >= (this.#init.deadAfterMs ?? DEAD_AFTER_MS)) p.endpoint = endpointOf(announced.host, announced.port);
    p.announced = announced;
    this.#describe();
    stream.sendControl({ t: 'udp-key-ack', id: msg.id });
  }

  /**
   * A new receiving key of `p`: the older ones stay for {@link OLD_KEY_GRACE_MS} (datagrams in flight), three at most
   * (a rotation's two, and one more: an offer and keys agreed by hellos may cross).
   */
  #addRecvKey(peerId: string, p: PeerState, id: number, key: Uint8Array): void {
    const now = steadyClock();
    for (const old of p.recvIds) {
      const k = this.#recv.get(old);
      if (k) {
        k.expiresAt = Math.min(k.expiresAt, now + OLD_KEY_GRACE_MS);
        this.#table.expire(old, k.expiresAt);
      }
    }
    while (p.recvIds.length >= MAX_RECV_KEYS) this.#dropRecv(p.recvIds[0] as number, true);
    if (!this.#table.add(id, p.tag, key)) return;
    this.#recv.set(id, { peer: peerId, expiresAt: Infinity });
    p.recvIds.push(id);
  }

  /**
   * A hello (src/core/tunnel/hello.ts) from the peer tagged `tag`. Checked cheaply first (its layout and that its key
   * is a peer's: in C, see {@link #helloPins}), then, within a budget of signature checks per second, its signature;
   * then judged against what we remember of its sender.
   */
  #onHello(buf: Uint8Array, from: UdpSource, tag: number): void {
    // the native table passes hellos only once #helloPins set its pins, which it does only with a tunnel key
    const crypto = this.#hello as HelloCrypto;
    const h = parseHello(buf);
    if (typeof h === 'string') return this.#drop(h);
    const p = this.#tags.get(tag);
    if (!p) return this.#drop('helloUnknownPeer');
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
    this.stats.hellosReceived++;
    if (v.newHandshake) {
      // only a generation above the one on record moves the peer (a replay of its current hello after our restart
      // makes us answer its known address, never the replayer's)
      if (h.generation > p.seenGeneration || !p.endpoint) p.endpoint = endpointOf(from.address, from.port);
      p.seenGeneration = h.generation;
      p.theirEph = h.eph.slice();
      this.#remember();
    }
    if (v.renewMyEph) this.#renewEph(p);
    const mine = p.myEph as Ephemeral;
    if (v.derive && !(p.myEphUsedWith && equalBytes(p.myEphUsedWith, h.eph))) {
      const keys = crypto.derive(mine, h.eph, p.pin);
      if (!keys || this.#recv.has(keys.recv.id)) return this.#drop('helloMalformed');
      p.myEphUsedWith = h.eph.slice();
      const was = p.send;
      // an offer made before this handshake is stale: its key may reach the peer after the handshake's, and the peer
      // keeps its newest receiving keys only (the older expire), so a late ack of it would switch us to a key the peer
      // lets go of while we use it (the lab's NAT reboot showed it: one end sending under a key the other had dropped)
      const stale = p.pending;
      p.pending = undefined;
      p.send = { id: keys.send.id, key: new SealKey(keys.send.key, keys.send.id), createdAt: now };
      this.#addRecvKey(peerId, p, keys.recv.id, keys.recv.key);
      this.#describe();
      was?.key.free();
      stale?.key.free();
      keys.send.key.fill(0);
      keys.recv.key.fill(0);
      this.stats.helloKeys++;
      this.#c.log?.info('datagram keys agreed by hellos', { peer: peerId, endpoint: `${from.address}:${from.port}`, rebuildingForMs: p.rebuildingSince === undefined ? 0 : Date.now() - p.rebuildingSince });
    }
    // it echoed our key: it hears us, and we hear it (the full-size keepalives confirm the path's MTU later)
    if (v.derive) onHandshake(p, now);
    if (v.answer && answerHello(p, now)) this.#sendHello(p);
  }

  /** Hellos on, for the peers' keys alone (a node without a tunnel key takes none): the native table drops the rest. */
  #helloPins(): void {
    if (this.#hello) this.#table.setHelloPins([...this.#peers.values()]);
  }

  /** A new ephemeral key for `p`, under a new generation saved before any hello carries it. */
  #renewEph(p: PeerState): void {
    const state = this.#state as DatagramLocalState;
    const generation = state.generation + 1;
    this.#save({ ...state, generation });
    p.myEph = { ...(this.#hello as HelloCrypto).newEphemeral(), generation };
    p.myEphUsedWith = undefined;
  }

  #sendHello(p: PeerState): void {
    const crypto = this.#hello;
    if (!crypto || !p.endpoint) return;
    if (!p.myEph) this.#renewEph(p);
    const mine = p.myEph as Ephemeral & { generation: number };
    const derived = p.myEphUsedWith !== undefined && p.theirEph !== undefined && equalBytes(p.myEphUsedWith, p.theirEph);
    const hello = crypto.hello(p.pin, mine.generation, mine.pub, p.theirEph, derived);
    // after what is queued
    this.flush();
    const err = (this.#sender as DatagramSender).sendRaw(p.endpoint.addr, p.endpoint.port, hello);
    if (err !== 0) {
      this.stats.dropped.sendFailed++;
      this.stats.lastSendErrno = err;
    }
    this.stats.hellosSent++;
  }

  /**
   * Every {@link HELLO_FAST_MS}: a peer whose path is not usable and that has no stream to bring keys, or only a silent
   * one (the relay and the controller away, or a peer that restarted) gets hellos at its last address, fast at first, then every second,
   * until the path is usable again. Both ends do the same, so whichever restarted, the pair finds itself again as long
   * as one of the two addresses still holds.
   */
  #helloPass(): void {
    const now = steadyClock();
    const dead = this.#init.deadAfterMs ?? DEAD_AFTER_MS;
    const wall = Date.now();
    for (const [id, p] of this.#peers) {
      const step = helloStep(p, now, wall, this.#c.streamOf(id)?.silentMs, dead);
      if (step.started) {
        this.#c.log?.info('rebuilding the datagram path with hellos (no usable path, no stream the peer answers on)', { peer: id, endpoint: `${p.endpoint?.host}:${p.endpoint?.port}` });
        // a key already used to derive is spent: a rebuild starts a new handshake
        if (p.myEphUsedWith) p.myEph = undefined;
      }
      if (step.send) this.#sendHello(p);
    }
  }

  /** Saves the peers' addresses when one changed since the last save. */
  #remember(): void {
    const state = this.#state;
    if (!state || !this.#peersSet) return;
    const peers: Record<string, DatagramPeerMemory> = {};
    let changed = false;
    for (const [id, p] of this.#peers) {
      const endpoint = p.endpoint ? `${p.endpoint.host}:${p.endpoint.port}` : undefined;
      const was = state.peers[id];
      peers[id] = { pin: p.pin, ...(endpoint ? { endpoint } : {}), ...(p.seenGeneration >= 0 ? { seenGeneration: p.seenGeneration } : {}) };
      if (was?.pin !== p.pin || was.endpoint !== endpoint || (was.seenGeneration ?? -1) !== p.seenGeneration) changed = true;
    }
    if (changed || Object.keys(state.peers).length !== this.#peers.size) this.#save({ ...state, peers });
  }

  /**
   * Keeps `state` and writes it. A failed write (a full disk) is logged, not thrown: the hellos go on from memory; after
   * a restart the peers then may take our hellos for replays until the generation passes the one they saw.
   */
  #save(state: DatagramLocalState): void {
    this.#state = state;
    try {
      this.#c.state?.save(state);
    } catch (err) {
      this.#c.log?.error('cannot save the datagram path\'s local state', { err });
    }
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
    const n = p && this.#usable(p, steadyClock()) ? this.#queue(p, DATAGRAM_TYPE.data, pkt) : -1;
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
    const n = this.#queue(p, DATAGRAM_TYPE.data, pkt);
    if (n < 0) return false;
    this.stats.sent += n;
    this.stats.sentAnyway += n;
    return true;
  }

  /** Sends what {@link send} queued. */
  flush(): void {
    const sender = this.#sender;
    if (!sender) return;
    const { failed, errno, copies } = sender.flush();
    if (failed > 0) this.stats.dropped.sendFailed += failed;
    this.stats.copiesSent += copies;
    if (errno !== 0) this.stats.lastSendErrno = errno;
  }

  /**
   * Seals `pkt` (a superpacket in segments) for `p` into the sender's run (native: one system call sends a run of
   * equal-sized datagrams to one peer with UDP GSO; a run ends at another peer, at a datagram larger than the run's
   * first, after a shorter one, and at the kernel's limits). @returns the datagrams queued, or -1.
   */
  #queue(p: PeerState, type: typeof DATAGRAM_TYPE.data | typeof DATAGRAM_TYPE.keepalive, pkt: Uint8Array): number {
    const sender = this.#sender;
    const k = p.send;
    const e = p.endpoint;
    if (!sender || !k || !e) return -1;
    return sender.send(k.key, e.addr, e.port, type, pkt, this.#maxIp);
  }

  #drop(reason: DatagramDropReason): void {
    this.stats.dropped[reason]++;
  }

  /**
   * A ring of `n` messages from the socket: opened natively (the GRO runs cut apart, keys found, replay windows
   * checked, tags verified, in place, TCP segments of a flow merged back into superpackets), then per authentic packet
   * the source check and keepalive or packet here.
   * A peer heard from after a silence may have turned usable: the kept region is described again at once, not at the
   * next tick, or an agent killed in between takes the path back as unusable and drops its packets until keepalives
   * and a stream come back.
   */
  #onMessages(socket: UdpBatchSocket, n: number): void {
    const now = steadyClock();
    const dead = this.#init.deadAfterMs ?? DEAD_AFTER_MS;
    let revived = false;
    const table = this.#table;
    // a hello ends each pass: the keys it agrees open the datagrams behind it (the peer seals under them at once)
    // close() from a callback frees the ring at once: stop reading it then
    for (let more = false, done = false; !done && !socket.closed; more = true) {
      const opened = table.open(socket.ring, n, now, this.stats.dropped, true, more);
      done = opened.done;
      this.stats.copiesSpared += opened.spared;
      revived = this.#handOn(socket, opened.handed, now, dead) || revived;
    }
    if (revived && this.#init.kept && this.#usableSet(now) !== this.#describedUsable) this.#describe();
  }

  /** The `handed` results of the last open, in order. @returns whether a peer was heard from after a silence. */
  #handOn(socket: UdpBatchSocket, handed: number, now: number, dead: number): boolean {
    let revived = false;
    let answered = false;
    const r = this.#table.results;
    const bytes = socket.ringBytes;
    for (let i = 0, o = 0; i < handed && !socket.closed; i++, o += RESULT_INTS) {
      const kind = r[o]!;
      const msg = r[o + 2]!;
      const off = r[o + 3]!;
      const len = r[o + 4]!;
      if (kind === HELLO_TYPE) {
        this.#onHello(bytes.subarray(off, off + len), socket.sourceOf(msg), r[o + 1]!);
        continue;
      }
      const p = this.#tags.get(r[o + 1]!);
      const datagrams = r[o + 5]!;
      if (!p) {
        this.stats.dropped.unknownKey += datagrams;
        continue;
      }
      const known = p.endpoint?.key === socket.sourceKey(msg);
      if (kind === DATAGRAM_TYPE.keepalive) {
        this.stats.keepalivesReceived++;
        if (!known) {
          const from = socket.sourceOf(msg);
          p.endpoint = endpointOf(from.address, from.port);
          this.stats.endpointMoves++;
          this.#describe();
        }
        const heard = onKeepalive(p, bytes[off]!, len, now, dead);
        revived ||= heard.revived;
        if (heard.answer !== undefined) {
          this.#echoReply[0] = heard.answer;
          if (this.#queue(p, DATAGRAM_TYPE.keepalive, this.#echoReply) > 0) {
            this.stats.keepalivesSent++;
            answered = true;
          }
        }
        continue;
      }
      if (!known) {
        this.stats.dropped.unknownAddress += datagrams;
        continue;
      }
      revived ||= onPacket(p, now, dead);
      this.stats.received += datagrams;
      this.#c.onPacket(p.id, bytes.subarray(off, off + len), datagrams, r[o + 6]!);
    }
    if (answered) this.flush();
    return revived;
  }

  /** Every second: keepalives, key rotation, offers that went unanswered, expired receiving keys. */
  #tick(): void {
    const now = steadyClock();
    const limits = this.#init.rekey ?? { packets: REKEY_AFTER_PACKETS, ms: REKEY_AFTER_MS };
    for (const [id, p] of this.#peers) {
      const plan = planTick(p, now, this.#ticks, p.tag, { deadAfterMs: this.#init.deadAfterMs, rekey: limits });
      if (plan.offer) {
        const stream = this.#c.streamOf(id);
        if (stream) this.offerKey(id, stream);
      }
      const keepalive = plan.keepalive;
      if (keepalive) {
        this.#keepalive[0] = keepalive.flags;
        const at = steadyClock();
        if (this.#queue(p, DATAGRAM_TYPE.keepalive, keepalive.full ? this.#keepalive : this.#keepalive.subarray(0, 1)) > 0) {
          this.stats.keepalivesSent++;
          keepaliveSent(p, keepalive, at);
        }
        this.flush();
      }
    }
    this.#ticks++;
    for (const [id, k] of [...this.#recv]) if (k.expiresAt < now) this.#dropRecv(id, true);
    if (this.#init.kept && this.#usableSet(now) !== this.#describedUsable) this.#describe();
    this.#remember();
  }

  /** Drops receiving key `id`; `describe`: described without it first (its peer stays). */
  #dropRecv(id: number, describe: boolean): void {
    const k = this.#recv.get(id);
    if (!k) return;
    this.#recv.delete(id);
    const p = this.#peers.get(k.peer);
    const i = p?.recvIds.indexOf(id) ?? -1;
    if (i >= 0) p?.recvIds.splice(i, 1);
    if (describe) this.#describe();
    this.#table.remove(id);
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
    this.#sender?.free();
    this.#sender = undefined;
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
    this.#recv.clear();
    this.#sender?.free();
    this.#sender = undefined;
    this.#table.free(true);
  }

  #stopTimers(): void {
    if (this.#timer) clearInterval(this.#timer);
    if (this.#helloTimer) clearInterval(this.#helloTimer);
    this.#timer = undefined;
    this.#helloTimer = undefined;
  }
}

/** A steady-clock deadline as wall-clock ms (null: never). */
function wallOf(steady: number, now: number, wall: number): number | null {
  return steady === Infinity ? null : wall + (steady - now);
}

function parseEndpoint(text: string | undefined): Endpoint | undefined {
  const m = text === undefined ? null : /^(\d{1,3}(?:\.\d{1,3}){3}):(\d{1,5})$/.exec(text);
  return m ? endpointOf(m[1] as string, Number(m[2])) : undefined;
}

function endpointOf(host: string, port: number): Endpoint {
  const addr = ipv4Number(host) ?? 0;
  return { host, port, addr, key: addr * 65_536 + port };
}

/** The key `id` announced with `salt` on `stream`: HKDF-SHA256 over the stream's exported keying material. */
export function deriveDatagramKey(stream: Pick<TunnelStream, 'exportKeyingMaterial'>, salt: string, id: number): Uint8Array {
  const ikm = stream.exportKeyingMaterial(32, DATAGRAM_EXPORTER_LABEL);
  return new Uint8Array(hkdfSync('sha256', ikm, Buffer.from(salt, 'hex'), `atoll datagram key ${id >>> 0}`, 32));
}
