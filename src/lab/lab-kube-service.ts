/**
 * The lab's ClusterIP Services (`--kubernetes`), through the kube-proxy of every node: the Service check (one site's
 * pods behind a Service, tried from every pod and every node's namespace), and one pod put alone behind a Service of
 * its own (the crash-offline fault reaches it through it while its site is cut off).
 */
import { join } from 'node:path';
import { atollError } from '../core/errors.ts';
import { LAB_CRASH_LABEL, LAB_CRASH_SERVICE, LAB_SERVICE_LABEL, LAB_SERVICE_NAME, labCrashServiceObject, labServiceBackends, labServiceObject } from './plan/kubernetes.ts';
import type { TcpResult } from './plan/report.ts';
import { LAB_POD_NAMESPACE, type LabPlan } from './plan/plan.ts';
import { NETNS_DIR } from './io/processes.ts';
import { sleep } from '../adapters/timers.ts';
import type { LabPodInfo } from './lab-pods.ts';
import { PROBE_PORT, ProbeClient } from './probe.ts';
import type { LabKubernetes } from './lab-kube.ts';

/** How long a client keeps trying the Service (kube-proxy programs it within a sync period of creating it). */
const SERVICE_TIMEOUT_MS = 30_000;

/** One client's answer from the lab's Service. */
export interface ServiceProbe {
  /** A pod's name, or `node <name>`. */
  readonly from: string;
  readonly ok: boolean;
  readonly connectMs?: number;
  readonly error?: string;
}

/** The Service check: a ClusterIP in front of one site's pods, tried from every node and every pod. */
export interface ServiceCheck {
  readonly clusterIp: string;
  readonly port: number;
  readonly backends: readonly string[];
  readonly probes: readonly ServiceProbe[];
  readonly ok: boolean;
}

/**
 * Puts the pods of one site ({@link labServiceBackends}) behind a ClusterIP Service on the TCP probe's echo port and
 * connects to it from every pod and every node's namespace (through kube-proxy's rules there), each retried until
 * {@link SERVICE_TIMEOUT_MS}. The Service stays for later checks. Echo servers run in every pod while it checks.
 */
export async function checkService(lab: { plan: LabPlan; pods: readonly LabPodInfo[]; kube: LabKubernetes; tag: string }): Promise<ServiceCheck> {
  const { plan, pods, kube } = lab;
  // the lab's own pods (the workloads' join them for the faults, and only take part as clients)
  const backends = labServiceBackends(pods.filter((p) => plan.pods.some((q) => q.name === p.name)), plan.nodes);
  await kube.kubectl(['label', 'pod', '--overwrite', '-n', LAB_POD_NAMESPACE, ...backends.map((p) => p.name), `${LAB_SERVICE_LABEL}=${LAB_SERVICE_NAME}`]);
  await kube.kubectl(['apply', '-f', '-'], JSON.stringify(labServiceObject(PROBE_PORT)));
  const clusterIp = (await kube.kubectl(['get', 'service', '-n', LAB_POD_NAMESPACE, LAB_SERVICE_NAME, '-o', 'jsonpath={.spec.clusterIP}'])).trim();
  const clients = [
    ...pods.map((p) => ({ from: p.name, enter: p.enter })),
    ...plan.nodes.map((n) => ({ from: `node ${n.name}`, enter: ['nsenter', `--net=${join(NETNS_DIR, n.netns)}`, '--'] })),
  ];
  // echo servers in every pod; node clients listen too (on their namespace, unused)
  const probes = new Map(clients.map((c) => [c.from, new ProbeClient(c.enter, c.from, lab.tag)]));
  try {
    await Promise.all([...probes.values()].map((p) => p.ready()));
    const results = await Promise.all(clients.map(async (c): Promise<ServiceProbe> => {
      const deadline = Date.now() + SERVICE_TIMEOUT_MS;
      let r: TcpResult;
      do {
        r = await (probes.get(c.from) as ProbeClient).tcp(clusterIp, 2000);
        if (!r.ok) await sleep(500);
      } while (!r.ok && Date.now() < deadline);
      return { from: c.from, ok: r.ok, ...(r.connectMs === undefined ? {} : { connectMs: r.connectMs }), ...(r.error ? { error: r.error } : {}) };
    }));
    return { clusterIp, port: PROBE_PORT, backends: backends.map((p) => p.name), probes: results, ok: results.every((r) => r.ok) };
  } finally {
    await Promise.all([...probes.values()].map((p) => p.close()));
  }
}

/** How long after its EndpointSlice names the pod the nodes' kube-proxies are given to program a new Service (their sync period is 1 s). */
const KUBE_PROXY_SYNC_MS = 3000;

/**
 * Puts pod `name` alone behind ClusterIP Service {@link LAB_CRASH_SERVICE} (labelled {@link LAB_CRASH_LABEL}), waits
 * until its EndpointSlice has the pod's address and the kube-proxies had time to program it, and returns the ClusterIP.
 * @throws AtollError LAB_STEP_FAILED when no endpoint shows within 30 s.
 */
export async function exposePod(kube: LabKubernetes, name: string): Promise<string> {
  await kube.kubectl(['label', 'pod', '--overwrite', '-n', LAB_POD_NAMESPACE, name, `${LAB_CRASH_LABEL}=true`]);
  await kube.kubectl(['apply', '-f', '-'], JSON.stringify(labCrashServiceObject(PROBE_PORT)));
  const deadline = Date.now() + SERVICE_TIMEOUT_MS;
  const endpoints = () => kube.kubectl(['get', 'endpointslices', '-n', LAB_POD_NAMESPACE, '-l', `kubernetes.io/service-name=${LAB_CRASH_SERVICE}`, '-o', 'jsonpath={.items[*].endpoints[*].addresses[*]}'])
    .then((out) => out.trim(), () => '');
  while (!(await endpoints())) {
    if (Date.now() > deadline) throw atollError('LAB_STEP_FAILED', `Service ${LAB_CRASH_SERVICE} has no endpoint for pod ${name} after ${SERVICE_TIMEOUT_MS / 1000} s`, `kubectl get endpointslices -n ${LAB_POD_NAMESPACE}`);
    await sleep(250);
  }
  await sleep(KUBE_PROXY_SYNC_MS);
  return (await kube.kubectl(['get', 'service', '-n', LAB_POD_NAMESPACE, LAB_CRASH_SERVICE, '-o', 'jsonpath={.spec.clusterIP}'])).trim();
}
