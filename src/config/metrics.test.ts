import { test } from 'node:test';
import assert from 'node:assert/strict';
import { parseAgentConfig } from './agent-config.ts';
import { relayConfigSchema } from './relay-config.ts';
import { parseControllerConfig } from './controller-config.ts';

const agent = (metrics: unknown) => parseAgentConfig({ nodeName: 'n1', ...(metrics === undefined ? {} : { metrics }) });

test('metrics: off when absent, loopback on each component\'s port by default', () => {
  assert.equal(agent(undefined).metrics, undefined);
  assert.deepEqual(agent({}).metrics, { listen: '127.0.0.1:9470' });
  const relay = relayConfigSchema.parse({ controller: { urls: ['https://c:7443'], caCertHash: `sha256:${'0'.repeat(64)}`, token: 'x'.repeat(16) }, metrics: {} });
  assert.deepEqual(relay.metrics, { listen: '127.0.0.1:9472' });
  const controller = parseControllerConfig({ advertiseUrl: 'https://c:7443', clusterCidrs: ['10.244.0.0/16'], bootstrapTokens: ['b'.repeat(16)], adminToken: 'a'.repeat(16), metrics: {} });
  assert.deepEqual(controller.metrics, { listen: '127.0.0.1:9471' });
});

test('metrics.listen: host:port, IPv6 in brackets; anything else is refused naming the key', () => {
  assert.equal(agent({ listen: '[::1]:9470' }).metrics?.listen, '[::1]:9470');
  assert.equal(agent({ listen: '10.0.0.5:0' }).metrics?.listen, '10.0.0.5:0');
  for (const listen of ['9470', 'host', ':9470', '::1:9470', '10.0.0.5:70000', '10.0.0.5:94 70']) {
    assert.throws(() => agent({ listen }), (e: Error & { code?: string }) => e.code === 'CONFIG_FILE_INVALID' && /metrics\.listen/.test(e.message), listen);
  }
  assert.throws(() => agent({ listen: '127.0.0.1:9470', port: 1 }), /metrics/);
});
