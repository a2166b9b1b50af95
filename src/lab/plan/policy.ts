/**
 * The lab's NetworkPolicy run (`atoll lab run --kubernetes --policy`) as data: the labels of the lab's pods, the
 * policies the lab applies, and their truth table, written here by hand from the policies' text (not computed with
 * Atoll's own compiler, which it checks). Pure.
 *
 * Every lab pod is labelled with its site (`atoll.dev/lab-site`) and a role (`atoll.dev/lab-role`): the first pod
 * of each node is `web`, the others `db`. The policies, in the lab's pod namespace:
 * - `db-from-web` (ingress): the db pods of the cloud and of every edge site but the last accept only web pods, from
 *   any site: pairs are denied at the destination within a site (VXLAN; on one node with 3 pods or more per node),
 *   into the cloud from the edges and out to the edges over the tunnel, and between edge sites (hole-punched, or
 *   relayed behind a symmetric NAT);
 * - `edge-web-egress` (egress): the web pods of the first edge site send only to pods of the namespace outside the
 *   cloud: every pair from them to the cloud is denied at the source, pairs to the edge sites stay allowed.
 * No ingress policy selects the pods of the last edge site, the Service's endpoints (the lab's Service check reaches
 * them from every pod and node as before), and no policy selects the workloads' pods (no lab labels; as sources
 * they are no web pods). The policies need an edge site.
 */
import { CLOUD_SITE, type LabSpec } from './spec.ts';

export const LAB_SITE_LABEL = 'atoll.dev/lab-site';
export const LAB_ROLE_LABEL = 'atoll.dev/lab-role';

/** The names of the lab's policies. */
export const LAB_POLICY_NAMES: readonly string[] = ['db-from-web', 'edge-web-egress'];

/** Where the policies apply: the sites whose db pods are guarded, and the edge site whose web pods' egress is limited. */
export interface LabPolicySites {
  readonly guarded: readonly string[];
  readonly egressSite: string;
}

/** The sites of {@link LabPolicySites} for `spec`; undefined without an edge site. */
export function labPolicySites(spec: Pick<LabSpec, 'edges'>): LabPolicySites | undefined {
  const first = spec.edges[0];
  if (!first) return undefined;
  return { guarded: [CLOUD_SITE, ...spec.edges.slice(0, -1).map((e) => e.name)], egressSite: first.name };
}

/** The policy labels of lab pod number `index` (1-based, as in its name `<node>-p<index>`) on a node of `site`. */
export function labPolicyLabels(site: string, index: number): Record<string, string> {
  return { [LAB_SITE_LABEL]: site, [LAB_ROLE_LABEL]: index === 1 ? 'web' : 'db' };
}

/** The NetworkPolicy objects the lab applies in `namespace`. */
export function labPolicyObjects(namespace: string, sites: LabPolicySites): Record<string, unknown>[] {
  const meta = (name: string) => ({ name, namespace, labels: { 'app.kubernetes.io/part-of': 'atoll-lab' } });
  return [
    {
      apiVersion: 'networking.k8s.io/v1', kind: 'NetworkPolicy', metadata: meta(LAB_POLICY_NAMES[0] as string),
      spec: {
        podSelector: { matchLabels: { [LAB_ROLE_LABEL]: 'db' }, matchExpressions: [{ key: LAB_SITE_LABEL, operator: 'In', values: [...sites.guarded] }] },
        policyTypes: ['Ingress'],
        ingress: [{ from: [{ podSelector: { matchLabels: { [LAB_ROLE_LABEL]: 'web' } } }] }],
      },
    },
    {
      apiVersion: 'networking.k8s.io/v1', kind: 'NetworkPolicy', metadata: meta(LAB_POLICY_NAMES[1] as string),
      spec: {
        podSelector: { matchLabels: { [LAB_SITE_LABEL]: sites.egressSite, [LAB_ROLE_LABEL]: 'web' } },
        policyTypes: ['Egress'],
        egress: [{ to: [{ podSelector: { matchExpressions: [{ key: LAB_SITE_LABEL, operator: 'NotIn', values: [CLOUD_SITE] }] } }] }],
      },
    },
  ];
}

/** Whether a pod labelled `labels` is isolated by one of the lab's policies (so its node's agent has chains for it). */
export function labPodIsolated(labels: Readonly<Record<string, string>>, sites: LabPolicySites): boolean {
  const site = labels[LAB_SITE_LABEL] ?? '';
  return (sites.guarded.includes(site) && labels[LAB_ROLE_LABEL] === 'db') || (site === sites.egressSite && labels[LAB_ROLE_LABEL] === 'web');
}

/**
 * The truth table: the name of the policy that denies a packet from a pod labelled `from` to one labelled `to`
 * (both in the lab's namespace; a pod without lab labels passes `{}`), or undefined when the policies allow it.
 * Whether the topology lets the pair talk at all is the path's business (src/lab/plan/paths.ts), not this.
 */
export function labPolicyDenies(from: Readonly<Record<string, string>>, to: Readonly<Record<string, string>>, sites: LabPolicySites): string | undefined {
  if (from[LAB_SITE_LABEL] === sites.egressSite && from[LAB_ROLE_LABEL] === 'web' && to[LAB_SITE_LABEL] === CLOUD_SITE) return LAB_POLICY_NAMES[1];
  if (sites.guarded.includes(to[LAB_SITE_LABEL] ?? '') && to[LAB_ROLE_LABEL] === 'db' && from[LAB_ROLE_LABEL] !== 'web') return LAB_POLICY_NAMES[0];
  return undefined;
}
