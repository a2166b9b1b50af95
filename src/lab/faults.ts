/**
 * The lab's faults, for real, run one after the other on the live lab and judged (what hits whom, and how the results
 * are judged, is planned in src/lab/plan/faults.ts and src/lab/plan/fault-results.ts): the whole matrix right before and after each, sample pings and
 * TCP flows held across it (src/lab/samplers.ts), the fault itself held and healed (src/lab/fault-actions.ts: kills
 * and restarts by PID, an edge router's uplink cut and flapped, a node "rebooted", pods re-created; its Kubernetes
 * forms in src/lab/lab-kube-faults.ts), then until every sample answers and every tunnel pair is back on its expected
 * path. With `--kubernetes` the lab's Service is checked after each.
 *
 * Safety: everything happens inside the run's namespaces; processes are stopped by PID (the ones the lab started);
 * every wait is bounded; a fault that throws still restores the uplink it cut.
 */
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { asAtollError } from '../core/errors.ts';
import { CLOCK_JUMP, type LabFaultKind, type LabFaultTarget, peerCutRuleset, planFault } from './plan/faults.ts';
import { type DeniedSample, lostOutsideWindows, type LossWindow, policyChangeSeen, sampleStats, type SampleStats, windowsFor } from './plan/fault-samples.ts';
import { type FlowResult, judgeFault, type LabFaultResult, type MatrixCount } from './plan/fault-results.ts';
import { labChartEndpoints } from './plan/kubernetes.ts';
import { LAB_POD_NAMESPACE } from './plan/plan.ts';
import { applyLabPolicies } from './lab-kube-policy.ts';
import { verdictOf } from './plan/report.ts';
import { readTunnelStatus, statusSocketOf } from '../adapters/ops/status-socket.ts';
import { Nft } from '../adapters/kernel/nft.ts';
import type { LabKubernetes } from './lab-kube.ts';
import {
  ATOLL_ROLL_TAG, crashSandbox, deleteNode, killAtollContainers, killChartContainers, kubeOf, nodeHoldings, podIps, reachWhileCut, rebootNodeOffline, recreateStatefulPod, rollAgents,
  scaleController,
} from './lab-kube-faults.ts';
import { checkService, exposePod } from './lab-kube-service.ts';
import { Flow, FLOW_START_TIMEOUT_MS, PING_INTERVAL_S, Pinger } from './samplers.ts';
import {
  cutFromCloud, cutUplink, flushConntrack, HOLD_MS, moveRouter, rebuildingLine, recreatePod, replacePod, restartAgent, restartService, restoreUplink, routerOf, wipeNode,
} from './fault-actions.ts';
import { LIBFAKETIME } from './agent-process.ts';
import { runChecks } from './lab-checks.ts';
import { waitForTunnelPaths } from './lab-convergence.ts';
import { type LabOptions, type LabPodInfo, nsPath, type RunningLab, saveLogs } from './running-lab.ts';

/** A tunnel path that stopped working is declared dead after this long (a punched stream; the datagram path). */
const PATH_DEAD_MS = 3000;
/** After a NAT reboot a site's edge-to-edge paths must answer again within this long. */
const NAT_REBOOT_WINDOW_MS = 5000;
/** An agent's restart may cost its edge-to-edge paths this long after it serves again. */
const RESTART_GRACE_MS = 1000;
const FLAPS = 3;
const FLAP_MS = 700;
/** Bound on waiting for every sample to answer again after the heal (the edge re-dials with backoff of at most 30 s). */
const RECOVERY_TIMEOUT_MS = 35_000;
/** Bound on waiting, after that, for every tunnel pair to be back on its expected path (hole punching retries with backoff). */
const PATHS_TIMEOUT_MS = 40_000;
const WARMUP_TIMEOUT_MS = 5000;

const nft = new Nft();

/** How long the first agent of offline-restart-all stays down: past the datagram path's 3 s deadline at its peers. */
const WATCH_DOWN_MS = 4500;

/** The first line of a (multi-line) error message. */
const firstLine = (message: string): string => message.split('\n', 1)[0] ?? '';

async function waitUntil(check: () => boolean, timeoutMs: number): Promise<boolean> {
  const deadline = performance.now() + timeoutMs;
  while (performance.now() < deadline) {
    if (check()) return true;
    await sleep(50);
  }
  return check();
}

