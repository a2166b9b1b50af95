/**
 * A full garbage collection now and then while a daemon is idle. An idle agent, controller or relay allocates a little
 * on every timer (keepalives, resyncs, usage reports); with the small young generation `bin/atoll` sets, what lives
 * across a scavenge (a Buffer in flight, a pending request) is promoted and dies in the old generation, which grows
 * far below V8's limit, so V8 runs no major collection and that garbage, and the C memory its Buffers hold, stays
 * resident (docs/architecture.md, "Memory"). Once a period, when the process used less than a small share of a core
 * since the last look, this runs V8's `gc()` (a full, atomic collection: 10 to 40 ms for an idle agent here) and then
 * `malloc_trim`. A busy process is left to V8's own schedule. It needs `gc` exposed (`--expose-gc`, set by
 * `bin/atoll` and the image's launcher); without it (the daemon run from its sources) it does nothing.
 */
import { trimMalloc } from './malloc-trim.ts';

/** How often the collector looks, ms. */
const IDLE_GC_PERIOD_MS = 60_000;
/** Share of one core under which a period counts as idle. */
const IDLE_CPU_SHARE = 0.02;

/** Whether `cpuMicros` of CPU time over `periodMs` is idle (under {@link IDLE_CPU_SHARE} of one core). Pure. */
export function isIdle(cpuMicros: number, periodMs: number): boolean {
  return cpuMicros / 1000 < periodMs * IDLE_CPU_SHARE;
}

/** Starts the collector; `stop` ends it. The timer does not keep the process alive. */
export function startIdleGc(periodMs = IDLE_GC_PERIOD_MS): { stop(): void } {
  const gc = (globalThis as { gc?: () => void }).gc;
  if (typeof gc !== 'function') return { stop: () => undefined };
  let since = process.cpuUsage();
  const timer = setInterval(() => {
    const used = process.cpuUsage(since);
    if (isIdle(used.user + used.system, periodMs)) {
      gc();
      trimMalloc();
    }
    since = process.cpuUsage();
  }, periodMs);
  timer.unref();
  return { stop: () => clearInterval(timer) };
}
