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
import { closeSync } from 'node:fs';
import type { Server } from 'node:tls';
import type { NodeRecord } from '../core/cluster/model.ts';
import { planTunnel, type TunnelPeerPlan, type TunnelPlan, type TunnelRole, tunnelSourceAddress } from '../core/tunnel/plan.ts';
import type { Logger } from '../core/ports.ts';
import type { PeerPath, TunnelStatus } from '../core/tunnel/status.ts';
import { innerMtu } from '../core/tunnel/datagram.ts';
import type { ControlMessage } from '../core/tunnel/messages.ts';
import { DatagramPath, KEPT_META_BYTES, KEPT_SLOTS, SOCKET_BUFFER_BYTES } from '../adapters/tunnel/datagram-path.ts';
import { type DatagramLocalState, DatagramStateFile, EMPTY_DATAGRAM_STATE } from '../adapters/tunnel/datagram-state-file.ts';
import type { IpRoute2 } from '../adapters/kernel/iproute2.ts';
import { keeperQuit, KeptRegion } from '../adapters/tunnel/datagram-native.ts';
import { handTo, type Held, keeperLives, reattach, release, startKeeper, takeHeld } from '../adapters/tunnel/keeper.ts';
import { adoptTun, openTun, type TunDevice } from '../adapters/tunnel/tun.ts';
import { UdpBatchSocket } from '../adapters/tunnel/udp-batch.ts';
import { type StreamKind, TunnelEndpoint } from '../adapters/tunnel/tunnel-endpoint.ts';
import type { TunnelCredentials } from '../adapters/tunnel/tunnel-credentials.ts';
import { listenTunnel } from '../adapters/tunnel/tunnel-dial.ts';
import type { TunnelStream } from '../adapters/tunnel/tunnel-stream.ts';
import { Puncher } from './punch.ts';
import { type RelayAddress, RelayControl } from './relay-control.ts';
import { TunnelCircuits } from './tunnel-circuits.ts';
import { keepDialled } from './keep-dialled.ts';
import { syncTunnelRoutes } from './tunnel-routes.ts';

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
  /** This node's community ('' for none): edge <-> edge paths only inside one. */
  readonly community: string;
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

/** What a keeper handed back from the agent's previous process: the TUN device, the bound socket, the kept region attached. */
interface TakenBack {
  readonly tun: TunDevice;
  readonly socket: UdpBatchSocket;
  readonly held: Held;
  /** The kept region's memfd (attached; kept open to hand it to another keeper). */
  readonly keptFd: number;
}

