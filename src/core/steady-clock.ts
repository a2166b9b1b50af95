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
 * Not for what must follow real time across restarts (IP reservations, certificate validity): those keep the wall
 * clock, which is the only one that survives a reboot.
 */
import type { Clock } from './ports.ts';

export class SteadyClock {
  readonly #raw: Clock;
  readonly #maxStepMs: number;
  #last: number;
  #offset = 0;
  /** Jumps taken out so far, and their total (ms; a backwards jump counts its size). */
  jumps = 0;
  jumpedMs = 0;

  /** `maxStepMs`: the largest step between two readings that is time passing; read at least that often (see {@link tick}). */
  constructor(raw: Clock, maxStepMs: number) {
    this.#raw = raw;
    this.#maxStepMs = maxStepMs;
    this.#last = raw();
  }

  /** The steady time, ms: the raw clock less every jump seen. Never goes backwards. */
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
}
