/**
 * The lab's spec from the command line: a JSON file (`--spec FILE`, strict schema) and size and condition flags on
 * top of it (or of the default spec). The only place the lab's raw input enters; the result is checked against
 * the core's limits and frozen.
 */
import * as z from 'zod/mini';
import { describeIssues, readJsonFile } from '../config/json-file.ts';
import { atollError } from '../core/errors.ts';
import { DEFAULT_LAB_SPEC, type EdgeSiteSpec, edgeSiteName, type LabSpec, labSpecProblems, type NatType } from './plan/spec.ts';

const natType = z.enum(['endpoint-independent', 'symmetric']);

const int = () => z.number().check(z.int());

export const labSpecSchema = z.strictObject({
  cloudNodes: z._default(int(), DEFAULT_LAB_SPEC.cloudNodes),
  edges: z._default(z.array(z.strictObject({
    name: z.string(),
    nodes: z._default(int(), 2),
    community: z._default(z.string(), ''),
    nat: z._default(natType, 'endpoint-independent'),
    uplink: z._default(z.strictObject({ delayMs: z.optional(int()), rateMbit: z.optional(int()) }), {}),
    udpBlocked: z.optional(z.boolean()),
  })), DEFAULT_LAB_SPEC.edges.map((e) => ({ ...e, uplink: { ...e.uplink } }))),
  podsPerNode: z._default(int(), DEFAULT_LAB_SPEC.podsPerNode),
  sameSite: z._default(z.enum(['vxlan', 'direct']), DEFAULT_LAB_SPEC.sameSite),
  tunnelUdp: z.optional(z.boolean()),
  metrics: z.optional(z.boolean()),
});

/** The lab flags as `node:util` parseArgs gives them (strings; repeatable ones as arrays). */
export interface LabFlags {
  readonly spec?: string;
  readonly 'cloud-nodes'?: string;
  readonly 'edge-sites'?: string;
  readonly 'nodes-per-site'?: string;
  readonly 'pods-per-node'?: string;
  readonly community?: readonly string[];
  readonly nat?: readonly string[];
  readonly delay?: readonly string[];
  readonly rate?: readonly string[];
  readonly 'same-site'?: string;
  readonly udp?: boolean;
  readonly 'no-udp'?: boolean;
  readonly 'no-metrics'?: boolean;
  readonly 'block-udp'?: readonly string[];
}

/** parseArgs options for {@link LabFlags}. */
export const LAB_FLAG_OPTIONS = {
  spec: { type: 'string' },
  'cloud-nodes': { type: 'string' },
  'edge-sites': { type: 'string' },
  'nodes-per-site': { type: 'string' },
  'pods-per-node': { type: 'string' },
  community: { type: 'string', multiple: true },
  nat: { type: 'string', multiple: true },
  delay: { type: 'string', multiple: true },
  rate: { type: 'string', multiple: true },
  'same-site': { type: 'string' },
  udp: { type: 'boolean' },
  'no-udp': { type: 'boolean' },
  'no-metrics': { type: 'boolean' },
  'block-udp': { type: 'string', multiple: true },
} as const;

export const LAB_FLAGS_HELP = `  --cloud-nodes N          nodes in the cloud site (default ${DEFAULT_LAB_SPEC.cloudNodes})
  --edge-sites N           edge sites a, b, c... behind NAT routers (default ${DEFAULT_LAB_SPEC.edges.length})
  --nodes-per-site N       nodes per edge site (default 2)
  --pods-per-node N        pods on every node (default ${DEFAULT_LAB_SPEC.podsPerNode})
  --community [SITE=]NAME  community of every edge site, or of one (default: all in "edge"; NAME empty for none)
  --nat [SITE=]TYPE        endpoint-independent (default) or symmetric
  --delay [SITE=]MS        one-way delay on edge uplinks, both directions (tc netem; without netem, the lab's
                           delay line), e.g. 20 or 20ms
  --rate [SITE=]MBIT       rate limit on edge uplinks (tc tbf), e.g. 100, 100mbit or 1gbit
  --same-site vxlan|direct how nodes of one site reach each other (default vxlan)
  --udp, --no-udp          the tunnel's datagram path on (the default, as the agents') or off (agents' tunnel.udp
                           false: TCP streams only)
  --no-metrics             the agents, the controller and the relay without their metrics listeners (for measuring
                           what metrics cost; not with --prometheus or --kubernetes)
  --block-udp SITE         the site's router drops UDP on its uplink (the datagram path falls back to TCP); repeatable
  --spec FILE              a JSON spec (docs/lab.md); the flags above change it
`;

function fail(message: string): never {
  throw atollError('LAB_SPEC_INVALID', message, 'see `atoll lab --help` for the flags and their ranges');
}

function count(flag: string, text: string | undefined): number | undefined {
  if (text === undefined) return undefined;
  if (!/^\d{1,6}$/.test(text)) fail(`--${flag} must be a whole number, not "${text}"`);
  return Number(text);
}

/** Splits `[SITE=]VALUE` flags into a value for every site and values per site. */
function perSite(flag: string, values: readonly string[] | undefined, sites: readonly string[]): { all?: string; bySite: Map<string, string> } {
  const bySite = new Map<string, string>();
  let all: string | undefined;
  for (const v of values ?? []) {
    const m = /^([a-z]{1,6})=(.*)$/.exec(v);
    if (m) {
      if (!sites.includes(m[1] as string)) fail(`--${flag} ${v}: there is no edge site "${m[1]}" (sites: ${sites.join(', ') || 'none'})`);
      bySite.set(m[1] as string, m[2] as string);
    } else {
      all = v;
    }
  }
  return { all, bySite };
}

