/**
 * Kubernetes NetworkPolicy, Namespace and Pod objects turned into the policy model (src/core/policy/model.ts). Pure:
 * the controller's adapter hands in the JSON it read; the core never sees a Kubernetes object past this file.
 *
 * The API server validates NetworkPolicies, so a part this file cannot read means a newer API or a broken object.
 * Each such part is reported (POLICY_UNSUPPORTED, with the policy and the part) and replaced by what closes more,
 * never by what opens more: a peer or port that cannot be read is dropped, and a rule left with none of its peers or
 * ports is dropped (an empty list would mean "all"); a policy selector that cannot be read selects every pod of the
 * namespace.
 */
import { type AtollError, atollError } from '../errors.ts';
import type { LabelRequirement, LabelSelector, NamedPort, NetworkPolicy, PolicyNamespace, PolicyPeer, PolicyPod, PolicyPort, PolicyProtocol, PolicyRule } from '../policy/model.ts';

type Json = Record<string, unknown>;

const isObject = (v: unknown): v is Json => typeof v === 'object' && v !== null && !Array.isArray(v);
const PROTOCOLS: readonly string[] = ['TCP', 'UDP', 'SCTP'];
const OPERATORS: readonly string[] = ['In', 'NotIn', 'Exists', 'DoesNotExist'];

function stringMap(v: unknown): Record<string, string> | undefined {
  if (v === undefined || v === null) return {};
  if (!isObject(v)) return undefined;
  const out: Record<string, string> = {};
  for (const [k, val] of Object.entries(v)) {
    if (typeof val !== 'string') return undefined;
    out[k] = val;
  }
  return out;
}

/** A label selector, or a reason it cannot be read. */
function selectorOf(v: unknown): LabelSelector | string {
  if (v === undefined || v === null) return {};
  if (!isObject(v)) return 'is not an object';
  const matchLabels = stringMap(v.matchLabels);
  if (!matchLabels) return 'has matchLabels that are not strings';
  const exprs: LabelRequirement[] = [];
  for (const e of Array.isArray(v.matchExpressions) ? v.matchExpressions : v.matchExpressions === undefined ? [] : [null]) {
    if (!isObject(e) || typeof e.key !== 'string' || typeof e.operator !== 'string' || !OPERATORS.includes(e.operator)) return `has a matchExpression ${JSON.stringify(e)} with no key or an operator other than ${OPERATORS.join(', ')}`;
    const values = e.values === undefined || e.values === null ? [] : e.values;
    if (!Array.isArray(values) || values.some((x) => typeof x !== 'string')) return `has a matchExpression on ${e.key} whose values are not strings`;
    exprs.push({ key: e.key, operator: e.operator as LabelRequirement['operator'], values: values as string[] });
  }
  return { ...(Object.keys(matchLabels).length > 0 ? { matchLabels } : {}), ...(exprs.length > 0 ? { matchExpressions: exprs } : {}) };
}

export interface ConvertedPolicy {
  readonly policy: NetworkPolicy;
  /** POLICY_UNSUPPORTED errors, one per part replaced by what closes more. */
  readonly problems: readonly AtollError[];
}

