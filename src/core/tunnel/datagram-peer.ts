/**
 * One peer's datagram path as time sees it: when it is usable, what a keepalive or packet received changes, what each
 * tick sends, when hellos rebuild the path and when a packet may go on it all the same. Pure, with the time passed in
 * (`now`: a steady clock in ms; `wall`: ms since the epoch, only for what `atoll peers` shows); the adapter
 * (src/adapters/tunnel/datagram-path.ts) keeps the socket and the timers (the keys: datagram-keys.ts), and asks here.
 *
 * Design notes (why):
 * - Usable = we hear the peer (an authentic datagram within the dead interval, and a full-size one within
 *   {@link FULL_KEEPALIVE_EVERY} of them: the path takes full-size datagrams) and it hears us (its keepalives say so),
 *   with a sending key and an address. Either end alone cannot tell: a NAT may pass one direction only.
 * - Keepalives are one byte on a usable path, padded to the full size one tick in {@link FULL_KEEPALIVE_EVERY} per peer
 *   (staggered by the peer's tag) and on every tick while not usable; an echo request rides one in {@link ECHO_EVERY}.
 * - Hellos rebuild a path only when nothing else can bring keys: no stream, or only one silent for a dead interval (a
 *   circuit through the relay stays open for 20 s after the peer's side went). Fast at first (a restarted peer comes
 *   back within seconds), then every second.
 */
import { ECHO_EVERY, echoReplyFlags, KEEPALIVE_ECHO_ODD, KEEPALIVE_ECHO_REPLY, KEEPALIVE_ECHO_REQUEST, KEEPALIVE_HEARS_YOU, MAX_COUNTER, rekeyDue } from './datagram.ts';

/** A keepalive goes to every peer with a key and an address this often (the adapter's tick). */
export const KEEPALIVE_MS = 1000;
/** A usable path's keepalives are padded to the full datagram size one tick in this many (per peer, staggered). */
export const FULL_KEEPALIVE_EVERY = 10;
/** A peer's datagram path is given up after this long without an authentic keepalive saying it hears us. */
export const DEAD_AFTER_MS = 3000;
/**
 * A peer nothing else reaches (no stream, no circuit) still gets datagrams on a path that is not usable for this long
 * after its last authentic datagram: its agent may be restarting while its keeper holds the socket, whose queue keeps
 * them for the next process (a kubelet's crash back-off keeps an agent down for 10 s and more, past {@link
 * DEAD_AFTER_MS}). The keeper's grace by default (`tunnel.udp.keepMs`): after it there is no socket to queue them.
 */
export const LAST_RESORT_MS = 60_000;
/** An offered key not acknowledged within this long is offered again (a new id). */
export const OFFER_TIMEOUT_MS = 5000;
/** A peer without a usable path and without a stream gets a hello this often in the first {@link HELLO_FAST_FOR_MS} of it... */
export const HELLO_FAST_MS = 250;
export const HELLO_FAST_FOR_MS = 5000;
/** ...and this often after. */
export const HELLO_SLOW_MS = 1000;
/** A peer's hellos are answered at most this often (a bound on what a replayed current hello can make us send). */
export const HELLO_ANSWER_MIN_MS = 100;

/** The times a peer's path is judged by (steady ms; -Infinity: never). */
export interface PeerTimes {
  /** When an authentic datagram from the peer last came, when a full-size keepalive did, and when one said it hears us. */
  lastHeard: number;
  heardFull: number;
  heardByPeer: number;
  /** The echo request awaiting its answer: when it went and its ECHO_ODD bit; how many went. */
  echo: { readonly at: number; readonly odd: boolean } | undefined;
  echoes: number;
  /** The last echo's round trip, ms. */
  rttMs: number | undefined;
  /** Since when (wall clock) hellos are rebuilding the path, with no stream to help; when that began and the next goes (steady). */
  rebuildingSince: number | undefined;
  rebuildStartedAt: number;
  nextHelloAt: number;
  /** When a hello of the peer's was last answered. */
  lastAnswerAt: number;
}

