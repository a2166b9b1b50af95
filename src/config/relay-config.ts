/**
 * The relay's configuration file (JSON): where it listens, where it keeps its key and its copy of the registry,
 * and how it reaches the controller. Every key is in docs/configuration.md.
 */
import * as z from 'zod/mini';
import { describeIssues, readJsonFile } from './json-file.ts';
import { atollError } from '../core/errors.ts';
import { METRICS_PORTS, metricsSchema } from './metrics.ts';

const absPath = z.string().check(z.regex(/^\/[A-Za-z0-9._/-]*$/, 'must be an absolute path of safe characters'));
const port = z.number().check(z.int(), z.gte(1), z.lte(65535));

export const relayConfigSchema = z.strictObject({
  listenHost: z._default(z.string(), '0.0.0.0'),
  listenPort: z._default(port, 8476),
  /** Where nodes connect for circuits (plain TCP; the relay joins two such connections, the nodes run TLS over them). */
  circuitPort: z._default(port, 8477),
  /** Its tunnel key (the pin agents configure) and its copy of the registry, so it works while the controller is down. */
  dataDir: z._default(absPath, '/var/lib/atoll-relay'),
  controller: z.strictObject({
    urls: z.array(z.url()).check(z.minLength(1)),
    /** The controller CA's pin, as agents have it. */
    caCertHash: z.string().check(z.regex(/^sha256:[0-9a-f]{64}$/, 'must be sha256:<64 hex digits>, as the controller prints it')),
    /** One of the controller's `relayTokens`. */
    token: z.string().check(z.minLength(16)),
  }),
  /** /healthz, /readyz and /metrics over HTTP; off when absent. */
  metrics: z.optional(metricsSchema(METRICS_PORTS.relay)),
}).check(z.refine((c) => c.circuitPort !== c.listenPort, { message: 'must differ from listenPort (the control streams listen there)', path: ['circuitPort'] }));

export type RelayConfig = Readonly<z.output<typeof relayConfigSchema>>;

/** Reads and validates the relay configuration at `path`. @throws AtollError CONFIG_FILE_INVALID naming every bad key. */
export function loadRelayConfig(path: string): RelayConfig {
  const res = relayConfigSchema.safeParse(readJsonFile(path, 'the relay configuration', 'CONFIG_FILE_INVALID', '--config'));
  if (!res.success) {
    const problems = describeIssues(res.error);
    throw atollError('CONFIG_FILE_INVALID', `the relay configuration ${path} is invalid: ${problems}`, 'fix the keys named; docs/configuration.md lists them all');
  }
  return Object.freeze(res.data);
}
