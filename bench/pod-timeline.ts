/**
 * Where a single pod's create-to-Running went in bench/kubelet.ts's `--kubernetes 1.37` mode (pure): when containerd
 * started its container (from containerd's log), and which PLEG relist of the kubelet (from its log) was the first to
 * begin after that start, the one that saw the container running. bench/README.md ("On-demand relist") explains why.
 *
 * With kubelet v1.34's generic PLEG that relist is the next global one (every 1 s); with v1.37's on-demand relist
 * (gate `PLEGOnDemandRelist`, GA) the pod worker asks for a relist of its pod right after the sync that started the
 * container, so the catching relist is usually that pod's own and begins a few ms after the start.
 */
import { lastAtOrBefore } from './relist-phase.ts';

/** What containerd's CRI log says about one pod (ms since the epoch); absent steps are not in the log. */
export interface ContainerdPodSteps {
  /** `RunPodSandbox for &PodSandboxMetadata{Name:<pod>,...}`: the request arrived. */
  sandboxRequested?: number;
  /** `RunPodSandbox ... returns sandbox id`: sandbox and network ready (the CNI ADD is inside). */
  sandboxReady?: number;
  /** `StartContainer for "<id>" returns successfully`, for the pod's (last) container. */
  containerStarted?: number;
}

const LOGRUS_TIME = /^time="(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)"/;

/** The time of a containerd (logrus text) log line, ms since the epoch with sub-ms precision; undefined without one. */
export function containerdLineTime(line: string): number | undefined {
  const m = LOGRUS_TIME.exec(line);
  if (!m) return undefined;
  const [, y, mo, d, h, mi, s, frac, zone] = m as unknown as [string, string, string, string, string, string, string, string | undefined, string];
  let t = Date.UTC(Number(y), Number(mo) - 1, Number(d), Number(h), Number(mi), Number(s));
  if (zone !== 'Z') {
    const sign = zone.startsWith('-') ? -1 : 1;
    t -= sign * (Number(zone.slice(1, 3)) * 60 + Number(zone.slice(4, 6))) * 60_000;
  }
  return t + (frac === undefined ? 0 : Number(`0.${frac}`) * 1000);
}

/** The message of a logrus text line (`msg="..."`, its quotes and backslashes escaped), unescaped. */
function logrusMessage(line: string): string | undefined {
  const m = /\smsg="((?:[^"\\]|\\.)*)"/.exec(line);
  return m === null ? undefined : (m[1] as string).replace(/\\(.)/g, '$1');
}

/**
 * Each pod's steps (by pod name) from containerd's CRI log (internal/cri/instrument/instrumented_service.go:
 * `RunPodSandbox for %+v`, `RunPodSandbox for %+v returns sandbox id %q`, `CreateContainer within sandbox %q for %+v
 * returns container id %q`, `StartContainer for %q returns successfully`). The sandbox metadata prints as protobuf
 * text in containerd 2.x (`name:"<pod>" uid:"..." namespace:"..."`) and as a Go struct in 1.6
 * (`&PodSandboxMetadata{Name:<pod>,...}`); both are read. A name used twice keeps its last pod's steps.
 */
export function containerdPodSteps(log: string): Map<string, ContainerdPodSteps> {
  const byPod = new Map<string, ContainerdPodSteps>();
  const podOfSandbox = new Map<string, string>();
  const podOfContainer = new Map<string, string>();
  for (const line of log.split('\n')) {
    if (!line.includes('msg="RunPodSandbox for ') && !line.includes('msg="CreateContainer within sandbox ') && !line.includes('msg="StartContainer for ')) continue;
    const msg = logrusMessage(line);
    const t = containerdLineTime(line);
    if (msg === undefined || t === undefined) continue;
    let m: RegExpExecArray | null;
    if ((m = /^RunPodSandbox for (?:&PodSandboxMetadata\{Name:([^,]+),.*?\}|name:"([^"]+)".*?)(?: returns sandbox id "([0-9a-f]+)")?$/.exec(msg))) {
      const pod = (m[1] ?? m[2]) as string;
      const sandbox = m[3];
      if (sandbox === undefined) {
        byPod.set(pod, { sandboxRequested: t });
      } else {
        const steps = byPod.get(pod) ?? {};
        steps.sandboxReady = t;
        byPod.set(pod, steps);
        podOfSandbox.set(sandbox, pod);
      }
    } else if ((m = /^CreateContainer within sandbox "([0-9a-f]+)" for .* returns container id "([0-9a-f]+)"$/.exec(msg))) {
      const pod = podOfSandbox.get(m[1] as string);
      if (pod !== undefined) podOfContainer.set(m[2] as string, pod);
    } else if ((m = /^StartContainer for "([0-9a-f]+)" returns successfully$/.exec(msg))) {
      const pod = podOfContainer.get(m[1] as string);
      const steps = pod === undefined ? undefined : byPod.get(pod);
      if (steps !== undefined) steps.containerStarted = t;
    }
  }
  return byPod;
}

/** Which relist first began after a pod's container started. */
export type CatchingRelist = 'on-demand' | 'global' | 'none';

/** One pod's start against the relists, all on one clock (ms). */
export interface RelistCatch {
  readonly kind: CatchingRelist;
  /** The start of that relist minus the container's start. */
  readonly afterStartMs: number | undefined;
}

/**
 * The first relist that began at or after `started` (the container's start) and before `running` (the watch's stamp):
 * the pod's own on-demand relists `podRelists` or the global ones `globalStarts` (both ascending). 'none' when no
 * relist of either kind began in that window (the log missed it, or the clocks disagree).
 */
export function catchingRelist(started: number, running: number, globalStarts: readonly number[], podRelists: readonly number[]): RelistCatch {
  const first = (xs: readonly number[]) => {
    const x = xs[lastAtOrBefore(xs, started - 1e-6) + 1];
    return x !== undefined && x <= running ? x : undefined;
  };
  const g = first(globalStarts);
  const p = first(podRelists);
  if (g === undefined && p === undefined) return { kind: 'none', afterStartMs: undefined };
  if (g === undefined || (p !== undefined && p <= g)) return { kind: 'on-demand', afterStartMs: (p as number) - started };
  return { kind: 'global', afterStartMs: g - started };
}