/** What the peer's keys and address are now, as far as timing cares (the adapter's peer state is one). */
export interface PeerKeying {
  /** The sending key: when it was made and how many datagrams it sealed; undefined without one. */
  readonly send: { readonly createdAt: number; readonly key: { readonly counter: number } } | undefined;
  /** The key offered on a stream and not yet acknowledged: when it went; undefined without one. */
  readonly pending: { readonly at: number } | undefined;
  /** The peer's address; undefined without one. */
  readonly endpoint: object | undefined;
}

/** A peer as this module sees it. */
export type PeerView = PeerTimes & PeerKeying;

/** The times of a peer not heard yet. */
export function newPeerTimes(): PeerTimes {
  return {
    lastHeard: -Infinity, heardFull: -Infinity, heardByPeer: -Infinity, echo: undefined, echoes: 0, rttMs: undefined,
    rebuildingSince: undefined, rebuildStartedAt: 0, nextHelloAt: 0, lastAnswerAt: -Infinity,
  };
}

/** We hear the peer: an authentic datagram lately, and a full-size keepalive within {@link FULL_KEEPALIVE_EVERY} dead intervals. */
export function hears(t: PeerTimes, now: number, deadMs = DEAD_AFTER_MS): boolean {
  return now - t.lastHeard < deadMs && now - t.heardFull < deadMs * FULL_KEEPALIVE_EVERY;
}

/** Packets take the datagram path: a key, an address, we hear the peer and it hears us. */
export function usable(p: PeerView, now: number, deadMs = DEAD_AFTER_MS): boolean {
  return p.send !== undefined && p.endpoint !== undefined && now - p.heardByPeer < deadMs && hears(p, now, deadMs);
}

/**
 * A keepalive with `flags` and payload length `len` came from the peer at `now`: the times move.
 * @returns whether the path may have turned usable (it was not heard, or did not hear us, for a dead interval), and the
 *   flags of the one-byte echo answer to send at once, when the keepalive asked for one.
 */
export function onKeepalive(t: PeerTimes, flags: number, len: number, now: number, deadMs = DEAD_AFTER_MS): { revived: boolean; answer: number | undefined } {
  const hearsUs = (flags & KEEPALIVE_HEARS_YOU) !== 0;
  const revived = !hears(t, now, deadMs) || (hearsUs && now - t.heardByPeer >= deadMs);
  t.lastHeard = now;
  // padded (an older agent pads every one): the path takes full-size datagrams
  if (len > 1) t.heardFull = now;
  if (hearsUs) t.heardByPeer = now;
  if ((flags & KEEPALIVE_ECHO_REPLY) !== 0 && t.echo && t.echo.odd === ((flags & KEEPALIVE_ECHO_ODD) !== 0)) {
    t.rttMs = Math.max(0, now - t.echo.at);
    t.echo = undefined;
  }
  return { revived, answer: (flags & KEEPALIVE_ECHO_REQUEST) !== 0 ? echoReplyFlags(flags, hears(t, now, deadMs)) : undefined };
}

/** A packet came from the peer at `now`. @returns whether the path may have turned usable (not heard for a dead interval). */
export function onPacket(t: PeerTimes, now: number, deadMs = DEAD_AFTER_MS): boolean {
  const revived = now - t.lastHeard >= deadMs;
  t.lastHeard = now;
  return revived;
}

/** A hello exchange agreed keys with the peer at `now`: it echoed our key, so it hears us and we hear it. */
export function onHandshake(t: PeerTimes, now: number): void {
  t.lastHeard = now;
  t.heardFull = now;
  t.heardByPeer = now;
}

/** Whether a hello of the peer's is answered at `now` (at most one per {@link HELLO_ANSWER_MIN_MS}); records the answer. */
export function answerHello(t: PeerTimes, now: number): boolean {
  if (now - t.lastAnswerAt < HELLO_ANSWER_MIN_MS) return false;
  t.lastAnswerAt = now;
  return true;
}

/** What one tick does for a peer. */
export interface TickPlan {
  /** Offer a new key on the peer's stream: none yet, one stuck, one due for rotation (and no fresh offer waits). */
  readonly offer: boolean;
  /** The keepalive to send (with a key and an address): its flags byte, whether padded, whether it asks for an echo. */
  readonly keepalive: { readonly flags: number; readonly full: boolean; readonly echo: boolean } | undefined;
}

