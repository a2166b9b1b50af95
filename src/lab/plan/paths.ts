/**
 * What the lab's checks expect of each pod pair, pure: the path a packet should take by the topology and community
 * rules ({@link LabPath}), what that means for ping and TCP, and the route the source node's kernel and agent should
 * show for it ({@link ObservedRoute}, classified from `ip -j route get`).
 */
import { CLOUD_SITE } from './spec.ts';
import { type LabNode, type LabPlan, NODE_DEVICES } from './plan.ts';

/** The path a packet from a pod on `from` to a pod on `to` should take, by the topology and community rules. */
export type LabPath = 'same node' | 'vxlan' | 'direct route' | 'tunnel direct' | 'tunnel hole-punched' | 'tunnel relayed' | 'not allowed';

/** What the check expects of a path: every path but 'not allowed' must carry ping and TCP. */
export type LabExpectation = 'reachable' | 'blocked';

export function expectationOf(path: LabPath): LabExpectation {
  return path === 'not allowed' ? 'blocked' : 'reachable';
}

/**
 * The expected path between two nodes of `plan`. Same node, then same site (VXLAN or direct routes, by the spec);
 * across sites the tunnel: direct when one end is in the cloud (public addresses: the edge dials out, any NAT
 * passes), hole-punched when both edges share a community behind endpoint-independent NATs, relayed when a
 * symmetric NAT is on the way; edges without a common community are not allowed to talk.
 */
export function expectedPath(plan: LabPlan, from: string, to: string): LabPath {
  if (from === to) return 'same node';
  const a = plan.nodes.find((n) => n.name === from);
  const b = plan.nodes.find((n) => n.name === to);
  // cannot happen: callers pass names of the plan's nodes, or of the nodes its pods run on
  if (!a || !b) throw new Error(`unknown lab node ${a ? to : from}`);
  if (a.site === b.site) return plan.spec.sameSite === 'direct' ? 'direct route' : 'vxlan';
  if (a.site === CLOUD_SITE || b.site === CLOUD_SITE) return 'tunnel direct';
  if (a.community === '' || a.community !== b.community) return 'not allowed';
  const natOf = (site: string) => plan.spec.edges.find((e) => e.name === site)?.nat;
  return natOf(a.site) === 'symmetric' || natOf(b.site) === 'symmetric' ? 'tunnel relayed' : 'tunnel hole-punched';
}

/**
 * Where the source node sends a packet for a pod address: as `ip route get` reports it, and for the tunnel device
 * how the agent carries it to that peer now (`atoll peers`: a direct stream, or through the relay).
 */
export type ObservedRoute = 'same node' | 'vxlan' | 'direct route' | 'tunnel' | 'tunnel relayed' | 'tunnel down' | 'default route' | 'no route';

/** Classifies `ip -j route get <pod ip>` run in `node`'s namespace. */
export function classifyRoute(node: Pick<LabNode, 'gateway'>, route: { readonly dev?: string; readonly gateway?: string; readonly type?: string } | undefined): ObservedRoute {
  if (!route?.dev || (route.type !== undefined && route.type !== 'unicast')) return 'no route';
  if (route.dev === NODE_DEVICES.bridge) return 'same node';
  if (route.dev === NODE_DEVICES.overlay) return 'vxlan';
  if (route.dev === NODE_DEVICES.tunnel) return 'tunnel';
  if (route.dev === NODE_DEVICES.underlay && route.gateway && route.gateway !== node.gateway) return 'direct route';
  return 'default route';
}

/** The route a path needs at the source node; undefined for pairs that are not allowed (no route is right). */
export function routeFor(path: LabPath): ObservedRoute | undefined {
  if (path === 'same node' || path === 'vxlan' || path === 'direct route' || path === 'tunnel relayed') return path;
  if (path === 'tunnel direct' || path === 'tunnel hole-punched') return 'tunnel';
  return undefined;
}
