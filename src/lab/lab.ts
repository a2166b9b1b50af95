/**
 * `atoll lab`: a whole cloud and edge cluster on one machine, for real. This file builds it ({@link labUp}): the
 * planned topology (src/lab/plan/plan.ts) from network namespaces, the controller, the relay and an agent per node as
 * real processes (or, with `--kubernetes`, Atoll installed through its chart: src/lab/lab-kube-install.ts), then the
 * pods through the real `atoll-cni` (by containerd's CRI when containerd is installed, else by calling it directly:
 * src/lab/lab-pods.ts). Beside it: the running lab's handle and what the later steps share
 * (src/lab/running-lab.ts), waiting for the agents to converge (src/lab/lab-convergence.ts), the checks
 * (src/lab/lab-checks.ts), the faults (src/lab/faults.ts), removing runs (src/lab/lab-down.ts).
 *
 * Safety rules the lab keeps:
 * - Everything it creates is named with the run's prefix (`atl-lab-<runid>-`) and recorded in the run's state file
 *   (src/lab/io/lab-state.ts) before it is created, so `atoll lab down` can remove the leftovers of a run that was
 *   killed. Traffic only flows inside the run's namespaces.
 * - Processes are stopped by PID only, and only when their command line carries the run's directory (or they live in
 *   one of the run's namespaces, or in the mount namespace or sandbox cgroup of one of the run's containerds).
 * - Every wait is bounded; a failed step removes the whole run before the error is reported; SIGINT, SIGTERM and
 *   uncaught errors remove the run too.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { AtollError, asAtollError, atollError } from '../core/errors.ts';
import {
  agentConfigFor, type LabNamespace, labPrefix, type LabPlan, relayConfigFor, NODE_HOST_PATHS, NODE_KUBELET_PATHS, planLab, runIdOfNetns,
} from './plan/plan.ts';
import { type LabSetupStep, renderLabSetup } from './plan/setup.ts';
import { describeLabSpec, type LabSpec } from './plan/spec.ts';
import { IpRoute2 } from '../adapters/kernel/iproute2.ts';
import { type LabState, LabStateStore } from './io/lab-state.ts';
import { Nft } from '../adapters/kernel/nft.ts';
import { listNetns } from './io/processes.ts';
import { writeSysctl } from '../adapters/kernel/sysctl.ts';
import { Tc } from './io/tc.ts';
import { AgentProcess, DELAY_BIN, LIBFAKETIME } from './agent-process.ts';
import { ServiceProcess } from './service-process.ts';
import { choosePodMode, CriPods, DirectPods, type LabContainerdRecord, type LabPodInfo, type LabPodRuntime } from './lab-pods.ts';
import { type LabKubernetes, startLabKubernetes } from './lab-kube.ts';
import { agentPodLogTail, ATOLL_IMAGE_TAG, type AtollInstall, installAtoll } from './lab-kube-install.ts';
import { applyLabPolicies } from './lab-kube-policy.ts';
import { LAB_POLICY_NAMES } from './plan/policy.ts';
import { KubePods } from './lab-kube-pods.ts';
import { labPreflight, requireRoot, uplinkDelayMethod } from './lab-preflight.ts';
import { waitForBlocksAndPeers, waitForSiteRoutes, waitForTunnelPaths } from './lab-convergence.ts';
import { type ActiveRun, destroyRun, type LabRuns, removeStaleRuns } from './lab-down.ts';
import { agentLauncher, type LabOptions, mapLimit, nsPath, type RunningLab, saveLogs, secs, since } from './running-lab.ts';

/** `labUp`'s options: the runs of this process, shared with the clean-up handlers, besides the common ones. */
export interface LabUpOptions extends LabOptions {
  readonly runs: LabRuns;
}

const ip = new IpRoute2();

function newRunId(store: LabStateStore): string {
  const taken = new Set([...store.list(), ...listNetns().map(runIdOfNetns).filter((x) => x !== undefined)]);
  for (;;) {
    const id = randomBytes(2).toString('hex');
    if (!taken.has(id)) return id;
  }
}

