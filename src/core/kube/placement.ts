/**
 * Where a Kubernetes Node sits in Atoll's network, from its labels and the Community objects: its role (edge or
 * cloud), its site and its community. Pure: the controller's Kubernetes adapter turns Node and Community objects into
 * these inputs; the core never sees a Kubernetes object.
 *
 * - Edge when `node-role.kubernetes.io/edge` is present (KubeEdge) or `openyurt.io/is-edge-worker` is "true"
 *   (OpenYurt); cloud otherwise.
 * - Site from `atoll.dev/site`, else `topology.kubernetes.io/zone`, else none ('').
 * - Community from `atoll.dev/community`, else from the one Community whose `spec.members` names the node (FabEdge's
 *   communities.fabedge.io shape), else none.
 */
import { type AtollError, atollError } from '../errors.ts';
import { compareText } from '../order.ts';

export const LABEL_SITE = 'atoll.dev/site';
export const LABEL_COMMUNITY = 'atoll.dev/community';
export const LABEL_ZONE = 'topology.kubernetes.io/zone';
export const LABEL_KUBEEDGE_EDGE = 'node-role.kubernetes.io/edge';
export const LABEL_OPENYURT_EDGE = 'openyurt.io/is-edge-worker';

/** Annotations the controller publishes on each Node (flannel's shape, under Atoll's domain). */
export const ANNOTATION_BACKEND_DATA = 'atoll.dev/backend-data';
export const ANNOTATION_PUBLIC_IP = 'atoll.dev/public-ip';
export const ANNOTATION_BLOCKS = 'atoll.dev/blocks';
export const ANNOTATION_TUNNEL_PIN = 'atoll.dev/tunnel-pin';
export const PUBLISHED_ANNOTATIONS = [ANNOTATION_BACKEND_DATA, ANNOTATION_PUBLIC_IP, ANNOTATION_BLOCKS, ANNOTATION_TUNNEL_PIN] as const;

export type NodeRole = 'edge' | 'cloud';

export interface Placement {
  readonly role: NodeRole;
  readonly site: string;
  readonly community: string;
}

/** A Community object as the core sees it. */
export interface CommunitySpec {
  readonly name: string;
  readonly members: readonly string[];
}

/** Which community each node is in through Community objects, and what is wrong with them. */
export interface CommunityIndex {
  readonly byNode: ReadonlyMap<string, string>;
  readonly problems: readonly AtollError[];
}

/** A label value Atoll accepts as a site or community name (a Kubernetes label value, non-empty). */
const NAME = /^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$/;

/**
 * Indexes the Community objects. A Community naming nodes that do not exist is reported (those names are ignored
 * until such a node appears); a node named by two Communities is in neither through them (reported), so nothing
 * changes for it until an operator resolves the overlap.
 */
export function indexCommunities(communities: readonly CommunitySpec[], nodes: ReadonlySet<string>): CommunityIndex {
  const claims = new Map<string, string[]>();
  const problems: AtollError[] = [];
  for (const c of [...communities].sort((a, b) => compareText(a.name, b.name))) {
    if (!NAME.test(c.name)) {
      problems.push(atollError('COMMUNITY_INVALID', `Community ${c.name}: the name is not a valid label value, so it cannot be a community`, 'rename it (letters, digits, - _ ., at most 63)'));
      continue;
    }
    const unknown = c.members.filter((m) => !nodes.has(m));
    if (unknown.length > 0) {
      problems.push(atollError('COMMUNITY_INVALID', `Community ${c.name} names nodes that do not exist: ${unknown.join(', ')}`, 'fix spec.members (they take effect once such nodes register)'));
    }
    for (const m of new Set(c.members)) claims.set(m, [...(claims.get(m) ?? []), c.name]);
  }
  const byNode = new Map<string, string>();
  for (const [node, names] of claims) {
    if (names.length === 1) byNode.set(node, names[0] as string);
    else problems.push(atollError('COMMUNITY_INVALID', `node ${node} is a member of ${names.length} Communities (${names.join(', ')}); a node is in one at most`, `remove ${node} from all but one Community's spec.members`));
  }
  return { byNode, problems };
}

/**
 * The placement of Node `name` from its labels and the community index.
 * @returns the placement, or an AtollError NODE_LABELS_INVALID naming the node and the label (the caller keeps the
 * node's last good placement).
 */
export function placementOf(name: string, labels: Readonly<Record<string, string>>, communities: CommunityIndex): Placement | AtollError {
  const bad = (label: string, why: string) => atollError('NODE_LABELS_INVALID', `Node ${name}: label ${label}=${JSON.stringify(labels[label])} ${why}`, `fix the label (kubectl label node ${name} ${label}=... --overwrite)`);
  const yurt = labels[LABEL_OPENYURT_EDGE];
  if (yurt !== undefined && yurt !== 'true' && yurt !== 'false') return bad(LABEL_OPENYURT_EDGE, 'must be "true" or "false"');
  const role: NodeRole = LABEL_KUBEEDGE_EDGE in labels || yurt === 'true' ? 'edge' : 'cloud';
  for (const label of [LABEL_SITE, LABEL_COMMUNITY]) {
    const v = labels[label];
    if (v !== undefined && !NAME.test(v)) return bad(label, 'must be a non-empty label value');
  }
  const site = labels[LABEL_SITE] ?? labels[LABEL_ZONE] ?? '';
  const fromLabel = labels[LABEL_COMMUNITY];
  const fromObject = communities.byNode.get(name);
  if (fromLabel !== undefined && fromObject !== undefined && fromLabel !== fromObject) {
    return bad(LABEL_COMMUNITY, `disagrees with Community ${fromObject}, which lists the node`);
  }
  return { role, site, community: fromLabel ?? fromObject ?? '' };
}

/** The annotations the controller publishes on a Node for a registered node (flannel's shape). */
export function publishedAnnotations(n: { vtepMac: string; observedAddress: string; addresses: readonly string[]; blocks: readonly string[]; tunnelPin: string }): Record<string, string> {
  const out: Record<string, string> = {
    [ANNOTATION_BACKEND_DATA]: JSON.stringify({ VtepMAC: n.vtepMac }),
    [ANNOTATION_BLOCKS]: n.blocks.join(','),
  };
  const ip = n.observedAddress || n.addresses[0];
  if (ip) out[ANNOTATION_PUBLIC_IP] = ip;
  if (n.tunnelPin) out[ANNOTATION_TUNNEL_PIN] = n.tunnelPin;
  return out;
}

/** The merge patch that brings `current` annotations to `desired` for the published keys, or undefined if in step. */
export function annotationPatch(current: Readonly<Record<string, string>>, desired: Readonly<Record<string, string>>): Record<string, string | null> | undefined {
  const patch: Record<string, string | null> = {};
  for (const k of PUBLISHED_ANNOTATIONS) {
    const want = desired[k];
    if (want === undefined && current[k] !== undefined) patch[k] = null;
    else if (want !== undefined && current[k] !== want) patch[k] = want;
  }
  return Object.keys(patch).length > 0 ? patch : undefined;
}