function count(cells: Awaited<ReturnType<typeof runChecks>>): MatrixCount {
  const v = verdictOf(cells);
  const failed = cells.filter((c) => c.verdict !== 'ok' && c.verdict !== 'blocked as expected').slice(0, 6).map((c) => `${c.from} -> ${c.to}: ${c.note ?? c.verdict}`);
  return { ok: v.ok, shouldWork: v.shouldWork, working: v.working, ...(failed.length > 0 ? { failed } : {}) };
}

/** A whole matrix, counted: how long it took and when it ended (performance.now()). */
export interface Measured {
  readonly count: MatrixCount;
  readonly ms: number;
  readonly endedAt: number;
  /** Tunnel pairs of the cells that failed: what each end's `atoll peers` said right after. */
  readonly tunnelViews?: readonly string[];
}

/** The whole matrix, quietly, counted; and how long it took. */
async function measure(lab: RunningLab): Promise<Measured> {
  const t = performance.now();
  const cells = await runChecks(lab, { say: () => {} });
  const ms = Math.round(performance.now() - t);
  const bad = cells.filter((c) => c.verdict === 'FAIL' && c.fromNode !== c.toNode);
  const pairs = [...new Set(bad.map((c) => `${c.fromNode}|${c.toNode}`))].slice(0, 3).map((k) => k.split('|') as [string, string]);
  const tunnelViews = (await Promise.all(pairs.flatMap(([a, b]) => [tunnelView(lab, a, b), tunnelView(lab, b, a)]))).filter((v) => v !== undefined);
  return { count: count(cells), ms, endedAt: performance.now(), ...(tunnelViews.length > 0 ? { tunnelViews } : {}) };
}

/** What `node`'s agent says of its tunnel peer `peer` (path, datagram path, drops), for a failed cell's note. */
async function tunnelView(lab: RunningLab, node: string, peer: string): Promise<string | undefined> {
  const n = lab.plan.nodes.find((x) => x.name === node);
  const st = n ? await readTunnelStatus(statusSocketOf(n.socketPath), 2000).catch(() => null) : null;
  const p = st?.peers.find((x) => x.name === peer);
  if (!st || !p) return undefined;
  const drops = Object.entries(st.dropped).filter(([, v]) => v > 0).map(([k, v]) => `${k} ${v}`).join(', ');
  return `${node} on ${peer}: path ${p.path}${p.udp ? `, udp ${p.udp.endpoint ?? '-'} ${p.udp.usable ? 'usable' : 'not usable'}` : ''}, sent ${p.txPackets}, received ${p.rxPackets}; drops: ${drops || 'none'}`;
}

/** A matrix that ended at most this long before a fault starts is that fault's "before" (nothing happened between). */
const BEFORE_FRESH_MS = 5000;