async function applyStep(step: LabSetupStep): Promise<void> {
  const netns = step.netns ? nsPath(step.netns) : undefined;
  switch (step.tool) {
    case 'ip':
      return ip.batch(step.lines, { netns });
    case 'tc':
      return new Tc().batch(step.lines, { netns });
    case 'nft':
      return new Nft().apply(`${step.lines.join('\n')}\n`, { netns });
    case 'sysctl':
      for (const line of step.lines) {
        const [key, value] = line.split('=') as [string, string];
        writeSysctl(key, value, netns, { ifPresent: step.ifPresent });
      }
  }
}

/** A run being built: what the phases of {@link labUp} read and add to. */
interface Build {
  readonly runs: LabRuns;
  readonly store: LabStateStore;
  readonly spec: LabSpec;
  readonly plan: LabPlan;
  readonly mode: 'cri' | 'direct';
  /** Why `mode` was chosen, for the terminal. */
  readonly why: string;
  /** The namespaces the run makes (under CRI containerd creates the pods' own). */
  readonly namespaces: readonly LabNamespace[];
  /** `--kubernetes`: Atoll installed through its chart on the lab's kubelets. */
  readonly kubernetes: boolean;
  /** `--openyurt`: edge kubelets and kube-proxies behind their node's yurthub. */
  readonly openyurt: boolean;
  /** With `kubernetes`: the chart's agents enforce NetworkPolicy; images imported beside Atoll's. */
  readonly install: { readonly networkPolicy: boolean; readonly images: readonly string[] };
  readonly say: (l: string) => void;
  readonly timingsMs: Record<string, number>;
  readonly agents: Map<string, AgentProcess>;
  /** The libfaketime file of each agent run with faked clocks, by node. */
  readonly clockFiles: Map<string, string>;
  /** The run as recorded in its state file; also `runs.active` while it is being built or runs. */
  readonly run: ActiveRun;
  /** What is under way, for the error when it fails. */
  step: string;
  /** The pod runtime while it starts (a containerd per node starts beside the controller). */
  runtimeStarting?: Promise<LabPodRuntime>;
}

/** Records a process of the run being built in its state file, before anything waits for it. */
function recordStarted(b: Build, role: string, pid: number | undefined): void {
  if (pid === undefined) return;
  b.run.state = { ...b.run.state, processes: [...b.run.state.processes, { role, pid }] };
  b.store.save(b.run.state);
}

/** Plans the run and records it (its state file, the process's active run) before anything is created. */
async function beginRun(spec: LabSpec, opts: LabUpOptions): Promise<Build> {
  const { say, runs } = opts;
  const store = opts.store ?? new LabStateStore();
  await removeStaleRuns(runs, store, say);
  const runId = newRunId(store);
  const prefix = labPrefix(runId);
  const dir = store.runDir(runId);
  const token = () => randomBytes(18).toString('base64url');
  const delayBy = spec.edges.some((e) => e.uplink.delayMs !== undefined) ? await uplinkDelayMethod(`${prefix}probe`) : 'netem';
  const plan = planLab({ spec, runId, dir, bootstrapToken: token(), adminToken: token(), relayToken: token(), delayBy, kubernetes: opts.kubernetes ?? false });
  const { mode, why } = choosePodMode(opts.pods ?? 'auto');
  if (opts.kubernetes && mode !== 'cri') {
    throw atollError('LAB_PREREQUISITE_MISSING', `--kubernetes runs a kubelet beside each node's containerd, but pods would be made by direct CNI calls (${why})`, 'install containerd, runc and busybox-static (make setup) and drop --pods direct');
  }
  // under CRI, containerd creates the pods' namespaces; the planned ones are not made
  const namespaces = plan.namespaces.filter((n) => mode === 'direct' || n.role !== 'pod');
  const state: LabState = {
    runId, prefix, dir, labPid: process.pid, detached: false, startedAt: new Date().toISOString(),
    namespaces: [...namespaces.map((n) => n.name), `${prefix}probe`], processes: [], containerds: [],
  };
  store.save(state);
  const run: ActiveRun = { store, state, say };
  runs.active = run;
  say(`atoll lab ${runId}: ${describeLabSpec(spec)}`);
  // the clock-jump fault's site: the first edge site (src/lab/plan/faults.ts), its agents under libfaketime
  const faked = opts.fakeClocks && LIBFAKETIME ? plan.nodes.filter((n) => n.site === spec.edges[0]?.name) : [];
  const clockFiles = new Map(faked.map((n) => [n.name, join(n.dir, 'faketime')]));
  return { runs, store, spec, plan, mode, why, namespaces, kubernetes: opts.kubernetes ?? false, openyurt: opts.openyurt ?? false, install: { networkPolicy: opts.networkPolicy ?? false, images: opts.images ?? [] }, say, timingsMs: {}, agents: new Map(), clockFiles, run, step: 'preflight' };
}

