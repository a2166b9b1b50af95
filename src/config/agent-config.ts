/**
 * The agent's configuration file: the only place its raw JSON enters. Validated once against a strict schema
 * (unknown keys are refused), defaults filled in, the result frozen. `docs/configuration.md` documents every key.
 */
import { z } from 'zod';
import { describeIssues, readJsonFile } from './json-file.ts';
import { atollError } from '../core/errors.ts';
import { type Cidr, parseCidr, parseIpv4 } from '../core/net/ipv4.ts';
import { parseDuration } from './duration.ts';
import { METRICS_PORTS, metricsSchema } from './metrics.ts';

const IFNAME = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$/;
const SAFE_PATH = /^\/[A-Za-z0-9_./@:+-]*$/;

const cidr = z.string().refine((s) => parseCidr(s) !== undefined, { message: 'must be an IPv4 network such as 10.244.1.0/24 (no host bits)' });
const absPath = z.string().regex(SAFE_PATH, 'must be an absolute path of letters, digits and _ . / @ : + -');
const duration = z.union([z.number().int().nonnegative(), z.string()]).transform((v, ctx) => {
  const ms = typeof v === 'number' ? v * 1000 : parseDuration(v);
  if (ms === undefined) {
    ctx.addIssue({ code: 'custom', message: 'must be seconds or a duration such as 90s, 30m, 24h' });
    return z.NEVER;
  }
  return ms;
});

const label = z.string().max(63).regex(/^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$/, 'must be a Kubernetes label value');

const controllerSchema = z.strictObject({
  /** Controller API URLs, tried in order (several for replicas). */
  urls: z.array(z.url().startsWith('https://', 'must be an https:// URL').refine((u) => new URL(u).pathname === '/', { message: 'must have no path (https://host:port)' })).min(1),
  /** Bootstrap token to join with. */
  token: z.string().min(16),
  /** Pin of the controller CA, printed by the controller at start: sha256:<64 hex>. */
  caCertHash: z.string().regex(/^sha256:[0-9a-f]{64}$/, 'must be sha256: followed by 64 lowercase hex digits'),
  /** How often the agent reports its address usage (and may receive a spare block). */
  usagePeriod: duration.default(10_000),
});