/**
 * Tick number `tick` for the peer of tag `tag` at `now`. A path that stays unusable under a key older than an offer's
 * timeout may hold keys the ends do not share (a handshake by hellos that one end finished and the other did not
 * before a stream came back): a new key on the stream sets it right (where UDP is blocked, that is one small message
 * per peer every 5 s).
 */
export function planTick(p: PeerView, now: number, tick: number, tag: number, opts: { readonly deadAfterMs?: number | undefined; readonly rekey?: { readonly packets: number; readonly ms: number } | undefined } = {}): TickPlan {
  const deadMs = opts.deadAfterMs ?? DEAD_AFTER_MS;
  const up = usable(p, now, deadMs);
  const offerStale = !p.pending || now - p.pending.at > OFFER_TIMEOUT_MS;
  const send = p.send;
  const sent = send?.key.counter ?? 0;
  const stuck = send !== undefined && now - send.createdAt > OFFER_TIMEOUT_MS && !up;
  const offer = offerStale && (!send || stuck || rekeyDue(sent, now - send.createdAt, opts.rekey) || sent >= MAX_COUNTER);
  if (!send || !p.endpoint) return { offer, keepalive: undefined };
  // the echo goes on a one-byte keepalive of a usable path (half a round of ticks from the padded one)
  const echo = (tick + tag) % ECHO_EVERY === ECHO_EVERY >> 1;
  const odd = p.echoes % 2 === 1;
  const flags = (hears(p, now, deadMs) ? KEEPALIVE_HEARS_YOU : 0) | (echo ? KEEPALIVE_ECHO_REQUEST | (odd ? KEEPALIVE_ECHO_ODD : 0) : 0);
  return { offer, keepalive: { flags, full: !up || (tick + tag) % FULL_KEEPALIVE_EVERY === 0, echo } };
}

/** The keepalive of {@link planTick} went at `now`: an echo it asked for now awaits its answer. */
export function keepaliveSent(t: PeerTimes, plan: NonNullable<TickPlan['keepalive']>, now: number): void {
  if (!plan.echo) return;
  t.echo = { at: now, odd: (plan.flags & KEEPALIVE_ECHO_ODD) !== 0 };
  t.echoes++;
}

/**
 * One hello pass for the peer at `now`: whether its path is being rebuilt by hellos (an address, not usable, and no
 * stream the peer answers on: `streamSilentMs` undefined without a stream) and whether a hello goes now. A rebuild
 * that starts says so (`started`: log it, and start a new handshake when our key was spent).
 */
export function helloStep(t: PeerView, now: number, wall: number, streamSilentMs: number | undefined, deadMs = DEAD_AFTER_MS): { rebuilding: boolean; started: boolean; send: boolean } {
  const rebuilding = t.endpoint !== undefined && !usable(t, now, deadMs) && (streamSilentMs === undefined || streamSilentMs >= deadMs);
  if (!rebuilding) {
    t.rebuildingSince = undefined;
    return { rebuilding: false, started: false, send: false };
  }
  const started = t.rebuildingSince === undefined;
  if (started) {
    t.rebuildingSince = wall;
    t.rebuildStartedAt = now;
    t.nextHelloAt = now;
  }
  if (now < t.nextHelloAt) return { rebuilding: true, started, send: false };
  t.nextHelloAt = now + (now - t.rebuildStartedAt < HELLO_FAST_FOR_MS ? HELLO_FAST_MS : HELLO_SLOW_MS);
  return { rebuilding: true, started, send: true };
}

/**
 * Whether a packet may go to the peer on a path that is not usable, when nothing else reaches it: no stream or
 * circuit (`streamSilentMs` undefined), or only one silent for a dead interval; with a key and an address, and within
 * `lastResortMs` of its last authentic datagram (its agent may be restarting behind its keeper).
 */
export function lastResort(p: PeerView, now: number, streamSilentMs: number | undefined, opts: { readonly deadAfterMs?: number | undefined; readonly lastResortMs?: number | undefined } = {}): boolean {
  if (streamSilentMs !== undefined && streamSilentMs < (opts.deadAfterMs ?? DEAD_AFTER_MS)) return false;
  return p.send !== undefined && p.endpoint !== undefined && now - p.lastHeard < (opts.lastResortMs ?? LAST_RESORT_MS);
}