/** How often the agent checks that the keeper holding its data plane is still the one it is connected to. */
const KEEPER_WATCH_MS = 1000;
/** Checks in a row with no keeper answering at the socket before the agent starts one of its own. */
const KEEPER_MISSES_BEFORE_OWN = 3;

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
  #refused = 0;
  readonly #abort = new AbortController();
  /** The relay, its circuits and punching: with a relay configured. */
  readonly #relay: { control: RelayControl; circuits: TunnelCircuits; puncher: Puncher } | undefined;
  readonly #punchers = new Map<string, PeerLoop>();
  readonly #circuitKeepers = new Map<string, PeerLoop>();
  readonly #pathSince = new Map<string, { path: PeerPath; since: number }>();
  #datagrams: DatagramPath | undefined;
  /** The keeper's connection (it tells the keeper an agent lives), while one holds the data plane. */
  #keeper: Held | undefined;
  /** What a keeper is to hold (the TUN device, the socket, the kept region's memfd), with a keeper configured. */
  #dataPlaneFds: readonly number[] | undefined;
  #keeperWatch: NodeJS.Timeout | undefined;
  #keeperWatching = false;
  #keeperMisses = 0;
  /** Whether the TUN device and the socket are read (from the first {@link sync} on). */
  #running = false;
  /** Whether the data plane was taken back from the agent's last process. */
  #takenBack = false;

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
    const found = udp?.keeper ? this.#takeBack(udp.keeper.socketPath, device, mtu) : {};
    const back = found.back;
    this.#takenBack = back !== undefined;
    // a new kept region when there is to be a keeper and none handed one back
    const keptFd = udp?.keeper ? back?.keptFd ?? this.#newKeptRegion() : undefined;
    const tun = back?.tun ?? openTun({ name: device, mtu });
    const endpoint = new TunnelEndpoint(tun, []);
    this.#endpoint = endpoint;
    if (udp) {
      try {
        this.#datagrams = this.#startDatagrams(udp, back?.socket, back !== undefined || keptFd !== undefined);
      } catch (err) {
        endpoint.close();
        if (keptFd !== undefined) closeSync(keptFd);
        if (found.standing) closeSync(found.standing.connection);
        throw err;
      }
      endpoint.useDatagrams(this.#datagrams);
      if (udp.keeper && keptFd !== undefined) {
        const fds = [tun.fd, this.#datagrams.socketFd, keptFd];
        this.#dataPlaneFds = fds;
        this.#keeper = back?.held ?? (found.standing ? this.#handTo(found.standing, fds) : await this.#startKeeper(udp.keeper, fds));
        if (this.#keeper) this.#watchKeeper(udp.keeper);
      } else if (found.standing) {
        closeSync(found.standing.connection); // no kept region to hand it (logged): nothing is kept
      }
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
      ...(this.#datagrams ? { udpPort: this.#datagrams.port, underlayMtu: udp?.underlayMtu, takenBack: back !== undefined, keeper: this.#keeper?.pid } : {}),
      ...(this.#init.relay ? { relay: `${this.#init.relay.host}:${this.#init.relay.port}` } : {}),
    });
  }

  /**
   * What the keeper at `socketPath` holds for the agent's previous process, if it is this node's device and a kept
   * region: taken back, the region attached. A set that does not fit (the device deleted meanwhile, a configuration
   * that changed) is given up: the keeper is asked to let go of it (one the agent started exits then, a standing one
   * stays and gets the new set). A standing keeper that holds nothing is returned as `standing`.
   */
  #takeBack(socketPath: string, device: string, mtu: number): { back?: TakenBack; standing?: Held } {
    const held = takeHeld(socketPath);
    if (!held) return {};
    // a standing keeper (on Kubernetes, its own DaemonSet) that holds nothing yet: it gets what we make
    if (held.fds.length === 0) return { standing: held };
    const ours = new Set(held.fds);
    const giveUp = (why: string): { standing?: Held } => {
      this.#c.log.warn('the keeper\'s data plane does not fit: starting a new one', { why, keeper: held.pid });
      for (const fd of ours) closeSync(fd);
      keeperQuit(held.connection);
      KeptRegion.detach();
      // a standing keeper let go of it and stays, empty; one of ours exits
      const again = takeHeld(socketPath);
      if (again && again.fds.length === 0) return { standing: again };
      if (again) release(again);
      return {};
    };
    const [tunFd, udpFd, keptFd] = held.fds;
    if (held.fds.length !== 3 || tunFd === undefined || udpFd === undefined || keptFd === undefined) return giveUp(`it held ${held.fds.length} descriptors, not 3`);
    if (!KeptRegion.attach(keptFd)) return giveUp('its memfd holds no kept region');
    ours.delete(tunFd); // adoptTun closes it when it does not fit
    let tun: TunDevice | undefined;
    try {
      tun = adoptTun(tunFd, { name: device, mtu });
    } catch (err) {
      return giveUp((err as Error).message);
    }
    if (!tun) return giveUp(`its TUN descriptor is not attached to ${device} (deleted meanwhile?)`);
    ours.delete(udpFd); // the socket closes it when it does not fit
    let socket: UdpBatchSocket;
    try {
      socket = new UdpBatchSocket({ host: '0.0.0.0', port: 0, bufferBytes: SOCKET_BUFFER_BYTES }, udpFd);
    } catch (err) {
      tun.close();
      return giveUp((err as Error).message);
    }
    if (this.#init.role === 'cloud' && socket.port !== this.#init.udp?.port) {
      socket.close();
      tun.close();
      return giveUp(`its socket is bound to port ${socket.port}, the configuration says ${this.#init.udp?.port}`);
    }
    return { back: { tun, socket, held: { fds: [], pid: held.pid, connection: held.connection }, keptFd } };
  }

  /** A new kept region, attached; undefined (no keeping) when the memfd cannot be made. */
  #newKeptRegion(): number | undefined {
    try {
      return KeptRegion.create(KEPT_SLOTS, KEPT_META_BYTES);
    } catch (err) {
      this.#c.log.warn('no kept region for the datagram keys: an agent restart interrupts the datagram path', { err });
      return undefined;
    }
  }

  /** Hands the TUN device, the socket and the kept region (`fds`) to a standing keeper; a failure costs only the keeping. */
  #handTo(standing: Held, fds: readonly number[]): Held | undefined {
    const why = handTo(standing, fds);
    if (why === undefined) return standing;
    closeSync(standing.connection);
    this.#c.log.warn('the standing keeper took no data plane: an agent restart interrupts the datagram path', { why, keeper: standing.pid });
    return undefined;
  }

  /** Starts a keeper holding the TUN device, the socket and the kept region (`fds`); a failure costs only the keeping. */
  async #startKeeper(keeper: { socketPath: string; graceMs: number }, fds: readonly number[]): Promise<Held | undefined> {
    const { held, why } = await startKeeper(keeper.socketPath, fds, keeper.graceMs);
    if (!held) this.#c.log.warn('no keeper for the data plane: an agent restart interrupts the datagram path', { why });
    return held;
  }

  /**
   * Keeps the data plane held by a keeper this process is connected to: a keeper counts its time without an agent by
   * its connections, and lets go at its grace. Ours ends when the keeper went: on Kubernetes the chart's standing
   * keeper, come up after the agent, took over the keeper the agent started (which then exits), or the keeper's pod
   * was deleted and started again, empty. Either way the data plane lives on in this process alone, and the keeper
   * that holds it (or none) lets go before the next restart: that restart lost every packet of its gap (the first
   * Kubernetes lab runs, on a node whose agent came up first). So, every second, a keeper that went is replaced by the
   * one listening now (connected to; handed the data plane when it holds another or none) and, when none answers for
   * {@link KEEPER_MISSES_BEFORE_OWN} checks, by one of the agent's own.
   */
  #watchKeeper(keeper: { socketPath: string; graceMs: number }): void {
    this.#keeperWatch = setInterval(() => {
      if (this.#keeperWatching) return;
      this.#keeperWatching = true;
      void this.#checkKeeper(keeper).finally(() => (this.#keeperWatching = false));
    }, KEEPER_WATCH_MS);
    this.#keeperWatch.unref();
  }

  async #checkKeeper(keeper: { socketPath: string; graceMs: number }): Promise<void> {
    const fds = this.#dataPlaneFds;
    if (!fds || (this.#keeper && keeperLives(this.#keeper))) return;
    if (this.#keeper) {
      this.#c.log.info('the keeper holding the data plane went: finding the one listening now', { keeper: this.#keeper.pid });
      closeSync(this.#keeper.connection);
      this.#keeper = undefined;
    }
    const { held, handed, why } = reattach(keeper.socketPath, fds);
    if (held) {
      this.#keeper = held;
      this.#keeperMisses = 0;
      this.#c.log.info('the keeper holds the data plane again', { keeper: held.pid, handed });
      return;
    }
    if (++this.#keeperMisses < KEEPER_MISSES_BEFORE_OWN) return;
    this.#keeperMisses = 0;
    this.#c.log.warn('no keeper answers: starting one', { why });
    const own = await this.#startKeeper(keeper, fds);
    if (this.#dataPlaneFds === fds) this.#keeper = own;
    else if (own) closeSync(own.connection); // stopped meanwhile
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
      ...(file ? { state: { load: () => state, save: (s: DatagramLocalState) => file.save((state = s)) } } : {}),
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
   * Brings peers, routes and dialers in line with `peers`, of which `remote` are outside this node's site.
   * Serialised: calls run one after the other. A failed route batch is logged and retried at the next call.
   */
  sync(peers: readonly NodeRecord[], remote: ReadonlySet<string>): Promise<void> {
    this.#chain = this.#chain.then(() => this.#sync(peers, remote)).catch((err: unknown) => {
      this.#c.log.error('tunnel sync failed; retrying at the next resync', { err });
    });
    return this.#chain;
  }

  async #sync(peers: readonly NodeRecord[], remote: ReadonlySet<string>): Promise<void> {
    const endpoint = this.#endpoint;
    if (!endpoint) return;
    const { nodeName: name, role, port } = this.#init;
    // the controller's record of this node wins over the configuration: on Kubernetes it carries the Node's labels
    const community = peers.find((p) => p.name === name)?.community ?? this.#init.community;
    const plan = planTunnel({ name, role, port, community, relay: this.#init.relay !== undefined }, peers, remote);
    const changed = JSON.stringify(plan) !== JSON.stringify(this.#plan);
    this.#plan = plan;
    if (changed) {
      endpoint.setPeers(plan.peers.map((p) => ({ id: p.name, blocks: p.blocks })));
      this.#datagrams?.setPeers(plan.peers.map((p) => ({ id: p.name, pin: p.pin })));
      this.#c.log.info('tunnel peers', { peers: plan.peers.map((p) => `${p.name} (${p.dial ? `dial ${p.dial.host}:${p.dial.port}` : p.mode})`), skipped: plan.skipped });
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
    await syncTunnelRoutes(this.#c.ip, this.#c.log, this.#init.device, plan, tunnelSourceAddress(peers.find((p) => p.name === name)));
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
        keeper: this.#keeper ? { pid: this.#keeper.pid, takenBack: this.#takenBack } : null,
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
    clearInterval(this.#keeperWatch);
    for (const loops of [this.#dialers, this.#punchers, this.#circuitKeepers]) {
      for (const d of loops.values()) d.abort.abort();
      loops.clear();
    }
    this.#server?.close();
    // with a keeper, the socket, the TUN device and the keys stay for the agent's next process: the socket's last
    // ring is still handed on (the TUN device read meanwhile), then the device is no longer read
    const datagrams = this.#datagrams;
    this.#datagrams = undefined;
    if (this.#keeper) await datagrams?.closeKeeping();
    else datagrams?.close();
    this.#endpoint?.close();
    this.#endpoint = undefined;
    if (this.#keeper) closeSync(this.#keeper.connection);
    this.#keeper = undefined;
    const kept = this.#dataPlaneFds?.[2];
    this.#dataPlaneFds = undefined;
    if (kept !== undefined) closeSync(kept);
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
