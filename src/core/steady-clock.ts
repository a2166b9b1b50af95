/**
 * A clock for liveness that a clock jump cannot fool. Pure: it reads the raw clock it is given.
 *
 * Why: the tunnel declares a peer dead after a few seconds without hearing from it. When the process's clock jumps
 * (a VM restored from a snapshot, a host resumed, a monotonic clock faked forward; an NTP step moves the wall clock),
 * "now - last heard" suddenly reads days, and every working stream and datagram path would be declared dead at once,
 * without a single probe. Here a jump is told from time passing by the ticker that reads the clock often: between
 * two readings a healthy process sees at most a tick or so; a larger step (or one backwards) is taken out of the
 * steady time, so after a jump the deadlines count from the jump, the keepalives go out, and only peers that do not
 * answer them are declared dead. A stall of the process itself (a long garbage collection, a host starved of CPU)
 * looks the same and is treated the same, which is right: nothing could be heard while it lasted.
 *
 * Given the wall clock too, it also keeps the wall clock's jumps (a step of the wall clock that the steady time did not
 * make): {@link wallNow} is the wall clock less them, for reading the age of what was stamped with the wall clock (IP
 * reservations): a jump of days then expires nothing; only time this process saw pass counts. Stamps themselves keep
 * the plain wall clock, the only one that survives a reboot. (A suspend is a jump here too, so what expires while
 * the process lives errs on the side of lasting longer.)
 */
import type { Clock } from './ports.ts';

export class SteadyClock {
  readonly #raw: Clock;
  readonly #wall: Clock | undefined;
  readonly #maxStepMs: number;
  #last: number;
  #offset = 0;
  /** The wall clock and the steady time at the last {@link wallNow}, and the wall clock's jumps so far. */
  #lastWall: number;
  #steadyAtWall: number;
  #wallOffset = 0;
  /** Jumps taken out so far, and their total (ms; a backwards jump counts its size). */
  jumps = 0;
  jumpedMs = 0;

  /** `maxStepMs`: the largest step between two readings that is time passing; read at least that often (see {@link tick}). */
  constructor(raw: Clock, maxStepMs: number, wall?: Clock) {
    this.#raw = raw;
    this.#wall = wall;
    this.#maxStepMs = maxStepMs;
    this.#last = raw();
    this.#lastWall = wall?.() ?? 0;
    this.#steadyAtWall = this.#last;
  }

  /** The steady time, ms: the raw clock less every jump seen. Never goes backwards. Cheap: one clock read. */
  now(): number {
    const raw = this.#raw();
    const step = raw - this.#last;
    if (step < 0 || step > this.#maxStepMs) {
      this.#offset += step;
      this.jumps++;
      this.jumpedMs += Math.abs(step);
    }
    this.#last = raw;
    return raw - this.#offset;
  }

  /**
   * The wall clock less its jumps (without a wall clock, NaN): what the wall clock moved since the last call beyond
   * what the steady time did is a jump when it exceeds the largest step. Read it at least as often as {@link now} is
   * read by the ticker; the steady time's own jumps are taken out first.
   */
  wallNow(): number {
    const steady = this.now();
    if (!this.#wall) return Number.NaN;
    const wall = this.#wall();
    const jump = wall - this.#lastWall - (steady - this.#steadyAtWall);
    if (Math.abs(jump) > this.#maxStepMs) this.#wallOffset += jump;
    this.#lastWall = wall;
    this.#steadyAtWall = steady;
    return wall - this.#wallOffset;
  }
}
