/**
 * The relay's registry file on a disk that refuses it, through a real controller (embedded store) over HTTPS: a node
 * that joins while `registry.json` cannot be written is still a member (the relay goes on from memory, where a failed
 * write thrown from the watch's timer ended the process before), the failure is logged once with
 * NODE_STATE_WRITE_FAILED, and the file is written at the next change once the disk takes it. The refusal is made
 * without root: the file's path is a directory, so the rename over it fails (EISDIR).
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { generateKeyPairSync } from 'node:crypto';
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseControllerConfig } from '../../src/config/controller-config.ts';
import type { NodeFields } from '../../src/core/cluster/model.ts';
import { ROLE_ANNOTATION } from '../../src/core/tunnel/plan.ts';
import { jsonLogger } from '../../src/adapters/ops/json-logger.ts';
import { ControllerClient } from '../../src/adapters/node/controller-client.ts';
import { selfSignedTunnelCert, spkiPin } from '../../src/adapters/pki.ts';
import { dialTunnel } from '../../src/adapters/tunnel/tunnel-dial.ts';
import { Controller } from '../../src/controller/controller.ts';
import { Relay } from '../../src/relay/relay.ts';
import { memoryIdentity } from '../../harness/join-simulator.ts';
import { freePort } from '../../harness/ports.ts';
import { until } from '../../harness/wait.ts';

const TOKEN = 'atoll-relay-bootstrap-0123456789';
const RELAY_TOKEN = 'atoll-relay-token-0123456789abcdef';

describe('the relay\'s registry on a disk that refuses it', () => {
  const dir = mkdtempSync(join(tmpdir(), 'atoll-relay-registry-'));
  const registry = join(dir, 'relay', 'registry.json');
  const logs: { msg?: string; code?: string; level?: string }[] = [];
  let controller: Controller;
  let relay: Relay;
  let url = '';
  let relayPort = 0;

  /** A node joined with its own tunnel key; returns the key, which the relay accepts once the node is a member. */
  const join_ = async (name: string) => {
    const keyPem = generateKeyPairSync('ed25519').privateKey.export({ type: 'pkcs8', format: 'pem' }) as string;
    const certPem = selfSignedTunnelCert(keyPem, name);
    const identity = memoryIdentity();
    const client = new ControllerClient({ urls: [url], caPem: readFileSync(join(dir, 'controller', 'pki', 'ca.crt'), 'utf8'), identity, nodeName: name });
    const fields: NodeFields = { site: name, community: 'c', addresses: ['192.0.2.9'], vtepMac: '02:00:00:00:00:09', tunnelKey: spkiPin(certPem), agentVersion: 'test',
      annotations: { [ROLE_ANNOTATION]: 'edge' } };
    await client.join(TOKEN, identity.publicKey, fields);
    client.close();
    return { keyPem, certPem };
  };
  /** Whether the relay takes a tunnel from `who` (only members' keys are accepted). */
  const accepted = async (who: { keyPem: string; certPem: string }) => {
    try {
      const s = await dialTunnel({ host: '127.0.0.1', port: relayPort, credentials: who, peerPin: relay.pin });
      s.close();
      return true;
    } catch {
      return false;
    }
  };

  before(async () => {
    const port = await freePort();
    url = `https://127.0.0.1:${port}`;
    controller = new Controller({ log: jsonLogger({ level: 'error' }), clock: Date.now }, parseControllerConfig({
      listenHost: '127.0.0.1', listenPort: port, advertiseUrl: url, clusterCidrs: ['10.100.0.0/16'], blockBits: 26,
      dataDir: join(dir, 'controller'), bootstrapTokens: [TOKEN], adminToken: 'atoll-relay-admin-0123456789abcdef', relayTokens: [RELAY_TOKEN],
    }));
    await controller.start();
    relayPort = await freePort();
    relay = new Relay({ listenHost: '127.0.0.1', listenPort: relayPort, circuitPort: await freePort(), dataDir: join(dir, 'relay'),
      controller: { urls: [url], caCertHash: controller.caCertHash, token: RELAY_TOKEN } },
    jsonLogger({ level: 'debug', write: (l) => logs.push(JSON.parse(l) as { msg?: string; code?: string; level?: string }) }));
    await relay.start();
  });

  after(async () => {
    relay?.stop();
    await controller?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  test('a node that joins meanwhile is a member from memory, the failure logged once, the file written once the disk takes it', async () => {
    const a = await join_('a-1');
    await until('a-1 in the registry file', () => {
      try {
        return readFileSync(registry, 'utf8').includes('"a-1"');
      } catch {
        return false;
      }
    }, 15_000);
    rmSync(registry);
    mkdirSync(registry); // the rename of every write over it fails
    const b = await join_('b-1');
    await until('b-1 a member', () => accepted(b), 15_000, 200);
    assert.ok(await accepted(a));
    const c = await join_('c-1');
    await until('c-1 a member', () => accepted(c), 15_000, 200);
    const failed = logs.filter((l) => l.code === 'NODE_STATE_WRITE_FAILED');
    assert.equal(failed.filter((l) => l.level === 'error').length, 1, 'said once, however many writes failed');
    rmSync(registry, { recursive: true });
    const d = await join_('d-1');
    await until('the file written at the next change', () => {
      try {
        const text = readFileSync(registry, 'utf8');
        return ['a-1', 'b-1', 'c-1', 'd-1'].every((n) => text.includes(`"${n}"`));
      } catch {
        return false;
      }
    }, 15_000);
    assert.ok(await accepted(d));
    assert.ok(logs.some((l) => /registry written again/.test(l.msg ?? '')), 'its recovery is said');
  });
});
