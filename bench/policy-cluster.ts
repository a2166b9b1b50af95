/**
 * The synthetic cluster the NetworkPolicy benchmarks share, the same in every run (seeded, bench/seeded.ts): 1,000
 * NetworkPolicies over 100 namespaces, 10 each, 10,000 remote pods on 100 other nodes and 110 pods on the node.
 * bench/policy.ts compiles and applies it, and runs iperf3 between two of the node's pods under it; bench/cni-latency.ts
 * `--policy` hands it to a real agent as its kept view and ADDs pods the cluster's policies select. Pure: no I/O.
 */
import { type Cidr, parseCidr } from '../src/core/net/ipv4.ts';
import { hostVethName } from '../src/core/plan/pod-plan.ts';
import type { PolicyInput } from '../src/core/policy/compile.ts';
import { keyOf, type LabelSelector, type NamedPort, type NetworkPolicy, type PolicyNamespace, type PolicyPod, type PolicyPort } from '../src/core/policy/model.ts';
import type { PodSource } from '../src/core/policy/nft.ts';
import type { NodePolicyView, ViewPod } from '../src/core/policy/scope.ts';
import { seeded } from './seeded.ts';

/** The synthetic cluster's seed: the same cluster, hence the same ruleset, every run. */
export const SEED = 35;
const NAMESPACES = 100;
const POLICIES_PER_NAMESPACE = 10;
const REMOTE_PODS = 10_000;
const LOCAL_PODS = 110;
/** Remote pods live on this many other nodes, a /24 each (10.200.1.0/24 on); the node's own block is 10.200.0.0/24. */
const REMOTE_NODES = 100;
export const NODE_BLOCK = '10.200.0.0/24';
export const NODE_GATEWAY = '10.200.0.1';
const CLIENT_IP = '10.200.0.10';
const SERVER_IP = '10.200.0.11';
/** The pod the change adds: a frontend pod in the server's namespace, named by rules in the server's chain. */
const EXTRA_POD_IP = '10.200.1.200';
export const IPERF_PORT = 5201;

type Random = () => number;
const pick = <T>(rng: Random, xs: readonly T[]): T => xs[Math.floor(rng() * xs.length)] as T;

const NAME_LABEL = 'kubernetes.io/metadata.name';
const APPS = ['web', 'gateway', 'api', 'worker', 'auth', 'search', 'billing', 'queue', 'db', 'cache'] as const;
type App = (typeof APPS)[number];
const BACKEND_APPS: readonly App[] = ['api', 'worker', 'auth', 'search', 'billing'];
const TIER: Record<App, string> = { web: 'frontend', gateway: 'frontend', api: 'backend', worker: 'backend', auth: 'backend', search: 'backend', billing: 'backend', queue: 'backend', db: 'data', cache: 'data' };
const TEAMS = 12;
const ENVS = ['prod', 'prod', 'staging', 'dev'] as const;

const nsName = (i: number): string => `ns-${String(i).padStart(3, '0')}`;
/** Special namespaces: cluster DNS, monitoring, and the throughput pair's (the client's has no team or env label). */
const DNS_NS = nsName(0);
const MONITORING_NS = nsName(1);
export const SERVER_NS = nsName(42);
export const CLIENT_NS = nsName(99);

const tcp = (port: number | string, endPort?: number): PolicyPort => ({ protocol: 'TCP', port, ...(endPort === undefined ? {} : { endPort }) });
const matchLabels = (labels: Record<string, string>): LabelSelector => ({ matchLabels: labels });

/** The named container ports an app's pods declare (every pod serves metrics). */
function portsOf(app: App | 'kube-dns' | 'prometheus'): NamedPort[] {
  const metrics: NamedPort = { name: 'metrics', protocol: 'TCP', port: 9090 };
  switch (app) {
    case 'kube-dns': return [{ name: 'dns', protocol: 'UDP', port: 53 }, { name: 'dns-tcp', protocol: 'TCP', port: 53 }, metrics];
    case 'prometheus': return [{ name: 'web', protocol: 'TCP', port: 9090 }];
    case 'web': case 'gateway': return [{ name: 'http', protocol: 'TCP', port: 8080 }, metrics];
    case 'api': case 'auth': case 'search': case 'billing': return [{ name: 'http', protocol: 'TCP', port: 8080 }, { name: 'grpc', protocol: 'TCP', port: 9000 }, metrics];
    case 'db': return [{ name: 'pg', protocol: 'TCP', port: 5432 }, metrics];
    case 'cache': return [{ name: 'redis', protocol: 'TCP', port: 6379 }, metrics];
    case 'queue': return [{ name: 'amqp', protocol: 'TCP', port: 5672 }, metrics];
    case 'worker': return [metrics];
  }
}

