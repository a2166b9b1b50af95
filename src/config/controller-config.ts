/**
 * The controller's configuration file and the API's request bodies: validated once against strict schemas,
 * defaults filled in, frozen. `docs/configuration.md` documents every key.
 */
import { z } from 'zod';
import { describeIssues, readJsonFile } from './json-file.ts';
import { atollError } from '../core/errors.ts';
import { METRICS_PORTS, metricsSchema } from './metrics.ts';
import { type Cidr, parseCidr, parseIpv4 } from '../core/net/ipv4.ts';

const cidr = z.string().refine((s) => parseCidr(s) !== undefined, { message: 'must be an IPv4 network such as 10.244.0.0/16 (no host bits)' });
const SAFE_PATH = /^\/[A-Za-z0-9_./@:+-]*$/;
const secret = z.string().min(16, 'must be at least 16 characters').regex(/^[A-Za-z0-9._~+/=-]+$/, 'must be URL-safe characters');

const storeSchema = z.discriminatedUnion('type', [
  z.strictObject({ type: z.literal('embedded') }),
  z.strictObject({
    type: z.literal('etcd'),
    endpoints: z.array(z.url()).min(1),
    prefix: z.string().regex(/^\/[A-Za-z0-9_./-]*\/$/, 'must start and end with /').default('/atoll/'),
    leaseTtlSeconds: z.number().int().min(2).max(60).default(5),
  }),
  z.strictObject({
    type: z.literal('kubernetes'),
    /** Where the Lease that elects the leader lives. */
    leaseNamespace: z.string().regex(/^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/, 'must be a namespace name').default('atoll-system'),
    leaseName: z.string().regex(/^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/, 'must be an object name').default('atoll-controller'),
    leaseDurationSeconds: z.number().int().min(2).max(120).default(15),
  }),
]);

/** The controller on Kubernetes: where the API is, and how Node objects drive the registry. */
export const kubernetesSchema = z.strictObject({
  /** A kubeconfig file; without it, the pod's service account (in-cluster). */
  kubeconfig: z.string().regex(SAFE_PATH).optional(),
  /** The API endpoint to use instead (an edge cache such as yurthub); the credentials stay the kubeconfig's. */
  server: z.url().optional(),
  /** A deleted Node's registration and blocks are released this long after the deletion (unless it comes back). */
  nodeDeleteGraceSeconds: z.number().int().min(0).max(7 * 86400).default(60),
  /** Sent as User-Agent: list it in yurthub's cache_agents to have the edge cache serve it. */
  userAgent: z.string().min(1).max(128).default('atoll-controller'),
});

export const controllerConfigSchema = z.strictObject({
  /** Address and port the API listens on. */
  listenHost: z.string().default('0.0.0.0'),
  listenPort: z.number().int().min(1).max(65535).default(7443),
  /** The URL agents use for this replica (its host goes into the TLS certificate; followers point agents to it). */
  advertiseUrl: z.url(),
  /** Extra IPs or DNS names for the server certificate. */
  tlsHosts: z.array(z.string()).default([]),
  clusterCidrs: z.array(cidr).min(1),
  /** Prefix length of each node block. */
  blockBits: z.number().int().min(16).max(30).default(26),
  maxBlocksPerNode: z.number().int().min(1).max(256).default(8),
  /** An agent reporting fewer free addresses than this is given another block. */
  refillBelow: z.number().int().min(0).default(16),
  dataDir: z.string().regex(SAFE_PATH).default('/var/lib/atoll-controller'),
  /** The CA and server certificate; replicas must share one CA (copy this directory), default <dataDir>/pki. */
  pkiDir: z.string().regex(SAFE_PATH).optional(),
  bootstrapTokens: z.array(secret).min(1),
  adminToken: secret,
  /** Tokens relays (`atoll relay`) present to watch the nodes; a relay can do nothing else with them. */
  relayTokens: z.array(secret).default([]),
  store: storeSchema.default({ type: 'embedded' }),
  /** Follow Kubernetes Node objects (admission, labels, deletion, annotations); absent: nodes join with a token alone. */
  kubernetes: kubernetesSchema.optional(),
  maxBodyBytes: z.number().int().min(1024).max(1 << 20).default(64 * 1024),
  /** /healthz, /readyz and /metrics over HTTP; off when absent. */
  metrics: metricsSchema(METRICS_PORTS.controller).optional(),
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
const label = z.string().max(63).regex(/^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$/, 'must be a Kubernetes label value');
const ipv4 = z.string().refine((s) => parseIpv4(s) !== undefined, { message: 'must be an IPv4 address' });
const mac = z.string().regex(/^([0-9a-f]{2}:){5}[0-9a-f]{2}$/, 'must be a lowercase MAC address').or(z.literal(''));

/** The fields a node sets about itself. */
export const nodeFieldsSchema = z.strictObject({
  site: label.default(''),
  community: label.default(''),
  addresses: z.array(ipv4).max(16).default([]),
  vtepMac: mac.default(''),
  tunnelKey: z.string().max(512).default(''),
  agentVersion: z.string().max(64).default(''),
  annotations: z.record(z.string().regex(/^([a-z0-9.-]{1,253}\/)?[A-Za-z0-9._-]{1,63}$/, 'must be a Kubernetes annotation key'), z.string().max(1024))
    .refine((a) => Object.keys(a).length <= 16, { message: 'at most 16 annotations' })
    .default({}),
});

export const joinRequestSchema = nodeFieldsSchema.extend({
  token: z.string().max(256),
  name: z.string().regex(NAME, 'must be a DNS subdomain'),
  identity: z.string().max(256).regex(/^[A-Za-z0-9+/=]+$/, 'must be base64'),
});

export const usageReportSchema = z.strictObject({
  capacity: z.number().int().min(0),
  allocated: z.number().int().min(0),
  reserved: z.number().int().min(0),
  free: z.number().int().min(0),
});
