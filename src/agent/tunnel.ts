/**
 * The agent's cross-site tunnel, wired together: the TUN device, the tunnel endpoint (packets to and from peers'
 * streams, with the source check), the routes of the peers' blocks into the TUN device (tunnel-routes.ts), and the
 * streams: an edge node dials every cloud peer (reconnecting with backoff, keep-dialled.ts), a cloud node listens
 * and accepts only peers whose key matches a registered peer's `tunnelKey`; edge peers of one community reach each
 * other through the relay (relay-control.ts): in circuits (tunnel-circuits.ts) until and whenever they have a
 * hole-punched direct stream (punch.ts). What to do comes from the pure plan (src/core/tunnel/plan.ts) on every peer
 * change and every resync; one loop runs per peer and role (dial, punch, circuit), restarted when the peer's key,
 * mode or address changes.
 *
 * With `udp`, packets take the datagram path (src/adapters/tunnel/datagram-path.ts) whenever it is usable: its keys are
 * offered on every stream that comes up, and the streams carry everything else. With `udp.keepMs`, the node's keeper
 * (src/adapters/tunnel/keeper.ts) holds the TUN device, the UDP socket and the kept keys while the agent is away: a restarted
 * agent takes them back and goes on where the last one stopped, so established datagram paths lose nothing (packets
 * wait in the device's and socket's queues meanwhile). Neither the TUN device nor the socket is read before the first
 * {@link Tunnel.sync} set the peers: a packet read earlier would find no peer and be dropped.
 *
 * MTU: the TUN device gets the pods' MTU, so no packet a pod sends is too big for it; the stream is TCP, so the
 * underlay's MTU does not limit the tunnel's packets (TCP superpackets pass whole, GSO on both TUN devices). With the
 * datagram path the TUN device's MTU is at most the underlay MTU less the datagram overhead (innerMtu): pods with a
 * larger MTU learn the smaller one from the ICMP "fragmentation needed" the node sends them (their superpackets are
 * cut into segments of that size, one per datagram).
 */
import type { Server } from 'node:tls';
import type { NodeRecord } from '../core/cluster/model.ts';
import { type PeerSelection, planTunnel, type TunnelPeerPlan, type TunnelPlan, type TunnelRole, tunnelSourceAddress } from '../core/tunnel/plan.ts';
import type { Logger } from '../core/ports.ts';
import type { PeerPath, TunnelStatus } from '../core/tunnel/status.ts';
import { innerMtu } from '../core/tunnel/datagram.ts';
import type { ControlMessage } from '../core/tunnel/messages.ts';
import { DatagramPath, SOCKET_BUFFER_BYTES } from '../adapters/tunnel/datagram-path.ts';
import { KEPT_META_BYTES, KEPT_SLOTS } from '../adapters/tunnel/datagram-kept-peers.ts';
import { type DatagramLocalState, DatagramStateFile, EMPTY_DATAGRAM_STATE } from '../adapters/tunnel/datagram-state-file.ts';
import type { IpRoute2 } from '../adapters/kernel/iproute2.ts';
import { KeeperLink } from '../adapters/tunnel/keeper.ts';
import { openTun } from '../adapters/tunnel/tun.ts';
import { UdpBatchSocket } from '../adapters/tunnel/udp-batch.ts';
import { type StreamKind, TunnelEndpoint } from '../adapters/tunnel/tunnel-endpoint.ts';
import type { TunnelCredentials } from '../adapters/tunnel/tunnel-credentials.ts';
import { listenTunnel } from '../adapters/tunnel/tunnel-dial.ts';
import type { TunnelStream } from '../adapters/tunnel/tunnel-stream.ts';
import { Puncher } from './punch.ts';
import { type RelayAddress, RelayControl } from './relay-control.ts';
import { TunnelCircuits } from './tunnel-circuits.ts';
import { keepDialled } from './keep-dialled.ts';
import { LOG_LIST_MAX, syncTunnelRoutes } from './tunnel-routes.ts';

export interface TunnelComponents {
  readonly ip: IpRoute2;
  readonly log: Logger;
}