function namespaces(rng: Random): PolicyNamespace[] {
  return Array.from({ length: NAMESPACES }, (_, i) => {
    const name = nsName(i);
    if (name === CLIENT_NS) return { name, labels: { [NAME_LABEL]: name, purpose: 'bench-client' } };
    const labels: Record<string, string> = { [NAME_LABEL]: name, team: `team-${i % TEAMS}`, env: pick(rng, ENVS) };
    if (name === DNS_NS) labels.purpose = 'dns';
    if (name === MONITORING_NS) labels.purpose = 'monitoring';
    return { name, labels };
  });
}

/** A pod of namespace `ns`: cluster DNS in DNS_NS, Prometheus in MONITORING_NS, a random app elsewhere. */
function podOf(rng: Random, ns: string, name: string, ip: string): PolicyPod {
  if (ns === DNS_NS) return { namespace: ns, name: `coredns-${name}`, ip, labels: { 'k8s-app': 'kube-dns' }, ports: portsOf('kube-dns') };
  if (ns === MONITORING_NS) return { namespace: ns, name: `prometheus-${name}`, ip, labels: { app: 'prometheus' }, ports: portsOf('prometheus') };
  const app = pick(rng, APPS);
  return { namespace: ns, name: `${app}-${name}`, ip, labels: { app, tier: TIER[app] }, ports: portsOf(app) };
}

/** Pod k of the remote ones: on remote node 1 + k % 100, host 10 + k / 100 of that node's /24. */
function remotePods(rng: Random): PolicyPod[] {
  return Array.from({ length: REMOTE_PODS }, (_, k) => {
    const ns = nsName(Math.floor(rng() * NAMESPACES));
    return podOf(rng, ns, `r${k}`, `10.200.${1 + (k % REMOTE_NODES)}.${10 + Math.floor(k / REMOTE_NODES)}`);
  });
}

export interface LocalPod {
  readonly pod: PolicyPod;
  /** The host end of its veth, as the agent names it. */
  readonly veth: string;
}

const vethOf = (pod: PolicyPod): string => hostVethName(`bench-${pod.namespace}-${pod.name}`, 'eth0');

/** The node's pods: the throughput client and server first (fixed), then 108 random ones at 10.200.0.12 on. */
function localPods(rng: Random): LocalPod[] {
  const client: PolicyPod = { namespace: CLIENT_NS, name: 'iperf-client', ip: CLIENT_IP, labels: { app: 'gateway', tier: 'frontend', role: 'bench-client' }, ports: portsOf('gateway') };
  const server: PolicyPod = { namespace: SERVER_NS, name: 'iperf-server', ip: SERVER_IP, labels: { app: 'api', tier: 'backend', role: 'bench-server' }, ports: portsOf('api') };
  const rest = Array.from({ length: LOCAL_PODS - 2 }, (_, j) => {
    let ns = nsName(Math.floor(rng() * NAMESPACES));
    if (ns === CLIENT_NS) ns = nsName(2);
    return podOf(rng, ns, `l${j}`, `10.200.0.${12 + j}`);
  });
  return [client, server, ...rest].map((pod) => ({ pod, veth: vethOf(pod) }));
}

type Shape = Omit<NetworkPolicy, 'namespace' | 'name'>;
type Kind = 'default-deny-ingress' | 'default-deny-egress' | 'allow-same-namespace' | 'from-frontend' | 'db-from-backend' | 'from-team' | 'from-monitoring'
  | 'from-env' | 'from-external' | 'telemetry' | 'egress-dns' | 'egress-internet' | 'egress-to-team' | 'egress-to-db';

