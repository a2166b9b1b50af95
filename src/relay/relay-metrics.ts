/**
 * The relay's metrics, read from its counters (src/relay/relay.ts, src/relay/circuits.ts) when Prometheus scrapes.
 */
import type { Metrics } from '../adapters/ops/metrics.ts';
import type { RelayStats } from './relay.ts';
import type { CircuitStats } from './circuits.ts';

export interface RelayMetricSources {
  readonly stats: Readonly<RelayStats>;
  readonly circuits: () => Readonly<CircuitStats>;
  /** Registered nodes the relay accepts (from the controller's watch, or its saved registry). */
  readonly members: () => number;
}

export function registerRelayMetrics(m: Metrics, s: RelayMetricSources): void {
  m.gauge('atoll_relay_connected_nodes', 'Nodes with a control stream to the relay now', () => s.stats.connected);
  m.gauge('atoll_relay_registered_nodes', 'Registered nodes the relay accepts', () => s.members());
  m.counter('atoll_relay_control_messages_forwarded_total', 'Relayed control messages (hole punching) passed on', () => s.stats.forwardedControl);
  m.counter('atoll_relay_control_messages_dropped_total', 'Relayed control messages or circuit requests dropped, by reason (noDestination, notAllowed, queueFull)', () => [
    [{ reason: 'noDestination' }, s.stats.droppedNoDestination], [{ reason: 'notAllowed' }, s.stats.droppedNotAllowed], [{ reason: 'queueFull' }, s.stats.droppedQueueFull],
  ], ['reason']);
  m.counter('atoll_relay_refused_connections_total', 'Connections refused (an unregistered key, a failed handshake)', () => s.stats.refused);
  m.counter('atoll_relay_circuits_offered_total', 'Circuits offered (a token pair handed out)', () => s.stats.circuitsOffered);
  m.counter('atoll_relay_circuits_joined_total', 'Circuits both ends joined', () => s.circuits().joined);
  m.counter('atoll_relay_circuits_lapsed_total', 'Circuit offers that lapsed with an end missing', () => s.circuits().lapsed);
  m.counter('atoll_relay_circuit_bad_tokens_total', 'Circuit connections with an unknown, used or malformed token', () => s.circuits().badToken);
  m.gauge('atoll_relay_circuits_open', 'Circuits joined and still open', () => s.circuits().open);
  m.counter('atoll_relay_circuit_bytes_total', 'Bytes carried through circuits, both directions', () => s.circuits().bytes);
}
