/**
 * The agent's controller client against a real controller API (in process, embedded store, TLS on 127.0.0.1),
 * through a TCP relay of the test's that counts connections: a node's requests share one kept-alive connection
 * instead of a TLS handshake each (every agent reports its usage every few seconds), and closing the client lets
 * it go. A fake controller (HTTPS on 127.0.0.1 with the real one's certificates) serves a watch stream with a bad line:
 * the agent's controller link logs a coded error, watches again and takes the good state.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer as createHttpsServer } from 'node:https';
import { connect, createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseControllerConfig } from '../../src/config/controller-config.ts';
import { atollError } from '../../src/core/errors.ts';
import { jsonLogger } from '../../src/adapters/ops/json-logger.ts';
import { ControllerClient } from '../../src/adapters/node/controller-client.ts';
import { Controller } from '../../src/controller/controller.ts';
import { ControllerLink } from '../../src/agent/controller-link.ts';
import { ClusterStateFile } from '../../src/adapters/node/cluster-state-file.ts';
import { ensureControllerPki } from '../../src/adapters/pki.ts';
import type { NodeRecord } from '../../src/core/cluster/model.ts';
import { memoryIdentity } from '../../harness/join-simulator.ts';
import { RUN_PREFIX } from '../../harness/netns.ts';
import { freePort } from '../../harness/ports.ts';
import { until } from '../../harness/wait.ts';

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

/** A node record as the controller sends it. */
function record(name: string, blocks: string[]): NodeRecord {
  return {
    name, identity: 'aWQ=', site: 'edge-1', community: '', addresses: ['198.51.100.20'], observedAddress: '198.51.100.20', vtepMac: '02:00:00:00:00:14',
    tunnelKey: '', agentVersion: 'test', annotations: {}, blocks, registeredAt: 1, updatedAt: 1,
  };
}

