/**
 * Many agents joining at once, simulated in one process: each simulated node has its own in-memory ed25519 identity
 * and its own {@link ControllerClient} (HTTPS with the pinned CA, fail-over across controller URLs, "not leader"
 * followed), and joins with the bootstrap token; a failed join is retried with jittered exponential backoff until a
 * deadline. Optionally each node then reports usage once with free = 0, which makes the controller lease it a
 * second block (an unanswered report is retried the same way, as an agent that never learnt of its new block would).
 *
 * Imported, each node's fields can be chosen (`fields`: its site, community, addresses, annotations, tunnel key) and
 * each joined node's key is handed back (`onJoined`), so that a caller can act as that node afterwards.
 *
 * At most `concurrency` requests are in flight at once; a node waiting out its backoff holds no slot. It prints (CLI)
 * or returns (import) one report; the CLI's stdout carries only that JSON object, progress goes to stderr as JSON
 * lines `{"progress":{"joined":N,"reported":M,"ms":T}}`.
 *
 * Usage: node harness/join-simulator.ts --urls https://192.0.2.1:17443[,URL...] --ca CA.pem --token TOKEN
 *        [--count 500] [--prefix sim-] [--deadline-ms 60000] [--concurrency 64] [--second-block [--phased]] [--progress-ms 250]
 */
import { generateKeyPairSync, randomBytes, sign } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { asAtollError } from '../src/core/errors.ts';
import type { NodeFields, NodeRecord } from '../src/core/cluster/model.ts';
import { ControllerClient } from '../src/adapters/node/controller-client.ts';
import type { NodeIdentity } from '../src/adapters/node/node-identity.ts';

export interface SimulationInit {
  readonly urls: readonly string[];
  readonly caPem: string;
  readonly token: string;
  readonly count: number;
  /** Node names are `${prefix}${index}` (index from 0, zero-padded to the width of count - 1): {@link simulatedName}. */
  readonly prefix: string;
  /**
   * The fields node `index` joins with, over the defaults (no site, community, address, annotation or tunnel key; a
   * random MAC). Called once per node, before its first join attempt.
   */
  readonly fields?: (index: number, name: string) => Partial<NodeFields>;
  /** Called once for each node whose join succeeded, with its key: to act as that node afterwards (sign, watch). */
  readonly onJoined?: (joined: JoinedNode) => void;
  /** Give up on nodes not done this long after the start. */
  readonly deadlineMs: number;
  /** Requests in flight at once (default 64). */
  readonly concurrency?: number;
  /** After joining, report usage once with free = 0 to get a second block. */
  readonly secondBlock?: boolean;
  /** With secondBlock: no node reports before every node has joined (or failed to), so the two phases time apart. */
  readonly phased?: boolean;
  /** Backoff bounds of a retried request (defaults 100 ms and 2000 ms). */
  readonly retryMinMs?: number;
  readonly retryMaxMs?: number;
  /** Per-request timeout of the client (default 10 s). */
  readonly requestTimeoutMs?: number;
  /** Called every `progressMs` with the running counts. */
  readonly onProgress?: (p: SimulationProgress) => void;
  readonly progressMs?: number;
}

/** A node that joined: its index and name, its in-memory key, and the controller's answer. */
export interface JoinedNode {
  readonly index: number;
  readonly name: string;
  readonly identity: NodeIdentity;
  readonly node: NodeRecord;
  readonly blocks: readonly string[];
}

export interface SimulationProgress {
  readonly joined: number;
  readonly reported: number;
  readonly ms: number;
}

/** An error seen, by code and message (URLs and node names kept), with how often it happened. */
export interface ErrorSample {
  readonly code: string;
  readonly message: string;
  count: number;
}

export interface SimulationReport {
  /** Nodes whose join succeeded. */
  readonly joined: number;
  /** Nodes not done by the deadline (join, or the usage report with --second-block). */
  readonly failed: number;
  /** Nodes whose usage report succeeded (0 without second-block). */
  readonly reported: number;
  /** Each node's blocks, as its last successful answer listed them. */
  readonly blocks: Record<string, string[]>;
  /** Blocks that two or more nodes' answers list. */
  readonly duplicates: Record<string, string[]>;
  /** Requests sent, including retries. */
  readonly attempts: number;
  /** Wall time from the start to the last node done, in ms. */
  readonly ms: number;
  /** With phased: when the last join settled, and from then to the last report settled, in ms. */
  readonly joinPhaseMs: number | undefined;
  readonly reportPhaseMs: number | undefined;
  /** When each join and each report succeeded, ms from the start, and each request's latency in ms. */
  readonly joinDoneMs: number[];
  readonly reportDoneMs: number[];
  readonly joinRequestMs: number[];
  readonly reportRequestMs: number[];
  /** Up to 20 distinct errors, most frequent first. */
  readonly errors: ErrorSample[];
}

