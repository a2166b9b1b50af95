/**
 * The tunnel's keeper (native/atoll-keeper.c): a small process that holds the datagram path's data plane (the TUN
 * device, the UDP socket, the memfd of the kept keys) across the agent's restarts, SIGKILL included. Where a standing
 * keeper listens (on Kubernetes, the chart's keeper DaemonSet, which a roll of the agents does not touch), the agent
 * hands it the three descriptors over its unix socket; else it starts one of its own with them (as its descriptors 3
 * to 5, in a session of its own). After a restart it takes them back (SCM_RIGHTS). While the agent is away, packets
 * wait in the device's and the socket's queues. The keeper lets go of everything once no agent was connected for its
 * grace time.
 */
import { spawn } from 'node:child_process';
import { closeSync, existsSync, fstatSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Logger } from '../../core/ports.ts';
import { keeperAlive, keeperConnect, keeperHold, keeperQuit, KeptRegion } from './datagram-native.ts';
import { adoptTun, type TunDevice } from './tun.ts';
import { UdpBatchSocket } from './udp-batch.ts';
import { installRoot } from '../install-root.ts';

/** The keeper program, under the install root (the checkout, or /opt/atoll in the image). */
export const KEEPER_PROGRAM = 'bin/atoll-keeper';
/** How long a keeper waits for an agent to come back before it gives up the data plane. */
export const KEEPER_GRACE_MS = 60_000;
/** The keeper's socket in the agent's data directory. */
export const KEEPER_SOCKET = 'tunnel-keeper.sock';

/** What a keeper held: the descriptors (now ours), its pid, and the connection that tells it an agent lives. */
export interface Held {
  readonly fds: readonly number[];
  readonly pid: number;
  readonly connection: number;
}

/** The keeper's socket for the agent whose data directory is `dataDir`. */
export function keeperSocketOf(dataDir: string): string {
  return join(dataDir, KEEPER_SOCKET);
}

/** Takes what the keeper at `socketPath` holds, or undefined when none answers there. */
export function takeHeld(socketPath: string): Held | undefined {
  return existsSync(socketPath) ? keeperConnect(socketPath) : undefined;
}

/** The status a keeper exits with when another keeper already listens at its socket (native/atoll-keeper.c). */
const KEEPER_EXIT_ANOTHER = 3;

/**
 * Starts a keeper holding `fds` (in that order) at `socketPath` and connects to it. When another keeper listens there
 * already (the chart's standing keeper came up meanwhile), the new one leaves it be and that one gets `fds`.
 * @returns the connection, or undefined (the data plane then lives as long as this process, as without a keeper)
 *   when the keeper did not answer within 2 s; `why` says what went wrong.
 */
export async function startKeeper(socketPath: string, fds: readonly number[], graceMs = KEEPER_GRACE_MS): Promise<{ held?: Held; why?: string }> {
  const program = join(installRoot(), KEEPER_PROGRAM);
  if (!existsSync(program)) return { why: `${program} is missing (make setup builds it)` };
  const child = spawn(program, [socketPath, String(fds.length), String(graceMs)], { detached: true, stdio: ['ignore', 'ignore', 'ignore', ...fds] });
  child.unref();
  let exited: number | null = null;
  child.once('exit', (code) => {
    exited = code ?? -1;
  });
  child.once('error', () => {
    exited = -1;
  });
  for (let waited = 0; waited < 2000 && exited === null; waited += 20) {
    const held = takeHeld(socketPath);
    if (held && held.pid === child.pid) {
      for (const fd of held.fds) closeSync(fd); // our own descriptors stay in use
      return { held: { fds, pid: held.pid, connection: held.connection } };
    }
    if (held) release(held);
    await sleep(20);
  }
  if (exited === KEEPER_EXIT_ANOTHER) {
    const found = reattach(socketPath, fds);
    return found.held ? { held: found.held } : { why: `another keeper listens at ${socketPath}, and ${found.why}` };
  }
  if (exited === null && child.pid) process.kill(child.pid, 'SIGTERM');
  return { why: exited === null ? 'it did not answer within 2 s' : `it exited with status ${exited}` };
}

/** Hands `fds` to the keeper of `held` (a standing one that held nothing). @returns an error message, or undefined. */
export function handTo(held: Held, fds: readonly number[]): string | undefined {
  const errno = keeperHold(held.connection, fds);
  return errno === 0 ? undefined : `sending the descriptors to keeper ${held.pid} failed: errno ${errno}`;
}

/** Whether the keeper of `held` is still there: false once it exited (asked to, killed, or taken over). */
export function keeperLives(held: Held): boolean {
  return keeperAlive(held.connection);
}

/** Whether descriptors `a` and `b` are the same open file (a socket, a memfd; any two TUN descriptors match). */
function sameFile(a: number, b: number | undefined): boolean {
  if (b === undefined) return false;
  const [x, y] = [fstatSync(a), fstatSync(b)];
  return x.ino === y.ino && x.dev === y.dev;
}

