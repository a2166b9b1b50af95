/**
 * `atoll lab up | run | down`: parses flags, wires src/lab (lab.ts builds the lab, lab-checks.ts checks it, faults.ts
 * runs the faults, lab-down.ts removes it), prints the terminal report and writes the JSON one and the picture.
 * (`atoll lab probe` is the lab's own helper inside each pod.)
 */
import { existsSync, writeFileSync } from 'node:fs';
import { LAB_FLAG_OPTIONS, LAB_FLAGS_HELP, type LabFlags, labPodsFromFlag, labSpecFromFlags } from '../lab/lab-spec.ts';
import { LAB_RUN_ID } from '../lab/plan/plan.ts';
import { parseFaultList } from '../lab/plan/faults.ts';
import { type LabFaultResult, renderFaults } from '../lab/plan/fault-results.ts';
import { atollError } from '../core/errors.ts';
import { type LabCell, renderFailures, renderMatrix, renderSummary, summarize, verdictOf } from '../lab/plan/report.ts';
import { kubernetesLine } from '../lab/plan/kubernetes.ts';
import { labSvgInputOf, renderLabSvg } from '../lab/plan/svg.ts';
import { parseCommand, subcommand, UsageError } from './usage.ts';
import type { LabTraceCheck } from '../lab/lab-checks.ts';
import type { LabPrometheusReport } from '../lab/prometheus.ts';
import type { KubernetesView } from '../lab/lab-kube.ts';
import type { ServiceCheck } from '../lab/lab-kube-service.ts';

