/**
 * The agent's side of its NetworkPolicy worker (src/adapters/node/policy-worker.ts), a child process: each call is a message
 * over its IPC channel, answered in order. A child process, not a worker thread: the agent runs without V8's
 * compilers (`--jitless`, for its memory), and V8's flags are the whole process's; the worker compiles with them,
 * two to three times faster. It leaves when its channel closes, so it never outlives the agent, even a SIGKILLed
 * one. A worker that dies takes its view with it: every call after that fails (POLICY_ENGINE_FAILED), the ruleset in
 * the kernel stays in force, and the agent says so in its log; a restart of the agent starts a new one from the
 * kept view.
 */
import { type ChildProcess, fork } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { atollError } from '../../core/errors.ts';
import type { IpamRecord } from '../../core/ipam/sticky-pool.ts';
import type { Flow, PolicySide } from '../../core/policy/compile.ts';
import type { CompileRequest, CompileResult } from '../../core/policy/engine.ts';
import type { PolicyLine } from '../../core/policy/scope.ts';

export type PolicyRequest = { readonly id: number } & (
  | { readonly op: 'line'; readonly line: PolicyLine }
  | { readonly op: 'unknown'; readonly active: readonly IpamRecord[]; readonly nodeName: string }
  | { readonly op: 'compile'; readonly req: CompileRequest }
  | { readonly op: 'whole' }
  | { readonly op: 'committed'; readonly kept: boolean }
  | { readonly op: 'save'; readonly path: string }
  | { readonly op: 'explain'; readonly flow: Flow }
  | { readonly op: 'drops'; readonly counters: ReadonlyMap<string, number> });

export type PolicyResponse = { readonly id: number } & ({ readonly ok: true; readonly value: unknown } | { readonly ok: false; readonly message: string; readonly code: string });

type Body<R> = R extends unknown ? Omit<R, 'id'> : never;

/** The worker's file: beside this module, as TypeScript in a source checkout and as JavaScript in the bundle. */
const WORKER_PATH = fileURLToPath(new URL(import.meta.url.endsWith('.ts') ? './policy-worker.ts' : './policy-worker.js', import.meta.url));
/**
 * Its Node flags: V8's compilers on (not the agent's `--jitless`), a small young generation and `gc` exposed for the
 * collection when idle, as the agent's.
 */
const WORKER_NODE_FLAGS = ['--max-semi-space-size=1', '--expose-gc'];

export class PolicyCompute {
  readonly #worker: ChildProcess;
  readonly #waiting = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void }>();
  #next = 1;
  #failed: Error | undefined;

  /** `onFailure` hears once when the worker dies or cannot start. */
  constructor(onFailure: (err: Error) => void) {
    this.#worker = fork(WORKER_PATH, [], { execArgv: WORKER_NODE_FLAGS, serialization: 'advanced', stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
    this.#worker.on('message', (message) => {
      const res = message as PolicyResponse;
      const w = this.#waiting.get(res.id);
      if (!w) return;
      this.#waiting.delete(res.id);
      if (res.ok) w.resolve(res.value);
      else w.reject(atollError('POLICY_ENGINE_FAILED', `the NetworkPolicy worker failed: ${res.message} (${res.code})`, 'the ruleset in the kernel stays in force; the next change retries'));
    });
    const fail = (why: string) => {
      if (this.#failed) return;
      this.#failed = atollError('POLICY_ENGINE_FAILED', `the NetworkPolicy worker ${why}`,
        'the ruleset in the kernel stays in force, but changes are no longer applied: restart the agent (it starts from the kept view)');
      for (const w of this.#waiting.values()) w.reject(this.#failed);
      this.#waiting.clear();
      onFailure(this.#failed);
    };
    this.#worker.on('error', (e) => fail(`died: ${e.message}`));
    this.#worker.on('exit', (code, signal) => fail(`exited (${signal ?? `code ${code}`})`));
  }

  line(line: PolicyLine): Promise<void> {
    return this.#call({ op: 'line', line }) as Promise<void>;
  }

  unknown(active: readonly IpamRecord[], nodeName: string): Promise<IpamRecord[]> {
    return this.#call({ op: 'unknown', active, nodeName }) as Promise<IpamRecord[]>;
  }

  compile(req: CompileRequest): Promise<CompileResult> {
    return this.#call({ op: 'compile', req }) as Promise<CompileResult>;
  }

  whole(): Promise<string> {
    return this.#call({ op: 'whole' }) as Promise<string>;
  }

  committed(kept: boolean): Promise<void> {
    return this.#call({ op: 'committed', kept }) as Promise<void>;
  }

  /** Writes the view to `path`; resolves with why not when the disk refused it (full, read-only), undefined once written. */
  save(path: string): Promise<{ readonly message: string; readonly errno?: string } | undefined> {
    return this.#call({ op: 'save', path }) as Promise<{ message: string; errno?: string } | undefined>;
  }

  explain(flow: Flow): Promise<PolicySide[]> {
    return this.#call({ op: 'explain', flow }) as Promise<PolicySide[]>;
  }

  drops(counters: ReadonlyMap<string, number>): Promise<Map<string, number>> {
    return this.#call({ op: 'drops', counters }) as Promise<Map<string, number>>;
  }

  /** Stops the worker (what it was doing is dropped). */
  async close(): Promise<void> {
    this.#failed ??= atollError('POLICY_ENGINE_FAILED', 'the NetworkPolicy worker was stopped', 'nothing to do: the agent is stopping');
    if (this.#worker.exitCode !== null || this.#worker.signalCode !== null) return;
    const exited = new Promise((resolve) => this.#worker.once('exit', resolve));
    this.#worker.kill('SIGTERM');
    await exited;
  }

  #call(body: Body<PolicyRequest>): Promise<unknown> {
    if (this.#failed) return Promise.reject(this.#failed);
    const id = this.#next++;
    return new Promise((resolve, reject) => {
      this.#waiting.set(id, { resolve, reject });
      this.#worker.send({ ...body, id });
    });
  }
}