export interface TunnelInit {
  readonly nodeName: string;
  readonly role: TunnelRole;
  readonly device: string;
  readonly port: number;
  /** Address a cloud node listens on ('0.0.0.0' for all). */
  readonly listenHost: string;
  readonly mtu: number;
  readonly credentials: TunnelCredentials;
  /** The relay (edge nodes): where it listens and its key pin. */
  readonly relay?: RelayAddress;
  readonly retryMinMs?: number;
  readonly retryMaxMs?: number;
  /** How long one hole-punching attempt may take. */
  readonly punchTimeoutMs?: number;
  /**
   * The datagram path: its UDP port, the underlay's MTU and the file its local state lives in (the port an edge node
   * bound, peers' last addresses: what rebuilds paths without the relay); off when absent.
   */
  readonly udp?: {
    readonly port: number; readonly underlayMtu: number; readonly statePath?: string;
    /** The keeper: its socket (keeperSocketOf the data directory) and how long it waits for an agent; none when absent. */
    readonly keeper?: { readonly socketPath: string; readonly graceMs: number };
  };
}

/** A running per-peer loop: what it was started for, and how to stop it. */
interface PeerLoop {
  readonly key: string;
  readonly abort: AbortController;
}

export class Tunnel {
  readonly #c: TunnelComponents;
  readonly #init: TunnelInit;
  #endpoint: TunnelEndpoint | undefined;
  #server: Server | undefined;
  #plan: TunnelPlan = { peers: [], skipped: [] };
  readonly #dialers = new Map<string, PeerLoop>();
  #chain: Promise<void> = Promise.resolve();
  /** The arguments of the latest sync not started yet: the passes queued behind a running one take these. */
  #wanted: { peers: readonly NodeRecord[]; selection: PeerSelection } | undefined;
  #refused = 0;
  readonly #abort = new AbortController();
  /** The relay, its circuits and punching: with a relay configured. */
  readonly #relay: { control: RelayControl; circuits: TunnelCircuits; puncher: Puncher } | undefined;
  readonly #punchers = new Map<string, PeerLoop>();
  readonly #circuitKeepers = new Map<string, PeerLoop>();
  readonly #pathSince = new Map<string, { path: PeerPath; since: number }>();
  #datagrams: DatagramPath | undefined;
  /** The agent's side of its keeper, with a keeper configured. */
  #keeper: KeeperLink | undefined;
  /** Whether the TUN device and the socket are read (from the first {@link sync} on). */
  #running = false;