export const LAB_USAGE = `usage: atoll lab <command> [flags]

  up [flags] [--detach] [--json FILE] [--svg FILE] [--keep-logs DIR] [--pods cri|direct|auto] [--kubernetes]
     [--policy] [--openyurt] [--image FILE]...
                 build the lab: namespaces, NAT routers, the controller, the relay, an agent per node, pods
                 (root); stays up until Ctrl-C, or with --detach until \`atoll lab down\`
  run [flags] [--json FILE] [--svg FILE] [--keep-logs DIR] [--faults LIST|all|none] [--pods cri|direct|auto]
      [--prometheus] [--kubernetes] [--policy] [--openyurt] [--image FILE]...
                 up, then the connectivity matrix (every pod to every pod, ping and TCP, path and RTT),
                 \`atoll trace\` of every cell against the path measured, then the faults (default all:
                 controller-kill, relay-kill, direct-path-cut, agent-restart, offline-restart, pod-recreate,
                 uplink-cut, uplink-flap, node-reboot; with --udp also the first edge site cut off from the cloud
                 while its agents restart in turn (offline-restart-all), its NAT reboots (nat-reboot-offline)
                 or its agents' clocks jump 8 days (clock-jump, under libfaketime), and both edge sites take new
                 public addresses (readdress-offline)), each with loss, convergence, TCP flows
                 held across it and the matrix before and after, the report, down. Exit 0 only if every
                 allowed cell works over its path and no forbidden one does, before and after every fault
  down [RUNID] [--all]
                 remove a run; without RUNID every run whose lab process is gone or detached, and lab
                 namespaces without a state file; --all also live runs

--json FILE writes the report as JSON (spec, nodes, pods and their IPs, timings; for run every cell, the summary,
the verdict and the faults).
--svg FILE draws the lab as SVG: sites, NAT routers, nodes, pods, and for run the path of every node pair
(VXLAN, direct route, tunnel direct, hole-punched, relayed) with failures in red; for up the topology only.
--keep-logs DIR copies the controller's, relay's, agents', containerds' and kubelets' (and their pods') logs there
                before the run is removed (run, or a failed up), and after each fault that fails into DIR/after-FAULT
                (a later fault may replace the pods whose logs tell why).
--prometheus    after the matrix, a real Prometheus (Debian's prometheus package, run by the lab in the
                controller's namespace) scrapes every agent, the controller and the relay over the lab's monitoring
                network; its PromQL answers are checked against the lab (targets, nodes, blocks, peers per path),
                every query of deploy/grafana/atoll.json must name a scraped metric, and the relay is killed (relayed
                peers must show down) and restarted (they must come back)
--pods          how pods are created: cri (a private containerd per node, RunPodSandbox through its CRI, which
                calls the node's atoll-cni), direct (the lab calls atoll-cni itself), auto (default: cri when
                containerd, runc and busybox-static are installed, else direct); the report says which was used.
--kubernetes    also a real Kubernetes v1.34 (sh scripts/k8s.sh all): etcd, kube-apiserver (192.0.2.2:6443),
                kube-controller-manager and kube-scheduler in the controller's namespace, a kubelet (beside the
                node's containerd, registered as a Node with its site labels) and a kube-proxy on every node; the
                pods are Pods bound to their nodes, their IPs read from the API; Atoll itself is installed as users
                install it (make image's image imported on every node, \`atoll kubernetes secret\`, the chart
                rendered with the lab's values and applied: agents, controller and relay are its pods). run also
                checks a ClusterIP Service from every pod and node (after the matrix and every fault), starts a
                Deployment and a StatefulSet with a pod per node and checks the matrix between their pods, and
                adds the faults through Kubernetes: statefulset-recreate, crash-offline (a pod's sandbox killed
                while its site is cut off), policy-offline (with --policy: a policy deleted while the first edge
                site is cut off), agent-roll (the DaemonSets rolled to image tag <version>-b, built with
                \`node scripts/image.ts --tag <version>-b\`), node-delete (the last node of the first edge site
                switched off and \`kubectl delete node\`: its blocks released); controller-kill, relay-kill, agent-restart
                and offline-restart kill the chart's container (SIGKILL in the node's containerd; its kubelet starts it
                again; offline-restart scales the controller to 0 meanwhile), offline-restart-all the site's agent
                containers; clock-jump and node-reboot are skipped. Needs containerd and \`make image\`.
--policy        with --kubernetes: the chart's agents enforce NetworkPolicy (its value networkPolicy.enabled), and
                once the pods run the lab applies two policies (docs/lab.md): the db pods of the cloud and of every
                edge site but the last accept only web pods, the first edge site's web pods send only to pods
                outside the cloud; needs an edge site; the matrix (and every
                fault's) expects the pairs they deny to be blocked, through every path; run's faults sample
                pairs they allow, and those that restart agents ping pairs they deny too: none may answer
--openyurt      with --kubernetes: every edge node's kubelet and kube-proxy reach the API through that node's own
                OpenYurt yurthub v1.7 (built by sh scripts/k8s.sh all; edge working mode, its node pool the node's
                site, certificates from a CA of the lab the apiserver trusts; the NodePool CRD, yurthub's RBAC and
                its yurt-hub-cfg ConfigMap from OpenYurt's own charts, cache_agents naming atoll-controller)
--image FILE    with --kubernetes: also import this docker-archive image into every node's containerd (repeat for
                more), for workloads of your own; the apiserver reaches the cloud nodes' kubelets (\`kubectl exec\`,
                \`logs\`), not the edge ones behind their NAT

flags for up and run:
${LAB_FLAGS_HELP}`;

const say = (line: string) => process.stdout.write(`${line}\n`);

function writeJson(path: string | undefined, report: unknown): void {
  if (!path) return;
  writeFileSync(path, JSON.stringify(report, null, 2) + '\n');
  say(`  report written to ${path}`);
}

function writeSvg(path: string | undefined, svg: () => string): void {
  if (!path) return;
  writeFileSync(path, svg());
  say(`  picture written to ${path}`);
}