/** Phase: root, the tools, and every kernel feature the spec needs, tried in a throwaway namespace. */
async function preflight(b: Build): Promise<void> {
  const t = performance.now();
  const features = await labPreflight(b.spec, `${b.plan.prefix}probe`);
  b.say(`  preflight: root; ip, nft, tc, ping; kernel: netns, ${features.join(', ')} (${secs(since(t))})`);
  b.say(`  pods will be created by ${b.mode === 'cri' ? 'containerd\'s CRI' : 'direct CNI calls'} (${b.why})`);
}

/** Phase: the namespaces, links, NAT routers and qdiscs of the plan, and the delay lines of a kernel without netem. */
async function buildTopology(b: Build): Promise<void> {
  const { plan, namespaces } = b;
  b.step = 'building the topology';
  const t = performance.now();
  mkdirSync(plan.controller.dir, { recursive: true, mode: 0o700 });
  writeFileSync(plan.controller.configPath, JSON.stringify(plan.controller.config, null, 2));
  for (const phase of renderLabSetup({ ...plan, namespaces })) await mapLimit(phase, 8, applyStep);
  b.timingsMs.topology = since(t);
  const count = (role: string) => namespaces.filter((n) => n.role === role).length;
  b.say(`  topology: ${namespaces.length} namespaces (wan, ${count('router')} routers, controller, ${count('node')} nodes${b.mode === 'direct' ? `, ${count('pod')} pods` : ''}), `
    + `${plan.veths.length} veth links, ${plan.nat.length} NAT router${plan.nat.length === 1 ? '' : 's'}${plan.qdiscs.length ? `, ${plan.qdiscs.length} uplink qdiscs` : ''} (${secs(b.timingsMs.topology)})`);
  for (const d of plan.delayLines) {
    const line = new ServiceProcess({ kind: 'delay-line', logPath: d.logPath, argv: [DELAY_BIN, String(d.delayMs), d.ports[0].tap, d.ports[1].tap, plan.dir] });
    const ready = line.start(['ip', 'netns', 'exec', d.netns]);
    recordStarted(b, `delay-line ${d.site}`, line.pid);
    b.say(`  delay line: uplink of ${d.site}, ${await ready} (pid ${line.pid}; this kernel has no netem)`);
  }
}

/** Starts the pod runtime (under CRI a containerd per node, each recorded as it spawns); {@link podRuntimeStarted} awaits it. */
function startPodRuntime(b: Build): Promise<LabPodRuntime> {
  const { plan, run } = b;
  const tCtd = performance.now();
  const abort = new AbortController();
  const recordContainerd = (rec: LabContainerdRecord) => {
    run.state = { ...run.state, containerds: [...(run.state.containerds ?? []), rec] };
    b.store.save(run.state);
  };
  const runtimeStarting = b.mode === 'cri'
    ? CriPods.start({ plan, record: recordContainerd, signal: abort.signal, nodeHostPaths: b.kubernetes }).then((r) => {
      b.timingsMs.containerd = since(tCtd);
      return r;
    })
    : Promise.resolve(new DirectPods(plan));
  b.runtimeStarting = runtimeStarting;
  const settled = runtimeStarting.then((r) => b.runs.runtimes.set(plan.runId, r), () => undefined); // also: a rejection is handled
  run.starting = { abort, settled };
  return runtimeStarting;
}

async function podRuntimeStarted(b: Build, starting: Promise<LabPodRuntime>): Promise<LabPodRuntime> {
  const podRuntime = await starting;
  b.run.starting = undefined;
  if (podRuntime instanceof CriPods) {
    const pids = [...podRuntime.containerds.values()].map((c) => c.pid);
    const dirs = b.kubernetes ? `its own ${[...NODE_HOST_PATHS, ...NODE_KUBELET_PATHS].join(', ')} bind-mounted in its mount namespace` : 'its CNI dirs';
    b.say(`  containerd: ${pids.length} private instances, one per node in its namespace with ${dirs} (pids ${pids.join(', ')}), pause image built once (${secs(b.timingsMs.containerd ?? 0)})`);
  }
  return podRuntime;
}