/**
 * The policy kinds, as clusters write them: default denies, same-namespace, pod and namespace selectors (labels and
 * expressions, alone and together), ipBlocks with except, numbered, ranged and named ports over TCP, UDP and SCTP,
 * and egress (DNS, the internet, another team's namespaces by a named port, the namespace's data tier). `app` and
 * `team` are the kind's free choices.
 */
function shapeOf(kind: Kind, app: App, team: string): Shape {
  const ingress = (podSelector: LabelSelector, rules: Shape['ingress']): Shape => ({ podSelector, policyTypes: ['Ingress'], ingress: rules, egress: [] });
  const egress = (podSelector: LabelSelector, rules: Shape['egress']): Shape => ({ podSelector, policyTypes: ['Egress'], ingress: [], egress: rules });
  switch (kind) {
    case 'default-deny-ingress': return ingress({}, []);
    case 'default-deny-egress': return egress({}, []);
    case 'allow-same-namespace': return ingress({}, [{ peers: [{ podSelector: {} }], ports: [] }]);
    case 'from-frontend': return ingress(matchLabels({ app }), [{ peers: [{ podSelector: matchLabels({ tier: 'frontend' }) }], ports: [tcp(8080), tcp('http')] }]);
    case 'db-from-backend':
      return ingress(matchLabels({ app: 'db' }), [{ peers: [{ podSelector: { matchExpressions: [{ key: 'tier', operator: 'In', values: ['backend'] }] } }], ports: [tcp('pg'), tcp(5432)] }]);
    case 'from-team':
      return ingress(matchLabels({ app }), [{ peers: [{ namespaceSelector: matchLabels({ team }), podSelector: matchLabels({ app: 'gateway' }) }], ports: [tcp(8000, 8999)] }]);
    case 'from-monitoring':
      return ingress({}, [{ peers: [{ namespaceSelector: matchLabels({ purpose: 'monitoring' }), podSelector: matchLabels({ app: 'prometheus' }) }], ports: [tcp('metrics')] }]);
    case 'from-env':
      return ingress({ matchExpressions: [{ key: 'app', operator: 'In', values: ['api', 'worker', 'search'] }] }, [{
        peers: [{ namespaceSelector: { matchExpressions: [{ key: 'env', operator: 'In', values: ['prod', 'staging'] }] }, podSelector: { matchExpressions: [{ key: 'tier', operator: 'NotIn', values: ['data'] }] } }],
        ports: [{ protocol: 'UDP', port: 5000, endPort: 5100 }, tcp('grpc')],
      }]);
    case 'from-external':
      return ingress(matchLabels({ tier: 'frontend' }), [{
        peers: [{ ipBlock: { cidr: '192.168.0.0/16', except: ['192.168.13.0/24', '192.168.200.0/22'] } }, { ipBlock: { cidr: '10.0.0.0/8', except: ['10.200.0.0/16'] } }],
        ports: [tcp(443), tcp(80)],
      }]);
    case 'telemetry':
      return ingress(matchLabels({ app: 'worker' }), [{ peers: [{ podSelector: matchLabels({ app: 'queue' }) }, { ipBlock: { cidr: '172.16.0.0/12', except: [] } }], ports: [{ protocol: 'SCTP', port: 9899 }, { protocol: 'UDP', port: 8125 }] }]);
    case 'egress-dns':
      return egress({}, [{ peers: [{ namespaceSelector: matchLabels({ purpose: 'dns' }), podSelector: matchLabels({ 'k8s-app': 'kube-dns' }) }], ports: [{ protocol: 'UDP', port: 53 }, tcp(53)] }]);
    case 'egress-internet':
      return egress(matchLabels({ tier: 'frontend' }), [{ peers: [{ ipBlock: { cidr: '0.0.0.0/0', except: ['10.0.0.0/8', '172.16.0.0/12', '192.168.0.0/16', '169.254.169.254/32'] } }], ports: [tcp(443)] }]);
    case 'egress-to-team':
      return {
        podSelector: matchLabels({ app }), policyTypes: ['Ingress', 'Egress'],
        ingress: [{ peers: [{ podSelector: matchLabels({ app: 'gateway' }) }], ports: [tcp('http')] }],
        egress: [{ peers: [{ namespaceSelector: matchLabels({ team }) }], ports: [tcp(8080), tcp('grpc')] }],
      };
    case 'egress-to-db':
      return egress(matchLabels({ tier: 'backend' }), [{ peers: [{ podSelector: matchLabels({ app: 'db' }) }], ports: [tcp('pg')] }, { peers: [{ podSelector: matchLabels({ app: 'cache' }) }], ports: [tcp(6379)] }]);
  }
}