  constructor(components: TunnelComponents, init: TunnelInit) {
    this.#c = components;
    this.#init = init;
    if (init.relay) {
      const { log } = components;
      const directOf = (name: string) => this.#endpoint?.streamOf(name);
      const inPlan = (name: string) => this.#plan.peers.some((p) => p.name === name);
      const punchPeerOf = (pin: string) => this.#plan.peers.find((p) => p.pin === pin && p.mode === 'punch');
      const attach = (peer: TunnelPeerPlan, stream: TunnelStream, kind?: StreamKind) => this.#attach(peer, stream, kind);
      const control = new RelayControl({
        log,
        isPunchPeer: (pin) => punchPeerOf(pin) !== undefined,
        onPunch: (fromPin, msg) => {
          const peer = punchPeerOf(fromPin);
          if (peer && !peer.initiator) void puncher.answer(peer, msg, this.#abort.signal);
        },
        onCircuitJoin: (fromPin, token) => void circuits.join(fromPin, token, this.#abort.signal),
      }, { relay: init.relay, credentials: init.credentials, retryMinMs: init.retryMinMs, retryMaxMs: init.retryMaxMs });
      const circuits = new TunnelCircuits({ log, relay: control, directOf, punchPeerOf, inPlan, attach });
      const puncher = new Puncher({ log, relay: control, directOf, inPlan, attach }, { credentials: init.credentials, punchTimeoutMs: init.punchTimeoutMs });
      this.#relay = { control, circuits, puncher };
    }
  }

  /**
   * Opens the TUN device (or takes it back from the keeper, with the socket and the kept keys), binds the datagram
   * path and, on a cloud node, starts the listener. Packets flow from the first {@link sync} on.
   * @throws AtollError on failure.
   */
  async start(): Promise<void> {
    const { device, role, listenHost, port, credentials, udp } = this.#init;
    const mtu = udp ? Math.min(this.#init.mtu, innerMtu(udp.underlayMtu)) : this.#init.mtu;
    const keeper = udp?.keeper ? new KeeperLink({ ...udp.keeper, log: this.#c.log }) : undefined;
    this.#keeper = keeper;
    const back = keeper?.takeBack({
      device, mtu, port: role === 'cloud' ? udp?.port : undefined,
      socketBufferBytes: SOCKET_BUFFER_BYTES, keptSlots: KEPT_SLOTS, keptMetaBytes: KEPT_META_BYTES,
    });
    const tun = back?.tun ?? openTun({ name: device, mtu });
    const endpoint = new TunnelEndpoint(tun, []);
    this.#endpoint = endpoint;
    if (udp) {
      try {
        this.#datagrams = this.#startDatagrams(udp, back?.socket, keeper?.keeping === true);
      } catch (err) {
        endpoint.close();
        keeper?.close();
        throw err;
      }
      endpoint.useDatagrams(this.#datagrams);
      await keeper?.hold(tun.fd, this.#datagrams.socketFd);
    }
    if (role === 'cloud') {
      const { server } = await listenTunnel({
        host: listenHost, port, credentials,
        acceptPin: (pin) => this.#acceptable(pin) !== undefined,
        onStream: (stream) => this.#attach(this.#acceptable(stream.peerPin) as TunnelPeerPlan, stream),
        onRefused: (reason) => {
          this.#refused++;
          this.#c.log.warn('tunnel connection refused', { reason });
        },
      });
      this.#server = server;
    }
    if (role === 'edge' && this.#relay) void this.#relay.control.run(this.#abort.signal);
    this.#c.log.info('tunnel started', {
      device, mtu, role, ...(role === 'cloud' ? { listen: `${listenHost}:${port}` } : {}),
      ...(this.#datagrams ? { udpPort: this.#datagrams.port, underlayMtu: udp?.underlayMtu, takenBack: back !== undefined, keeper: keeper?.status?.pid } : {}),
      ...(this.#init.relay ? { relay: `${this.#init.relay.host}:${this.#init.relay.port}` } : {}),
    });
  }

  /**
   * The datagram path, bound (not yet receiving: {@link sync} runs it). An edge node binds an ephemeral port the first
   * time (nodes behind one NAT then never want the same outside port, so the NAT keeps each one's) and the same port
   * after a restart, so its NAT mapping, which its peers know, still holds; another one when that port is taken
   * meanwhile. A cloud node has a public address and the configured port. `socket`: the one the keeper held.
   */
  #startDatagrams(udp: NonNullable<TunnelInit['udp']>, socket: UdpBatchSocket | undefined, kept: boolean): DatagramPath {
    const { role, listenHost, credentials } = this.#init;
    const file = udp.statePath ? new DatagramStateFile(udp.statePath) : undefined;
    const saved = file?.load() ?? EMPTY_DATAGRAM_STATE;
    let state = saved;
    const endpoint = this.#endpoint as TunnelEndpoint;
    const components = {
      streamOf: (name: string) => endpoint.streamOf(name) ?? endpoint.circuitOf(name),
      publicHost: () => this.#relay?.control.publicHost ?? '',
      onPacket: (name: string, pkt: Uint8Array, datagrams: number, bytes: number) => endpoint.fromDatagram(name, pkt, datagrams, bytes),
      log: this.#c.log,
      ...(file ? { state: { load: () => state, save: (s: DatagramLocalState) => file.save((state = s)), path: file.path } } : {}),
    };
    const init = (port: number) => ({ host: role === 'cloud' ? listenHost : '0.0.0.0', port, underlayMtu: udp.underlayMtu, identityKeyPem: credentials.keyPem, kept });
    const wanted = role === 'cloud' ? udp.port : saved.port;
    const datagrams = new DatagramPath(components, init(wanted));
    try {
      datagrams.bind(socket);
      return datagrams;
    } catch (err) {
      datagrams.close();
      if (role === 'cloud' || wanted === 0) throw err;
      this.#c.log.warn('the UDP port of the last run is taken: peers learn the new one from the relay or the controller', { port: wanted });
      const fresh = new DatagramPath(components, init(0));
      fresh.bind();
      return fresh;
    }
  }

  /** A peer that dials us (an edge peer of a cloud node) with this pin. */
  #acceptable(pin: string): TunnelPeerPlan | undefined {
    return this.#plan.peers.find((p) => p.pin === pin && p.mode === 'accept');
  }

  #attach(peer: TunnelPeerPlan, stream: TunnelStream, kind: StreamKind = 'direct'): void {
    this.#endpoint?.attach(peer.name, stream, kind);
    const what = kind === 'direct' ? 'tunnel stream' : 'circuit';
    this.#c.log.info(`${what} up`, { peer: peer.name, pin: peer.pin, mode: peer.mode, remote: `${stream.remote.host}:${stream.remote.port}` });
    this.#notePath(peer.name);
    stream.once('close', (err?: Error) => {
      this.#c.log.info(`${what} closed`, { peer: peer.name, ...(err ? { err: err.message } : {}) });
      this.#notePath(peer.name);
    });
    const datagrams = this.#datagrams;
    if (datagrams) {
      stream.on('control', (msg: ControlMessage) => {
        if (msg.t === 'udp-key' || msg.t === 'udp-key-ack') datagrams.onControl(peer.name, stream, msg);
      });
      datagrams.offerKey(peer.name, stream); // a new stream may be a restarted peer's, which holds none of our keys
    }
  }

  /** Logs a peer's path when it changed (direct, relayed, down) and remembers since when. */
  #notePath(name: string): void {
    const path = this.#endpoint?.pathOf(name) ?? 'down';
    const was = this.#pathSince.get(name);
    if (was?.path === path) return;
    this.#pathSince.set(name, { path, since: Date.now() });
    if (was) this.#c.log.info('tunnel path changed', { peer: name, from: was.path, to: path });
  }

  /**
   * Brings peers, routes and dialers in line with `peers`, as `selection` sees them (this node, and which peers are
   * outside its site). Serialised and coalesced: calls made while a sync runs are merged into one more with the
   * latest arguments (a pass over 100,000 peers takes seconds; one per update of a burst would queue without end).
   * A failed route batch is logged and retried at the next call.
   */
  sync(peers: readonly NodeRecord[], selection: PeerSelection): Promise<void> {
    this.#wanted = { peers, selection };
    this.#chain = this.#chain.then(() => {
      const wanted = this.#wanted;
      this.#wanted = undefined;
      return wanted && this.#sync(wanted.peers, wanted.selection);
    }).catch((err: unknown) => {
      this.#c.log.error('tunnel sync failed; retrying at the next resync', { err });
    });
    return this.#chain;
  }

  async #sync(peers: readonly NodeRecord[], { self, community, remote }: PeerSelection): Promise<void> {
    const endpoint = this.#endpoint;
    if (!endpoint) return;
    const { nodeName: name, role, port } = this.#init;
    const plan = planTunnel({ name, role, port, community, relay: this.#init.relay !== undefined }, peers, remote);
    const changed = JSON.stringify(plan) !== JSON.stringify(this.#plan);
    if (changed) {
      // first what can refuse the plan (two peers claiming one block): a refused plan changes nothing, and is tried
      // again at the next sync
      endpoint.setPeers(plan.peers.map((p) => ({ id: p.name, blocks: p.blocks })));
      this.#plan = plan;
      this.#datagrams?.setPeers(plan.peers.map((p) => ({ id: p.name, pin: p.pin })));
      // a cloud node may have 100,000 peers: the count, and only the first few by name (`atoll peers` lists them all)
      this.#c.log.info('tunnel peers', {
        count: plan.peers.length, peers: plan.peers.slice(0, LOG_LIST_MAX).map((p) => `${p.name} (${p.dial ? `dial ${p.dial.host}:${p.dial.port}` : p.mode})`),
        skippedCount: plan.skipped.length, skipped: plan.skipped.slice(0, LOG_LIST_MAX),
      });
      for (const p of plan.peers) this.#notePath(p.name);
    }
    if (!this.#running) {
      this.#running = true;
      this.#datagrams?.run();
      endpoint.start();
    }
    syncLoops(this.#dialers, plan.peers.filter((p) => p.mode === 'dial'), (p, signal) => this.#dialLoop(p, signal));
    const relay = this.#relay;
    // without a relay the plan has no punch peers (planTunnel skips them)
    if (relay) {
      syncLoops(this.#punchers, plan.peers.filter((p) => p.mode === 'punch' && p.initiator), (p, signal) => relay.puncher.initiate(p, signal));
      syncLoops(this.#circuitKeepers, plan.peers.filter((p) => p.mode === 'punch'), (p, signal) => relay.circuits.keep(p, signal));
    }
    await syncTunnelRoutes(this.#c.ip, this.#c.log, this.#init.device, plan, tunnelSourceAddress(self));
  }

  /** Keeps one stream to `peer` up: dial, wait for it to close, dial again; backoff while dials fail. */
  #dialLoop(peer: TunnelPeerPlan, signal: AbortSignal): Promise<void> {
    const dial = peer.dial as { host: string; port: number };
    const maxMs = this.#init.retryMaxMs ?? 30_000;
    return keepDialled(this.#c.log, {
      label: { what: 'tunnel', peer: peer.name }, to: { ...dial, pin: peer.pin }, credentials: this.#init.credentials,
      backoff: { minMs: this.#init.retryMinMs ?? 500, maxMs },
    }, signal, (stream) => {
      this.#attach(peer, stream);
      return () => {};
    });
  }

  /** Path, round trip and traffic of every peer, for `atoll peers`. */
  status(): TunnelStatus {
    const endpoint = this.#endpoint;
    const relay = this.#relay;
    return {
      role: this.#init.role,
      ...(relay ? { relay: relay.control.status() } : {}),
      peers: this.#plan.peers.map((p) => {
        this.#notePath(p.name); // the datagram path comes and goes without an event
        const path = endpoint?.pathOf(p.name) ?? 'down';
        const udp = this.#datagrams?.statusOf(p.name);
        const t = endpoint?.trafficOf(p.name);
        const punch = relay?.puncher.stateOf(p.name);
        return {
          name: p.name, role: p.role, mode: p.mode, path,
          // udp: the datagram path's keepalive echoes; otherwise the stream's pings
          rttMs: path === 'udp' ? udp?.rttMs : (path === 'direct' ? endpoint?.streamOf(p.name) : endpoint?.circuitOf(p.name))?.rttMs,
          txBytes: t?.txBytes ?? 0, rxBytes: t?.rxBytes ?? 0, txPackets: t?.txPackets ?? 0, rxPackets: t?.rxPackets ?? 0,
          since: this.#pathSince.get(p.name)?.since ?? 0,
          ...(punch ? { punch: { ...punch } } : {}),
          ...(udp ? { udp: { endpoint: udp.endpoint, usable: udp.usable, ...(udp.rebuildingSince !== undefined ? { rebuildingSince: udp.rebuildingSince } : {}) } } : {}),
        };
      }),
      skipped: this.#plan.skipped,
      refusedConnections: this.#refused,
      ...(this.#datagrams ? {
        udpCopies: { sent: this.#datagrams.stats.copiesSent, spared: this.#datagrams.stats.copiesSpared },
        keeper: this.#keeper?.status ?? null,
      } : {}),
      dropped: endpoint ? {
        noPeer: endpoint.stats.droppedNoPeer, noPath: endpoint.stats.droppedNoStream, badSource: endpoint.stats.droppedBadSource, tunWrite: endpoint.stats.droppedTunWrite,
        ...Object.fromEntries(Object.entries(this.#datagrams?.stats.dropped ?? {}).map(([reason, n]) => [`udp.${reason}`, n])),
      } : {},
    };
  }

  /** Stops dialling, punching and listening, closes every stream and the TUN device (its routes go with it). */
  async stop(): Promise<void> {
    this.#abort.abort();
    for (const loops of [this.#dialers, this.#punchers, this.#circuitKeepers]) {
      for (const d of loops.values()) d.abort.abort();
      loops.clear();
    }
    this.#server?.close();
    // with a keeper, the socket, the TUN device and the keys stay for the agent's next process: the socket's last
    // ring is still handed on (the TUN device read meanwhile), then the device is no longer read
    const datagrams = this.#datagrams;
    this.#datagrams = undefined;
    const kept = this.#keeper?.status != null;
    this.#keeper?.close();
    this.#keeper = undefined;
    if (kept) await datagrams?.closeKeeping();
    else datagrams?.close();
    this.#endpoint?.close();
    this.#endpoint = undefined;
  }
}

const loopKey = (p: TunnelPeerPlan) => `${p.pin}|${p.mode}|${p.dial?.host}|${p.dial?.port}`;

/** Runs `loop` once per peer in `want`, restarting it when the peer's key, mode or address changes; stops the rest. */
function syncLoops(loops: Map<string, PeerLoop>, want: readonly TunnelPeerPlan[], loop: (p: TunnelPeerPlan, signal: AbortSignal) => Promise<void>): void {
  const byName = new Map(want.map((p) => [p.name, p]));
  for (const [name, d] of loops) {
    const p = byName.get(name);
    if (!p || loopKey(p) !== d.key) {
      d.abort.abort();
      loops.delete(name);
    }
  }
  for (const [name, p] of byName) {
    if (loops.has(name)) continue;
    const d: PeerLoop = { key: loopKey(p), abort: new AbortController() };
    loops.set(name, d);
    void loop(p, d.abort.signal);
  }
}
