/**
 * The relay's circuits at scale, side by side in one run: many TCP pairs joined by a relay process, on loopback.
 *   ours       the joins of src/adapters/tunnel/splice-native.ts (the relay's own: splice(2) on the library's epoll threads);
 *   reference  Node's stream piping, `a.pipe(b)` and `b.pipe(a)`: the plain Node relay (how Atoll's first relay
 *              joined circuits: a `data` event, a Buffer and a write per chunk).
 *
 * For each side and repetition a fresh relay process (this file with `--serve ours|reference`) pairs the
 * connections it accepts in arrival order. This process opens N circuits (two connections each, one after the
 * other), checks a byte crosses each, samples the relay idle (threads, VmRSS, descriptors), then sends one way over B
 * of them for S seconds (a 1 MiB buffer written as fast as the socket takes it, the far end counting what arrives)
 * while it reads the relay's CPU time from /proc. Then it closes every circuit's ends and waits until the relay has
 * closed all of its side too (its sockets and pipes back to those it had before the first circuit). Sides alternate
 * (ours first in even repetitions). bench/README.md says what is measured and why.
 *
 * Usage: node bench/circuits.ts [--circuits N] [--busy B] [--seconds S] [--reps R] [--smoke] [--json FILE]
 *        [--timeout SECONDS] [--enforce]
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { readdirSync, readFileSync, readlinkSync, writeFileSync } from 'node:fs';
import { type AddressInfo, connect, createServer, type Socket } from 'node:net';
import { cpus, loadavg, release } from 'node:os';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { SpliceJoins } from '../src/adapters/tunnel/splice-native.ts';
import { until } from '../harness/wait.ts';
import { cleanUpOnExit, exitStatus, fmt, intOption, median, parseBenchArgs, runBench, table } from './common.ts';

type Side = 'ours' | 'reference';
const SIDES: readonly Side[] = ['ours', 'reference'];
/** The relay's worker threads are at most this many (native/atoll-splice.c, MAX_WORKERS). */
const MAX_WORKERS = 8;
const CLK_TCK = 100;

interface Options {
  readonly circuits: number;
  readonly busy: number;
  readonly seconds: number;
  readonly reps: number;
  readonly smoke: boolean;
  readonly timeoutS: number;
  readonly enforce: boolean;
  readonly json: string | undefined;
}

const USAGE = `usage: node bench/circuits.ts [options]
  --circuits N       circuits open at once per side (default 1000; 50 with --smoke)
  --busy B           of which carry a flow for the timed part (default 16; 4 with --smoke)
  --seconds S        length of the timed part (default 10; 2 with --smoke)
  --reps R           repetitions per side, alternating (default 3; 1 with --smoke)
  --smoke            a tiny run for CI
  --json FILE        write every sample and the summary to FILE
  --timeout SECONDS  abort (and clean up) after this long (default 600)
  --enforce          exit 1 when a target is missed (default: report only)`;

function parseOptions(argv: readonly string[]): Options {
  const v = parseBenchArgs(argv, USAGE, {
    circuits: { type: 'string' },
    busy: { type: 'string' },
    seconds: { type: 'string' },
    reps: { type: 'string' },
    enforce: { type: 'boolean', default: false },
  });
  const int = intOption(USAGE);
  const smoke = v.smoke === true;
  const circuits = int('circuits', v.circuits, smoke ? 50 : 1000, 1, 5000);
  return {
    circuits,
    busy: int('busy', v.busy, smoke ? 4 : 16, 1, circuits),
    seconds: int('seconds', v.seconds, smoke ? 2 : 10, 1, 120),
    reps: int('reps', v.reps, smoke ? 1 : 3, 1, 20),
    smoke,
    timeoutS: int('timeout', v.timeout, 600, 10),
    enforce: v.enforce === true,
    json: v.json,
  };
}

// ---------------------------------------------------------------------------------------------------------------
// The relay under test (`--serve SIDE`): pairs accepted connections in arrival order; prints its port.