/** Phase: the controller, and meanwhile the pod runtime. */
async function startControllerAndPods(b: Build): Promise<{ controller: ServiceProcess; caCertHash: string; podRuntime: LabPodRuntime }> {
  const { plan } = b;
  b.step = b.mode === 'cri' ? 'starting the controller and a containerd per node' : 'starting the controller';
  const t = performance.now();
  const runtimeStarting = startPodRuntime(b);
  const controller = new ServiceProcess({ kind: 'controller', configPath: plan.controller.configPath, logPath: plan.controller.logPath });
  const started = controller.start(['ip', 'netns', 'exec', plan.controller.netns]);
  recordStarted(b, 'controller', controller.pid);
  const caCertHash = await started;
  b.timingsMs.controller = since(t);
  b.say(`  controller: ${plan.controller.url} in ${plan.controller.netns} (pid ${controller.pid}), CA pin ${caCertHash.slice(0, 23)}... (${secs(b.timingsMs.controller)})`);
  return { controller, caCertHash, podRuntime: await podRuntimeStarted(b, runtimeStarting) };
}

/** Phase: the relay beside the controller, following it with a relay token. */
async function startRelay(b: Build, caCertHash: string): Promise<{ relay: ServiceProcess; relayPin: string }> {
  const { plan } = b;
  b.step = 'starting the relay';
  const t = performance.now();
  mkdirSync(plan.relay.dir, { recursive: true, mode: 0o700 });
  writeFileSync(plan.relay.configPath, JSON.stringify(relayConfigFor(plan.relay, caCertHash), null, 2));
  const relay = new ServiceProcess({ kind: 'relay', configPath: plan.relay.configPath, logPath: plan.relay.logPath });
  const relayStarted = relay.start(['ip', 'netns', 'exec', plan.relay.netns]);
  recordStarted(b, 'relay', relay.pid);
  const relayPin = await relayStarted;
  b.timingsMs.relay = since(t);
  b.say(`  relay: ${plan.relay.address}:${plan.relay.port} in ${plan.relay.netns} (pid ${relay.pid}), key pin ${relayPin.slice(0, 23)}... (${secs(b.timingsMs.relay)})`);
  return { relay, relayPin };
}

/** Phase: an agent per node, then until each holds a block, knows every node of its view and routes its site's and tunnel peers' blocks. */
async function startAgents(b: Build, peers: { podRuntime: LabPodRuntime; caCertHash: string; relayPin: string }): Promise<void> {
  const { plan, agents } = b;
  b.step = 'starting the agents';
  const t = performance.now();
  await mapLimit(plan.nodes, 8, async (n) => {
    mkdirSync(n.dir, { recursive: true, mode: 0o700 });
    writeFileSync(n.configPath, JSON.stringify(agentConfigFor(n, peers.caCertHash, { plan: plan.relay, pin: peers.relayPin }), null, 2));
    const agent = new AgentProcess({ configPath: n.configPath, socketPath: n.socketPath, logPath: n.logPath, detached: true });
    agents.set(n.name, agent);
    const starting = agent.start(agentLauncher({ podRuntime: peers.podRuntime, clockFiles: b.clockFiles }, n), 30_000);
    recordStarted(b, `agent ${n.name}`, agent.pid);
    await starting;
  });
  await awaitAgentsConverged(b, t, async (node) => agents.get(node)?.logTail(15) ?? '');
}

/** Phase, after the agents started: until each holds a block, knows every node of its view and routes its site's and tunnel peers' blocks. */
async function awaitAgentsConverged(b: Build, t: number, agentLog: (node: string) => Promise<string>): Promise<void> {
  const { plan } = b;
  b.step = 'waiting for blocks and peers';
  await waitForBlocksAndPeers(plan, agentLog);
  b.step = 'waiting for same-site and tunnel routes';
  await waitForSiteRoutes(plan);
  b.timingsMs.agents = since(t);
  b.say(`  agents: ${plan.nodes.length} up; each holds a block, knows every node of its view and routes its site's and its tunnel peers' blocks (${secs(b.timingsMs.agents)})`);
}

