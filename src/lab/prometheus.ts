/**
 * `atoll lab run --prometheus`: starts Debian's `prometheus` binary (not its system service) in the controller's
 * namespace with its own configuration and data directory under the run's directory, listening on that namespace's
 * loopback only, scraping every agent, the controller and the relay over the monitoring network. Then it checks the
 * PromQL answers against what the lab knows (src/lab/plan/monitoring.ts), that every query of the Grafana dashboard
 * (deploy/grafana/atoll.json) names a metric Prometheus scraped, and that a fault shows: the relay killed, relayed
 * peers down, then back once it restarts.
 */
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { atollError } from '../core/errors.ts';
import { Child, logTail } from './io/child-process.ts';
import { exec } from '../adapters/exec.ts';
import { installRoot } from '../adapters/install-root.ts';
import { healthyChecks, LAB_PROMETHEUS_LISTEN, metricNamesIn, type PromCheck, prometheusConfig, relayDownChecks } from './plan/monitoring.ts';
import { nsPath, recordProcess, type RunningLab } from './running-lab.ts';
import { restartService } from './fault-actions.ts';

export const PROMETHEUS_BIN = '/usr/bin/prometheus';
export const GRAFANA_DASHBOARD = join(installRoot(), 'deploy', 'grafana', 'atoll.json');

export interface PromCheckResult extends PromCheck {
  readonly phase: string;
  /** What Prometheus answered last (undefined: an empty result). */
  readonly got: number | undefined;
  readonly ok: boolean;
}

export interface LabPrometheusReport {
  readonly ok: boolean;
  readonly checks: readonly PromCheckResult[];
  /** Metric names the dashboard's queries use that Prometheus never scraped. */
  readonly dashboardMissing: readonly string[];
  readonly dashboardQueries: number;
  readonly notes: readonly string[];
}

const HEALTHY_TIMEOUT_MS = 45_000;
const RELAY_DOWN_TIMEOUT_MS = 20_000;
const RECOVERY_TIMEOUT_MS = 75_000;

class LabPrometheus {
  readonly #netns: string;
  readonly #child: Child;
  readonly #logPath: string;

