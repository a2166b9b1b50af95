/**
 * The `metrics` section every component's configuration shares: where its operations listener (/healthz, /readyz,
 * /metrics; src/adapters/ops/ops-server.ts) binds. Absent: no listener.
 */
import * as z from 'zod/mini';
import './json-file.ts'; // zod's English messages

/** Default ports of the operations listener: agent, controller, relay (one host may run all three). */
export const METRICS_PORTS = { agent: 9470, controller: 9471, relay: 9472 } as const;

const hostPort = z.string().check(
  z.regex(/^(\[[0-9A-Fa-f:.]+\]|[^\s:[\]]+):\d{1,5}$/, 'must be host:port, such as 127.0.0.1:9470 or [::1]:9470'),
  z.refine((s) => Number(s.slice(s.lastIndexOf(':') + 1)) <= 65535, { message: 'port must be 0 to 65535' }),
);

/** The `metrics` section, defaulting to loopback on `port`. */
export function metricsSchema(port: number) {
  return z.strictObject({
    /** host:port of the listener; loopback by default, so nothing off the host reaches it unless configured. */
    listen: z._default(hostPort, `127.0.0.1:${port}`),
  });
}
