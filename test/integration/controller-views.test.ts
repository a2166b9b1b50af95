/**
 * Each agent's watch carries its own view of the registry, through a real controller (embedded store) over HTTPS,
 * signed as each node: an edge node gets its site, its community and the cloud nodes, and the changes to those only;
 * it resumes from its revision; a node that moves community leaves one view and enters another; a cloud node gets
 * everything; a watcher that stops reading is dropped, and the others go on.
 */
import type { IncomingMessage } from 'node:http';
import { request } from 'node:https';
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseControllerConfig } from '../../src/config/controller-config.ts';
import type { WatchLine } from '../../src/config/watch-line.ts';
import type { NodeFields } from '../../src/core/cluster/model.ts';
import { ROLE_ANNOTATION } from '../../src/core/tunnel/plan.ts';
import { jsonLogger } from '../../src/adapters/ops/json-logger.ts';
import { ControllerClient } from '../../src/adapters/node/controller-client.ts';
import { type NodeIdentity, signRequest } from '../../src/adapters/node/node-identity.ts';
import { Controller } from '../../src/controller/controller.ts';
import { memoryIdentity } from '../../harness/join-simulator.ts';
import { RUN_PREFIX } from '../../harness/netns.ts';
import { freePort } from '../../harness/ports.ts';
import { until } from '../../harness/wait.ts';

const TOKEN = 'atoll-views-bootstrap-0123456789';

/** A watch held open by one node, its lines (pings left out) as they come. */
class Watcher {
  readonly lines: Exclude<WatchLine, { type: 'ping' }>[] = [];
  readonly #abort = new AbortController();
  readonly done: Promise<void>;

