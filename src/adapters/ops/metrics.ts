/**
 * Prometheus metrics for the components, on prom-client. The components keep plain counters where the work happens
 * (the tunnel's packet loop, the relay's circuits, IPAM) and this module reads them only when Prometheus scrapes
 * (collect callbacks), so the hot paths pay nothing per packet. Only what happens once per request (a CNI call, a
 * store operation) is observed as it happens, into a histogram.
 *
 * Naming follows Prometheus' conventions: `atoll_` prefix, base units (seconds, bytes), `_total` on counters, and
 * labels with a few fixed values each (a verb, a path kind, a reason), never a pod or node name.
 *
 * The four classes come from prom-client's own modules, not its index: the index also loads its default metrics,
 * cluster aggregation and push gateway, and with them node's http, perf_hooks and v8 modules; measured in a process
 * that already holds tls, https, net, dgram and child_process, the index adds 12.2 MB of RSS and the four modules
 * 3.2 MB; in a lab's idle agents, side by side, 1.4 to 1.6 MiB less.
 */
import Counter from 'prom-client/lib/counter.js';
import Gauge from 'prom-client/lib/gauge.js';
import Histogram from 'prom-client/lib/histogram.js';
import Registry from 'prom-client/lib/registry.js';

/** One value, or one value per label set. */
export type Samples = number | readonly (readonly [labels: Readonly<Record<string, string>>, value: number])[];

export type Read = () => Samples | Promise<Samples>;

/** Latency buckets for requests that take from a fraction of a millisecond to seconds. */
export const LATENCY_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];

export class Metrics {
  readonly registry = new Registry();

  /** A value that goes up and down, read at scrape time. */
  gauge(name: string, help: string, read: Read, labelNames: readonly string[] = []): void {
    new Gauge({
      name, help, labelNames, registers: [this.registry],
      async collect() {
        const s = await read();
        this.reset();
        if (typeof s === 'number') this.set(s);
        else for (const [labels, v] of s) this.set(labels, v);
      },
    });
  }

  /** A running total the component keeps itself, read at scrape time (`name` ends in `_total`). */
  counter(name: string, help: string, read: Read, labelNames: readonly string[] = []): void {
    new Counter({
      name, help, labelNames, registers: [this.registry],
      async collect() {
        const s = await read();
        this.reset();
        if (typeof s === 'number') this.inc(Math.max(0, s));
        else for (const [labels, v] of s) this.inc(labels, Math.max(0, v));
      },
    });
  }

  /** A histogram observed as things happen (once per request, not per packet). */
  histogram<L extends string>(name: string, help: string, labelNames: readonly L[], buckets = LATENCY_BUCKETS): Histogram<L> {
    return new Histogram({ name, help, labelNames, buckets, registers: [this.registry] });
  }
}