async function up(argv: readonly string[], mode: 'up' | 'run'): Promise<number> {
  const { values } = parseCommand(argv, { command: `atoll lab ${mode}`, usage: LAB_USAGE, options: { ...LAB_FLAG_OPTIONS, json: { type: 'string' }, svg: { type: 'string' }, 'keep-logs': { type: 'string' }, faults: { type: 'string' }, pods: { type: 'string' }, kubernetes: { type: 'boolean', default: false }, policy: { type: 'boolean', default: false }, openyurt: { type: 'boolean', default: false }, image: { type: 'string', multiple: true }, detach: { type: 'boolean', default: false }, prometheus: { type: 'boolean', default: false } } });
  const spec = labSpecFromFlags(values as LabFlags);
  const pods = labPodsFromFlag(values.pods);
  const faultList = parseFaultList(values.faults ?? (mode === 'run' ? 'all' : 'none'), { kubernetes: values.kubernetes });
  if (faultList.problems.length > 0) throw atollError('LAB_SPEC_INVALID', `--faults: ${faultList.problems.join('; ')}`, 'see `atoll lab --help`');
  if (mode === 'up' && faultList.faults.length > 0) throw atollError('LAB_SPEC_INVALID', '--faults is for `atoll lab run`', 'use `atoll lab run --faults ...`');
  if (mode === 'up' && values.prometheus) throw atollError('LAB_SPEC_INVALID', '--prometheus is for `atoll lab run`', 'use `atoll lab run --prometheus`');
  if (values.kubernetes && faultList.faults.includes('agent-roll')) {
    const { atollImageTarball } = await import('../lab/lab-kube-install.ts');
    const { ATOLL_ROLL_TAG } = await import('../lab/lab-kube-faults.ts');
    if (!existsSync(atollImageTarball(ATOLL_ROLL_TAG))) {
      throw atollError('LAB_PREREQUISITE_MISSING', `the agent-roll fault rolls the agents to ${atollImageTarball(ATOLL_ROLL_TAG)}, which is not built`, `node_modules/.bin/node scripts/image.ts --tag ${ATOLL_ROLL_TAG}, or leave agent-roll out of --faults`);
    }
  }
  if (values.kubernetes && values.prometheus) {
    throw atollError('LAB_SPEC_INVALID', '--prometheus scrapes the lab\'s own processes on its monitoring network; with --kubernetes the chart\'s pods listen on the nodes\' addresses', 'drop one of --prometheus and --kubernetes');
  }
  if (spec.metrics === false && values.prometheus) {
    throw atollError('LAB_SPEC_INVALID', '--no-metrics leaves out the metrics listeners --prometheus scrapes', 'drop one of --no-metrics and --prometheus');
  }
  if (spec.metrics === false && values.kubernetes) {
    throw atollError('LAB_SPEC_INVALID', '--no-metrics: with --kubernetes the chart\'s values decide the metrics listeners, not the lab\'s configurations', 'drop --no-metrics with --kubernetes');
  }
  const images = values.image ?? [];
  if (!values.kubernetes && (values.policy || values.openyurt || images.length > 0)) {
    throw atollError('LAB_SPEC_INVALID', `${values.policy ? '--policy' : values.openyurt ? '--openyurt' : '--image'} is for the Kubernetes lab: the chart's agents enforce NetworkPolicy, yurthub fronts kubelets, and images are imported for them`, 'add --kubernetes');
  }
  if (values.openyurt && spec.edges.length === 0) {
    throw atollError('LAB_SPEC_INVALID', '--openyurt puts a yurthub in front of every edge node\'s kubelet, and the lab has no edge site', 'drop --edge-sites 0, or --openyurt');
  }
  if (values.policy && spec.edges.length === 0) {
    throw atollError('LAB_SPEC_INVALID', '--policy applies the lab\'s NetworkPolicies, one of which restricts the first edge site\'s pods, and the lab has no edge site', 'drop --edge-sites 0, or --policy');
  }
  for (const image of images) {
    if (!existsSync(image)) throw atollError('LAB_PREREQUISITE_MISSING', `--image ${image}: no such file`, 'give the path of a docker-archive tarball (e.g. build/netpol/agnhost.tar, which scripts/netpol-e2e.ts packs)');
  }
  if (values.kubernetes && spec.sameSite === 'direct') {
    throw atollError('LAB_SPEC_INVALID', '--same-site direct: the chart installs the same-site overlay with its default (VXLAN); it has no value for direct routes', 'drop --same-site direct with --kubernetes');
  }
  const lab = await import('../lab/lab.ts');
  const { destroyRun, installCleanupHandlers, LabRuns } = await import('../lab/lab-down.ts');
  const { checkWorkloads, runChecks, traceCells } = await import('../lab/lab-checks.ts');
  const { saveLogs } = await import('../lab/running-lab.ts');
  const runs = new LabRuns();
  const uninstall = installCleanupHandlers(runs);
  const t0 = performance.now();
  const keepLogs = values['keep-logs'];
  const running = await lab.labUp(spec, { say, keepLogs, pods, runs, kubernetes: values.kubernetes, networkPolicy: values.policy, openyurt: values.openyurt, images, fakeClocks: faultList.faults.includes('clock-jump') });
  const describe = {
    runId: running.plan.runId, prefix: running.plan.prefix, spec, podCreation: running.podCreation, startedAt: running.state.startedAt,
    uplinkDelayBy: running.plan.delayBy,
    // installed through the chart (--kubernetes), the controller runs where its Deployment put it
    ...(running.atollInstall
      ? { atoll: running.atollInstall }
      : { controller: { url: running.plan.controller.url, netns: running.plan.controller.netns, caCertHash: running.caCertHash } }),
    nodes: running.plan.nodes.map((n) => ({ name: n.name, site: n.site, community: n.community, netns: n.netns, underlay: n.underlay, agentSocket: n.socketPath })),
    pods: running.pods, namespaces: running.state.namespaces, processes: running.state.processes, containerds: running.state.containerds ?? [], timingsMs: { ...running.timingsMs } as Record<string, number>,
    // with the command line that runs kubectl as the cluster's admin (its namespace and kubeconfig), for tools that drive the lab's cluster
    kubernetes: undefined as (KubernetesView & { kubectl: readonly string[] }) | undefined,
  };
  if (running.kubernetes) {
    const { kubernetesView } = await import('../lab/lab-kube.ts');
    const view = await kubernetesView(running.kubernetes);
    describe.kubernetes = { ...view, kubectl: running.kubernetes.kubectlCommand };
    say(`  kubernetes nodes (${view.server}):`);
    for (const n of view.nodes) say(`    ${n.name.padEnd(14)} ${(n.ready ? 'Ready' : 'NotReady').padEnd(9)} ${(n.internalIp ?? '').padEnd(15)} ${n.kubeletVersion ?? ''} ${Object.entries(n.labels).map(([k, v]) => `${k}=${v}`).join(',')}`);
    if (view.atoll.length > 0) say(`  atoll pods (${view.atoll[0]?.image ?? ''}): ${view.atoll.map((p) => `${p.name} on ${p.node ?? '-'}${p.ready ? '' : ' (not Ready)'}`).join(', ')}`);
  }
  if (mode === 'up') {
    say(`  pod addresses:`);
    for (const p of running.pods) say(`    ${p.name.padEnd(14)} ${p.ip.padEnd(15)} ${p.enter.join(' ')} ...`);
    writeJson(values.json, describe);
    writeSvg(values.svg, () => renderLabSvg(labSvgInputOf(running.plan, running.pods, undefined, describe.kubernetes ? { kubernetes: kubernetesLine(describe.kubernetes) } : {})));
    if (running.kubernetes) say(`  kubectl: ${running.kubernetes.kubectlCommand.join(' ')} get nodes`);
    if (values.detach) {
      lab.detachLab(running);
      uninstall();
      say(`lab ${running.plan.runId} is up and stays up; remove it with: atoll lab down ${running.plan.runId}`);
      return 0;
    }
    say(`lab ${running.plan.runId} is up; Ctrl-C (or SIGTERM) removes it`);
    // the cleanup handlers remove the lab and exit; until then nothing else holds the event loop
    setInterval(() => {}, 1 << 30);
    return new Promise<number>(() => {});
  }
  // the picture and the saved logs show the lab as it came up (node-delete takes a node out of running.plan; the
  // workloads' pods join running.pods)
  const planAtUp = running.plan;
  const podsAtUp = [...running.pods];
  let cells: LabCell[] = [];
  let faults: LabFaultResult[] = [];
  let traces: LabTraceCheck[] = [];
  let prometheus: LabPrometheusReport | undefined;
  let service: ServiceCheck | undefined;
  let workloads: Record<string, unknown> | undefined;
  let workloadsOk = true;
  // the workloads' pods and cells, for the picture
  const drawn: { pods: { name: string; node: string; ip: string }[]; cells: LabCell[] } = { pods: [], cells: [] };
  let down: unknown;
  try {
    const tc = performance.now();
    cells = await runChecks(running, { say });
    const checksEnd = performance.now();
    const checksMs = Math.round(checksEnd - tc);
    say('');
    if (running.pods.length <= 24) {
      say('connectivity (row: from, column: to)');
      for (const l of renderMatrix(running.pods.map((p) => p.name), cells)) say(`  ${l}`.trimEnd());
      say('');
    }
    for (const l of renderSummary(summarize(cells))) say(`  ${l}`);
    say('');
    const v = verdictOf(cells);
    if (v.ok) {
      say(`PASS: all ${v.shouldWork} allowed cells work over their expected path (same node, same site, tunnel direct, hole-punched or relayed); `
        + `${v.blocked} cells the communities${running.policy ? ' or the NetworkPolicies' : ''} forbid are blocked`);
    } else {
      say(`FAIL: ${v.failures.length} cell${v.failures.length === 1 ? '' : 's'} failed (${v.working} of ${v.shouldWork} allowed cells work):`);
      for (const l of renderFailures(cells)) say(`  ${l}`);
    }
    describe.timingsMs.checks = checksMs;
    traces = await traceCells(running, cells);
    const wrong = traces.filter((t) => !t.ok);
    say(wrong.length === 0 ? `PASS: atoll trace explains all ${traces.length} judged cells with the path the matrix measured`
      : `FAIL: atoll trace disagrees with the matrix on ${wrong.length} of ${traces.length} cells:`);
    for (const t of wrong.slice(0, 20)) say(`  ${t.from} -> ${t.to}: measured ${t.measured}, traced ${t.traced}${t.reason ? ` (${t.reason})` : ''}`);
    if (values.prometheus) {
      const tp = performance.now();
      say('');
      const { renderPrometheusReport, runPrometheusChecks } = await import('../lab/prometheus.ts');
      prometheus = await runPrometheusChecks(running, say);
      describe.timingsMs.prometheus = Math.round(performance.now() - tp);
      for (const l of renderPrometheusReport(prometheus)) say(`  ${l}`);
      say(prometheus.ok ? 'PASS: Prometheus sees what the lab knows, and the relay fault' : 'FAIL: Prometheus disagrees with the lab (above)');
    }
    if (running.kubernetes) {
      const ts = performance.now();
      const { checkService } = await import('../lab/lab-kube-service.ts');
      service = await checkService({ plan: running.plan, pods: running.pods, kube: running.kubernetes, tag: running.state.dir });
      describe.timingsMs.service = Math.round(performance.now() - ts);
      const answered = (prefix: boolean) => service?.probes.filter((p) => p.from.startsWith('node ') === prefix) ?? [];
      const line = (ps: readonly { ok: boolean }[], what: string) => `${ps.filter((p) => p.ok).length}/${ps.length} ${what}`;
      const connects = service.probes.flatMap((p) => (p.connectMs === undefined ? [] : [p.connectMs])).sort((a, b) => a - b);
      say('');
      say(`${service.ok ? 'PASS' : 'FAIL'}: Service ${service.clusterIp}:${service.port} (ClusterIP, endpoints ${service.backends.join(', ')}) answered from ${line(answered(true), 'nodes')} and ${line(answered(false), 'pods')}`
        + (connects.length ? ` (connect median ${connects[Math.floor(connects.length / 2)]} ms)` : ''));
      for (const p of service.probes.filter((x) => !x.ok)) say(`  ${p.from}: ${p.error ?? 'failed'}`);
    }
    if (running.kubernetes) {
      const tw = performance.now();
      say('');
      say('workloads through the API: Deployment lab-web and StatefulSet lab-db, a pod of each on every node; the matrix between their pods, IPs from the API');
      const { workloads: w, cells: wc } = await checkWorkloads(running, { say });
      describe.timingsMs.workloads = Math.round(performance.now() - tw);
      const wv = verdictOf(wc);
      const names = [...w.deployment, ...w.statefulSet].map((p) => p.name);
      if (names.length <= 24) {
        for (const l of renderMatrix(names, wc)) say(`  ${l}`.trimEnd());
        say('');
      }
      workloadsOk = wv.ok;
      drawn.pods.push(...w.deployment, ...w.statefulSet);
      drawn.cells.push(...wc);
      workloads = { deployment: w.deployment, statefulSet: w.statefulSet, readyMs: w.readyMs, cells: wc, summary: summarize(wc), verdict: { ...wv, failures: wv.failures.length } };
      const spread = new Set(w.deployment.map((p) => p.node)).size;
      say(`${wv.ok ? 'PASS' : 'FAIL'}: workloads: lab-web ${w.deployment.length} pods on ${spread} nodes, lab-db ${w.statefulSet.map((p) => `${p.name} on ${p.node}`).join(', ')} (Running in ${(w.readyMs / 1000).toFixed(1)} s); `
        + `${wv.working}/${wv.shouldWork} allowed cells work over their expected path, ${wv.blocked} blocked as expected`);
      for (const l of renderFailures(wc)) say(`  ${l}`);
    }
    if (faultList.faults.length > 0) {
      const tf = performance.now();
      say('');
      const { runFaults } = await import('../lab/faults.ts');
      // the main matrix just measured is the first fault's "before", unless the workloads' pods joined since
      const initial = running.workloadPods.length > 0 ? undefined : { count: { ok: v.ok, shouldWork: v.shouldWork, working: v.working }, ms: checksMs, endedAt: checksEnd };
      faults = await runFaults(running, faultList.faults, { say, ...(keepLogs ? { keepLogs } : {}), ...(initial ? { initial } : {}) });
      describe.timingsMs.faults = Math.round(performance.now() - tf);
      say('');
      say('faults (before/after: cells that should work and do, in the matrix right before and after each fault; convergence from the heal; loss of the sample pings)');
      for (const l of renderFaults(faults)) say(`  ${l}`);
      const bad = faults.filter((f) => !f.ok);
      say(bad.length === 0 ? `PASS: every fault healed, all cells that should work work again` : `FAIL: ${bad.map((f) => f.kind).join(', ')}`);
    }
  } finally {
    if (keepLogs) saveLogs(planAtUp, keepLogs, say);
    down = await destroyRun(runs, running, say);
    uninstall();
  }
  const v = verdictOf(cells);
  const durationMs = Math.round(performance.now() - t0);
  writeJson(values.json, { ...describe, processes: running.state.processes, durationMs, cells, summary: summarize(cells), verdict: { ...v, failures: v.failures.length }, traces, prometheus, faults, ...(service ? { service } : {}), ...(workloads ? { workloads } : {}), cleanup: down });
  writeSvg(values.svg, () => renderLabSvg(labSvgInputOf(planAtUp, [...podsAtUp, ...drawn.pods], [...cells, ...drawn.cells], { ...(describe.kubernetes ? { kubernetes: kubernetesLine(describe.kubernetes, service) } : {}), faults })));
  say(`done in ${(durationMs / 1000).toFixed(1)} s`);
  return v.ok && faults.every((f) => f.ok) && traces.every((t) => t.ok) && (prometheus?.ok ?? true) && (service?.ok ?? true) && workloadsOk ? 0 : 1;
}