/**
 * Connects to the keeper listening at `socketPath` for the data plane this process holds (`fds`: the TUN device, the
 * socket, the kept region), after the keeper it was connected to went. One that holds these same files (a standing
 * keeper took over the keeper the agent started) is only connected to; one that holds nothing or other files (a
 * keeper started again, empty) is handed `fds`. Either way it now knows an agent lives, so its grace does not run out.
 * @returns its connection (`fds` stay ours), or undefined with why (none answers there, or the hand-over failed).
 */
export function reattach(socketPath: string, fds: readonly number[]): { held?: Held; handed?: boolean; why?: string } {
  const found = takeHeld(socketPath);
  if (!found) return { why: `no keeper answers at ${socketPath}` };
  const same = found.fds.length === fds.length && found.fds.every((fd, i) => sameFile(fd, fds[i]));
  for (const fd of found.fds) closeSync(fd);
  const held: Held = { fds: [], pid: found.pid, connection: found.connection };
  if (same) return { held, handed: false };
  const why = handTo(held, fds);
  if (why === undefined) return { held, handed: true };
  closeSync(found.connection);
  return { why };
}

/** Closes what `held` brought (descriptors and connection), leaving the keeper as it is. */
export function release(held: Held): void {
  for (const fd of held.fds) closeSync(fd);
  closeSync(held.connection);
}

/**
 * Makes the keeper at `socketPath` give up what it holds and exit (a node's reboot, a lab or a test taking the node
 * down). @returns its pid, once it is gone (SIGKILL after 2 s), or undefined when none answered.
 */
export async function stopKeeper(socketPath: string): Promise<number | undefined> {
  const held = takeHeld(socketPath);
  if (!held) return undefined;
  for (const fd of held.fds) closeSync(fd);
  keeperQuit(held.connection);
  for (let waited = 0; waited < 2000; waited += 20) {
    if (!existsSync(`/proc/${held.pid}`)) return held.pid;
    await sleep(20);
  }
  try {
    process.kill(held.pid, 'SIGKILL');
  } catch {
    // gone meanwhile
  }
  return held.pid;
}

/** How often the agent checks that the keeper holding its data plane is still the one it is connected to. */
const KEEPER_WATCH_MS = 1000;
/** Checks in a row with no keeper answering at the socket before the agent starts one of its own. */
const KEEPER_MISSES_BEFORE_OWN = 3;

/** What a keeper handed back from the agent's previous process: the TUN device and the bound socket. */
export interface TakenBack {
  readonly tun: TunDevice;
  readonly socket: UdpBatchSocket;
}

/** The data plane a keeper's set must fit, and how to make what is not taken back. */
export interface DataPlaneSpec {
  /** The TUN device's name and MTU. */
  readonly device: string;
  readonly mtu: number;
  /** The port the socket must be bound to (a cloud node's configured one); any when undefined. */
  readonly port: number | undefined;
  /** The receive and send buffers of a socket taken back. */
  readonly socketBufferBytes: number;
  /** Slots (peers) and bytes of metadata of a new kept region. */
  readonly keptSlots: number;
  readonly keptMetaBytes: number;
}

/**
 * The agent's side of its keeper: takes the data plane back from the keeper at its start, hands it to the keeper
 * that is to hold it (the standing one, or one it starts), and keeps a keeper holding it while the agent runs. Owns
 * the kept region's memfd and the connection that tells the keeper an agent lives. A failure of any of it costs only
 * the keeping (logged): the data plane then lives as long as this process, as without a keeper.
 */
export class KeeperLink {
  readonly #socketPath: string;
  readonly #graceMs: number;
  readonly #log: Logger;
  /** The connection to the keeper that holds the data plane. */
  #held: Held | undefined;
  /** A standing keeper found holding nothing: it gets what the agent makes. */
  #standing: Held | undefined;
  /** The kept region's memfd (attached; kept open to hand it to another keeper). */
  #keptFd: number | undefined;
  /** What the keeper is to hold: the TUN device, the socket, the kept region. */
  #fds: readonly number[] | undefined;
  #takenBack = false;
  #watch: NodeJS.Timeout | undefined;
  #watching = false;
  #misses = 0;

  constructor(opts: { readonly socketPath: string; readonly graceMs: number; readonly log: Logger }) {
    this.#socketPath = opts.socketPath;
    this.#graceMs = opts.graceMs;
    this.#log = opts.log;
  }

  /** The keeper holding the data plane and whether it was taken back from the last process; null when none holds it. */
  get status(): { pid: number; takenBack: boolean } | null {
    return this.#held ? { pid: this.#held.pid, takenBack: this.#takenBack } : null;
  }

  /** Whether the datagram keys are kept (a kept region is attached). */
  get keeping(): boolean {
    return this.#keptFd !== undefined;
  }

  /**
   * What the keeper holds for the agent's previous process, if it is `device` and a kept region (and, with `port`, a
   * socket bound to it): taken back, the region attached. A set that does not fit (the device deleted meanwhile, a
   * configuration that changed) is given up: the keeper is asked to let go of it (one the agent started exits then, a
   * standing one stays and gets the new set). Without a set taken back, a new kept region is made.
   */
  takeBack(spec: DataPlaneSpec): TakenBack | undefined {
    const back = this.#takeBack(spec);
    this.#takenBack = back !== undefined;
    if (!back) this.#keptFd = this.#newKeptRegion(spec);
    return back;
  }