/** Phase: until every tunnel pair runs over its expected path (hole-punched, relayed, cloud <-> edge). */
async function awaitTunnelPaths(b: Build): Promise<void> {
  b.step = 'waiting for tunnel paths (hole punching, relay)';
  const t = performance.now();
  const paths = await waitForTunnelPaths(b.plan);
  b.timingsMs.tunnelPaths = since(t);
  b.say(`  tunnel paths: ${Object.entries(paths).map(([p, n]) => `${n} ${p}`).join(', ') || 'none'} node pairs up (${secs(b.timingsMs.tunnelPaths)})`);
}

/** Phase (`--kubernetes`): the control plane in the cloud, a kubelet and kube-proxy per node beside its containerd, every Node registered. */
async function startKubernetes(b: Build, podRuntime: LabPodRuntime): Promise<{ kube: LabKubernetes; podRuntime: CriPods }> {
  b.step = 'starting Kubernetes (control plane, kubelets)';
  const t = performance.now();
  // cannot happen: beginRun refuses --kubernetes unless pods go through CRI, and then the runtime is CriPods
  if (!(podRuntime instanceof CriPods)) throw new Error('--kubernetes needs the CRI pod runtime');
  const kube = await startLabKubernetes({ plan: b.plan, containerds: podRuntime.containerds, openyurt: b.openyurt, record: (role, pid) => recordStarted(b, role, pid) });
  b.timingsMs.kubernetes = since(t);
  const cp = Object.entries(kube.controlPlane.pids).map(([role, pid]) => `${role} ${pid}`).join(', ');
  const hubs = kube.yurthubs.size > 0 ? `, the ${kube.yurthubs.size} edge ones through their node's yurthub` : '';
  b.say(`  kubernetes: control plane at ${kube.controlPlane.server} in ${b.plan.controller.netns} (${cp}); ${kube.kubelets.size} kubelets and kube-proxies${hubs}, every node registered with its site labels (${secs(b.timingsMs.kubernetes)})`);
  return { kube, podRuntime };
}

/**
 * `--kubernetes`: containerds (each node's own host directories), Kubernetes, then Atoll installed through its chart
 * (src/lab/lab-kube-install.ts installAtoll); no agent, controller or relay process of the lab's own. Then as without
 * Kubernetes: until the agents converged and every tunnel pair is on its path, read from their state and status
 * sockets in the nodes' own directories.
 */
async function installedThroughKubernetes(b: Build): Promise<{ kube: LabKubernetes; install: AtollInstall; podRuntime: KubePods }> {
  b.step = 'starting a containerd per node';
  const { kube, podRuntime } = await startKubernetes(b, await podRuntimeStarted(b, startPodRuntime(b)));
  const kubePods = new KubePods(podRuntime, kube);
  b.runs.runtimes.set(b.plan.runId, kubePods);
  b.step = 'installing Atoll through its chart';
  const t = performance.now();
  const install = await installAtoll(kube, { plan: b.plan, containerds: podRuntime.containerds, tag: ATOLL_IMAGE_TAG, ...b.install, say: b.say });
  b.timingsMs.install = since(t);
  await awaitAgentsConverged(b, t, async (node) => agentPodLogTail(kube, node));
  await awaitTunnelPaths(b);
  return { kube, install, podRuntime: kubePods };
}

/** Phase: every planned pod, through the pod runtime. */
async function createPods(b: Build, podRuntime: LabPodRuntime): Promise<LabPodInfo[]> {
  b.step = 'creating pods';
  const t = performance.now();
  const pods = await mapLimit(b.plan.pods, 8, (pod) => podRuntime.create(pod));
  b.timingsMs.pods = since(t);
  const adds = pods.map((p) => p.addMs ?? 0).sort((x, y) => x - y);
  b.say(`  pods: ${pods.length} created by ${podRuntime.description} (${secs(b.timingsMs.pods)}; ${podRuntime instanceof KubePods ? 'Pod applied to Running' : b.mode === 'cri' ? 'RunPodSandbox' : 'CNI ADD'} median ${adds[Math.floor(adds.length / 2)]} ms, max ${adds.at(-1)} ms)`);
  return pods;
}

