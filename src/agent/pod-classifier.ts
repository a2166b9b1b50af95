/**
 * Classifies the node's pods that the NetworkPolicy view does not know from their CRI sandboxes (why:
 * src/core/policy/local-pods.ts). Each new sandbox is asked about once, in the background, and `onClassified` is
 * called when its answer arrives; a sync only reads what is known, so neither a sync nor a CNI ADD ever waits on the
 * runtime. Each call has the runtime's deadline. A sandbox the runtime does not hold yet (containerd registers it
 * once RunPodSandbox, which includes the CNI ADD, has returned), or a runtime that does not answer, is asked again
 * every 25 ms for 2 s (the pod is closed until then where a policy could select it: keep that short), then at
 * intervals doubling up to 1 s, for at most 30 s; then, or at once on any other failure, the pod is left to the
 * view (as without a runtime) and that is logged once for the sandbox (POLICY_POD_UNCLASSIFIED). A runtime that does
 * not answer is logged once per run (CRI_UNREACHABLE).
 */
import { asAtollError, atollError } from '../core/errors.ts';
import type { IpamRecord } from '../core/ipam/sticky-pool.ts';
import type { SandboxPod, SandboxRuntime } from '../core/policy/local-pods.ts';
import { keyOf } from '../core/policy/model.ts';
import type { Logger } from '../core/ports.ts';

const FIRST_RETRY_MS = 25;
/** How long to ask again at FIRST_RETRY_MS before backing off. */
const EAGER_MS = 2000;
const MAX_RETRY_MS = 1000;
const GIVE_UP_MS = 30_000;

export interface PodClassifierComponents {
  /** The node's runtime; without one nothing is classified. */
  readonly runtime: SandboxRuntime | undefined;
  readonly log: Logger;
  /** Called when a sandbox's pod became known. */
  readonly onClassified: () => void;
}

export class PodClassifier {
  readonly #c: PodClassifierComponents;
  readonly #known = new Map<string, SandboxPod>();
  /** Sandboxes being asked about, or waiting to be asked again. */
  readonly #asking = new Set<string>();
  /** Sandboxes given up on. */
  readonly #failed = new Set<string>();
  readonly #timers = new Set<NodeJS.Timeout>();
  #wanted = new Set<string>();
  #unreachableLogged = false;
  #stopped = false;

  constructor(c: PodClassifierComponents) {
    this.#c = c;
  }

  /**
   * The sandbox pods known of `wanted` (records to classify, by containerId), asking about those not asked yet;
   * forgets the sandboxes no longer wanted. `asked` settles (never rejects) when those first answers are in, each
   * within the runtime's deadline.
   */
  classify(wanted: readonly IpamRecord[]): { readonly classified: ReadonlyMap<string, SandboxPod>; readonly asked: Promise<void> } {
    this.#wanted = new Set(wanted.map((r) => r.containerId));
    for (const id of this.#known.keys()) if (!this.#wanted.has(id)) this.#known.delete(id);
    for (const id of this.#failed) if (!this.#wanted.has(id)) this.#failed.delete(id);
    const asks: Promise<void>[] = [];
    if (this.#c.runtime !== undefined && !this.#stopped) {
      for (const r of wanted) {
        if (this.#known.has(r.containerId) || this.#asking.has(r.containerId) || this.#failed.has(r.containerId)) continue;
        asks.push(this.#ask(this.#c.runtime, r, Date.now(), FIRST_RETRY_MS));
      }
    }
    return { classified: this.#known, asked: Promise.all(asks).then(() => undefined) };
  }

  /** Whether sandboxes are read at all (a runtime was given, and this has not stopped). */
  get reads(): boolean {
    return this.#c.runtime !== undefined && !this.#stopped;
  }

  /** The sandboxes given up on (the runtime could not tell), by id. */
  givenUp(): string[] {
    return [...this.#failed];
  }

  /** The sandbox pods known so far, by sandbox id. */
  known(): ReadonlyMap<string, SandboxPod> {
    return this.#known;
  }

  /** Stops asking (timers cleared; answers still under way are dropped). */
  stop(): void {
    this.#stopped = true;
    for (const t of this.#timers) clearTimeout(t);
    this.#timers.clear();
  }

  async #ask(runtime: SandboxRuntime, r: IpamRecord, firstAt: number, delayMs: number): Promise<void> {
    const id = r.containerId;
    this.#asking.add(id);
    let again: { why: string; code: string };
    try {
      const pod = await runtime.sandboxPod(id);
      if (pod !== undefined) {
        if (this.#wanted.has(id) && !this.#stopped) {
          this.#known.set(id, pod);
          this.#c.onClassified();
        }
        this.#asking.delete(id);
        return;
      }
      again = { why: `the runtime holds no sandbox ${id}`, code: 'CRI_CALL_FAILED' };
    } catch (e) {
      const err = asAtollError(e);
      if (err.code !== 'CRI_UNREACHABLE') return this.#fail(r, err.message, err.code);
      if (!this.#unreachableLogged) {
        this.#unreachableLogged = true;
        this.#c.log.warn('the container runtime does not answer on its CRI socket; pods the NetworkPolicy view does not know wait for it', { code: err.code, err: err.message });
      }
      again = { why: err.message, code: err.code };
    }
    if (!this.#wanted.has(id) || this.#stopped) {
      this.#asking.delete(id);
      return;
    }
    if (Date.now() - firstAt >= GIVE_UP_MS) return this.#fail(r, `${again.why} after ${GIVE_UP_MS / 1000} s`, again.code);
    const timer = setTimeout(() => {
      this.#timers.delete(timer);
      if (!this.#wanted.has(id) || this.#stopped) {
        this.#asking.delete(id);
        return;
      }
      void this.#ask(runtime, r, firstAt, Date.now() - firstAt < EAGER_MS ? FIRST_RETRY_MS : Math.min(delayMs * 2, MAX_RETRY_MS));
    }, delayMs);
    this.#timers.add(timer);
  }

  #fail(r: IpamRecord, why: string, causeCode: string): void {
    this.#asking.delete(r.containerId);
    if (!this.#wanted.has(r.containerId) || this.#stopped) return;
    this.#failed.add(r.containerId);
    const err = atollError('POLICY_POD_UNCLASSIFIED', `pod ${keyOf(r)} (sandbox ${r.containerId}) could not be classified from its CRI sandbox: ${why}`,
      'no policy selects it until the controller sends it; check the container runtime (criSocket) if this repeats');
    this.#c.log.error('a pod the NetworkPolicy view does not know could not be classified', { code: err.code, cause: causeCode, err: err.message });
    // no longer being read: the pod is closed no more, left to the view
    this.#c.onClassified();
  }
}