/** A NetworkPolicy object in the model; undefined when it has no namespace or name (nothing to enforce it on). */
export function policyFromKube(obj: unknown): ConvertedPolicy | undefined {
  if (!isObject(obj) || !isObject(obj.metadata)) return undefined;
  const { namespace, name } = obj.metadata;
  if (typeof namespace !== 'string' || typeof name !== 'string') return undefined;
  const where = `NetworkPolicy ${namespace}/${name}`;
  const problems: AtollError[] = [];
  const problem = (part: string, what: string, instead: string) =>
    problems.push(atollError('POLICY_UNSUPPORTED', `${where}: ${part} ${what}; ${instead}`, 'fix the policy (kubectl get networkpolicy -o yaml); until then Atoll enforces it more strictly than written', undefined, { policy: `${namespace}/${name}`, part }));
  const spec = isObject(obj.spec) ? obj.spec : {};

  let podSelector = selectorOf(spec.podSelector);
  if (typeof podSelector === 'string') {
    problem('spec.podSelector', podSelector, 'it selects every pod of the namespace');
    podSelector = {};
  }

  const rules = (list: unknown, dir: 'ingress' | 'egress'): PolicyRule[] => {
    if (list === undefined || list === null) return [];
    if (!Array.isArray(list)) {
      problem(`spec.${dir}`, 'is not a list', 'no rule of it allows anything');
      return [];
    }
    const out: PolicyRule[] = [];
    list.forEach((r: unknown, i) => {
      const at = `spec.${dir}[${i}]`;
      if (!isObject(r)) {
        problem(at, 'is not an object', 'it allows nothing');
        return;
      }
      const peerList = r[dir === 'ingress' ? 'from' : 'to'];
      const peersIn = peerList === undefined || peerList === null ? [] : Array.isArray(peerList) ? peerList : [null];
      const peers: PolicyPeer[] = [];
      peersIn.forEach((p: unknown, j) => {
        const peer = peerOf(p);
        if (typeof peer === 'string') problem(`${at}.${dir === 'ingress' ? 'from' : 'to'}[${j}]`, peer, 'that peer matches nothing');
        else peers.push(peer);
      });
      const portsIn = r.ports === undefined || r.ports === null ? [] : Array.isArray(r.ports) ? r.ports : [null];
      const ports: PolicyPort[] = [];
      portsIn.forEach((p: unknown, j) => {
        const port = portOf(p);
        if (typeof port === 'string') problem(`${at}.ports[${j}]`, port, 'that port matches nothing');
        else ports.push(port);
      });
      if ((peersIn.length > 0 && peers.length === 0) || (portsIn.length > 0 && ports.length === 0)) return;
      out.push({ peers, ports });
    });
    return out;
  };
  const ingress = rules(spec.ingress, 'ingress');
  const egress = rules(spec.egress, 'egress');

  let policyTypes: ('Ingress' | 'Egress')[];
  if (Array.isArray(spec.policyTypes) && spec.policyTypes.length > 0) {
    policyTypes = spec.policyTypes.filter((t): t is 'Ingress' | 'Egress' => t === 'Ingress' || t === 'Egress');
    if (policyTypes.length !== spec.policyTypes.length) {
      problem('spec.policyTypes', `holds ${JSON.stringify(spec.policyTypes)}, not only Ingress and Egress`, 'it isolates both directions');
      policyTypes = ['Ingress', 'Egress'];
    }
  } else {
    // the API's documented default: Ingress always, Egress when the policy has egress rules
    policyTypes = Array.isArray(spec.egress) && spec.egress.length > 0 ? ['Ingress', 'Egress'] : ['Ingress'];
  }
  return { policy: { namespace, name, podSelector, policyTypes, ingress, egress }, problems };
}

function peerOf(p: unknown): PolicyPeer | string {
  if (!isObject(p)) return 'is not an object';
  if (p.ipBlock !== undefined && p.ipBlock !== null) {
    if (!isObject(p.ipBlock) || typeof p.ipBlock.cidr !== 'string') return 'has an ipBlock with no cidr';
    const except = p.ipBlock.except ?? [];
    if (!Array.isArray(except) || except.some((e) => typeof e !== 'string')) return 'has an ipBlock except that is not a list of prefixes';
    return { ipBlock: { cidr: p.ipBlock.cidr, except: except as string[] } };
  }
  const hasPods = p.podSelector !== undefined && p.podSelector !== null;
  const hasNamespaces = p.namespaceSelector !== undefined && p.namespaceSelector !== null;
  if (!hasPods && !hasNamespaces) return 'names neither pods, namespaces nor an ipBlock';
  const podSelector = hasPods ? selectorOf(p.podSelector) : undefined;
  if (typeof podSelector === 'string') return `has a podSelector that ${podSelector}`;
  const namespaceSelector = hasNamespaces ? selectorOf(p.namespaceSelector) : undefined;
  if (typeof namespaceSelector === 'string') return `has a namespaceSelector that ${namespaceSelector}`;
  return { ...(podSelector ? { podSelector } : {}), ...(namespaceSelector ? { namespaceSelector } : {}) };
}