/** How often each kind fills a namespace's free slots. */
const KIND_WEIGHTS: readonly (readonly [Kind, number])[] = [
  ['from-frontend', 3], ['from-team', 2], ['from-env', 2], ['db-from-backend', 1], ['from-monitoring', 1], ['from-external', 1], ['telemetry', 1],
  ['allow-same-namespace', 1], ['egress-dns', 1], ['egress-internet', 1], ['egress-to-team', 1], ['egress-to-db', 1],
];

/** The kinds with a free choice (an app, a team): a namespace may hold several of them; of the others at most one. */
const FREE_KINDS: ReadonlySet<Kind> = new Set(['from-frontend', 'from-team', 'egress-to-team']);

function weightedKind(rng: Random): Kind {
  const total = KIND_WEIGHTS.reduce((s, [, w]) => s + w, 0);
  let x = rng() * total;
  for (const [kind, w] of KIND_WEIGHTS) if ((x -= w) < 0) return kind;
  return KIND_WEIGHTS[0]?.[0] as Kind;
}

/** The server's last policy: lets the client in on the iperf3 port; its name sorts last in the namespace. */
export const SERVER_ALLOW: Omit<NetworkPolicy, 'namespace'> = {
  name: 'zz-allow-bench-client', podSelector: matchLabels({ role: 'bench-server' }), policyTypes: ['Ingress'], egress: [],
  ingress: [{ peers: [{ namespaceSelector: matchLabels({ purpose: 'bench-client' }), podSelector: matchLabels({ role: 'bench-client' }) }], ports: [tcp(IPERF_PORT)] }],
};
/** The client's last policy: lets it out to the server on the iperf3 port. */
export const CLIENT_ALLOW: Omit<NetworkPolicy, 'namespace'> = {
  name: 'zz-allow-to-bench-server', podSelector: matchLabels({ role: 'bench-client' }), policyTypes: ['Egress'], ingress: [],
  egress: [{ peers: [{ namespaceSelector: matchLabels({ [NAME_LABEL]: SERVER_NS }), podSelector: matchLabels({ role: 'bench-server' }) }], ports: [tcp(IPERF_PORT)] }],
};

/**
 * Ten policies a namespace. Most namespaces: a default deny for ingress (7 in 10), for egress (3 in 20), the rest
 * drawn by {@link KIND_WEIGHTS}. The server's namespace: five kinds that select the server (app api, tier backend),
 * three drawn, then SERVER_ALLOW. The client's: default denies both ways, egress kinds that select the client (app
 * gateway, tier frontend), then CLIENT_ALLOW.
 */
function policiesOf(rng: Random, ns: string): NetworkPolicy[] {
  const fixed: { kind: Kind; app?: App }[] = [];
  let last: Omit<NetworkPolicy, 'namespace'> | undefined;
  if (ns === SERVER_NS) {
    fixed.push({ kind: 'default-deny-ingress' }, { kind: 'allow-same-namespace' }, { kind: 'from-monitoring' }, { kind: 'from-frontend', app: 'api' }, { kind: 'from-env' }, { kind: 'from-team', app: 'api' });
    last = SERVER_ALLOW;
  } else if (ns === CLIENT_NS) {
    fixed.push({ kind: 'default-deny-ingress' }, { kind: 'default-deny-egress' }, { kind: 'egress-dns' }, { kind: 'egress-internet' }, { kind: 'egress-to-team', app: 'gateway' },
      { kind: 'allow-same-namespace' }, { kind: 'from-monitoring' }, { kind: 'from-external' });
    last = CLIENT_ALLOW;
  } else {
    if (rng() < 0.7) fixed.push({ kind: 'default-deny-ingress' });
    if (rng() < 0.15) fixed.push({ kind: 'default-deny-egress' });
  }
  const slots = POLICIES_PER_NAMESPACE - (last ? 1 : 0);
  while (fixed.length < slots) {
    const kind = weightedKind(rng);
    if (FREE_KINDS.has(kind) || !fixed.some((f) => f.kind === kind)) fixed.push({ kind }); // no namespace repeats a policy word for word
  }
  const out = fixed.map(({ kind, app }, j): NetworkPolicy => ({
    namespace: ns, name: `${kind}-${j}`, ...shapeOf(kind, app ?? pick(rng, BACKEND_APPS), `team-${Math.floor(rng() * TEAMS)}`),
  }));
  return last ? [...out, { namespace: ns, ...last }] : out;
}

