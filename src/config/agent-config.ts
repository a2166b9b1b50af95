/**
 * The agent's configuration file: the only place its raw JSON enters. Validated once against a strict schema
 * (unknown keys are refused), defaults filled in, the result frozen. `docs/configuration.md` documents every key.
 */
import * as z from 'zod/mini';
import { describeIssues, readJsonFile } from './json-file.ts';
import { atollError } from '../core/errors.ts';
import { type Cidr, parseCidr, parseIpv4 } from '../core/net/ipv4.ts';
import { parseDuration } from './duration.ts';
import { METRICS_PORTS, metricsSchema } from './metrics.ts';

const IFNAME = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$/;
const SAFE_PATH = /^\/[A-Za-z0-9_./@:+-]*$/;

const cidr = z.string().check(z.refine((s) => parseCidr(s) !== undefined, { message: 'must be an IPv4 network such as 10.244.1.0/24 (no host bits)' }));
const absPath = z.string().check(z.regex(SAFE_PATH, 'must be an absolute path of letters, digits and _ . / @ : + -'));
const duration = z.pipe(z.union([z.number().check(z.int(), z.nonnegative()), z.string()]), z.transform((v, ctx) => {
  const ms = typeof v === 'number' ? v * 1000 : parseDuration(v);
  if (ms === undefined) {
    ctx.issues.push({ code: 'custom', message: 'must be seconds or a duration such as 90s, 30m, 24h', input: v });
    return z.NEVER;
  }
  return ms;
}));
const intIn = (min: number, max: number) => z.number().check(z.int(), z.gte(min), z.lte(max));
const ifName = z.string().check(z.regex(IFNAME, 'must be a Linux interface name of at most 15 characters'));
const pin = (message: string) => z.string().check(z.regex(/^sha256:[0-9a-f]{64}$/, message));

const label = z.string().check(z.maxLength(63), z.regex(/^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$/, 'must be a Kubernetes label value'));

const controllerSchema = z.strictObject({
  /** Controller API URLs, tried in order (several for replicas). */
  urls: z.array(z.url().check(
    z.startsWith('https://', 'must be an https:// URL'),
    // a string that is no URL at all is z.url()'s to report; this check only judges URLs
    z.refine((u) => { const url = URL.parse(u); return url === null || url.pathname === '/'; }, { message: 'must have no path (https://host:port)' }),
  )).check(z.minLength(1)),
  /** Bootstrap token to join with. */
  token: z.string().check(z.minLength(16)),
  /** Pin of the controller CA, printed by the controller at start: sha256:<64 hex>. */
  caCertHash: pin('must be sha256: followed by 64 lowercase hex digits'),
  /** How often the agent reports its address usage (and may receive a spare block). */
  usagePeriod: z._default(duration, 10_000),
});