function portOf(raw: unknown): PolicyPort | string {
  if (!isObject(raw)) return 'is not an object';
  // a numeric string is how some clients write a numbered port (intstr)
  const p: Json = typeof raw.port === 'string' && /^[0-9]+$/.test(raw.port) ? { ...raw, port: Number(raw.port) } : raw;
  const protocol = p.protocol === undefined || p.protocol === null ? 'TCP' : p.protocol;
  if (typeof protocol !== 'string' || !PROTOCOLS.includes(protocol)) return `has protocol ${JSON.stringify(protocol)}, not TCP, UDP or SCTP`;
  const proto = protocol as PolicyProtocol;
  if (p.port === undefined || p.port === null) return { protocol: proto };
  const port = p.port;
  if (typeof port === 'string') return port.length > 0 && port.length <= 15 ? { protocol: proto, port } : `has port name ${JSON.stringify(port)}, not a name of 1 to 15 characters`;
  if (typeof port !== 'number' || !Number.isInteger(port) || port < 1 || port > 65535) return `has port ${JSON.stringify(port)}, not 1 to 65535`;
  if (p.endPort === undefined || p.endPort === null) return { protocol: proto, port };
  if (typeof p.endPort !== 'number' || !Number.isInteger(p.endPort) || p.endPort < port || p.endPort > 65535) return `has endPort ${JSON.stringify(p.endPort)}, not ${port} to 65535`;
  return { protocol: proto, port, endPort: p.endPort };
}

export function namespaceFromKube(obj: unknown): PolicyNamespace | undefined {
  if (!isObject(obj) || !isObject(obj.metadata) || typeof obj.metadata.name !== 'string') return undefined;
  return { name: obj.metadata.name, labels: stringMap(obj.metadata.labels) ?? {} };
}

/** A pod as policy sees it, and the node it runs on; undefined for pods that hold no cluster address. */
export function podFromKube(obj: unknown): { pod: PolicyPod; node: string } | undefined {
  if (!isObject(obj) || !isObject(obj.metadata) || !isObject(obj.spec) || !isObject(obj.status)) return undefined;
  const { namespace, name } = obj.metadata;
  if (typeof namespace !== 'string' || typeof name !== 'string' || typeof obj.spec.nodeName !== 'string') return undefined;
  if (obj.spec.hostNetwork === true || obj.status.phase === 'Succeeded' || obj.status.phase === 'Failed') return undefined;
  const ip = typeof obj.status.podIP === 'string' && /^\d+\.\d+\.\d+\.\d+$/.test(obj.status.podIP) ? obj.status.podIP : undefined;
  if (!ip) return undefined;
  const ports: NamedPort[] = [];
  for (const c of Array.isArray(obj.spec.containers) ? obj.spec.containers : []) {
    for (const p of isObject(c) && Array.isArray(c.ports) ? c.ports : []) {
      if (!isObject(p) || typeof p.name !== 'string' || typeof p.containerPort !== 'number') continue;
      const protocol = p.protocol === undefined ? 'TCP' : p.protocol;
      if (typeof protocol === 'string' && PROTOCOLS.includes(protocol)) ports.push({ name: p.name, protocol: protocol as PolicyProtocol, port: p.containerPort });
    }
  }
  return { pod: { namespace, name, ip, labels: stringMap(obj.metadata.labels) ?? {}, ports }, node: obj.spec.nodeName };
}

/** The fields of a Namespace {@link namespaceFromKube} reads (what a controller's cache keeps), and its version. */
export function keepNamespace<T extends { metadata: { name: string; labels?: Readonly<Record<string, string>>; resourceVersion?: string } }>(o: T): T {
  const { name, labels, resourceVersion } = o.metadata;
  return { metadata: { name, labels, resourceVersion } } as T;
}

/** The fields of a Pod {@link podFromKube} reads (what a controller's cache keeps of every pod), and its version. */
export function keepPod<T extends { metadata: { name: string } }>(o: T): T {
  const { name, namespace, labels, resourceVersion } = o.metadata as Json;
  const spec = isObject((o as unknown as Json).spec) ? (o as unknown as Json).spec as Json : {};
  const status = isObject((o as unknown as Json).status) ? (o as unknown as Json).status as Json : {};
  const containers = Array.isArray(spec.containers) ? spec.containers.map((c) => ({ ports: isObject(c) ? c.ports : undefined })) : [];
  return { metadata: { name, namespace, labels, resourceVersion }, spec: { nodeName: spec.nodeName, hostNetwork: spec.hostNetwork, containers }, status: { podIP: status.podIP, phase: status.phase } } as unknown as T;
}
