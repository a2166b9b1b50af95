/** Ports the core defines and adapters implement. */

/** Structured logging. Fields are merged into the JSON line. */
export interface Logger {
  info(msg: string, fields?: Record<string, unknown>): void;
  warn(msg: string, fields?: Record<string, unknown>): void;
  error(msg: string, fields?: Record<string, unknown>): void;
  debug(msg: string, fields?: Record<string, unknown>): void;
  /** A logger whose lines carry `component`. */
  child(component: string): Logger;
}

/** Milliseconds since the epoch; injected so leases and reservations can be tested with a manual clock. */
export type Clock = () => number;

/**
 * Waits `ms` milliseconds; injected so backoff and polling can be tested with a manual clock. Resolves early, and
 * never rejects, when `signal` aborts (at once if it already has).
 */
export type Sleep = (ms: number, signal?: AbortSignal) => Promise<void>;