export interface Cluster {
  /** What the node compiles: every policy, namespace and pod, and its own pods. */
  readonly input: PolicyInput;
  /** The same with one more remote pod (the change a rebuild answers). */
  readonly changed: PolicyInput;
  /** The rest of the renderer's input: the node's pods' veths and addresses, its block. */
  readonly node: { readonly sources: readonly PodSource[]; readonly localBlocks: readonly Cidr[] };
  readonly client: LocalPod;
  readonly server: LocalPod;
  readonly extra: PolicyPod;
}

export function synthesize(seed: number): Cluster {
  const rng = seeded(seed);
  const nss = namespaces(rng);
  const policies = nss.flatMap((n) => policiesOf(rng, n.name));
  const remote = remotePods(rng);
  const local = localPods(rng);
  const pods = [...local.map((l) => l.pod), ...remote];
  const extra: PolicyPod = { namespace: SERVER_NS, name: 'web-extra', ip: EXTRA_POD_IP, labels: { app: 'web', tier: 'frontend' }, ports: portsOf('web') };
  const localKeys = new Set(local.map((l) => keyOf(l.pod)));
  return {
    input: { policies, namespaces: nss, pods, local: localKeys },
    changed: { policies, namespaces: nss, pods: [...pods, extra], local: localKeys },
    node: { sources: local.map((l) => ({ port: l.veth, ip: l.pod.ip })), localBlocks: [parseCidr(NODE_BLOCK) as Cidr] },
    client: local[0] as LocalPod,
    server: local[1] as LocalPod,
    extra,
  };
}

// ---------------------------------------------------------------------------------------------------------------
// The cluster as one agent's kept view (bench/cni-latency.ts --policy)

/** Where the pods a latency bench ADDs live: the throughput server's namespace. */
export const ADDED_POD_NAMESPACE = SERVER_NS;
/** Their labels: an api backend, which 8 of that namespace's 10 policies select (isolated for ingress and egress). */
export const ADDED_POD_LABELS: Readonly<Record<string, string>> = { app: 'api', tier: 'backend' };

/** The node a remote pod runs on, by its /24 (10.200.N.0/24 is `remote-N`). */
const remoteNodeOf = (ip: string): string => `remote-${ip.split('.')[2] ?? '?'}`;

/**
 * The cluster as node `node`'s view (what src/agent/policy.ts keeps in `policy-view.json`): every policy and
 * namespace, the remote pods on their nodes, the cluster's 110 local pods on `node`, and one pod on `node` for each
 * name of `added` in {@link ADDED_POD_NAMESPACE} with {@link ADDED_POD_LABELS} and no address: the agent takes a pod's
 * address from its own IPAM record once the pod is ADDed (as for its pods while the controller is away), so each such
 * pod is isolated from its ADD to its DEL and compiled into nothing before or after. Each list sorted by key.
 */
export function nodePolicyView(c: Cluster, node: string, added: readonly string[]): NodePolicyView {
  const byKey = <T extends { namespace: string; name: string }>(a: T, b: T) => (keyOf(a) < keyOf(b) ? -1 : keyOf(a) > keyOf(b) ? 1 : 0);
  const pods: ViewPod[] = c.input.pods.map((p) => ({ ...p, node: c.input.local.has(keyOf(p)) ? node : remoteNodeOf(p.ip) }));
  for (const name of added) pods.push({ namespace: ADDED_POD_NAMESPACE, name, node, ip: '', labels: { ...ADDED_POD_LABELS }, ports: portsOf('api') });
  return {
    policies: [...c.input.policies].sort(byKey),
    namespaces: [...c.input.namespaces].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0)),
    pods: pods.sort(byKey),
  };
}