test('a watch line that is not JSON, or not a watch line, ends the watch with CONTROLLER_WATCH_INVALID; the link watches again and takes the good state', async () => {
  const pki = await ensureControllerPki(join(dir, 'data', 'pki'), { hosts: ['127.0.0.1'] });
  const line = (v: unknown) => JSON.stringify(v) + '\n';
  const bad = line({ type: 'snapshot', revision: 7, nodes: [record('peer-bad', ['10.100.9.0/26'])] });
  // each watch the link opens gets the next of these; the first two start with a bad line and carry on with lines
  // that must not be applied, and stay open (the client ends them, not the server)
  const streams = [
    'not json {\n' + bad,
    line({ type: 'put', revision: 3, node: { ...record('peer-x', []), blocks: 'nope' } }) + bad,
    line({ type: 'snapshot', revision: 5, nodes: [record('peer-good', ['10.100.1.0/26'])] }) + line({ type: 'ping' }),
  ];
  const watches: string[] = [];
  const server = createHttpsServer({ cert: pki.certChainPem, key: pki.keyPem }, (req, res) => {
    req.resume();
    if (req.url?.startsWith('/v1/watch')) {
      watches.push(req.url);
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      res.write(streams[Math.min(watches.length, streams.length) - 1]);
      return; // left open
    }
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify(req.url === '/v1/join' ? { node: record('client-n3', ['10.100.2.0/26']), blocks: ['10.100.2.0/26'] } : { blocks: ['10.100.2.0/26'] }));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const url = `https://127.0.0.1:${(server.address() as { port: number }).port}`;
  const caPath = join(dir, 'link-ca.crt');
  writeFileSync(caPath, pki.caPem);
  const warnings: Record<string, unknown>[] = [];
  const log = jsonLogger({ level: 'warn', write: (l) => warnings.push(JSON.parse(l) as Record<string, unknown>) });
  const seen: string[][] = [];
  const link = new ControllerLink({
    log, clock: Date.now, identity: memoryIdentity, stateFile: new ClusterStateFile(join(dir, 'link-state.json')),
    onBlocks: async () => {}, usage: () => ({ capacity: 62, allocated: 0, reserved: 0, free: 62 }), onPeers: (peers) => seen.push(peers.map((p) => p.name)),
  }, { urls: [url], token: TOKEN, caCertHash: pki.caHash, caPath, nodeName: 'client-n3', fields: { site: 'edge-1', community: '', addresses: [], vtepMac: '', tunnelKey: '', agentVersion: 'test' }, usagePeriodMs: 60_000, retryMinMs: 20, retryMaxMs: 50 });
  try {
    link.start();
    await until('the link to take the good snapshot', () => link.peers.some((p) => p.name === 'peer-good'), 10_000, 20);
    assert.deepEqual(link.peers.map((p) => p.name), ['peer-good']);
    assert.equal(link.state.revision, 5);
    assert.deepEqual(seen, [['peer-good']], 'nothing after a bad line was applied');
    assert.deepEqual(watches, ['/v1/watch?after=0', '/v1/watch?after=0', '/v1/watch?after=0']);
    const codes = warnings.map((w) => w.code);
    assert.deepEqual(codes, ['CONTROLLER_WATCH_INVALID', 'CONTROLLER_WATCH_INVALID'], JSON.stringify(warnings));
    assert.match(String(warnings[0]?.err), /not JSON: "not json \{"/);
    assert.match(String(warnings[1]?.err), /not a watch line \(node\.blocks: [^;]*\): /);
  } finally {
    await link.stop();
    server.closeAllConnections();
    server.close();
  }
});

test('a burst of watch lines is applied, saved and handed on once, not per line', async () => {
  const pki = await ensureControllerPki(join(dir, 'data', 'pki'), { hosts: ['127.0.0.1'] });
  const line = (v: unknown) => JSON.stringify(v) + '\n';
  let burst = line({ type: 'snapshot', revision: 10, nodes: [record('peer-000', ['10.100.0.0/26'])] });
  for (let i = 1; i <= 300; i++) burst += line({ type: 'put', revision: 10 + i, node: record(`peer-${String(i).padStart(3, '0')}`, []) });
  burst += line({ type: 'delete', revision: 311, name: 'peer-000' });
  const server = createHttpsServer({ cert: pki.certChainPem, key: pki.keyPem }, (req, res) => {
    req.resume();
    if (req.url?.startsWith('/v1/watch')) {
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      res.write(burst);
      return; // left open
    }
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify(req.url === '/v1/join' ? { node: record('client-n4', ['10.100.2.0/26']), blocks: ['10.100.2.0/26'] } : { blocks: ['10.100.2.0/26'] }));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const url = `https://127.0.0.1:${(server.address() as { port: number }).port}`;
  const caPath = join(dir, 'burst-ca.crt');
  writeFileSync(caPath, pki.caPem);
  const handed: number[] = [];
  const statePath = join(dir, 'burst-state.json');
  const link = new ControllerLink({
    log: jsonLogger({ level: 'error', write: () => {} }), clock: Date.now, identity: memoryIdentity, stateFile: new ClusterStateFile(statePath),
    onBlocks: async () => {}, usage: () => ({ capacity: 62, allocated: 0, reserved: 0, free: 62 }), onPeers: (peers) => handed.push(peers.length),
  }, { urls: [url], token: TOKEN, caCertHash: pki.caHash, caPath, nodeName: 'client-n4', fields: { site: 'edge-1', community: '', addresses: [], vtepMac: '', tunnelKey: '', agentVersion: 'test' }, usagePeriodMs: 60_000, retryMinMs: 20, retryMaxMs: 50 });
  try {
    link.start();
    await until('the link to reach the burst\'s last revision', () => link.state.revision === 311, 10_000, 20);
    assert.equal(link.peers.length, 300);
    assert.equal(link.peers[0]?.name, 'peer-001', 'sorted by name, peer-000 deleted');
    assert.ok(handed.length <= 3, `302 lines handed on in ${handed.length} batches`);
    assert.equal(handed.at(-1), 300);
    const saved = JSON.parse(readFileSync(statePath, 'utf8')) as { revision: number; peers: unknown[] };
    assert.deepEqual([saved.revision, saved.peers.length], [311, 300]);
  } finally {
    await link.stop();
    server.closeAllConnections();
    server.close();
  }
});

test('a disk that refuses the cluster state or the node key (issue #39): peers and blocks are applied from memory, the failure said once; no join without a key on disk', async () => {
  const pki = await ensureControllerPki(join(dir, 'data', 'pki'), { hosts: ['127.0.0.1'] });
  const line = (v: unknown) => JSON.stringify(v) + '\n';
  const joins: string[] = [];
  const server = createHttpsServer({ cert: pki.certChainPem, key: pki.keyPem }, (req, res) => {
    req.resume();
    if (req.url?.startsWith('/v1/watch')) {
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      res.write(line({ type: 'snapshot', revision: 4, nodes: [record('peer-a', ['10.100.3.0/26'])] }));
      return; // left open
    }
    if (req.url === '/v1/join') joins.push(req.url);
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify(req.url === '/v1/join' ? { node: record('client-n5', ['10.100.2.0/26']), blocks: ['10.100.2.0/26'] } : { blocks: ['10.100.2.0/26'] }));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const url = `https://127.0.0.1:${(server.address() as { port: number }).port}`;
  const caPath = join(dir, 'disk-ca.crt');
  writeFileSync(caPath, pki.caPem);
  const disk = { full: true, keyFull: true, saves: 0 };
  const refuse = () => {
    throw Object.assign(new Error('ENOSPC: no space left on device, write'), { code: 'ENOSPC' });
  };
  const stateFile = new ClusterStateFile(join(dir, 'disk-state.json'));
  const realSave = stateFile.save.bind(stateFile);
  stateFile.save = (s) => (disk.full ? refuse() : (disk.saves++, realSave(s)));
  const identity = memoryIdentity();
  const lines: Record<string, unknown>[] = [];
  const blocks: string[][] = [];
  const peers: string[][] = [];
  const link = new ControllerLink({
    log: jsonLogger({ level: 'debug', write: (l) => lines.push(JSON.parse(l) as Record<string, unknown>) }), clock: Date.now, stateFile,
    // as src/adapters/node/node-identity.ts says it
    identity: () => (disk.keyFull ? (() => { throw atollError('NODE_STATE_WRITE_FAILED', 'cannot create the node key /data/node.key: ENOSPC'); })() : identity),
    onBlocks: async (b) => void blocks.push([...b]), usage: () => ({ capacity: 62, allocated: 0, reserved: 0, free: 62 }), onPeers: (p) => peers.push(p.map((n) => n.name)),
  }, { urls: [url], token: TOKEN, caCertHash: pki.caHash, caPath, nodeName: 'client-n5', fields: { site: 'edge-1', community: '', addresses: [], vtepMac: '', tunnelKey: '', agentVersion: 'test' }, usagePeriodMs: 60_000, retryMinMs: 20, retryMaxMs: 50 });
  const coded = (level: string) => lines.filter((l) => l.code === 'NODE_STATE_WRITE_FAILED' && l.level === level);
  try {
    link.start();
    // no node key on disk: no join (a key only in memory would be another one at the next start)
    await until('the link to retry without a key', () => coded('warn').length >= 1 && lines.filter((l) => l.msg === 'no node key on disk to join with; working from local state').length >= 1, 10_000, 20);
    await new Promise((r) => setTimeout(r, 200));
    assert.deepEqual(joins, [], 'joined without a node key on disk');
    assert.equal(coded('warn').length, 1, 'said once, however often retried');
    assert.equal(link.status.state, 'offline');
    disk.keyFull = false;
    await until('the peers applied from memory', () => peers.length > 0, 10_000, 20);
    assert.deepEqual(joins, ['/v1/join']);
    assert.deepEqual(blocks, [['10.100.2.0/26']], 'the blocks reached IPAM though they could not be saved');
    assert.deepEqual(peers, [['peer-a']]);
    assert.equal(link.status.state, 'connected', 'a failed save is not a controller outage');
    assert.equal(coded('error').length, 1, JSON.stringify(coded('error')));
    assert.match(String(coded('error')[0]?.err), /cannot write the cluster state .*disk-state\.json: ENOSPC/);
    link.flush();
    assert.equal(coded('error').length, 1, 'a retry that fails again is not said again');
    assert.equal(disk.saves, 0);
    disk.full = false;
    link.flush();
    const saved = JSON.parse(readFileSync(join(dir, 'disk-state.json'), 'utf8')) as { revision: number; blocks: string[]; peers: NodeRecord[] };
    assert.deepEqual([saved.revision, saved.blocks, saved.peers.map((p) => p.name)], [4, ['10.100.2.0/26'], ['peer-a']]);
    assert.ok(lines.some((l) => l.msg === 'the cluster state written again'));
  } finally {
    await link.stop();
    server.closeAllConnections();
    server.close();
  }
});