  constructor(lab: RunningLab) {
    const dir = join(lab.plan.dir, 'prometheus');
    mkdirSync(join(dir, 'data'), { recursive: true, mode: 0o700 });
    writeFileSync(join(dir, 'prometheus.yml'), prometheusConfig(lab.plan));
    this.#netns = lab.plan.controller.netns;
    this.#logPath = join(dir, 'prometheus.log');
    this.#child = new Child(['ip', 'netns', 'exec', this.#netns, PROMETHEUS_BIN, `--config.file=${join(dir, 'prometheus.yml')}`,
      `--storage.tsdb.path=${join(dir, 'data')}`, `--web.listen-address=${LAB_PROMETHEUS_LISTEN}`, '--storage.tsdb.retention.time=1h'], { output: { log: this.#logPath }, detached: true });
    recordProcess(lab, 'prometheus', this.#child.pid);
  }

  async #get(path: string, params: Record<string, string> = {}): Promise<{ code: number; body: string }> {
    const args = ['-s', '-m', '5', '-o', '-', '-w', '\n%{http_code}', '-G', `http://${LAB_PROMETHEUS_LISTEN}${path}`, ...Object.entries(params).flatMap(([k, v]) => ['--data-urlencode', `${k}=${v}`])];
    const r = await exec('curl', args, { netns: nsPath(this.#netns) });
    const cut = r.stdout.lastIndexOf('\n');
    return { code: Number(r.stdout.slice(cut + 1)), body: r.stdout.slice(0, cut) };
  }

  async ready(timeoutMs = 30_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      if (!this.#child.running) throw atollError('LAB_STEP_FAILED', `prometheus exited:\n${logTail(this.#logPath, 20)}`, `its log is ${this.#logPath}`);
      if ((await this.#get('/-/ready')).code === 200) return;
      await sleep(250);
    }
    throw atollError('LAB_STEP_FAILED', `prometheus was not ready within ${timeoutMs} ms:\n${logTail(this.#logPath, 20)}`, `its log is ${this.#logPath}`);
  }

  /** The sum of an instant query's vector (undefined when empty or failed). */
  async value(query: string): Promise<number | undefined> {
    const r = await this.#get('/api/v1/query', { query });
    if (r.code !== 200) return undefined;
    const res = (JSON.parse(r.body) as { data: { resultType: string; result: { value: [number, string] }[] } }).data;
    if (res.result.length === 0) return undefined;
    return res.result.reduce((a, x) => a + Number(x.value[1]), 0);
  }

  async metricNames(): Promise<Set<string>> {
    const r = await this.#get('/api/v1/label/__name__/values');
    return new Set(r.code === 200 ? (JSON.parse(r.body) as { data: string[] }).data : []);
  }

  /** Polls until every check holds (then all are ok) or the time is up (the last answers, some not ok). */
  async until(phase: string, checks: readonly PromCheck[], timeoutMs: number): Promise<PromCheckResult[]> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const results = await Promise.all(checks.map(async (c) => {
        const got = await this.value(c.query);
        return { ...c, phase, got, ok: got !== undefined && Math.abs(got - c.expect) < 1e-9 };
      }));
      if (results.every((r) => r.ok) || Date.now() > deadline) return results;
      await sleep(1000);
    }
  }

  stop(): Promise<void> {
    return this.#child.stop();
  }
}

/** Every `expr` of a Grafana dashboard's panels. */
export function dashboardQueries(dashboard: unknown): string[] {
  const out: string[] = [];
  const walk = (v: unknown) => {
    if (Array.isArray(v)) v.forEach(walk);
    else if (v && typeof v === 'object') {
      for (const [k, x] of Object.entries(v)) {
        if (k === 'expr' && typeof x === 'string') out.push(x);
        else walk(x);
      }
    }
  };
  walk(dashboard);
  return out;
}

/**
 * Runs Prometheus against the lab and its checks; stops it again.
 * @throws AtollError LAB_PREREQUISITE_MISSING without Prometheus; LAB_STEP_FAILED when it cannot start.
 */
export async function runPrometheusChecks(lab: RunningLab, say: (line: string) => void): Promise<LabPrometheusReport> {
  if (!existsSync(PROMETHEUS_BIN)) throw atollError('LAB_PREREQUISITE_MISSING', `${PROMETHEUS_BIN} is missing: apt-get install prometheus (make setup does)`);
  const prom = new LabPrometheus(lab);
  const notes: string[] = [];
  try {
    await prom.ready();
    say(`  prometheus: ${LAB_PROMETHEUS_LISTEN} in ${lab.plan.controller.netns}, scraping ${lab.plan.nodes.length} agents, the controller and the relay`);
    const checks = await prom.until('healthy', healthyChecks(lab.plan), HEALTHY_TIMEOUT_MS);
    const scraped = await prom.metricNames();
    const queries = dashboardQueries(JSON.parse(readFileSync(GRAFANA_DASHBOARD, 'utf8')));
    const dashboardMissing = [...new Set(queries.flatMap(metricNamesIn))].filter((n) => !scraped.has(n)).sort();
    if (lab.plan.nodes.some((n) => n.site !== 'cloud')) {
      let down: PromCheckResult[] = [];
      await restartService(lab, 'relay', notes, async () => {
        down = await prom.until('relay killed', relayDownChecks(lab.plan), RELAY_DOWN_TIMEOUT_MS);
      });
      checks.push(...down, ...(await prom.until('relay back', healthyChecks(lab.plan), RECOVERY_TIMEOUT_MS)));
    } else notes.push('no edge site: the relay fault is skipped');
    const ok = checks.every((c) => c.ok) && dashboardMissing.length === 0;
    return { ok, checks, dashboardMissing, dashboardQueries: queries.length, notes };
  } finally {
    await prom.stop();
  }
}

/** The report as lines of text. */
export function renderPrometheusReport(r: LabPrometheusReport): string[] {
  const out = r.checks.map((c) => `${c.ok ? 'ok  ' : 'FAIL'} [${c.phase}] ${c.what}: ${c.query} = ${c.got ?? '(empty)'}${c.ok ? '' : `, expected ${c.expect}`}`);
  out.push(r.dashboardMissing.length === 0 ? `ok   grafana dashboard: ${r.dashboardQueries} queries, every metric they name was scraped`
    : `FAIL grafana dashboard: metrics never scraped: ${r.dashboardMissing.join(', ')}`);
  for (const n of r.notes) out.push(`note ${n}`);
  return out;
}
