/**
 * The controller's configuration file and the API's request bodies: validated once against strict schemas,
 * defaults filled in, frozen. `docs/configuration.md` documents every key.
 */
import * as z from 'zod/mini';
import { describeIssues, readJsonFile } from './json-file.ts';
import { atollError } from '../core/errors.ts';
import { METRICS_PORTS, metricsSchema } from './metrics.ts';
import { type Cidr, parseCidr, parseIpv4 } from '../core/net/ipv4.ts';

/** The controller's User-Agent towards the Kubernetes API by default (what an edge cache such as yurthub keys on). */
export const CONTROLLER_USER_AGENT = 'atoll-controller';

const cidr = z.string().check(z.refine((s) => parseCidr(s) !== undefined, { message: 'must be an IPv4 network such as 10.244.0.0/16 (no host bits)' }));
const SAFE_PATH = /^\/[A-Za-z0-9_./@:+-]*$/;
const safePath = z.string().check(z.regex(SAFE_PATH));
const secret = z.string().check(z.minLength(16, 'must be at least 16 characters'), z.regex(/^[A-Za-z0-9._~+/=-]+$/, 'must be URL-safe characters'));
const intIn = (min: number, max: number) => z.number().check(z.int(), z.gte(min), z.lte(max));
const intFrom = (min: number) => z.number().check(z.int(), z.gte(min));

const storeSchema = z.discriminatedUnion('type', [
  z.strictObject({ type: z.literal('embedded') }),
  z.strictObject({
    type: z.literal('etcd'),
    endpoints: z.array(z.url()).check(z.minLength(1)),
    prefix: z._default(z.string().check(z.regex(/^\/[A-Za-z0-9_./-]*\/$/, 'must start and end with /')), '/atoll/'),
    leaseTtlSeconds: z._default(intIn(2, 60), 5),
  }),
  z.strictObject({
    type: z.literal('kubernetes'),
    /** Where the Lease that elects the leader lives. */
    leaseNamespace: z._default(z.string().check(z.regex(/^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/, 'must be a namespace name')), 'atoll-system'),
    leaseName: z._default(z.string().check(z.regex(/^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/, 'must be an object name')), 'atoll-controller'),
    leaseDurationSeconds: z._default(intIn(2, 120), 15),
  }),
]);

/** The controller on Kubernetes: where the API is, and how Node objects drive the registry. */
export const kubernetesSchema = z.strictObject({
  /** A kubeconfig file; without it, the pod's service account (in-cluster). */
  kubeconfig: z.optional(safePath),
  /** The API endpoint to use instead (an edge cache such as yurthub); the credentials stay the kubeconfig's. */
  server: z.optional(z.url()),
  /** A deleted Node's registration and blocks are released this long after the deletion (unless it comes back). */
  nodeDeleteGraceSeconds: z._default(intIn(0, 7 * 86400), 60),
  /** Sent as User-Agent: list it in yurthub's cache_agents to have the edge cache serve it. */
  userAgent: z._default(z.string().check(z.minLength(1), z.maxLength(128)), CONTROLLER_USER_AGENT),
});

export const controllerConfigSchema = z.strictObject({
  /** Address and port the API listens on. */
  listenHost: z._default(z.string(), '0.0.0.0'),
  listenPort: z._default(intIn(1, 65535), 7443),
  /** The URL agents use for this replica (its host goes into the TLS certificate; followers point agents to it). */
  advertiseUrl: z.url(),
  /** Extra IPs or DNS names for the server certificate. */
  tlsHosts: z._default(z.array(z.string()), []),
  clusterCidrs: z.array(cidr).check(z.minLength(1)),
  /** Prefix length of each node block. */
  blockBits: z._default(intIn(16, 30), 26),
  maxBlocksPerNode: z._default(intIn(1, 256), 8),
  /** An agent reporting fewer free addresses than this is given another block. */
  refillBelow: z._default(intFrom(0), 16),
  dataDir: z._default(safePath, '/var/lib/atoll-controller'),
  /** The CA and server certificate; replicas must share one CA (copy this directory), default <dataDir>/pki. */
  pkiDir: z.optional(safePath),
  bootstrapTokens: z.array(secret).check(z.minLength(1)),
  adminToken: secret,
  /** Tokens relays (`atoll relay`) present to watch the nodes; a relay can do nothing else with them. */
  relayTokens: z._default(z.array(secret), []),
  store: z._default(storeSchema, { type: 'embedded' }),
  /** Follow Kubernetes Node objects (admission, labels, deletion, annotations); absent: nodes join with a token alone. */
  kubernetes: z.optional(kubernetesSchema),
  maxBodyBytes: z._default(intIn(1024, 1 << 20), 64 * 1024),
  /** A watcher that leaves more of its stream than this unread is dropped (it resumes when it reconnects). */
  watchBufferBytes: z._default(intIn(64 * 1024, 1 << 30), 64 << 20),
  /** /healthz, /readyz and /metrics over HTTP; off when absent. */
  metrics: z.optional(metricsSchema(METRICS_PORTS.controller)),
});