/** A node key pair held in memory only. */
export function memoryIdentity(): NodeIdentity {
  const { privateKey, publicKey } = generateKeyPairSync('ed25519');
  return {
    publicKey: publicKey.export({ type: 'spki', format: 'der' }).toString('base64'),
    sign: (data) => sign(null, typeof data === 'string' ? Buffer.from(data, 'utf8') : data, privateKey).toString('base64'),
  };
}

/** The name of simulated node `index` of `count`: `${prefix}${index}`, the index zero-padded to the width of count - 1. */
export function simulatedName(prefix: string, count: number, index: number): string {
  return `${prefix}${String(index).padStart(String(Math.max(0, count - 1)).length, '0')}`;
}

/** A counting semaphore: at most `n` holders. */
class Slots {
  #free: number;
  readonly #waiting: (() => void)[] = [];

  constructor(n: number) {
    this.#free = n;
  }

  async run<T>(fn: () => Promise<T>): Promise<T> {
    if (this.#free > 0) this.#free--;
    else await new Promise<void>((resolve) => this.#waiting.push(resolve));
    try {
      return await fn();
    } finally {
      const next = this.#waiting.shift();
      if (next) next();
      else this.#free++;
    }
  }
}

const MAX_ERROR_SAMPLES = 20;

/** Joins `count` simulated nodes (see the file header); never throws for a node that fails, it is counted. */
export async function simulateJoins(init: SimulationInit): Promise<SimulationReport> {
  const started = performance.now();
  const elapsed = () => Math.round(performance.now() - started);
  const deadline = started + init.deadlineMs;
  const slots = new Slots(init.concurrency ?? 64);
  const retryMin = init.retryMinMs ?? 100;
  const retryMax = init.retryMaxMs ?? 2000;
  const blocks: Record<string, string[]> = {};
  const errors = new Map<string, ErrorSample>();
  const joinDoneMs: number[] = [];
  const reportDoneMs: number[] = [];
  const joinRequestMs: number[] = [];
  const reportRequestMs: number[] = [];
  let attempts = 0;
  let lastDone = 0;
  let joinsSettled = 0;
  let joinPhaseMs: number | undefined;
  let allJoined = () => {};
  const barrier = new Promise<void>((resolve) => {
    allJoined = resolve;
  });
  const settleJoin = () => {
    if (++joinsSettled < init.count) return;
    joinPhaseMs = elapsed();
    allJoined();
  };

  const noteError = (e: unknown) => {
    const err = asAtollError(e);
    const key = `${err.code} ${err.message}`;
    const seen = errors.get(key);
    if (seen) seen.count++;
    else if (errors.size < 1000) errors.set(key, { code: err.code, message: err.message, count: 1 });
  };

  /** Runs `fn` in a slot until it succeeds or the deadline passes; undefined when it never succeeded. */
  const retrying = async <T>(fn: () => Promise<T>, latencies: number[]): Promise<T | undefined> => {
    let backoff = retryMin;
    while (performance.now() < deadline) {
      try {
        return await slots.run(async () => {
          attempts++;
          const t0 = performance.now();
          try {
            return await fn();
          } finally {
            latencies.push(performance.now() - t0);
          }
        });
      } catch (e) {
        noteError(e);
      }
      const wait = Math.min(backoff / 2 + Math.random() * (backoff / 2), Math.max(0, deadline - performance.now()));
      await new Promise((r) => setTimeout(r, wait));
      backoff = Math.min(retryMax, backoff * 2);
    }
    return undefined;
  };

  const progress = init.onProgress && setInterval(() => init.onProgress?.({ joined: joinDoneMs.length, reported: reportDoneMs.length, ms: elapsed() }), init.progressMs ?? 250);

  const simulateNode = async (index: number): Promise<boolean> => {
    const name = simulatedName(init.prefix, init.count, index);
    const identity = memoryIdentity();
    const client = new ControllerClient({ urls: init.urls, caPem: init.caPem, identity, nodeName: name, timeoutMs: init.requestTimeoutMs });
    try {
      const fields: NodeFields = { site: '', community: '', addresses: [], vtepMac: randomMac(), tunnelKey: '', agentVersion: 'join-simulator', ...init.fields?.(index, name) };
      const joined = await retrying(() => client.join(init.token, identity.publicKey, fields), joinRequestMs);
      if (joined) {
        blocks[name] = joined.blocks;
        joinDoneMs.push(elapsed());
        init.onJoined?.({ index, name, identity, node: joined.node, blocks: joined.blocks });
      }
      settleJoin();
      if (!joined) return false;
      if (init.secondBlock) {
        if (init.phased) await barrier;
        const reported = await retrying(() => client.reportUsage({ capacity: 0, allocated: 0, reserved: 0, free: 0 }), reportRequestMs);
        if (!reported) return false;
        blocks[name] = reported.blocks;
        reportDoneMs.push(elapsed());
      }
      lastDone = elapsed();
      return true;
    } finally {
      client.close();
    }
  };

  let done: boolean[];
  try {
    done = await Promise.all(Array.from({ length: init.count }, (_, i) => simulateNode(i)));
  } finally {
    if (progress) clearInterval(progress);
  }
  const holders = new Map<string, string[]>();
  for (const [node, list] of Object.entries(blocks)) for (const b of list) holders.set(b, [...(holders.get(b) ?? []), node]);
  return {
    joined: joinDoneMs.length,
    failed: done.filter((ok) => !ok).length,
    reported: reportDoneMs.length,
    blocks,
    duplicates: Object.fromEntries([...holders].filter(([, nodes]) => nodes.length > 1)),
    attempts,
    ms: done.every(Boolean) ? lastDone : elapsed(),
    joinPhaseMs: init.phased ? joinPhaseMs : undefined,
    reportPhaseMs: init.phased && init.secondBlock && joinPhaseMs !== undefined ? elapsed() - joinPhaseMs : undefined,
    joinDoneMs,
    reportDoneMs,
    joinRequestMs,
    reportRequestMs,
    errors: [...errors.values()].sort((a, b) => b.count - a.count).slice(0, MAX_ERROR_SAMPLES),
  };
}

function randomMac(): string {
  const b = randomBytes(6);
  b[0] = ((b[0] as number) & 0xfe) | 0x02; // unicast, locally administered
  return [...b].map((x) => x.toString(16).padStart(2, '0')).join(':');
}

const USAGE = `usage: node harness/join-simulator.ts --urls URL[,URL...] --ca CA.pem --token TOKEN [options]
  --count N          simulated nodes (default 500)
  --prefix P         node names P0..P(N-1), zero-padded (default sim-)
  --deadline-ms MS   give up on nodes not done by then (default 60000)
  --concurrency C    requests in flight at once (default 64)
  --second-block     after joining, report usage once with free=0 to get a second block
  --phased           with --second-block: reports start once every node has joined (times the phases apart)
  --progress-ms MS   progress lines on stderr this often (default 250; 0 for none)`;

async function main(argv: string[]): Promise<number> {
  const { values } = parseArgs({
    args: argv,
    strict: true,
    options: {
      urls: { type: 'string' },
      ca: { type: 'string' },
      token: { type: 'string' },
      count: { type: 'string', default: '500' },
      prefix: { type: 'string', default: 'sim-' },
      'deadline-ms': { type: 'string', default: '60000' },
      concurrency: { type: 'string', default: '64' },
      'second-block': { type: 'boolean', default: false },
      phased: { type: 'boolean', default: false },
      'progress-ms': { type: 'string', default: '250' },
    },
  });
  const int = (name: string, raw: string, min: number): number => {
    const n = Number(raw);
    if (!Number.isInteger(n) || n < min) throw new Error(`--${name} must be an integer >= ${min}, got "${raw}"\n${USAGE}`);
    return n;
  };
  if (!values.urls || !values.ca || !values.token) {
    process.stderr.write(`${USAGE}\n`);
    return 2;
  }
  const progressMs = int('progress-ms', values['progress-ms'], 0);
  const report = await simulateJoins({
    urls: values.urls.split(',').filter(Boolean),
    caPem: readFileSync(values.ca, 'utf8'),
    token: values.token,
    count: int('count', values.count, 1),
    prefix: values.prefix,
    deadlineMs: int('deadline-ms', values['deadline-ms'], 1),
    concurrency: int('concurrency', values.concurrency, 1),
    secondBlock: values['second-block'],
    phased: values.phased,
    progressMs,
    onProgress: progressMs > 0 ? (p) => process.stderr.write(`${JSON.stringify({ progress: p })}\n`) : undefined,
  });
  const { joinDoneMs: _j, reportDoneMs: _r, joinRequestMs, reportRequestMs, ...printed } = report;
  const sorted = [...joinRequestMs, ...reportRequestMs].sort((a, b) => a - b);
  const pct = (q: number) => Math.round(sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)] ?? 0);
  process.stdout.write(`${JSON.stringify({ ...printed, requestMsP50: pct(0.5), requestMsP99: pct(0.99) })}\n`);
  return report.failed === 0 ? 0 : 1;
}

if (import.meta.main) {
  main(process.argv.slice(2)).then((code) => {
    process.exitCode = code;
  }, (err: unknown) => {
    process.stderr.write(`join-simulator: ${err instanceof Error ? err.message : String(err)}\n`);
    process.exitCode = 2;
  });
}