function serve(side: Side): void {
  const joins = side === 'ours' ? new SpliceJoins(() => {}) : undefined;
  let waiting: Socket | undefined;
  const server = createServer((s) => {
    s.on('error', () => s.destroy());
    if (!waiting) {
      waiting = s;
      return;
    }
    const a = waiting;
    waiting = undefined;
    if (joins) {
      joins.join(a, s, 'bench');
    } else {
      a.pipe(s);
      s.pipe(a);
      a.on('close', () => s.destroy());
      s.on('close', () => a.destroy());
    }
  });
  server.listen(0, '127.0.0.1', () => process.stdout.write(`port ${(server.address() as AddressInfo).port}\n`));
  process.once('SIGTERM', () => {
    joins?.close();
    process.exit(0);
  });
}

// ---------------------------------------------------------------------------------------------------------------
// The driver

interface Proc {
  readonly threads: number;
  readonly rssKiB: number;
  readonly hwmKiB: number;
  /** Its sockets and pipes (the library's epoll and eventfd descriptors, which stay, are not counted). */
  readonly fds: number;
  /** utime + stime, in seconds. */
  readonly cpuS: number;
}

function sample(pid: number): Proc {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const field = (name: string) => Number(new RegExp(`^${name}:\\s+(\\d+)`, 'm').exec(status)?.[1]);
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const rest = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return {
    threads: field('Threads'),
    rssKiB: field('VmRSS'),
    hwmKiB: field('VmHWM'),
    fds: readdirSync(`/proc/${pid}/fd`).filter((fd) => {
      try {
        return /^(socket|pipe):/.test(readlinkSync(`/proc/${pid}/fd/${fd}`));
      } catch {
        return false; // closed meanwhile
      }
    }).length,
    cpuS: (Number(rest[11]) + Number(rest[12])) / CLK_TCK,
  };
}

/** The kernel's slab memory, system-wide (KiB): sockets, pipes' slot arrays and the like. */
function slabKiB(): number {
  return Number(/^Slab:\s+(\d+)/m.exec(readFileSync('/proc/meminfo', 'utf8'))?.[1]);
}

interface RunResult {
  readonly side: Side;
  readonly rep: number;
  readonly base: Proc;
  readonly idle: Proc;
  readonly busy: Proc;
  /** Slab growth from before the first circuit to the idle sample (KiB), system-wide: both ends' sockets too. */
  readonly slabKiB: number;
  readonly gbps: number;
  /** The relay's CPU over the timed part, % of one core. */
  readonly cpuPct: number;
  /** This process's (the flows' both ends), likewise. */
  readonly driverPct: number;
  /** Microseconds to open a circuit (both connections) and see a byte cross it, median. */
  readonly openUs: number;
  /** Milliseconds from closing every end to the relay holding no circuit's descriptor. */
  readonly drainMs: number;
}

async function startRelay(side: Side): Promise<{ child: ChildProcess; port: number }> {
  const child = spawn(process.execPath, [fileURLToPath(import.meta.url), '--serve', side], { stdio: ['ignore', 'pipe', 'inherit'] });
  const port = await new Promise<number>((resolve, reject) => {
    let out = '';
    child.stdout?.on('data', (d: Buffer) => {
      out += d.toString();
      const m = /port (\d+)/.exec(out);
      if (m) resolve(Number(m[1]));
    });
    child.once('exit', (code) => reject(new Error(`the ${side} relay exited (${code}) before listening`)));
  });
  return { child, port };
}

async function open(port: number): Promise<Socket> {
  const s = connect(port, '127.0.0.1');
  s.setNoDelay(true);
  await new Promise<void>((resolve, reject) => {
    s.once('connect', resolve);
    s.once('error', reject);
  });
  return s;
}

