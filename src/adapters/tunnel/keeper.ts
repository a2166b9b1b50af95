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
import { keeperAlive, keeperConnect, keeperHold, keeperQuit } from './datagram-native.ts';
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