/** Phase (`--policy`): the lab's NetworkPolicies applied, and in force on every node. */
async function applyPolicies(b: Build, kube: LabKubernetes): Promise<NonNullable<RunningLab['policy']>> {
  b.step = 'applying the lab\'s NetworkPolicies';
  const policy = await applyLabPolicies(kube, b.plan);
  b.timingsMs.policyInForce = policy.inForceMs;
  b.say(`  policy: ${LAB_POLICY_NAMES.join(', ')} applied, in force on every node ${policy.inForceMs} ms later`);
  return policy;
}

/** After a failed phase: saves the logs when asked, removes the whole run, and returns the error to throw. */
async function abandonRun(b: Build, err: unknown, keepLogs: string | undefined): Promise<AtollError> {
  const e = asAtollError(err);
  const refused = e.code === 'LAB_PREREQUISITE_MISSING';
  if (refused) b.say('  refused: nothing was created');
  else b.say(`  failed while ${b.step}; removing everything`);
  if (keepLogs && !refused) saveLogs(b.plan, keepLogs, b.say);
  // containerds still starting are recorded as they spawn: let them finish before removing the run
  await b.runtimeStarting?.then((r) => b.runs.runtimes.set(b.plan.runId, r), () => undefined);
  b.run.starting = undefined;
  await destroyRun(b.runs, b.run, refused ? () => {} : b.say);
  b.runs.active = undefined;
  if (err instanceof AtollError) return err;
  return atollError('LAB_STEP_FAILED', `atoll lab failed while ${b.step}: ${e.message}`, 'read the message and log tails above; `atoll lab down --all` removes any leftovers', err);
}

/**
 * Builds the lab for `spec` and returns it running: topology, controller, agents (every one with a block, every
 * peer and its same-site routes) and pods. In phases: {@link beginRun} (plan and record), {@link preflight},
 * {@link buildTopology}, {@link startControllerAndPods}, {@link startRelay}, {@link startAgents},
 * {@link awaitTunnelPaths}, {@link createPods}; a failed phase ends in {@link abandonRun}.
 * @throws AtollError LAB_PREREQUISITE_MISSING before creating anything; LAB_STEP_FAILED after removing what it built.
 */
export async function labUp(spec: LabSpec, opts: LabUpOptions): Promise<RunningLab> {
  requireRoot();
  const t0 = performance.now();
  const b = await beginRun(spec, opts);
  try {
    await preflight(b);
    await buildTopology(b);
    if (opts.kubernetes) {
      const { kube, install, podRuntime } = await installedThroughKubernetes(b);
      const pods = await createPods(b, podRuntime);
      const policy = b.install.networkPolicy ? await applyPolicies(b, kube) : undefined;
      b.timingsMs.up = since(t0);
      return {
        plan: b.plan, store: b.store, caCertHash: install.caCertHash, pods, podRuntime, podCreation: podRuntime.description,
        timingsMs: b.timingsMs, relayPin: install.relayPin, kubernetes: kube, atollInstall: install, workloadPods: [], ...(policy ? { policy } : {}),
        agents: b.agents, runs: b.runs, state: b.run.state, clockFiles: b.clockFiles,
      };
    }
    const { controller, caCertHash, podRuntime } = await startControllerAndPods(b);
    const { relay, relayPin } = await startRelay(b, caCertHash);
    await startAgents(b, { podRuntime, caCertHash, relayPin });
    await awaitTunnelPaths(b);
    const pods = await createPods(b, podRuntime);
    b.timingsMs.up = since(t0);
    return {
      plan: b.plan, store: b.store, caCertHash, pods, podRuntime, podCreation: podRuntime.description,
      timingsMs: b.timingsMs, controller, relay, relayPin, agents: b.agents, runs: b.runs, state: b.run.state, workloadPods: [], clockFiles: b.clockFiles,
    };
  } catch (err) {
    throw await abandonRun(b, err, opts.keepLogs);
  }
}

/** Marks `lab` as living on without its builder (`atoll lab up --detach`). */
export function detachLab(lab: RunningLab): void {
  lab.podRuntime.close();
  lab.runs.runtimes.delete(lab.state.runId);
  lab.state = { ...lab.state, detached: true };
  lab.store.save(lab.state);
  lab.runs.active = undefined;
}