export const agentConfigSchema = z.strictObject({
  /** This node's name, as Kubernetes knows it. */
  nodeName: z.string().regex(/^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/, 'must be a DNS subdomain (lowercase letters, digits, - and .)'),
  /** The CNI network name (the conflist `name`). */
  network: z.string().regex(/^[A-Za-z0-9][A-Za-z0-9_.-]*$/).default('atoll'),
  /** Pod address blocks of this node, until the controller leases them. */
  podCidrs: z.array(cidr).default([]),
  cniBinDir: absPath.default('/opt/cni/bin'),
  cniConfDir: absPath.default('/etc/cni/net.d'),
  /** File name of Atoll's conflist in cniConfDir; it must sort first. */
  cniConfName: z.string().regex(/^[A-Za-z0-9_.-]+\.conflist$/).default('10-atoll.conflist'),
  /** cniVersion written into the conflist (containerd 1.6 accepts results up to 1.0.0). */
  cniVersion: z.enum(['0.3.1', '0.4.0', '1.0.0', '1.1.0']).default('1.0.0'),
  /** Plugins chained after Atoll's in the conflist, as JSON objects (portmap, bandwidth, tuning...). */
  chainedPlugins: z.array(z.record(z.string(), z.unknown())).default([]),
  dataDir: absPath.default('/var/lib/atoll'),
  socketPath: absPath.default('/run/atoll/atoll.sock'),
  bridge: z.string().regex(IFNAME, 'must be a Linux interface name of at most 15 characters').default('atoll0'),
  /** Pod and bridge MTU; by default the underlay's minus 50 with the overlay, else 1500. */
  mtu: z.number().int().min(576).max(9000).optional(),
  /** How long a deleted pod's address stays reserved for it. */
  reservationTtl: duration.default(24 * 3600 * 1000),
  /** How often reservations are expired and state reconciled. */
  resyncPeriod: duration.default(60 * 1000),
  /** Path of the atoll-cni executable the agent installs into cniBinDir. */
  cniPluginSource: absPath.optional(),
  /** The cloud controller; without it the node uses podCidrs only. */
  controller: controllerSchema.optional(),
  site: label.default(''),
  community: label.default(''),
  /** This node's underlay addresses, as registered with the controller. */
  underlayAddresses: z.array(z.string().refine((s) => parseIpv4(s) !== undefined, { message: 'must be an IPv4 address' })).default([]),
  /** The same-site overlay (VXLAN, or direct routes on one L2 segment); off when absent. */
  overlay: z.strictObject({
    device: z.string().regex(IFNAME, 'must be a Linux interface name of at most 15 characters').default('atoll.1'),
    vni: z.number().int().min(1).max(16_777_215).default(1),
    port: z.number().int().min(1).max(65535).default(8472),
    directRouting: z.enum(['never', 'auto']).default('never'),
    probePort: z.number().int().min(1).max(65535).default(8474),
  }).optional(),
  /**
   * The cross-site tunnel (TUN device and pinned TLS streams); off when absent. Edge nodes dial cloud nodes at their
   * first underlay address; cloud nodes listen on `port`. Edge nodes of one community reach each other through the
   * relay and hole-punch direct streams; edge <-> edge needs `relay`.
   */
  tunnel: z.strictObject({
    port: z.number().int().min(1).max(65535).default(8475),
    device: z.string().regex(IFNAME, 'must be a Linux interface name of at most 15 characters').default('atoll.tun'),
    role: z.enum(['cloud', 'edge']),
    relay: z.strictObject({
      address: z.string().regex(/^[^\s:]+:\d{1,5}$/, 'must be host:port, as the relay listens').refine((a) => {
        const port = Number(a.slice(a.lastIndexOf(':') + 1));
        return port >= 1 && port <= 65535;
      }, { message: 'port must be 1 to 65535' }),
      pin: z.string().regex(/^sha256:[0-9a-f]{64}$/, 'must be sha256:<64 hex digits>, as `atoll relay` prints it'),
    }).optional(),
    /**
     * The datagram path: packets as AES-256-GCM UDP datagrams, keyed over the TLS streams, which stay the fallback;
     * on by default, `false` turns it off (docs/architecture.md says when that pays: a fast link that never loses a
     * packet, where the stream moves more per CPU). Cloud nodes receive on `port`; edge nodes on an ephemeral port (nodes behind one NAT must not
     * want the same outside port), the same one again after a restart (kept in <dataDir>/tunnel-udp.json with the
     * peers' last addresses, so paths heal without the relay). `underlayMtu` bounds every datagram (the TUN device's
     * MTU becomes at most underlayMtu - 70). `keepMs`: how long the node's keeper (bin/atoll-keeper) holds the data
     * plane (TUN device, UDP socket, keys) for an agent that went away, so that a restart loses no packet on
     * established datagram paths; 0 runs no keeper.
     */
    udp: z.union([z.literal(false), z.strictObject({
      port: z.number().int().min(1).max(65535).default(8477),
      underlayMtu: z.number().int().min(576).max(65535).default(1500),
      keepMs: z.number().int().min(0).max(86_400_000).default(60_000),
    })]).prefault({}),
  }).optional(),
  /** Cluster pod ranges: pod traffic to them is never masqueraded (every known block is included anyway). */
  clusterCidrs: z.array(cidr).default([]),
  /** /healthz, /readyz and /metrics over HTTP; off when absent. */
  metrics: metricsSchema(METRICS_PORTS.agent).optional(),
});

export type AgentConfig = Readonly<z.output<typeof agentConfigSchema>> & { readonly podBlocks: readonly Cidr[] };

/**
 * Validates a parsed configuration object.
 * @throws AtollError CONFIG_FILE_INVALID listing every bad key with its path.
 */
export function parseAgentConfig(raw: unknown, source = 'agent configuration'): AgentConfig {
  const res = agentConfigSchema.safeParse(raw);
  if (!res.success) {
    const problems = describeIssues(res.error);
    throw atollError('CONFIG_FILE_INVALID', `${source} is invalid: ${problems}`, 'fix the keys named; docs/configuration.md lists them all');
  }
  const podBlocks = res.data.podCidrs.map((c) => parseCidr(c) as Cidr);
  return Object.freeze({ ...res.data, podBlocks: Object.freeze(podBlocks) });
}

/** Reads and validates the configuration file at `path`. */
export function loadAgentConfig(path: string): AgentConfig {
  return parseAgentConfig(readJsonFile(path, 'the agent configuration', 'CONFIG_FILE_INVALID', '--config'), `the agent configuration ${path}`);
}