async function runFault(lab: RunningLab, target: LabFaultTarget, say: (l: string) => void, last: Measured | undefined): Promise<{ result: LabFaultResult; after: Measured }> {
  const t0 = performance.now();
  // the matrix right before the fault: the previous one (the main check, or the previous fault's after) when it ended
  // just now, else a fresh one
  const before = last && t0 - last.endedAt <= BEFORE_FRESH_MS ? last : await measure(lab);
  const beforeAgeMs = Math.round(performance.now() - before.endedAt);
  const notes: string[] = [];
  const facts: string[] = [];
  const podStartMs: number[] = [];
  const byName = new Map(lab.pods.map((p) => [p.name, p]));
  const pingers = target.samples.map((s) => new Pinger(s, byName.get(s.from) as LabPodInfo, byName.get(s.to) as LabPodInfo));
  const flows = target.flows.map((f) => new Flow(f, byName.get(f.from) as LabPodInfo, byName.get(f.to) as LabPodInfo));
  const deniedPingers = (target.denied ?? []).map((s) => new Pinger(s, byName.get(s.from) as LabPodInfo, byName.get(s.to) as LabPodInfo));
  /** Every ping of the fault, for a pod re-created meanwhile: its pings move with it. */
  const allPingers = [...pingers, ...deniedPingers];
  /** policy-offline: when the policy was deleted. */
  let changedAt: number | undefined;
  let healAt = performance.now();
  let heldMs = 0;
  let pathsBackMs: number | undefined;
  let cut: string | undefined;
  /** Where the fault may cost packets (faults with `strict` samples). */
  const windows: LossWindow[] = [];
  /** What is set right after the samples stopped, before the matrix after (the clock-jump fault's clocks). */
  let afterSamples: (() => Promise<void>) | undefined;
  try {
    // policy-offline's samples are pairs its policy denies: they answer only once it is deleted
    const warm = target.kind === 'policy-offline' ? [] : pingers;
    if (!(await waitUntil(() => warm.every((p) => p.replies.length > 0), WARMUP_TIMEOUT_MS))) notes.push('some samples did not answer before the fault');
    for (const f of flows) f.start();
    if (!(await waitUntil(() => flows.every((f) => f.flowing()), FLOW_START_TIMEOUT_MS))) notes.push('a TCP flow did not start before the fault');
    const tFault = performance.now();
    switch (target.kind) {
      case 'controller-kill':
      case 'relay-kill': {
        const component = target.kind === 'controller-kill' ? 'controller' : 'relay';
        if (lab.kubernetes) facts.push(await killChartContainers(lab, component));
        else await restartService(lab, component, notes);
        break;
      }
      case 'direct-path-cut':
        cut = target.site;
        await nft.apply(peerCutRuleset(target.peerAddress), { netns: nsPath(routerOf(lab, cut)) });
        await sleep(HOLD_MS['direct-path-cut']);
        break;
      case 'agent-restart': {
        const killedAt = performance.now();
        windows.push({ fromMs: killedAt, toMs: killedAt, label: `what ${target.node}'s agent held when killed`, nodes: [target.node], inHand: true });
        if (lab.kubernetes) facts.push(await killChartContainers(lab, 'agent', [target.node]));
        else await restartAgent(lab, target.node, () => sleep(HOLD_MS['agent-restart']));
        break;
      }
      case 'offline-restart':
        if (lab.kubernetes) {
          const kube = kubeOf(lab);
          const replicas = labChartEndpoints(lab.plan).controllers.length;
          await scaleController(kube.kube, 0);
          facts.push(`controller scaled to 0 replicas; ${await killChartContainers(lab, 'agent', [target.node])}`);
          healAt = performance.now();
          if (!(await waitUntil(() => pingers.every((p) => p.healthy(healAt)), RECOVERY_TIMEOUT_MS))) notes.push('the restarted agent did not rebuild its paths while the controller had no replica');
          await scaleController(kube.kube, replicas);
          break;
        }
        await restartService(lab, 'controller', notes, async () => {
          await restartAgent(lab, target.node, () => sleep(HOLD_MS['offline-restart']));
          // the heal is the agent's start: its samples must answer again while the controller is still down
          healAt = performance.now();
          if (!(await waitUntil(() => pingers.every((p) => p.healthy(healAt)), RECOVERY_TIMEOUT_MS))) notes.push('the restarted agent did not rebuild its paths while the controller was down');
        });
        break;
      case 'pod-recreate': {
        const { was, now } = await recreatePod(lab, target.pod, allPingers);
        podStartMs.push(now.addMs ?? 0);
        if (now.ip !== was.ip) notes.push(`re-created with ${now.ip}, not its former ${was.ip}`);
        break;
      }
      case 'statefulset-recreate': {
        const kube = kubeOf(lab);
        const { was, now } = await replacePod(lab, target.pod, allPingers, (current) => recreateStatefulPod(kube.kube, kube.containerds, current));
        podStartMs.push(now.addMs ?? 0);
        if (now.ip !== was.ip) notes.push(`re-created with ${now.ip}, not its former ${was.ip}`);
        if (now.node !== was.node) notes.push(`re-created on ${now.node}, not on ${was.node}`);
        break;
      }
      case 'crash-offline': {
        const kube = kubeOf(lab);
        const clusterIp = await exposePod(kube.kube, target.pod);
        cut = target.site;
        await cutUplink(lab, cut);
        const { was, now } = await replacePod(lab, target.pod, allPingers, (current) => crashSandbox(kube.containerds, current));
        podStartMs.push(now.addMs ?? 0);
        if (now.ip !== was.ip) notes.push(`restarted with ${now.ip}, not its former ${was.ip}`);
        const reach = await reachWhileCut(lab, target.site, now, clusterIp);
        facts.push(reach.line);
        notes.push(...reach.notes);
        await sleep(HOLD_MS['crash-offline']);
        break;
      }
      case 'policy-offline': {
        const { kube } = kubeOf(lab);
        cut = target.site;
        await cutFromCloud(lab, cut, target.cloud);
        await sleep(1000);
        // set before the deletion: the later faults are judged by the lab's policies, whatever happens here
        afterSamples = async () => {
          const again = await applyLabPolicies(kube, lab.plan);
          facts.push(`${target.policy} applied again: the lab's policies in force on every node ${again.inForceMs} ms later`);
        };
        changedAt = performance.now();
        await kube.kubectl(['delete', 'networkpolicy', target.policy, '-n', LAB_POD_NAMESPACE]);
        await sleep(HOLD_MS['policy-offline']);
        break;
      }
      case 'node-reboot-offline': {
        cut = target.site;
        await cutFromCloud(lab, cut, target.cloud);
        await sleep(1000);
        const samplers = pingers.filter((p) => target.samples.includes(p.pair));
        const rebooted = await rebootNodeOffline(lab, target.node, async (pod, now) => {
          await replacePod(lab, pod, allPingers, async () => now);
        }, (since) => samplers.every((p) => p.healthy(since)), notes);
        if (rebooted.podsBackMs !== undefined) podStartMs.push(rebooted.podsBackMs);
        facts.push(...rebooted.facts);
        await sleep(HOLD_MS['node-reboot-offline']);
        break;
      }
      case 'agent-roll': {
        const kube = kubeOf(lab);
        const ipsBefore = await podIps(kube.kube);
        const held = await nodeHoldings(lab);
        const restarts = await rollAgents(kube.kube, kube.containerds, ATOLL_ROLL_TAG);
        for (const r of restarts) windows.push({ fromMs: r.fromMs, toMs: (r.toMs ?? performance.now()) + RESTART_GRACE_MS, label: `${r.node}'s agent restart`, nodes: [r.node] });
        const unseen = [...held.keys()].filter((n) => !restarts.some((r) => r.node === n));
        if (unseen.length > 0) notes.push(`no agent restart seen on ${unseen.join(', ')}: did the roll reach it?`);
        notes.push(...restarts.filter((r) => r.toMs === undefined).map((r) => `${r.node}'s new agent was not seen ready`));
        facts.push(`agent restarts (old pod stopping to new pod ready): ${restarts.map((r) => `${r.node} ${r.toMs === undefined ? 'never ready' : `${((r.toMs - r.fromMs) / 1000).toFixed(1)} s`}`).join(', ')}`);
        const ipsAfter = await podIps(kube.kube);
        const holdsNow = await nodeHoldings(lab);
        const changed = [
          ...[...held].filter(([node, was]) => holdsNow.get(node) !== was).map(([node, was]) => `${node} changed across the roll: ${was} -> ${holdsNow.get(node)}`),
          ...[...ipsBefore].filter(([pod, was]) => ipsAfter.get(pod) !== was).map(([pod, was]) => `pod ${pod} changed its IP across the roll: ${was} -> ${ipsAfter.get(pod)}`),
        ];
        notes.push(...changed);
        facts.push(`rolled to atoll.dev/atoll:${ATOLL_ROLL_TAG}: ${changed.length === 0 ? 'pod IPs, routes and VTEP MACs unchanged' : 'changes (notes)'} on ${held.size} nodes, ${ipsBefore.size} pods`);
        break;
      }
      case 'node-delete':
        facts.push(...await deleteNode(lab, target.node, notes));
        break;
      case 'offline-restart-all':
        cut = target.site;
        await cutFromCloud(lab, cut, target.cloud);
        for (const [i, node] of target.nodes.entries()) {
          await sleep(HOLD_MS['offline-restart-all']);
          if (lab.kubernetes) {
            // its kubelet starts the container again when it will (at once after a first crash, later after its back-off):
            // no agent is held down for the watch
            for (const r of await killAtollContainers(lab, 'agent', [node])) {
              windows.push({ fromMs: r.fromMs, toMs: r.toMs + RESTART_GRACE_MS, label: `${node}'s restart` });
              facts.push(`${node}'s agent container killed offline, running and ready again after ${((r.toMs - r.fromMs) / 1000).toFixed(1)} s`);
            }
            continue;
          }
          const killedAt = performance.now();
          // the first agent stays down past its peers' 3 s deadline: they must show it being rebuilt (`atoll peers`)
          await restartAgent(lab, node, i > 0 ? undefined : async () => {
            await sleep(WATCH_DOWN_MS);
            const seen = await rebuildingLine(lab, target.watcher, node);
            if (seen) facts.push(`while ${node}'s agent was down, \`atoll peers\` on ${target.watcher}: ${seen}`);
            else notes.push(`${target.watcher} did not show the path to ${node} being rebuilt without the relay`);
          });
          windows.push({ fromMs: killedAt, toMs: performance.now() + RESTART_GRACE_MS, label: `${node}'s restart` });
        }
        await sleep(HOLD_MS['offline-restart-all']);
        break;
      case 'nat-reboot-offline': {
        cut = target.site;
        await cutFromCloud(lab, cut, target.cloud);
        await sleep(1000);
        const flushedAt = performance.now();
        await flushConntrack(routerOf(lab, cut));
        windows.push({ fromMs: flushedAt, toMs: flushedAt + NAT_REBOOT_WINDOW_MS, label: 'the NAT reboot' });
        await sleep(HOLD_MS['nat-reboot-offline']);
        break;
      }
      case 'clock-jump': {
        cut = target.site;
        await cutFromCloud(lab, cut, target.cloud);
        await sleep(1000);
        const files = target.nodes.map((n) => lab.clockFiles.get(n)).filter((f) => f !== undefined);
        for (const f of files) writeFileSync(f, `${CLOCK_JUMP}\n`);
        await sleep(HOLD_MS['clock-jump']);
        // libfaketime cannot step a monotonic clock back (no kernel does): set the clocks right and restart the agents
        afterSamples = async () => {
          for (const f of files) writeFileSync(f, '+0\n');
          for (const n of target.nodes) await restartAgent(lab, n);
        };
        break;
      }
      case 'readdress-offline': {
        cut = target.site;
        await cutFromCloud(lab, cut, target.cloud);
        await sleep(1000);
        windows.push({ fromMs: performance.now(), toMs: Infinity, label: 'both ends moved: down until the cloud is back' });
        for (const m of target.moves) await moveRouter(lab, m.site, m.from, m.to);
        await sleep(HOLD_MS['readdress-offline'] / 2);
        const seen = await rebuildingLine(lab, target.watcher, target.watched);
        if (seen) facts.push(`with both ends moved and ${target.site} cut off, \`atoll peers\` on ${target.watcher}: ${seen}`);
        else notes.push(`${target.watcher} did not show the path to ${target.watched} being rebuilt`);
        await sleep(HOLD_MS['readdress-offline'] / 2);
        afterSamples = async () => {
          for (const m of target.moves) await moveRouter(lab, m.site, m.to, m.from);
          // the moved paths look fine until their 3 s deadline: wait past it, then until every pair is back on its path
          await sleep(PATH_DEAD_MS + 1000);
          await waitForTunnelPaths(lab.plan, PATHS_TIMEOUT_MS);
        };
        break;
      }
      case 'uplink-cut':
        cut = target.site;
        await cutUplink(lab, cut);
        await sleep(HOLD_MS['uplink-cut']);
        break;
      case 'uplink-flap':
        cut = target.site;
        for (let i = 0; i < FLAPS; i++) {
          await cutUplink(lab, cut);
          await sleep(FLAP_MS);
          if (i < FLAPS - 1) {
            await restoreUplink(lab, cut);
            await sleep(FLAP_MS);
          }
        }
        break;
      case 'node-reboot': {
        cut = target.site;
        const node = target.node;
        await cutUplink(lab, cut);
        await restartAgent(lab, node, () => wipeNode(lab, node));
        for (const pod of lab.plan.pods.filter((p) => p.node === node)) {
          const { was, now } = await recreatePod(lab, pod.name, allPingers);
          podStartMs.push(now.addMs ?? 0);
          if (now.ip !== was.ip) notes.push(`${pod.name} came back with ${now.ip}, not its former ${was.ip}`);
        }
        await sleep(HOLD_MS['node-reboot']);
        break;
      }
    }
    if (cut) {
      await restoreUplink(lab, cut);
      cut = undefined;
    }
    if (target.kind !== 'offline-restart') healAt = performance.now();
    heldMs = Math.round(healAt - tFault);
    // meanwhile, every tunnel pair back on its expected path (hole-punched pairs punched again)
    const pathsBack = waitForTunnelPaths(lab.plan, PATHS_TIMEOUT_MS).then(
      () => (pathsBackMs = Math.round(performance.now() - healAt)),
      (err: unknown) => notes.push(firstLine(asAtollError(err).message)),
    );
    await waitUntil(() => pingers.every((p) => p.healthy(healAt)) && flows.every((f) => f.caughtUp()), RECOVERY_TIMEOUT_MS);
    await pathsBack;
  } catch (err) {
    notes.push(`the fault failed: ${firstLine(asAtollError(err).message)}`);
  } finally {
    if (cut) await restoreUplink(lab, cut).catch((e: unknown) => notes.push(`could not restore the uplink of ${cut}: ${asAtollError(e).message}`));
  }
  const samples: SampleStats[] = [];
  for (const p of pingers) {
    const st = sampleStats(p.pair, p.replies, await p.stop(), healAt);
    const ends = [p.pair.from, p.pair.to].map((pod) => lab.pods.find((q) => q.name === pod)?.node ?? '');
    const interval = Number(PING_INTERVAL_S) * 1000;
    const outside = target.strict ? lostOutsideWindows(p.replies, windowsFor(windows, ends), interval) : undefined;
    const inHand = windowsFor(windows, ends).filter((w) => w.inHand);
    // lost in a killed agent's hands: the gaps the kill windows excuse
    const lostInHand = inHand.length === 0 ? 0 : lostOutsideWindows(p.replies, [], interval).lost - lostOutsideWindows(p.replies, inHand, interval).lost;
    samples.push(outside ? { ...st, lostOutsideWindows: outside.lost, outsideRuns: outside.runs.map((r) => ({ ...r, fromMs: Math.round(r.fromMs - t0), toMs: Math.round(r.toMs - t0) })), ...(lostInHand > 0 ? { lostInHand } : {}) } : st);
  }
  const denied: DeniedSample[] = [];
  for (const p of deniedPingers) {
    const sent = await p.stop();
    const first = Math.min(...p.replies.map((r) => r.atMs));
    denied.push({ ...p.pair, sent, received: p.replies.length, ...(Number.isFinite(first) ? { firstReplyMs: Math.round(first - t0) } : {}) });
  }
  if (denied.length > 0) facts.push(`denied pairs pinged throughout: ${denied.map((d) => `${d.from} -> ${d.to} ${d.received} of ${d.sent} answered`).join(', ')}`);
  const policyChange = target.kind === 'policy-offline' && changedAt !== undefined
    ? policyChangeSeen(target.policy, pingers.filter((p) => target.held.includes(p.pair)), pingers.filter((p) => target.opened.includes(p.pair)), changedAt, healAt)
    : undefined;
  if (policyChange && target.kind === 'policy-offline') {
    facts.push(`while ${target.site} was cut off, pairs elsewhere that ${policyChange.policy} denied opened ${policyChange.opened.map((o) => `${o.openedAfterChangeMs ?? 'never'} ms`).join(', ')} after its deletion; `
      + `pairs into ${target.site} stayed blocked (${policyChange.held.map((h) => `${h.repliesBeforeHeal} replies`).join(', ')}) and opened ${policyChange.held.map((h) => `${h.openedAfterHealMs ?? 'never'} ms`).join(', ')} after the heal`);
  }
  if (afterSamples) await afterSamples().catch((err: unknown) => notes.push(`after the samples: ${firstLine(asAtollError(err).message)}`));
  const flowResults: FlowResult[] = [];
  for (const f of flows) flowResults.push(await f.stop());
  const after = await measure(lab);
  facts.push(...(after.tunnelViews ?? []));
  const judged = judgeFault(target, {
    before: before.count, after: after.count, matrixMs: { before: before.ms, after: after.ms }, samples, flows: flowResults, ...(podStartMs.length ? { podStartMs } : {}), heldMs,
    ...(pathsBackMs !== undefined ? { pathsBackMs } : {}), beforeAgeMs, durationMs: Math.round(performance.now() - t0), notes,
    // a window open to the end (readdress-offline) ends with the fault
    windows: windows.map((w) => ({ ...w, fromMs: Math.round(w.fromMs - t0), toMs: Math.round(Math.min(w.toMs, performance.now()) - t0) })),
    denied, ...(policyChange ? { policyChange } : {}),
  });
  const result = facts.length > 0 ? { ...judged, facts } : judged;
  say(`    ${target.kind.padEnd(16)} ${result.ok ? 'ok  ' : 'FAIL'} convergence ${result.convergenceMs === undefined ? 'never' : `${result.convergenceMs} ms`}, paths back ${pathsBackMs === undefined ? 'never' : `${pathsBackMs} ms`}, loss ${result.lossPct ?? '-'}%, longest gap ${result.maxGapMs ?? '-'} ms, `
    + `before ${before.count.working}/${before.count.shouldWork} (ended ${beforeAgeMs} ms before), after ${after.count.working}/${after.count.shouldWork} (${((result.durationMs ?? 0) / 1000).toFixed(1)} s, matrices ${(before.ms / 1000).toFixed(1)} + ${(after.ms / 1000).toFixed(1)} s)`);
  for (const f of facts) say(`    ${''.padEnd(16)} ${f}`);
  return { result, after };
}

