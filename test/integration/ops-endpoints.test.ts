/**
 * The controller and the relay, in process on loopback with an embedded store, serve /healthz, /readyz and /metrics;
 * the relay becomes ready once the controller's node list arrives.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Controller } from '../../src/controller/controller.ts';
import { Relay } from '../../src/relay/relay.ts';
import { parseControllerConfig } from '../../src/config/controller-config.ts';
import { relayConfigSchema } from '../../src/config/relay-config.ts';
import type { Logger } from '../../src/core/ports.ts';
import { freePort } from '../../harness/ports.ts';
import { until } from '../../harness/wait.ts';

const quiet: Logger = { debug() {}, info() {}, warn() {}, error() {}, child: () => quiet };

test('controller and relay: health, readiness and metrics on their metrics listeners', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'atoll-ops-'));
  const port = await freePort();
  const controller = new Controller({ log: quiet, clock: Date.now }, parseControllerConfig({
    listenHost: '127.0.0.1', listenPort: port, advertiseUrl: `https://127.0.0.1:${port}`, clusterCidrs: ['10.100.0.0/16'], blockBits: 24,
    dataDir: join(dir, 'controller'), bootstrapTokens: ['atoll-test-bootstrap-0123456789'], adminToken: 'atoll-test-admin-0123456789abcdef',
    relayTokens: ['atoll-test-relay-0123456789abcdef'], metrics: { listen: '127.0.0.1:0' },
  }));
  let relay: Relay | undefined;
  try {
    await controller.start();
    const c = `http://127.0.0.1:${controller.opsPort}`;
    assert.equal((await fetch(`${c}/healthz`)).status, 200);
    await until('the controller ready', async () => (await fetch(`${c}/readyz`)).status === 200, 10_000);
    const metrics = await (await fetch(`${c}/metrics`)).text();
    assert.match(metrics, /^atoll_controller_registered_nodes 0$/m);
    assert.match(metrics, /^atoll_controller_blocks\{state="free"\} 256$/m);
    assert.match(metrics, /^atoll_controller_blocks\{state="leased"\} 0$/m);
    await until('leadership', async () => /^atoll_controller_leader 1$/m.test(await (await fetch(`${c}/metrics`)).text()), 10_000);
    // the census of the scrapes above read the store, through the timing wrapper
    assert.match(await (await fetch(`${c}/metrics`)).text(), /^atoll_store_operation_duration_seconds_count\{operation="list",result="ok"\} [1-9]/m);

    const relayPort = await freePort();
    relay = new Relay(Object.freeze(relayConfigSchema.parse({
      listenHost: '127.0.0.1', listenPort: relayPort, circuitPort: await freePort(), dataDir: join(dir, 'relay'),
      controller: { urls: [`https://127.0.0.1:${port}`], caCertHash: controller.caCertHash, token: 'atoll-test-relay-0123456789abcdef' },
      metrics: { listen: '127.0.0.1:0' },
    })), quiet);
    await relay.start();
    const r = `http://127.0.0.1:${relay.opsPort}`;
    assert.equal((await fetch(`${r}/healthz`)).status, 200);
    // an empty cluster: the node list (empty) arrives with the watch's snapshot
    await until('the relay ready', async () => (await fetch(`${r}/readyz`)).status === 200, 10_000);
    await until('the relay watching', async () => /^atoll_controller_watch_clients 1$/m.test(await (await fetch(`${c}/metrics`)).text()), 10_000);
    const rm = await (await fetch(`${r}/metrics`)).text();
    for (const name of ['atoll_relay_connected_nodes 0', 'atoll_relay_registered_nodes 0', 'atoll_relay_circuits_open 0', 'atoll_relay_circuit_bytes_total 0']) {
      assert.match(rm, new RegExp(`^${name}$`, 'm'));
    }
  } finally {
    relay?.stop();
    await controller.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});
