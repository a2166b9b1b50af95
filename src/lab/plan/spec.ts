/**
 * What `atoll lab` builds, as data: a cloud site with public addresses and edge sites behind NAT routers, their
 * sizes and conditions. Pure. `src/lab/lab-spec.ts` turns flags or a JSON file into a {@link LabSpec};
 * `./plan.ts` turns a spec into namespaces, links, addresses, rules and agent configurations.
 */

/**
 * How an edge site's router translates addresses.
 * - `endpoint-independent`: Linux masquerade keeps a flow's source port when it can, so one inside address and port
 *   map to one outside port whatever the destination: hole punching works.
 * - `symmetric`: masquerade with `fully-random`: every flow gets a random outside port, so a peer cannot predict it
 *   and traffic between two such sites must go through the relay.
 */
export type NatType = 'endpoint-independent' | 'symmetric';

/** How nodes of one site reach each other: the agent's `overlay.directRouting` `never` (VXLAN) or `auto`. */
export type SameSitePath = 'vxlan' | 'direct';

/** Conditions on an edge site's uplink, applied in both directions (so a delay adds twice to a round trip). */
export interface UplinkConditions {
  /** One-way delay in milliseconds (tc netem). */
  readonly delayMs?: number;
  /** Rate limit in Mbit/s (tc tbf). */
  readonly rateMbit?: number;
}

export interface EdgeSiteSpec {
  /** Site label, also the start of its node names: lowercase letters, at most 6. */
  readonly name: string;
  readonly nodes: number;
  /** Community label; edges sharing a non-empty one may tunnel to each other directly. */
  readonly community: string;
  readonly nat: NatType;
  readonly uplink: UplinkConditions;
  /** Whether the site's router drops UDP to and from its uplink (a network that blocks UDP): the tunnel's datagram path then falls back to its streams. */
  readonly udpBlocked?: boolean;
}

export interface LabSpec {
  /** Nodes of the cloud site (public addresses, next to the controller). */
  readonly cloudNodes: number;
  readonly edges: readonly EdgeSiteSpec[];
  readonly podsPerNode: number;
  readonly sameSite: SameSitePath;
  /** Whether the agents' tunnels use the datagram path (`tunnel.udp`): on unless false ({@link labUsesUdp}). */
  readonly tunnelUdp?: boolean;
  /**
   * `false`: the agents, the controller and the relay run without their metrics listeners (no `metrics` in their
   * configurations; the monitoring network stays, unused). Absent or `true`: they listen on the monitoring network.
   */
  readonly metrics?: boolean;
}

/** Bounds that keep addresses inside their /24s, names inside 15 characters and the check matrix tractable. */
export const LAB_LIMITS = {
  cloudNodes: 200,
  edgeSites: 26,
  nodesPerSite: 200,
  podsPerNode: 50,
  /** The matrix has pods x (pods - 1) cells. */
  pods: 400,
  delayMs: 10_000,
  rateMbit: 100_000,
} as const;

export const CLOUD_SITE = 'cloud';
const SITE_NAME = /^[a-z]{1,6}$/;
const LABEL = /^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$/;

/** The default lab of the README: a cloud with 2 nodes, edge sites a and b with 2 nodes each, one community. */
export const DEFAULT_LAB_SPEC: LabSpec = Object.freeze({
  cloudNodes: 2,
  edges: Object.freeze([
    Object.freeze({ name: 'a', nodes: 2, community: 'edge', nat: 'endpoint-independent', uplink: Object.freeze({}) }),
    Object.freeze({ name: 'b', nodes: 2, community: 'edge', nat: 'endpoint-independent', uplink: Object.freeze({}) }),
  ]),
  podsPerNode: 2,
  sameSite: 'vxlan',
});

/** Whether the lab's agents use the tunnel's datagram path: as the agents' default, unless the spec turns it off. */
export function labUsesUdp(spec: Pick<LabSpec, 'tunnelUdp'>): boolean {
  return spec.tunnelUdp !== false;
}