function parseDelay(text: string): number {
  const m = /^(\d{1,5})(ms)?$/.exec(text);
  if (!m) fail(`--delay must be milliseconds such as 20 or 20ms, not "${text}"`);
  return Number(m[1]);
}

function parseRate(text: string): number {
  const m = /^(\d{1,6})(mbit|gbit)?$/.exec(text.toLowerCase());
  if (!m) fail(`--rate must be Mbit/s such as 100, 100mbit or 1gbit, not "${text}"`);
  return Number(m[1]) * (m[2] === 'gbit' ? 1000 : 1);
}

function readSpecFile(path: string): LabSpec {
  const res = labSpecSchema.safeParse(readJsonFile(path, 'the lab spec', 'LAB_SPEC_INVALID', '--spec'));
  if (!res.success) fail(`the lab spec ${path} is invalid: ${describeIssues(res.error)}`);
  return res.data as LabSpec;
}

/**
 * The spec the flags describe: the `--spec` file or the default, changed by the flags, checked and frozen.
 * @throws AtollError LAB_SPEC_INVALID naming the flag or value.
 */
export function labSpecFromFlags(flags: LabFlags): LabSpec {
  const base = flags.spec ? readSpecFile(flags.spec) : DEFAULT_LAB_SPEC;
  const sitesWanted = count('edge-sites', flags['edge-sites']);
  const perNode = count('nodes-per-site', flags['nodes-per-site']);
  let edges: EdgeSiteSpec[] = base.edges.map((e) => ({ ...e, uplink: { ...e.uplink } }));
  if (sitesWanted !== undefined) {
    if (sitesWanted > 26) fail(`--edge-sites must be at most 26, not ${sitesWanted}`);
    edges = Array.from({ length: sitesWanted }, (_, i) => edges[i] ?? { name: edgeSiteName(i), nodes: 2, community: 'edge', nat: 'endpoint-independent', uplink: {} });
  }
  if (perNode !== undefined) edges = edges.map((e) => ({ ...e, nodes: perNode }));
  const names = edges.map((e) => e.name);
  const apply = <T>(flag: string, values: readonly string[] | undefined, parse: (v: string) => T, set: (e: EdgeSiteSpec, v: T) => EdgeSiteSpec) => {
    const { all, bySite } = perSite(flag, values, names);
    edges = edges.map((e) => {
      const v = bySite.get(e.name) ?? all;
      return v === undefined ? e : set(e, parse(v));
    });
  };
  apply('community', flags.community, (v) => v, (e, community) => ({ ...e, community }));
  apply('nat', flags.nat, (v) => {
    const r = natType.safeParse(v);
    if (!r.success) fail(`--nat must be endpoint-independent or symmetric, not "${v}"`);
    return r.data as NatType;
  }, (e, nat) => ({ ...e, nat }));
  for (const site of flags['block-udp'] ?? []) {
    if (!names.includes(site)) fail(`--block-udp ${site}: there is no edge site "${site}" (sites: ${names.join(', ') || 'none'})`);
    edges = edges.map((e) => (e.name === site ? { ...e, udpBlocked: true } : e));
  }
  apply('delay', flags.delay, parseDelay, (e, delayMs) => ({ ...e, uplink: { ...e.uplink, delayMs } }));
  apply('rate', flags.rate, parseRate, (e, rateMbit) => ({ ...e, uplink: { ...e.uplink, rateMbit } }));
  const sameSite = flags['same-site'] ?? base.sameSite;
  if (sameSite !== 'vxlan' && sameSite !== 'direct') fail(`--same-site must be vxlan or direct, not "${sameSite}"`);
  const spec: LabSpec = {
    cloudNodes: count('cloud-nodes', flags['cloud-nodes']) ?? base.cloudNodes,
    edges: edges.map((e) => Object.freeze({ ...e, uplink: Object.freeze(e.uplink) })),
    podsPerNode: count('pods-per-node', flags['pods-per-node']) ?? base.podsPerNode,
    sameSite,
    ...(flags['no-udp'] || (base.tunnelUdp === false && !flags.udp) ? { tunnelUdp: false } : {}),
    ...(flags['no-metrics'] || base.metrics === false ? { metrics: false } : {}),
  };
  const problems = labSpecProblems(spec);
  if (problems.length > 0) fail(`the lab spec is impossible: ${problems.join('; ')}`);
  return Object.freeze({ ...spec, edges: Object.freeze(spec.edges) });
}

/** How the lab creates pods (`--pods`): containerd's CRI, direct CNI calls, or CRI when containerd is installed. */
export type LabPodsChoice = 'auto' | 'cri' | 'direct';

const LAB_PODS_CHOICES: readonly LabPodsChoice[] = ['auto', 'cri', 'direct'];

/** `--pods` as given (default `auto`). @throws AtollError LAB_SPEC_INVALID for another value. */
export function labPodsFromFlag(text: string | undefined): LabPodsChoice {
  if (text === undefined) return 'auto';
  if ((LAB_PODS_CHOICES as readonly string[]).includes(text)) return text as LabPodsChoice;
  return fail(`--pods must be ${LAB_PODS_CHOICES.join(', ')}, not "${text}"`);
}