async function once(o: Options, side: Side, rep: number, live: Set<ChildProcess>): Promise<RunResult> {
  const { child, port } = await startRelay(side);
  live.add(child);
  const pid = child.pid as number;
  const ends: Socket[] = [];
  try {
    await sleep(500);
    const base = sample(pid);
    const slab0 = slabKiB();
    const circuits: { a: Socket; b: Socket; got: number }[] = [];
    const openUs: number[] = [];
    for (let i = 0; i < o.circuits; i++) {
      const t0 = performance.now();
      const a = await open(port);
      const b = await open(port);
      ends.push(a, b);
      const c = { a, b, got: 0 };
      b.on('data', (d: Buffer) => { c.got += d.length; });
      a.resume();
      const first = new Promise<void>((resolve) => b.once('data', () => resolve()));
      a.write('x');
      await first;
      openUs.push((performance.now() - t0) * 1000);
      circuits.push(c);
    }
    await sleep(2000);
    const idle = sample(pid);
    const slab = slabKiB() - slab0;
    const chunk = Buffer.alloc(1 << 20, 7);
    const busy = circuits.slice(0, o.busy);
    let sending = true;
    for (const c of busy) {
      const pump = () => {
        while (sending && c.a.write(chunk)) { /* until the socket pushes back */ }
      };
      c.a.on('drain', pump);
      pump();
    }
    await sleep(1000); // the flows ramp up
    const got0 = busy.reduce((n, c) => n + c.got, 0);
    const cpu0 = sample(pid).cpuS;
    const driver0 = process.cpuUsage();
    const t0 = performance.now();
    await sleep(o.seconds * 1000);
    const got1 = busy.reduce((n, c) => n + c.got, 0);
    const elapsedS = (performance.now() - t0) / 1000;
    const after = sample(pid);
    const driver = process.cpuUsage(driver0);
    sending = false;
    const t1 = performance.now();
    for (const s of ends) s.destroy();
    await until(`the ${side} relay to close every circuit`, () => sample(pid).fds <= base.fds, 30_000, 20);
    const drainMs = performance.now() - t1;
    return {
      side,
      rep,
      base,
      idle,
      busy: after,
      slabKiB: slab,
      gbps: ((got1 - got0) * 8) / elapsedS / 1e9,
      cpuPct: ((after.cpuS - cpu0) / elapsedS) * 100,
      driverPct: ((driver.user + driver.system) / 1e6 / elapsedS) * 100,
      openUs: median(openUs),
      drainMs,
    };
  } finally {
    for (const s of ends) s.destroy();
    child.kill('SIGTERM');
    await new Promise((r) => (child.exitCode !== null ? r(null) : child.once('exit', r)));
    live.delete(child);
  }
}

interface Summary {
  readonly threadsAdded: number;
  readonly rssPerCircuitKiB: number;
  readonly slabPerCircuitKiB: number;
  readonly idleRssMiB: number;
  readonly peakRssMiB: number;
  readonly gbps: number;
  readonly cpuPct: number;
  readonly cpuPerGbps: number;
  readonly driverPct: number;
  readonly openUs: number;
  readonly drainMs: number;
}

function summarize(rs: readonly RunResult[], circuits: number): Summary {
  const m = (f: (r: RunResult) => number) => median(rs.map(f));
  return {
    threadsAdded: Math.max(...rs.map((r) => r.idle.threads - r.base.threads)),
    rssPerCircuitKiB: m((r) => (r.idle.rssKiB - r.base.rssKiB) / circuits),
    slabPerCircuitKiB: m((r) => r.slabKiB / circuits),
    idleRssMiB: m((r) => r.idle.rssKiB / 1024),
    peakRssMiB: m((r) => r.busy.hwmKiB / 1024),
    gbps: m((r) => r.gbps),
    cpuPct: m((r) => r.cpuPct),
    cpuPerGbps: m((r) => r.cpuPct / r.gbps),
    driverPct: m((r) => r.driverPct),
    openUs: m((r) => r.openUs),
    drainMs: m((r) => r.drainMs),
  };
}

