/**
 * Keeping a tunnel stream dialled: dial a listener with its key pinned, hand the stream over, wait for it to close,
 * dial again, with backoff while dials fail or streams die at once. An edge node keeps its streams to cloud peers and
 * to the relay up this way (src/agent/tunnel.ts, src/agent/relay-control.ts).
 */
import type { Logger } from '../core/ports.ts';
import { Backoff, type BackoffInit } from '../core/retry.ts';
import { sleep } from '../adapters/timers.ts';
import type { TunnelCredentials } from '../adapters/tunnel/tunnel-credentials.ts';
import { dialTunnel } from '../adapters/tunnel/tunnel-dial.ts';
import type { TunnelStream } from '../adapters/tunnel/tunnel-stream.ts';

/** A stream that lived this long resets the dial backoff. */
const STABLE_STREAM_MS = 5000;

export interface KeepDialledInit {
  /** Names the far end in log lines: `what` ('tunnel', 'relay') and the fields to log with it. */
  readonly label: { readonly what: string } & Record<string, string>;
  /** Where to dial, and the pin its key must have. */
  readonly to: { readonly host: string; readonly port: number; readonly pin: string };
  readonly credentials: TunnelCredentials;
  readonly backoff: BackoffInit;
}

/**
 * Dials `init.to`, hands the stream to `up` (which returns what to do when it closes), waits for it to close, and
 * dials again until `signal` aborts; backoff while dials fail or streams die at once (the far end does not know our
 * key yet). A dial failure is logged when its message changes.
 */
export async function keepDialled(log: Logger, init: KeepDialledInit, signal: AbortSignal, up: (stream: TunnelStream) => () => void): Promise<void> {
  const { label, to } = init;
  const backoff = new Backoff(init.backoff, sleep);
  let lastError = '';
  while (!signal.aborted) {
    try {
      const stream = await dialTunnel({ host: to.host, port: to.port, credentials: init.credentials, peerPin: to.pin, timeoutMs: 10_000, signal });
      if (signal.aborted) {
        stream.close();
        return;
      }
      const down = up(stream);
      lastError = '';
      const upAt = Date.now();
      await untilClosed(stream, signal);
      down();
      if (Date.now() - upAt >= STABLE_STREAM_MS) backoff.reset();
    } catch (err) {
      if (signal.aborted) return; // stopped mid-dial: not a failure
      const message = err instanceof Error ? err.message : String(err);
      if (message !== lastError) log.warn(`${label.what} dial failed; retrying with backoff`, { ...label, err: message, retryInMs: backoff.delayMs });
      lastError = message;
    }
    await backoff.wait(signal);
  }
}

/** Resolves when `stream` closes; closes it when `signal` aborts first. */
export async function untilClosed(stream: TunnelStream, signal: AbortSignal): Promise<void> {
  if (!stream.alive) return;
  const closed = new Promise<void>((resolve) => stream.once('close', () => resolve()));
  const onAbort = () => stream.close();
  signal.addEventListener('abort', onAbort, { once: true });
  await closed;
  signal.removeEventListener('abort', onAbort);
}
