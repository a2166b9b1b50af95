/**
 * The agent's controller client against a real controller API (in process, embedded store, TLS on 127.0.0.1),
 * through a TCP relay of the test's that counts connections: a node's requests share one kept-alive connection
 * instead of a TLS handshake each (every agent reports its usage every few seconds), and closing the client lets
 * it go.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { connect, createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseControllerConfig } from '../../src/config/controller-config.ts';
import { jsonLogger } from '../../src/adapters/ops/json-logger.ts';
import { ControllerClient } from '../../src/adapters/node/controller-client.ts';
import { Controller } from '../../src/controller/controller.ts';
import { memoryIdentity } from '../support/join-simulator.ts';
import { RUN_PREFIX } from '../support/netns.ts';
import { freePort } from '../support/ports.ts';

const TOKEN = 'atoll-client-bootstrap-0123456789';
const dir = mkdtempSync(join(tmpdir(), `${RUN_PREFIX}client-`));
let controller: Controller;
let relay: Server;
let relayPort = 0;
let ca = '';
const accepted: Socket[] = [];

before(async () => {
  const port = await freePort();
  const config = parseControllerConfig({
    listenHost: '127.0.0.1', listenPort: port, advertiseUrl: `https://127.0.0.1:${port}`, clusterCidrs: ['10.100.0.0/16'], blockBits: 26,
    dataDir: join(dir, 'data'), bootstrapTokens: [TOKEN], adminToken: 'atoll-client-admin-0123456789abcdef',
  });
  controller = new Controller({ log: jsonLogger({ level: 'error', write: () => {} }), clock: Date.now }, config);
  await controller.start();
  ca = readFileSync(join(dir, 'data', 'pki', 'ca.crt'), 'utf8');
  relay = createServer((down) => {
    accepted.push(down);
    const up = connect(port, '127.0.0.1');
    down.pipe(up).pipe(down);
    down.on('error', () => up.destroy());
    up.on('error', () => down.destroy());
  });
  await new Promise<void>((resolve) => relay.listen(0, '127.0.0.1', resolve));
  relayPort = (relay.address() as { port: number }).port;
});

after(async () => {
  relay?.close();
  for (const s of accepted) s.destroy();
  await controller?.stop();
  rmSync(dir, { recursive: true, force: true });
});

test('a node\'s join and usage reports share one kept-alive TLS connection; close() ends it', async () => {
  const identity = memoryIdentity();
  const client = new ControllerClient({ urls: [`https://127.0.0.1:${relayPort}`], caPem: ca, identity, nodeName: 'client-n1' });
  try {
    const fields = { site: 'edge-1', community: '', addresses: ['198.51.100.10'], vtepMac: '02:00:00:00:00:0a', tunnelKey: '', agentVersion: 'test' };
    const joined = await client.join(TOKEN, identity.publicKey, fields);
    assert.equal(joined.blocks.length, 1);
    for (let i = 0; i < 3; i++) {
      await client.reportUsage({ capacity: 62, allocated: i, reserved: 0, free: 62 - i });
      await new Promise((r) => setTimeout(r, 200)); // as a report period does: the request before has ended
    }
    assert.equal(accepted.length, 1, `requests opened ${accepted.length} connections`);
    assert.equal(accepted[0]?.destroyed, false, 'the connection is kept between requests');
  } finally {
    client.close();
  }
  await new Promise((r) => setTimeout(r, 200));
  assert.equal(accepted[0]?.destroyed, true, 'close() ended the kept connection');
});

test('a report after an idle pause longer than Node\'s default keep-alive (5 s) still uses the kept connection', async () => {
  const before = accepted.length;
  const identity = memoryIdentity();
  const client = new ControllerClient({ urls: [`https://127.0.0.1:${relayPort}`], caPem: ca, identity, nodeName: 'client-n2' });
  try {
    const fields = { site: 'edge-1', community: '', addresses: ['198.51.100.11'], vtepMac: '02:00:00:00:00:0b', tunnelKey: '', agentVersion: 'test' };
    await client.join(TOKEN, identity.publicKey, fields);
    await new Promise((r) => setTimeout(r, 7000)); // Node closes an idle connection at 5 s plus a 1 s buffer; an agent reports every 10 s
    await client.reportUsage({ capacity: 62, allocated: 1, reserved: 0, free: 61 });
    assert.equal(accepted.length - before, 1, `the join and the report opened ${accepted.length - before} connections`);
  } finally {
    client.close();
  }
});