  constructor(client: ControllerClient, after = 0) {
    this.done = client.watch(after, (l) => {
      if (l.type !== 'ping') this.lines.push(l);
    }, this.#abort.signal).catch(() => {});
  }

  /** The names in its snapshot (the first line). */
  snapshotNames(): string[] {
    const first = this.lines[0];
    return first?.type === 'snapshot' ? first.nodes.map((n) => n.name).sort() : [];
  }

  get revision(): number {
    const last = this.lines.at(-1);
    return last?.revision ?? 0;
  }

  async stop(): Promise<void> {
    this.#abort.abort();
    await this.done;
  }
}

describe('scoped watch views through the controller', () => {
  const dir = mkdtempSync(join(tmpdir(), `${RUN_PREFIX}views-`));
  let controller: Controller;
  const clients = new Map<string, ControllerClient>();
  const identities = new Map<string, NodeIdentity>();
  const logs: { msg?: string; code?: string }[] = [];
  let port = 0;
  let ca = '';
  const fields = new Map<string, NodeFields>();
  const watchers: Watcher[] = [];
  const watch = (name: string, from = 0) => {
    const w = new Watcher(clients.get(name) as ControllerClient, from);
    watchers.push(w);
    return w;
  };
  /** A change of node `name`'s own record (a new address, or a new community), as its agent sends it. */
  const update = async (name: string, change: Partial<NodeFields>) => {
    const f = { ...fields.get(name) as NodeFields, ...change };
    fields.set(name, f);
    await (clients.get(name) as ControllerClient).update(f);
  };

  before(async () => {
    port = await freePort();
    const config = parseControllerConfig({
      listenHost: '127.0.0.1', listenPort: port, advertiseUrl: `https://127.0.0.1:${port}`, clusterCidrs: ['10.100.0.0/16'], blockBits: 26,
      dataDir: join(dir, 'data'), bootstrapTokens: [TOKEN], adminToken: 'atoll-views-admin-0123456789abcdef', watchBufferBytes: 256 * 1024,
    });
    controller = new Controller({ log: jsonLogger({ level: 'warn', write: (l) => logs.push(JSON.parse(l) as { msg?: string; code?: string }) }), clock: Date.now }, config);
    await controller.start();
    ca = readFileSync(join(dir, 'data', 'pki', 'ca.crt'), 'utf8');
    // two cloud nodes; communities c1 (sites s1, s2) and c2 (sites s3, s4), two nodes a site
    const nodes: [string, string, string, 'cloud' | 'edge'][] = [['cloud-1', 'cloud', '', 'cloud'], ['cloud-2', 'cloud', '', 'cloud']];
    for (const [community, sites] of [['c1', ['s1', 's2']], ['c2', ['s3', 's4']]] as const) {
      for (const site of sites) for (const i of [1, 2]) nodes.push([`${site}-${i}`, site, community, 'edge']);
    }
    for (const [i, [name, site, community, role]] of nodes.entries()) {
      const identity = memoryIdentity();
      const client = new ControllerClient({ urls: [`https://127.0.0.1:${port}`], caPem: ca, identity, nodeName: name });
      const f: NodeFields = { site, community, addresses: [`192.0.2.${i + 10}`], vtepMac: '', tunnelKey: '', agentVersion: 'test', annotations: { [ROLE_ANNOTATION]: role } };
      await client.join(TOKEN, identity.publicKey, f);
      clients.set(name, client);
      identities.set(name, identity);
      fields.set(name, f);
    }
  });

  after(async () => {
    await Promise.all(watchers.map((w) => w.stop()));
    for (const c of clients.values()) c.close();
    await controller?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  test('an edge node\'s snapshot holds its site, its community and the clouds; a cloud node\'s holds every node', async () => {
    const edge = watch('s1-1');
    const cloud = watch('cloud-1');
    await until('both snapshots', () => edge.lines.length > 0 && cloud.lines.length > 0, 10_000);
    assert.deepEqual(edge.snapshotNames(), ['cloud-1', 'cloud-2', 's1-1', 's1-2', 's2-1', 's2-2']);
    assert.equal(cloud.snapshotNames().length, 10);
    await Promise.all([edge.stop(), cloud.stop()]);
  });

  test('a change in another community does not reach an edge node; one in its own does, in revision order', async () => {
    const edge = watch('s1-1');
    const other = watch('s3-1');
    await until('the snapshots', () => edge.lines.length > 0 && other.lines.length > 0, 10_000);
    await update('s4-1', { addresses: ['192.0.2.200'] });
    await update('s2-2', { addresses: ['192.0.2.201'] });
    await until('the change in c1 to reach s1-1', () => edge.lines.length > 1, 10_000);
    // lines come in revision order, so the first after the snapshot shows whether s4-1's came
    assert.deepEqual(edge.lines.slice(1).map((l) => (l.type === 'put' ? l.node.name : l.type)), ['s2-2']);
    await until('the change in c2 to reach s3-1', () => other.lines.some((l) => l.type === 'put' && l.node.name === 's4-1'), 10_000);
    assert.equal(other.lines.some((l) => l.type === 'put' && l.node.name === 's2-2'), false);
    await Promise.all([edge.stop(), other.stop()]);
  });

  test('a watch resumed from its revision gets the changes it missed, of its view only, and no snapshot', async () => {
    const first = watch('s1-2');
    await until('the snapshot', () => first.lines.length > 0, 10_000);
    await first.stop();
    await update('s3-2', { addresses: ['192.0.2.202'] });
    await update('s1-1', { addresses: ['192.0.2.203'] });
    const resumed = watch('s1-2', first.revision);
    await until('the missed change', () => resumed.lines.length > 0, 10_000);
    assert.deepEqual(resumed.lines.map((l) => [l.type, l.type === 'put' ? l.node.name : '']), [['put', 's1-1']]);
    await resumed.stop();
  });

  test('a node that moves to another community leaves its old community\'s views, enters the new one\'s, and gets a snapshot of its new view', async () => {
    const oldPeer = watch('s1-1');
    const newPeer = watch('s4-2');
    const mover = watch('s2-1');
    await until('the snapshots', () => [oldPeer, newPeer, mover].every((w) => w.lines.length > 0), 10_000);
    await update('s2-1', { community: 'c2' });
    await until('the move to reach all three', () => oldPeer.lines.length > 1 && newPeer.lines.length > 1 && mover.lines.length > 1, 10_000);
    assert.deepEqual(oldPeer.lines.slice(1).map((l) => [l.type, l.type === 'delete' ? l.name : '']), [['delete', 's2-1']]);
    assert.deepEqual(newPeer.lines.slice(1).map((l) => [l.type, l.type === 'put' ? l.node.name : '']), [['put', 's2-1']]);
    const fresh = mover.lines[1];
    assert.equal(fresh?.type, 'snapshot');
    assert.deepEqual(fresh?.type === 'snapshot' && fresh.nodes.map((n) => n.name).sort(), ['cloud-1', 'cloud-2', 's2-1', 's2-2', 's3-1', 's3-2', 's4-1', 's4-2']);
    await Promise.all([oldPeer.stop(), newPeer.stop(), mover.stop()]);
  });

  test('a watcher that stops reading is dropped with API_WATCH_TOO_SLOW once its stream holds more than watchBufferBytes; the others go on', async () => {
    // cloud-2 opens a watch (it sees every node) and never reads it
    const target = '/v1/watch?after=0';
    const headers = signRequest(identities.get('cloud-2') as NodeIdentity, { method: 'GET', path: target, node: 'cloud-2', body: Buffer.alloc(0), now: Date.now() });
    let closed = false;
    let stalledRes: IncomingMessage | undefined;
    const stalled = request({ host: '127.0.0.1', port, path: target, method: 'GET', ca, headers }, (res) => {
      stalledRes = res;
      res.pause();
      res.on('close', () => { closed = true; });
      res.on('error', () => { closed = true; });
    });
    stalled.on('error', () => { closed = true; });
    stalled.end();
    const reader = watch('s3-1');
    await until('the reader\'s snapshot', () => reader.lines.length > 0, 10_000);
    // s4-2 changes its annotations (14 KB a line) until the controller drops the stalled watcher
    const big = Object.fromEntries(Array.from({ length: 14 }, (_, i) => [`example.com/big-${i}`, String(i % 10).repeat(1000)]));
    let updates = 0;
    for (const end = Date.now() + 60_000; Date.now() < end && !logs.some((l) => l.code === 'API_WATCH_TOO_SLOW'); updates++) {
      await update('s4-2', { annotations: { ...big, [ROLE_ANNOTATION]: 'edge', 'example.com/n': String(updates) } });
    }
    const dropped = logs.find((l) => l.code === 'API_WATCH_TOO_SLOW');
    assert.equal(dropped?.msg, 'watch dropped', `${updates} updates of 14 KB did not get the stalled watcher dropped: ${JSON.stringify(logs)}`);
    // read on: what the controller wrote before it dropped the watch, then its end
    stalledRes?.resume();
    await until('the stalled watch to end', () => closed, 10_000);
    await until('the reader to have every update', () => reader.lines.filter((l) => l.type === 'put' && l.node.name === 's4-2').length === updates, 10_000);
    stalled.destroy();
    await reader.stop();
  });
});