export const agentConfigSchema = z.strictObject({
  /** This node's name, as Kubernetes knows it. */
  nodeName: z.string().check(z.regex(/^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/, 'must be a DNS subdomain (lowercase letters, digits, - and .)')),
  /** The CNI network name (the conflist `name`). */
  network: z._default(z.string().check(z.regex(/^[A-Za-z0-9][A-Za-z0-9_.-]*$/)), 'atoll'),
  /** Pod address blocks of this node, until the controller leases them. */
  podCidrs: z._default(z.array(cidr), []),
  cniBinDir: z._default(absPath, '/opt/cni/bin'),
  cniConfDir: z._default(absPath, '/etc/cni/net.d'),
  /** File name of Atoll's conflist in cniConfDir; it must sort first. */
  cniConfName: z._default(z.string().check(z.regex(/^[A-Za-z0-9_.-]+\.conflist$/)), '10-atoll.conflist'),
  /** cniVersion written into the conflist (containerd 1.6 accepts results up to 1.0.0). */
  cniVersion: z._default(z.enum(['0.3.1', '0.4.0', '1.0.0', '1.1.0']), '1.0.0'),
  /** Plugins chained after Atoll's in the conflist, as JSON objects (portmap, bandwidth, tuning...). */
  chainedPlugins: z._default(z.array(z.record(z.string(), z.unknown())), []),
  dataDir: z._default(absPath, '/var/lib/atoll'),
  socketPath: z._default(absPath, '/run/atoll/atoll.sock'),
  bridge: z._default(ifName, 'atoll0'),
  /** Pod and bridge MTU; by default the underlay's minus 50 with the overlay, else 1500. */
  mtu: z.optional(intIn(576, 9000)),
  /** How long a deleted pod's address stays reserved for it. */
  reservationTtl: z._default(duration, 24 * 3600 * 1000),
  /** How often reservations are expired and state reconciled. */
  resyncPeriod: z._default(duration, 60 * 1000),
  /** Path of the atoll-cni executable the agent installs into cniBinDir. */
  cniPluginSource: z.optional(absPath),
  /** The cloud controller; without it the node uses podCidrs only. */
  controller: z.optional(controllerSchema),
  site: z._default(label, ''),
  community: z._default(label, ''),
  /** This node's underlay addresses, as registered with the controller. */
  underlayAddresses: z._default(z.array(z.string().check(z.refine((s) => parseIpv4(s) !== undefined, { message: 'must be an IPv4 address' }))), []),
  /** The same-site overlay (VXLAN, or direct routes on one L2 segment); off when absent. */
  overlay: z.optional(z.strictObject({
    device: z._default(ifName, 'atoll.1'),
    vni: z._default(intIn(1, 16_777_215), 1),
    port: z._default(intIn(1, 65535), 8472),
    directRouting: z._default(z.enum(['never', 'auto']), 'never'),
    probePort: z._default(intIn(1, 65535), 8474),
  })),
  /**
   * The cross-site tunnel (TUN device and pinned TLS streams); off when absent. Edge nodes dial cloud nodes at their
   * first underlay address; cloud nodes listen on `port`. Edge nodes of one community reach each other through the
   * relay and hole-punch direct streams; edge <-> edge needs `relay`.
   */
  tunnel: z.optional(z.strictObject({
    port: z._default(intIn(1, 65535), 8475),
    device: z._default(ifName, 'atoll.tun'),
    role: z.enum(['cloud', 'edge']),
    relay: z.optional(z.strictObject({
      address: z.string().check(z.regex(/^[^\s:]+:\d{1,5}$/, 'must be host:port, as the relay listens'), z.refine((a) => {
        const port = Number(a.slice(a.lastIndexOf(':') + 1));
        return port >= 1 && port <= 65535;
      }, { message: 'port must be 1 to 65535' })),
      pin: pin('must be sha256:<64 hex digits>, as `atoll relay` prints it'),
    })),
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
    udp: z.prefault(z.union([z.literal(false), z.strictObject({
      port: z._default(intIn(1, 65535), 8477),
      underlayMtu: z._default(intIn(576, 65535), 1500),
      keepMs: z._default(intIn(0, 86_400_000), 60_000),
    })]), {}),
  })),
  /**
   * Enforce Kubernetes NetworkPolicy on this node's pods, as the controller serves it (it must follow Kubernetes);
   * kept on disk and enforced while the controller is away.
   */
  networkPolicy: z._default(z.boolean(), false),
  /**
   * The node's container runtime CRI socket (containerd: /run/containerd/containerd.sock). With networkPolicy, a pod
   * of this node that the kept view does not know (started while the controller was away) is classified from the
   * labels of its sandbox, asked once per new sandbox; without it, such a pod is selected by no policy until the
   * controller sends it.
   */
  criSocket: z.optional(absPath),
  /** Cluster pod ranges: pod traffic to them is never masqueraded (every known block is included anyway). */
  clusterCidrs: z._default(z.array(cidr), []),
  /** /healthz, /readyz and /metrics over HTTP; off when absent. */
  metrics: z.optional(metricsSchema(METRICS_PORTS.agent)),
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