export type ControllerConfig = Readonly<z.output<typeof controllerConfigSchema>> & { readonly clusterBlocks: readonly Cidr[] };

export function parseControllerConfig(raw: unknown, source = 'controller configuration'): ControllerConfig {
  const res = controllerConfigSchema.safeParse(raw);
  if (!res.success) {
    const problems = describeIssues(res.error);
    throw atollError('CONFIG_FILE_INVALID', `${source} is invalid: ${problems}`, 'fix the keys named; docs/configuration.md lists them all');
  }
  if (res.data.clusterCidrs.some((c) => (parseCidr(c) as Cidr).bits > res.data.blockBits)) {
    throw atollError('CONFIG_FILE_INVALID', `${source}: a cluster CIDR is smaller than one /${res.data.blockBits} block`, 'use larger cluster CIDRs or a larger blockBits');
  }
  if (res.data.store.type === 'kubernetes' && !res.data.kubernetes) {
    throw atollError('CONFIG_FILE_INVALID', `${source}: store.type "kubernetes" needs the kubernetes section (kubeconfig, or {} in a pod)`, 'add "kubernetes": {} (in-cluster) or "kubernetes": {"kubeconfig": "/path"}');
  }
  return Object.freeze({ ...res.data, clusterBlocks: res.data.clusterCidrs.map((c) => parseCidr(c) as Cidr) });
}

export function loadControllerConfig(path: string): ControllerConfig {
  return parseControllerConfig(readJsonFile(path, 'the controller configuration', 'CONFIG_FILE_INVALID', '--config'), `the controller configuration ${path}`);
}

const NAME = /^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/;
const label = z.string().check(z.maxLength(63), z.regex(/^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$/, 'must be a Kubernetes label value'));
const ipv4 = z.string().check(z.refine((s) => parseIpv4(s) !== undefined, { message: 'must be an IPv4 address' }));
const mac = z.union([z.string().check(z.regex(/^([0-9a-f]{2}:){5}[0-9a-f]{2}$/, 'must be a lowercase MAC address')), z.literal('')]);
const upTo = (max: number) => z.string().check(z.maxLength(max));

/** The fields a node sets about itself. */
export const nodeFieldsSchema = z.strictObject({
  site: z._default(label, ''),
  community: z._default(label, ''),
  addresses: z._default(z.array(ipv4).check(z.maxLength(16)), []),
  vtepMac: z._default(mac, ''),
  /** The pin of the node's tunnel key (src/adapters/pki.ts `spkiPin`), or empty when it runs no tunnel. */
  tunnelKey: z._default(z.union([z.string().check(z.regex(/^sha256:[0-9a-f]{64}$/, 'must be sha256:<64 lowercase hex digits>, the pin of the node\'s tunnel key')), z.literal('')]), ''),
  agentVersion: z._default(upTo(64), ''),
  annotations: z._default(
    z.record(z.string().check(z.regex(/^([a-z0-9.-]{1,253}\/)?[A-Za-z0-9._-]{1,63}$/, 'must be a Kubernetes annotation key')), upTo(1024))
      .check(z.refine((a) => Object.keys(a).length <= 16, { message: 'at most 16 annotations' })),
    {},
  ),
});

export const joinRequestSchema = z.extend(nodeFieldsSchema, {
  token: upTo(256),
  name: z.string().check(z.regex(NAME, 'must be a DNS subdomain')),
  identity: z.string().check(z.maxLength(256), z.regex(/^[A-Za-z0-9+/=]+$/, 'must be base64')),
});

/** `POST /v1/policy/applied`: a node applied what came before mark `seq` of policy stream `stream`. */
export const policyAppliedSchema = z.strictObject({
  stream: z.string().check(z.minLength(1), z.maxLength(64)),
  seq: intFrom(0),
});

/** `POST /v1/nodes/:name/reusable`: addresses the node released, with the pod that held each. */
export const reusableRequestSchema = z.strictObject({
  addresses: z.array(z.strictObject({
    ip: z.string().check(z.minLength(7), z.maxLength(15)),
    namespace: z.string().check(z.minLength(1), z.maxLength(253)),
    name: z.string().check(z.minLength(1), z.maxLength(253)),
  })).check(z.maxLength(4096)),
});

export const usageReportSchema = z.strictObject({
  capacity: intFrom(0),
  allocated: intFrom(0),
  reserved: intFrom(0),
  free: intFrom(0),
});