async function main(): Promise<number> {
  const o = parseOptions(process.argv.slice(2));
  const live = new Set<ChildProcess>();
  const watchdog = cleanUpOnExit({ cleanup: async () => { for (const c of live) c.kill('SIGKILL'); } }, o.timeoutS);
  const results: RunResult[] = [];
  process.stdout.write(`circuits: ${o.circuits} open, ${o.busy} busy for ${o.seconds} s, ${o.reps} rep(s) per side; ${cpus().length} CPUs, load ${loadavg()[0]?.toFixed(1)}\n`);
  for (let rep = 0; rep < o.reps; rep++) {
    for (const side of rep % 2 === 0 ? SIDES : [...SIDES].reverse()) {
      const r = await once(o, side, rep, live);
      results.push(r);
      process.stdout.write(`  rep ${rep} ${side.padEnd(9)} ${fmt(r.gbps, 2)} Gbit/s, relay ${fmt(r.cpuPct)} % of a core (ends ${fmt(r.driverPct)} %), ${r.idle.threads} threads, ${fmt(r.idle.rssKiB / 1024)} MiB idle, closed in ${fmt(r.drainMs, 0)} ms\n`);
    }
  }
  clearTimeout(watchdog);
  const s = { ours: summarize(results.filter((r) => r.side === 'ours'), o.circuits), reference: summarize(results.filter((r) => r.side === 'reference'), o.circuits) };
  const row = (name: string, f: (x: Summary) => number, digits = 1) => [name, '', fmt(f(s.ours), digits), fmt(f(s.reference), digits)];
  process.stdout.write('\n' + table([
    ['medians', '', 'ours', 'reference'],
    row(`threads added by ${o.circuits} circuits (max)`, (x) => x.threadsAdded, 0),
    row('idle VmRSS (MiB)', (x) => x.idleRssMiB),
    row('VmRSS per circuit (KiB)', (x) => x.rssPerCircuitKiB, 2),
    row('kernel slab per circuit, system-wide (KiB)', (x) => x.slabPerCircuitKiB, 2),
    row(`throughput, ${o.busy} flows (Gbit/s)`, (x) => x.gbps, 2),
    row('relay CPU (% of a core)', (x) => x.cpuPct),
    row('relay CPU per Gbit/s (% of a core)', (x) => x.cpuPerGbps, 2),
    row('the flows\' ends, this process (% of a core)', (x) => x.driverPct),
    row('peak VmRSS (MiB)', (x) => x.peakRssMiB),
    row('open a circuit (us)', (x) => x.openUs, 0),
    row('all closed after (ms)', (x) => x.drainMs, 0),
  ]) + '\n\n');
  const targets = [
    { name: `ours: threads added by ${o.circuits} circuits <= ${MAX_WORKERS}`, ok: s.ours.threadsAdded <= MAX_WORKERS },
    { name: 'relay CPU per Gbit/s, ours / reference <= 1.0', ok: s.ours.cpuPerGbps / s.reference.cpuPerGbps <= 1.0, ratio: s.ours.cpuPerGbps / s.reference.cpuPerGbps },
    { name: 'idle VmRSS per circuit, ours / reference <= 1.0', ok: s.ours.rssPerCircuitKiB <= s.reference.rssPerCircuitKiB, ratio: s.ours.rssPerCircuitKiB / s.reference.rssPerCircuitKiB },
  ];
  for (const t of targets) process.stdout.write(`${t.ok ? 'PASS' : 'MISS'}  ${t.name}${t.ratio === undefined ? '' : ` (${fmt(t.ratio, 3)})`}\n`);
  if (o.json) writeFileSync(o.json, JSON.stringify({ options: o, machine: { cpus: cpus().length, kernel: release(), node: process.version }, results, summary: s, targets }, null, 2));
  return exitStatus(targets.filter((t) => !t.ok).length, o.enforce);
}

const serveAt = process.argv.indexOf('--serve');
if (serveAt < 0) runBench(main);
else {
  const side = process.argv[serveAt + 1];
  if (side !== 'ours' && side !== 'reference') {
    process.stderr.write(`bench/circuits.ts: --serve takes ours or reference, got ${JSON.stringify(side)}\n`);
    process.exit(2);
  }
  serve(side);
}
