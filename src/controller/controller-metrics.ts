/**
 * The controller's metrics: leadership, store latency, watch clients, and the registry's census (nodes, blocks
 * leased and free), read from the store when Prometheus scrapes (one read serves every census metric of a scrape).
 */
import type { Metrics } from '../adapters/ops/metrics.ts';
import type { StoreObserver } from './timed-store.ts';

export interface ControllerMetricSources {
  readonly isLeader: () => boolean;
  readonly watchClients: () => number;
  /** Registered nodes and leased blocks, from the store. */
  readonly census: () => Promise<{ nodes: number; leasedBlocks: number }>;
  /** Blocks the cluster CIDRs hold in all. */
  readonly totalBlocks: number;
}

/** Census reads closer together than this share one store read (the metrics of one scrape). */
const CENSUS_REUSE_MS = 1000;

/** Registers the controller's metrics; returns the observer its store reports each operation to. */
export function registerControllerMetrics(m: Metrics, s: ControllerMetricSources): StoreObserver {
  const store = m.histogram('atoll_store_operation_duration_seconds', 'Controller store operations by kind (get, list, txn) and result (ok, error)', ['operation', 'result']);
  let last: { at: number; value: Promise<{ nodes: number; leasedBlocks: number }> } | undefined;
  const census = () => {
    const now = performance.now();
    if (!last || now - last.at > CENSUS_REUSE_MS) last = { at: now, value: s.census() };
    return last.value;
  };
  m.gauge('atoll_controller_leader', '1 when this replica leads (writes go to it), else 0', () => (s.isLeader() ? 1 : 0));
  m.gauge('atoll_controller_watch_clients', 'Open watches: agents and relays following the node list', () => s.watchClients());
  m.gauge('atoll_controller_registered_nodes', 'Nodes registered with the controller', async () => (await census()).nodes);
  m.gauge('atoll_controller_blocks', 'Address blocks of the cluster CIDRs by state: leased to a node, or free', async () => {
    const { leasedBlocks } = await census();
    return [[{ state: 'leased' }, leasedBlocks], [{ state: 'free' }, Math.max(0, s.totalBlocks - leasedBlocks)]];
  }, ['state']);
  return (operation, failed, seconds) => store.observe({ operation, result: failed ? 'error' : 'ok' }, seconds);
}