/** `--kubernetes`: the lab's Service checked after a fault, from every pod and node; a client that cannot reach it fails the fault. */
async function withServiceCheck(lab: RunningLab, kube: LabKubernetes, result: LabFaultResult, say: (l: string) => void): Promise<LabFaultResult> {
  const svc = await checkService({ plan: lab.plan, pods: lab.pods, kube, tag: lab.state.dir });
  const answered = svc.probes.filter((p) => p.ok).length;
  const failed = svc.probes.filter((p) => !p.ok).map((p) => `Service not reached from ${p.from}`);
  say(`    ${''.padEnd(16)} Service ${svc.clusterIp}:${svc.port} answered from ${answered}/${svc.probes.length} pods and nodes`);
  return { ...result, ok: result.ok && svc.ok, service: { answered, of: svc.probes.length }, notes: [...(result.notes ?? []), ...failed] };
}

/**
 * Runs `faults` one after the other on a running lab, each with its own matrix right before it and the matrix after
 * it. Never throws for a fault that misbehaves: it is reported as FAIL.
 */
export async function runFaults(lab: RunningLab, faults: readonly LabFaultKind[], opts: LabOptions & { readonly initial?: Measured }): Promise<LabFaultResult[]> {
  const say = opts.say;
  let last = opts.initial;
  say(`  faults: ${faults.join(', ')} (samples pinged every ${Number(PING_INTERVAL_S) * 1000} ms; the whole matrix right before and after each)`);
  const results: LabFaultResult[] = [];
  for (const kind of faults) {
    const planned = planFault(lab.plan, kind, lab.podRuntime.mode, lab.workloadPods, lab.policy?.denies, { openyurt: (lab.kubernetes?.yurthubs.size ?? 0) > 0 });
    const target = kind === 'clock-jump' && !('skipped' in planned) && lab.clockFiles.size === 0
      ? { kind, skipped: LIBFAKETIME ? 'the agents were not started under libfaketime (run with --faults including clock-jump)' : 'libfaketime is not installed (apt install libfaketime)' }
      : planned;
    if ('skipped' in target) {
      results.push({ kind, description: kind, skipped: target.skipped, ok: true });
      say(`    ${kind.padEnd(16)} skipped: ${target.skipped}`);
      continue;
    }
    const { result, after } = await runFault(lab, target, say, last);
    const checked = lab.kubernetes ? await withServiceCheck(lab, lab.kubernetes, result, say) : result;
    results.push(checked);
    // the logs as they are now: a later fault (agent-roll, node-reboot) replaces pods and their logs
    if (!checked.ok && opts.keepLogs) saveLogs(lab.plan, join(opts.keepLogs, `after-${kind}`), say);
    last = after;
  }
  return results;
}