  #takeBack({ device, mtu, port, socketBufferBytes }: DataPlaneSpec): TakenBack | undefined {
    const held = takeHeld(this.#socketPath);
    if (!held) return undefined;
    // a standing keeper (on Kubernetes, its own DaemonSet) that holds nothing yet: it gets what we make
    if (held.fds.length === 0) {
      this.#standing = held;
      return undefined;
    }
    const ours = new Set(held.fds);
    const giveUp = (why: string): undefined => {
      this.#log.warn('the keeper\'s data plane does not fit: starting a new one', { why, keeper: held.pid });
      for (const fd of ours) closeSync(fd);
      keeperQuit(held.connection);
      KeptRegion.detach();
      // a standing keeper let go of it and stays, empty; one of ours exits
      const again = takeHeld(this.#socketPath);
      if (again && again.fds.length === 0) this.#standing = again;
      else if (again) release(again);
      return undefined;
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
      socket = new UdpBatchSocket({ host: '0.0.0.0', port: 0, bufferBytes: socketBufferBytes }, udpFd);
    } catch (err) {
      tun.close();
      return giveUp((err as Error).message);
    }
    if (port !== undefined && socket.port !== port) {
      socket.close();
      tun.close();
      return giveUp(`its socket is bound to port ${socket.port}, the configuration says ${port}`);
    }
    this.#held = { fds: [], pid: held.pid, connection: held.connection };
    this.#keptFd = keptFd;
    return { tun, socket };
  }

  /** A new kept region, attached; undefined (no keeping) when the memfd cannot be made. */
  #newKeptRegion(spec: DataPlaneSpec): number | undefined {
    try {
      return KeptRegion.create(spec.keptSlots, spec.keptMetaBytes);
    } catch (err) {
      this.#log.warn('no kept region for the datagram keys: an agent restart interrupts the datagram path', { err });
      return undefined;
    }
  }

  /**
   * Has a keeper hold the TUN device `tunFd` and the socket `socketFd` with the kept region: the one that handed them
   * back keeps them; else the standing keeper is handed them, or one of the agent's own is started. Then watches it.
   */
  async hold(tunFd: number, socketFd: number): Promise<void> {
    const keptFd = this.#keptFd;
    if (keptFd === undefined) {
      this.close(); // no kept region (logged): nothing is kept
      return;
    }
    const fds = [tunFd, socketFd, keptFd];
    this.#fds = fds;
    const standing = this.#standing;
    this.#standing = undefined;
    this.#held ??= standing ? this.#handTo(standing, fds) : await this.#startOwn(fds);
    if (this.#held) this.#watchKeeper();
  }

  /** Hands `fds` to a standing keeper; a failure costs only the keeping. */
  #handTo(standing: Held, fds: readonly number[]): Held | undefined {
    const why = handTo(standing, fds);
    if (why === undefined) return standing;
    closeSync(standing.connection);
    this.#log.warn('the standing keeper took no data plane: an agent restart interrupts the datagram path', { why, keeper: standing.pid });
    return undefined;
  }

  /** Starts a keeper holding `fds`; a failure costs only the keeping. */
  async #startOwn(fds: readonly number[]): Promise<Held | undefined> {
    const { held, why } = await startKeeper(this.#socketPath, fds, this.#graceMs);
    if (!held) this.#log.warn('no keeper for the data plane: an agent restart interrupts the datagram path', { why });
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
  #watchKeeper(): void {
    this.#watch = setInterval(() => {
      if (this.#watching) return;
      this.#watching = true;
      void this.#check().finally(() => (this.#watching = false));
    }, KEEPER_WATCH_MS);
    this.#watch.unref();
  }

  async #check(): Promise<void> {
    const fds = this.#fds;
    if (!fds || (this.#held && keeperLives(this.#held))) return;
    if (this.#held) {
      this.#log.info('the keeper holding the data plane went: finding the one listening now', { keeper: this.#held.pid });
      closeSync(this.#held.connection);
      this.#held = undefined;
    }
    const { held, handed, why } = reattach(this.#socketPath, fds);
    if (held) {
      this.#held = held;
      this.#misses = 0;
      this.#log.info('the keeper holds the data plane again', { keeper: held.pid, handed });
      return;
    }
    if (++this.#misses < KEEPER_MISSES_BEFORE_OWN) return;
    this.#misses = 0;
    this.#log.warn('no keeper answers: starting one', { why });
    const own = await this.#startOwn(fds);
    if (this.#fds === fds) this.#held = own;
    else if (own) closeSync(own.connection); // closed meanwhile
  }

  /** Stops watching and lets go of the connection and the kept region's memfd; the keeper keeps what it holds. */
  close(): void {
    clearInterval(this.#watch);
    this.#fds = undefined;
    for (const h of [this.#held, this.#standing]) if (h) closeSync(h.connection);
    this.#held = undefined;
    this.#standing = undefined;
    if (this.#keptFd !== undefined) closeSync(this.#keptFd);
    this.#keptFd = undefined;
  }
}