async function downCmd(argv: readonly string[]): Promise<number> {
  const { values, positionals } = parseCommand(argv, { command: 'atoll lab down', usage: LAB_USAGE, options: { all: { type: 'boolean', default: false } }, positionals: { min: 0, max: 1 } });
  const id = positionals[0];
  if (id !== undefined && !LAB_RUN_ID.test(id)) throw new UsageError('atoll lab down', `"${id}" is not a run id (4 hex digits, as in atl-lab-<runid>-...)`, LAB_USAGE);
  const { labDown } = await import('../lab/lab-down.ts');
  const res = await labDown(id ? { runId: id } : { all: values.all }, { say });
  return res.every((r) => r.leftovers.length === 0) ? 0 : 1;
}

export async function runLab(argv: readonly string[]): Promise<number> {
  // probe is the lab's own helper inside each pod, not listed in the usage
  if (argv[0] === 'probe') {
    const { runProbe } = await import('../lab/probe.ts');
    return runProbe(argv.slice(1));
  }
  const [cmd, rest] = subcommand(argv, 'atoll lab', ['up', 'run', 'down'], LAB_USAGE);
  switch (cmd) {
    case 'up':
      return up(rest, 'up');
    case 'run':
      return up(rest, 'run');
    case 'down':
      return downCmd(rest);
  }
}
