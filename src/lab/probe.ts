/**
 * The lab's TCP probe, one process per pod (`atoll lab probe`, started in the pod's namespace): a TCP echo server
 * for the others to reach, and a client that measures connections to the others on request. Requests and answers
 * are JSON lines on stdin and stdout. It exits when stdin closes (so it dies with the lab, even after a crash) and
 * after `--max-seconds` in any case.
 *
 * Lab side: {@link ProbeClient} starts one and sends it requests.
 */
import { connect, createServer, type Socket } from 'node:net';
import { createInterface } from 'node:readline';
import type { TcpResult } from './plan/report.ts';
import { atollError } from '../core/errors.ts';
import { Child } from './io/child-process.ts';
import { ATOLL_BIN } from './agent-process.ts';

// not an ESM import, whose facade loads far more (the rule in eslint.config.js says why)
const { parseArgs } = process.getBuiltinModule('node:util');

export const PROBE_PORT = 7777;
const PAYLOAD = 'atoll-lab-probe\n';

interface ProbeRequest {
  readonly id: number;
  readonly host: string;
  readonly port: number;
  readonly timeoutMs: number;
}

/** One TCP round trip to `host`: connect (about one RTT), send a line, read it back from the echo. */
function tcpProbe(host: string, port: number, timeoutMs: number): Promise<TcpResult> {
  return new Promise((resolve) => {
    const t0 = performance.now();
    let connectMs: number | undefined;
    let t1 = 0;
    let got = '';
    const sock: Socket = connect({ host, port });
    const done = (r: TcpResult) => {
      clearTimeout(timer);
      sock.destroy();
      resolve(r);
    };
    const timer = setTimeout(() => done({ ok: false, connectMs, error: connectMs === undefined ? `no connection within ${timeoutMs} ms` : `no echo within ${timeoutMs} ms` }), timeoutMs);
    sock.setNoDelay(true);
    sock.on('connect', () => {
      connectMs = performance.now() - t0;
      t1 = performance.now();
      sock.write(PAYLOAD);
    });
    sock.on('data', (d: Buffer) => {
      got += d.toString('utf8');
      if (got === PAYLOAD) done({ ok: true, connectMs, echoMs: performance.now() - t1 });
      else if (got.length >= PAYLOAD.length) done({ ok: false, connectMs, error: 'the echo came back garbled' });
    });
    sock.on('error', (e: NodeJS.ErrnoException) => done({ ok: false, connectMs, error: e.code ?? e.message }));
  });
}

/** `atoll lab probe --port P --tag DIR --max-seconds S`: the in-pod side. */
export async function runProbe(argv: readonly string[]): Promise<number> {
  const { values } = parseArgs({ args: [...argv], options: { port: { type: 'string', default: String(PROBE_PORT) }, tag: { type: 'string' }, 'max-seconds': { type: 'string', default: '600' } } });
  const port = Number(values.port);
  const server = createServer((s) => {
    s.setTimeout(5000, () => s.destroy());
    s.on('error', () => s.destroy());
    s.pipe(s);
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, '0.0.0.0', () => resolve());
  });
  const write = (o: unknown) => process.stdout.write(`${JSON.stringify(o)}\n`);
  write({ ready: true, port });
  const lifetime = setTimeout(() => process.exit(3), Number(values['max-seconds']) * 1000);
  lifetime.unref();
  const lines = createInterface({ input: process.stdin });
  for await (const line of lines) {
    let req: ProbeRequest;
    try {
      req = JSON.parse(line) as ProbeRequest;
    } catch {
      continue;
    }
    void tcpProbe(req.host, req.port, req.timeoutMs).then((r) => write({ id: req.id, ...r }));
  }
  server.close();
  return 0;
}

/** What to do when a pod's probe does not come up. */
const PROBE_FIX = 'its stderr is quoted: the probe is `atoll lab probe`, started inside the pod\'s network namespace';

/** The lab side of one pod's probe process. */
export class ProbeClient {
  readonly #proc: Child;
  readonly #pending = new Map<number, (r: TcpResult) => void>();
  #next = 1;
  #ready: Promise<void>;

  /**
   * Starts the probe behind `enter` (an argument prefix leading into the pod's network namespace); `pod` names it in
   * errors; `tag` goes on its command line (the run's directory).
   */
  constructor(enter: readonly string[], pod: string, tag: string, port = PROBE_PORT) {
    const argv = [...enter, ATOLL_BIN, 'lab', 'probe', '--port', String(port), '--tag', tag];
    this.#proc = new Child(argv, { stdin: true, output: 'pipe' });
    this.#proc.stdin?.on('error', () => {});
    let stderr = '';
    this.#proc.stderr?.on('data', (d: Buffer) => {
      stderr = (stderr + d.toString()).slice(-2000);
    });
    const lines = createInterface({ input: this.#proc.stdout as NodeJS.ReadableStream });
    this.#ready = new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(atollError('LAB_STEP_FAILED', `the TCP probe in pod ${pod} did not start within 20 s: ${stderr}`, PROBE_FIX)), 20_000);
      void this.#proc.exited().then((code) => {
        clearTimeout(timer);
        reject(atollError('LAB_STEP_FAILED', `the TCP probe in pod ${pod} exited (${code}): ${stderr}`, PROBE_FIX));
        for (const [, settle] of this.#pending) settle({ ok: false, error: 'the probe exited' });
        this.#pending.clear();
      });
      lines.on('line', (line) => {
        const msg = JSON.parse(line) as { ready?: boolean; id?: number } & TcpResult;
        if (msg.ready) {
          clearTimeout(timer);
          resolve();
        } else if (msg.id !== undefined) {
          const { id, ...result } = msg;
          this.#pending.get(id)?.(result);
          this.#pending.delete(id);
        }
      });
    });
    this.#ready.catch(() => {});
  }

  get pid(): number | undefined {
    return this.#proc.pid;
  }

  ready(): Promise<void> {
    return this.#ready;
  }

  /** A TCP round trip from this pod to `host:port`, bounded by `timeoutMs`. */
  tcp(host: string, timeoutMs: number, port = PROBE_PORT): Promise<TcpResult> {
    const id = this.#next++;
    return new Promise((resolve) => {
      this.#pending.set(id, resolve);
      this.#proc.stdin?.write(`${JSON.stringify({ id, host, port, timeoutMs })}\n`);
    });
  }

  /** Closes stdin (the probe exits by itself); kills it by PID if it lingers. */
  async close(): Promise<void> {
    const p = this.#proc;
    if (!p.running) return;
    p.stdin?.end();
    const timer = setTimeout(() => p.kill('SIGKILL'), 2000);
    await p.exited();
    clearTimeout(timer);
  }
}