/** Edge site names by position: a, b, ... z. */
export function edgeSiteName(index: number): string {
  return String.fromCharCode(97 + index);
}

const intIn = (v: number, min: number, max: number) => Number.isInteger(v) && v >= min && v <= max;

/** Everything wrong with `spec`, one sentence each naming the value; empty when it is usable. */
export function labSpecProblems(spec: LabSpec): string[] {
  const problems: string[] = [];
  if (!intIn(spec.cloudNodes, 1, LAB_LIMITS.cloudNodes)) problems.push(`cloud nodes must be 1 to ${LAB_LIMITS.cloudNodes}, not ${spec.cloudNodes} (the controller's site needs a node)`);
  if (spec.edges.length > LAB_LIMITS.edgeSites) problems.push(`at most ${LAB_LIMITS.edgeSites} edge sites, not ${spec.edges.length}`);
  if (!intIn(spec.podsPerNode, 1, LAB_LIMITS.podsPerNode)) problems.push(`pods per node must be 1 to ${LAB_LIMITS.podsPerNode}, not ${spec.podsPerNode}`);
  const seen = new Set<string>();
  for (const e of spec.edges) {
    if (!SITE_NAME.test(e.name) || e.name === CLOUD_SITE) problems.push(`edge site name "${e.name}" must be 1 to 6 lowercase letters and not "${CLOUD_SITE}"`);
    if (seen.has(e.name)) problems.push(`edge site "${e.name}" appears twice`);
    seen.add(e.name);
    if (!intIn(e.nodes, 1, LAB_LIMITS.nodesPerSite)) problems.push(`edge site ${e.name}: nodes must be 1 to ${LAB_LIMITS.nodesPerSite}, not ${e.nodes}`);
    if (!LABEL.test(e.community)) problems.push(`edge site ${e.name}: community "${e.community}" must be a Kubernetes label value`);
    if (e.uplink.delayMs !== undefined && !intIn(e.uplink.delayMs, 0, LAB_LIMITS.delayMs)) problems.push(`edge site ${e.name}: delay must be 0 to ${LAB_LIMITS.delayMs} ms, not ${e.uplink.delayMs}`);
    if (e.uplink.rateMbit !== undefined && !intIn(e.uplink.rateMbit, 1, LAB_LIMITS.rateMbit)) problems.push(`edge site ${e.name}: rate must be 1 to ${LAB_LIMITS.rateMbit} Mbit/s, not ${e.uplink.rateMbit}`);
  }
  const pods = (spec.cloudNodes + spec.edges.reduce((n, e) => n + e.nodes, 0)) * spec.podsPerNode;
  if (pods > LAB_LIMITS.pods) problems.push(`${pods} pods in all is more than ${LAB_LIMITS.pods}: the check matrix would have ${pods * (pods - 1)} cells`);
  return problems;
}

/** One line describing the spec, for the terminal. */
export function describeLabSpec(spec: LabSpec): string {
  const conditions = (u: UplinkConditions) => [u.delayMs !== undefined ? `delay ${u.delayMs} ms` : '', u.rateMbit !== undefined ? `rate ${u.rateMbit} Mbit/s` : ''].filter(Boolean);
  const edges = spec.edges.map((e) => {
    const extra = [`NAT ${e.nat}`, e.community ? `community ${e.community}` : 'no community', ...conditions(e.uplink), ...(e.udpBlocked ? ['UDP blocked'] : [])];
    return `edge ${e.name} ${e.nodes} node${e.nodes === 1 ? '' : 's'} (${extra.join(', ')})`;
  });
  return [`cloud ${spec.cloudNodes} node${spec.cloudNodes === 1 ? '' : 's'}`, ...edges, `${spec.podsPerNode} pod${spec.podsPerNode === 1 ? '' : 's'} per node`, `same-site ${spec.sameSite === 'vxlan' ? 'VXLAN' : 'direct routes'}`,
    ...(labUsesUdp(spec) ? [] : ['tunnel datagram path off (streams only)']), ...(spec.metrics === false ? ['metrics listeners off'] : [])].join('; ');
}
