/**
 * One contract for the controller store port (src/core/cluster/store.ts), run against every implementation: the
 * embedded store (files in a temporary directory), etcd (real etcd processes on loopback) and Kubernetes (a real
 * kube-apiserver and its etcd on loopback, harness/kube.ts, with the CRDs of deploy/helm/atoll/crds/). Then the cases only
 * one of them has: the embedded store's log, snapshot and lock; etcd's failover across members and leases; the
 * Kubernetes store's roll-forward after a crash mid-apply, its shared watch, its Lease and its hand-edited objects.
 *
 * Needs no root; it starts etcd processes, hence test/integration.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { appendFileSync, copyFileSync, existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { createServer, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import type { ClusterStore, LeaderElection, TxnOp, WatchEvent } from '../../src/core/cluster/store.ts';
import { EmbeddedLeader, EmbeddedStore } from '../../src/adapters/store/store-embedded.ts';
import { EtcdLeader, EtcdStore } from '../../src/adapters/store/store-etcd.ts';
import { KubeStore } from '../../src/adapters/store/store-kube.ts';
import type { EntryObject, LogObject } from '../../src/adapters/store/store-kube-log.ts';
import { KubeLeaseElection } from '../../src/adapters/store/store-kube-lease.ts';
import { KubeClient } from '../../src/adapters/kube/kube-client.ts';
import { etcdSkipReason, startEtcdCluster, type EtcdCluster } from '../../harness/etcd.ts';
import { type ControlPlane, startControlPlane } from '../../harness/kube.ts';
import { until } from '../../harness/wait.ts';
import { ClusterRegistry } from '../../src/core/cluster/registry.ts';
import { parseCidr } from '../../src/core/net/ipv4.ts';
import type { Cidr } from '../../src/core/net/ipv4.ts';

const put = (key: string, value: string): TxnOp => ({ type: 'put', key, value });
const del = (key: string): TxnOp => ({ type: 'delete', key });
const never = () => undefined;
const delay = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));


/** Settles to 'pending' when `p` has not settled within `ms`. */
function settledWithin<T>(p: Promise<T>, ms: number): Promise<'settled' | 'pending'> {
  return Promise.race([p.then(() => 'settled' as const, () => 'settled' as const), delay(ms).then(() => 'pending' as const)]);
}

/** One store under test with its data, fresh and empty. */
interface Subject {
  readonly store: ClusterStore;
  /** Another writer on the same data: a second etcd client; for the embedded store the same one (only one may exist). */
  writer(): Promise<ClusterStore>;
  /** Closes the store and opens the same data again; `store` is then the new one. */
  reopen(): Promise<void>;
  /** Makes the store forget its history up to the current revision. */
  forgetHistory(): Promise<void>;
  elector(id: string): LeaderElection;
  cleanup(): Promise<void>;
}

interface Backend {
  readonly name: string;
  readonly skip: string | false;
  /** Whether several electors can exist at once (the embedded store is one controller by construction). */
  readonly manyElectors: boolean;
  /** The electors' lease TTL in ms (0: no lease). */
  readonly leaseMs: number;
  setup(): Promise<void>;
  teardown(): Promise<void>;
  subject(): Promise<Subject>;
}

const tmpRoot = mkdtempSync(join(tmpdir(), 'atoll-store-'));
after(() => rmSync(tmpRoot, { recursive: true, force: true }));

const EMBEDDED_HISTORY = 100;
const ELECTOR_TTL_SECONDS = 2;

function embeddedBackend(): Backend {
  return {
    name: 'embedded',
    skip: false,
    manyElectors: false,
    leaseMs: 0,
    setup: async () => undefined,
    teardown: async () => undefined,
    async subject() {
      const dir = mkdtempSync(join(tmpRoot, 'emb-'));
      let store = await EmbeddedStore.open(dir, { historyLimit: EMBEDDED_HISTORY });
      return {
        get store() {
          return store;
        },
        writer: async () => store,
        async reopen() {
          await store.close();
          store = await EmbeddedStore.open(dir, { historyLimit: EMBEDDED_HISTORY });
        },
        async forgetHistory() {
          for (let i = 0; i < EMBEDDED_HISTORY * 2; i++) await store.txn([], [put('~filler', String(i))]);
        },
        elector: (id) => new EmbeddedLeader({ id }),
        cleanup: () => store.close(),
      };
    },
  };
}

async function etcdPost(endpoint: string, path: string, body: unknown): Promise<Record<string, unknown>> {
  const res = await fetch(endpoint + path, { method: 'POST', body: JSON.stringify(body) });
  const out = (await res.json()) as Record<string, unknown>;
  assert.equal(res.status, 200, `${path}: ${JSON.stringify(out)}`);
  return out;
}

function etcdBackend(): Backend {
  let cluster: EtcdCluster | undefined;
  const endpoints = () => cluster!.endpoints;
  return {
    name: 'etcd',
    skip: etcdSkipReason(),
    manyElectors: true,
    leaseMs: ELECTOR_TTL_SECONDS * 1000,
    async setup() {
      cluster = await startEtcdCluster({ members: 1, dir: tmpRoot });
    },
    async teardown() {
      await cluster?.stop();
    },
    async subject() {
      const prefix = `/atoll-test/${randomBytes(4).toString('hex')}/`;
      const stores: EtcdStore[] = [];
      const open = () => {
        const s = new EtcdStore({ endpoints: endpoints(), prefix });
        stores.push(s);
        return s;
      };
      let store = open();
      return {
        get store() {
          return store;
        },
        writer: async () => open(),
        async reopen() {
          await store.close();
          store = open();
        },
        async forgetHistory() {
          const { revision } = await store.list('');
          await etcdPost(endpoints()[0]!, '/v3/kv/compaction', { revision: String(revision), physical: true });
        },
        elector: (id) => new EtcdLeader({ endpoints: endpoints(), prefix, id, ttlSeconds: ELECTOR_TTL_SECONDS }),
        async cleanup() {
          await Promise.all(stores.map((s) => s.close()));
        },
      };
    },
  };
}

const MANIFEST = join(import.meta.dirname, '../../deploy/atoll.yaml');
/** The manifest's namespace, where its Role lets the controller's account take the Lease. */
const LEASE_NAMESPACE = 'atoll-system';
const STORELOGS = '/apis/atoll.dev/v1alpha1/storelogs';
const STOREENTRIES = '/apis/atoll.dev/v1alpha1/storeentries';

/** A control plane with deploy/atoll.yaml applied (CRDs, namespace, RBAC), and a client with only the controller's role. */
async function startKubeStorePlane(): Promise<{ cp: ControlPlane; controller: KubeClient }> {
  const cp = await startControlPlane(tmpRoot);
  cp.kubectl(['apply', '--server-side', '-f', MANIFEST]);
  cp.kubectl(['wait', '--for=condition=Established', '--timeout=60s', 'crd', '--all']);
  const token = await cp.serviceAccountToken(LEASE_NAMESPACE, 'atoll-controller');
  return { cp, controller: new KubeClient({ server: new URL(cp.server), ca: cp.ca, token: () => token, userAgent: 'atoll-controller' }) };
}

function kubeBackend(): Backend {
  let cp: ControlPlane | undefined;
  let controller: KubeClient | undefined;
  return {
    name: 'kubernetes',
    skip: false,
    manyElectors: true,
    leaseMs: ELECTOR_TTL_SECONDS * 1000,
    async setup() {
      ({ cp, controller } = await startKubeStorePlane());
    },
    async teardown() {
      controller?.close();
      await cp?.stop();
    },
    async subject() {
      // A fresh StoreLog per subject: its entries carry its name, so subjects never see each other's keys.
      const name = `t-${randomBytes(4).toString('hex')}`;
      // the store runs with the controller's account from deploy/atoll.yaml: a permission it lacks fails here
      const kube = controller!;
      const stores: KubeStore[] = [];
      const open = async () => {
        const s = await KubeStore.open({ kube }, { name });
        stores.push(s);
        return s;
      };
      let store = await open();
      return {
        get store() {
          return store;
        },
        writer: () => open(),
        async reopen() {
          await store.close();
          store = await open();
        },
        async forgetHistory() {
          const log = (await kube.get<LogObject>(`${STORELOGS}/${name}`))!;
          await kube.replace(`${STORELOGS}/${name}`, { ...log, spec: { ...log.spec, history: [], compacted: log.spec.revision, appliedThrough: log.spec.revision } });
        },
        elector: (id) => new KubeLeaseElection({ kube }, { namespace: LEASE_NAMESPACE, name, id, leaseDurationSeconds: ELECTOR_TTL_SECONDS }),
        async cleanup() {
          await Promise.all(stores.map((s) => s.close()));
        },
      };
    },
  };
}

for (const backend of [embeddedBackend(), etcdBackend(), kubeBackend()]) {
  describe(`ClusterStore contract: ${backend.name}`, { skip: backend.skip }, () => {
    const subjects: Subject[] = [];
    const subject = async () => {
      const s = await backend.subject();
      subjects.push(s);
      return s;
    };
    before(() => backend.setup());
    after(async () => {
      await Promise.all(subjects.map((s) => s.cleanup()));
      await backend.teardown();
    });

    test('get and list of nothing', async () => {
      const { store } = await subject();
      assert.equal(await store.get('nope'), undefined);
      const l = await store.list('');
      assert.deepEqual(l.entries, []);
      assert.ok(l.revision >= 0);
    });

    test('a compare on a missing key (modRevision 0) creates once', async () => {
      const { store } = await subject();
      const first = await store.txn([{ key: 'a', modRevision: 0 }], [put('a', '1')]);
      assert.equal(first.succeeded, true);
      assert.deepEqual(await store.get('a'), { key: 'a', value: '1', createRevision: first.revision, modRevision: first.revision });
      const second = await store.txn([{ key: 'a', modRevision: 0 }], [put('a', '2')]);
      assert.deepEqual(second, { succeeded: false, revision: first.revision });
      assert.equal((await store.get('a'))?.value, '1');
    });

    test('a compare on modRevision: a stale one fails, the current one wins; createRevision stays', async () => {
      const { store } = await subject();
      const r1 = (await store.txn([], [put('k', 'v1')])).revision;
      const r2 = (await store.txn([{ key: 'k', modRevision: r1 }], [put('k', 'v2')])).revision;
      assert.ok(r2 > r1);
      const stale = await store.txn([{ key: 'k', modRevision: r1 }], [put('k', 'v3')]);
      assert.equal(stale.succeeded, false);
      assert.deepEqual(await store.get('k'), { key: 'k', value: 'v2', createRevision: r1, modRevision: r2 });
      // modRevision 0 on an existing key fails too.
      assert.equal((await store.txn([{ key: 'k', modRevision: 0 }], [put('k', 'v4')])).succeeded, false);
    });

    test('ops apply atomically at one revision; list is sorted and bounded by the prefix', async () => {
      const { store } = await subject();
      await store.txn([], [put('p/gone', 'x')]);
      const r = await store.txn([], [put('p/b', '2'), put('p/a', '1'), put('p/c', '3'), put('q/x', '9'), del('p/gone')]);
      assert.equal(r.succeeded, true);
      const l = await store.list('p/');
      assert.deepEqual(l.entries.map((e) => [e.key, e.value, e.modRevision]), [['p/a', '1', r.revision], ['p/b', '2', r.revision], ['p/c', '3', r.revision]]);
      assert.equal(l.revision, r.revision);
      assert.equal(await store.get('p/gone'), undefined);
      assert.deepEqual((await store.list('')).entries.map((e) => e.key), ['p/a', 'p/b', 'p/c', 'q/x']);
    });

    test('a failed txn applies nothing, even when some compares hold', async () => {
      const { store } = await subject();
      const r1 = (await store.txn([], [put('a', '1')])).revision;
      const res = await store.txn([{ key: 'a', modRevision: r1 }, { key: 'b', modRevision: 12345 }], [put('x', 'new'), del('a')]);
      assert.deepEqual(res, { succeeded: false, revision: r1 });
      assert.equal(await store.get('x'), undefined);
      assert.equal((await store.get('a'))?.value, '1');
    });

    test('revisions strictly increase; a txn that changes nothing keeps the revision', async () => {
      const { store } = await subject();
      let last = (await store.list('')).revision;
      for (let i = 0; i < 20; i++) {
        const r = await store.txn([], [i % 3 === 2 ? del(`r/${i - 1}`) : put(`r/${i}`, String(i))]);
        assert.ok(r.revision > last, `revision ${r.revision} after ${last}`);
        last = r.revision;
      }
      assert.deepEqual(await store.txn([], [del('r/never-existed')]), { succeeded: true, revision: last });
      assert.deepEqual(await store.txn([], []), { succeeded: true, revision: last });
    });

    test('a txn naming one key twice is refused (as etcd does)', async () => {
      const { store } = await subject();
      await assert.rejects(store.txn([], [put('d', '1'), del('d')]), { code: 'INTERNAL', message: /key d twice/ });
      assert.equal(await store.get('d'), undefined);
    });

    test('watch from a revision delivers exactly the later events, in order, a txn per batch, until aborted', async () => {
      const { store } = await subject();
      const r1 = (await store.txn([], [put('w/a', '1')])).revision;
      const r2 = (await store.txn([], [put('w/b', '2')])).revision;
      await store.txn([], [put('other', 'x')]);
      const r3 = (await store.txn([], [del('w/a')])).revision;
      const batches: WatchEvent[][] = [];
      const count = () => batches.flat().length;
      const ac = new AbortController();
      const done = store.watch('w/', r1, (events) => batches.push([...events]), ac.signal);
      await until('the two past events', () => count() >= 2);
      const r4 = (await store.txn([], [put('w/c', '3'), put('w/d', '4'), put('other', 'y')])).revision;
      await until('the live events', () => count() >= 4);
      ac.abort();
      await done;
      await store.txn([], [put('w/e', 'after abort')]);
      // once a live watch has seen w/e, the store has delivered it: the aborted watch must have got nothing
      const live: WatchEvent[] = [];
      const acLive = new AbortController();
      const liveDone = store.watch('w/', r4, (events) => live.push(...events), acLive.signal);
      await until('w/e on a live watch', () => live.some((e) => e.key === 'w/e'));
      acLive.abort();
      await liveDone;
      assert.deepEqual(batches.flat(), [
        { type: 'put', key: 'w/b', value: '2', modRevision: r2 },
        { type: 'delete', key: 'w/a', value: '', modRevision: r3 },
        { type: 'put', key: 'w/c', value: '3', modRevision: r4 },
        { type: 'put', key: 'w/d', value: '4', modRevision: r4 },
      ]);
      assert.deepEqual(batches.at(-1)?.map((e) => e.key), ['w/c', 'w/d']);
    });

    test('a watch from before the history the store keeps rejects with STORE_COMPACTED', async () => {
      const s = await subject();
      const r1 = (await s.store.txn([], [put('c/a', '1')])).revision;
      await s.store.txn([], [put('c/a', '2')]);
      await s.forgetHistory();
      await assert.rejects(s.store.watch('c/', r1 - 1, never, new AbortController().signal), { code: 'STORE_COMPACTED' });
      // From the current revision, watching works again.
      const ac = new AbortController();
      const seen: WatchEvent[] = [];
      const done = s.store.watch('c/', (await s.store.list('c/')).revision, (e) => seen.push(...e), ac.signal);
      await s.store.txn([], [put('c/a', '3')]);
      await until('the event after re-listing', () => seen.length === 1);
      ac.abort();
      await done;
    });

    test('committed data survives closing and reopening', async () => {
      const s = await subject();
      const r = (await s.store.txn([], [put('dur/a', '1'), put('dur/b', '2')])).revision;
      await s.store.txn([], [del('dur/b')]);
      const before = await s.store.list('dur/');
      await s.reopen();
      assert.deepEqual(await s.store.list('dur/'), before);
      assert.equal((await s.store.get('dur/a'))?.createRevision, r);
      const next = await s.store.txn([{ key: 'dur/a', modRevision: r }], [put('dur/a', '3')]);
      assert.ok(next.succeeded && next.revision > before.revision);
    });

    test('200 concurrent "create if absent" from several writers: exactly one wins', async () => {
      const s = await subject();
      const writers = await Promise.all([0, 1, 2, 3].map(() => s.writer()));
      const results = await Promise.all(Array.from({ length: 200 }, (_, i) =>
        writers[i % writers.length]!.txn([{ key: 'blocks/X', modRevision: 0 }], [put('blocks/X', `writer-${i}`)])));
      const winners = results.flatMap((r, i) => (r.succeeded ? [i] : []));
      assert.equal(winners.length, 1, `winners: ${winners.join(',')}`);
      assert.equal((await s.store.get('blocks/X'))?.value, `writer-${winners[0]}`);
    });

    test('leader: campaign leads, leader() names it, resign aborts lost and frees the seat', async () => {
      const s = await subject();
      const a = s.elector('http://a');
      const { lost } = await a.campaign(new AbortController().signal);
      assert.equal(await a.leader(), 'http://a');
      assert.equal((await a.campaign(new AbortController().signal)).lost, lost, 'a second campaign while leading returns the same term');
      await delay(backend.leaseMs + 500);
      assert.equal(lost.aborted, false, 'the term outlives its lease TTL while renewed');
      await a.resign();
      assert.equal(lost.aborted, true);
      assert.equal(await a.leader(), undefined);
      const again = await a.campaign(new AbortController().signal);
      assert.equal(again.lost.aborted, false);
      await a.resign();
    });

    test('leader: of two electors exactly one leads; on resign the other takes over', { skip: !backend.manyElectors && 'one controller per embedded store: its directory lock refuses a second (tested below)' }, async () => {
      const s = await subject();
      const [a, b] = [s.elector('http://a'), s.elector('http://b')];
      const ac = new AbortController();
      const pa = a.campaign(ac.signal);
      const pb = b.campaign(ac.signal);
      const first = await Promise.race([pa.then(() => 'a'), pb.then(() => 'b')]);
      const [leaderElector, other, pOther] = first === 'a' ? [a, b, pb] : [b, a, pa];
      assert.equal(await settledWithin(pOther, 300), 'pending', 'the second elector must wait');
      assert.equal(await a.leader(), `http://${first}`);
      const t0 = Date.now();
      await leaderElector.resign();
      const { lost } = await pOther;
      assert.ok(Date.now() - t0 < backend.leaseMs, `took over ${Date.now() - t0} ms after resign: the seat was not freed at once (lease TTL ${backend.leaseMs} ms)`);
      assert.equal(await a.leader(), `http://${first === 'a' ? 'b' : 'a'}`);
      assert.equal(lost.aborted, false);
      await other.resign();
    });
  });
}

describe('EmbeddedStore: log, snapshot and lock', () => {
  const dirs: string[] = [];
  const freshDir = () => {
    const d = mkdtempSync(join(tmpRoot, 'emb-'));
    dirs.push(d);
    return d;
  };

  test('a second open of one directory is refused, naming the directory and the pid', async () => {
    const dir = freshDir();
    const store = await EmbeddedStore.open(dir);
    try {
      await assert.rejects(EmbeddedStore.open(dir), (err: Error & { code?: string }) => {
        assert.equal(err.code, 'STORE_UNAVAILABLE');
        assert.match(err.message, new RegExp(`${dir}.*process ${process.pid}`));
        return true;
      });
      // And by another process.
      const other = spawnSync(process.execPath, ['--input-type=module', '-e', `
        import { EmbeddedStore } from ${JSON.stringify(join(import.meta.dirname, '../../src/adapters/store/store-embedded.ts'))};
        try { await EmbeddedStore.open(${JSON.stringify(dir)}); console.log('opened'); } catch (e) { console.log(e.code); }`], { encoding: 'utf8' });
      assert.equal(other.stdout.trim(), 'STORE_UNAVAILABLE', other.stderr);
    } finally {
      await store.close();
    }
    const again = await EmbeddedStore.open(dir);
    await again.close();
  });

  test('a lock left by a dead process is stale and taken over', async () => {
    const dir = freshDir();
    const dead = spawnSync(process.execPath, ['-e', '']);
    assert.ok(dead.pid > 0);
    writeFileSync(join(dir, 'LOCK'), `${dead.pid}\n`);
    const store = await EmbeddedStore.open(dir);
    assert.equal(readFileSync(join(dir, 'LOCK'), 'utf8').trim(), String(process.pid));
    await store.close();
    assert.equal(existsSync(join(dir, 'LOCK')), false);
  });

  test('a torn last log line (crash mid-append) is dropped; later appends start clean', async () => {
    const dir = freshDir();
    let store = await EmbeddedStore.open(dir);
    const r = (await store.txn([], [put('t/a', '1')])).revision;
    await store.close();
    appendFileSync(join(dir, 'wal.log'), '{"rev":2,"ops":[{"type":"put","key":"t/b","val');
    store = await EmbeddedStore.open(dir);
    assert.deepEqual((await store.list('t/')).entries.map((e) => e.key), ['t/a']);
    const r2 = (await store.txn([], [put('t/c', '3')])).revision;
    assert.equal(r2, r + 1);
    await store.close();
    store = await EmbeddedStore.open(dir);
    assert.deepEqual((await store.list('t/')).entries.map((e) => e.key), ['t/a', 't/c']);
    await store.close();
  });

  test('a damaged line before the end of the log refuses the open, naming file and line', async () => {
    const dir = freshDir();
    const store = await EmbeddedStore.open(dir);
    for (let i = 0; i < 3; i++) await store.txn([], [put(`m/${i}`, String(i))]);
    await store.close();
    const log = join(dir, 'wal.log');
    const lines = readFileSync(log, 'utf8').split('\n');
    lines[1] = lines[1]!.replace('"m/1"', '"m/X"');
    writeFileSync(log, lines.join('\n'));
    await assert.rejects(EmbeddedStore.open(dir), { code: 'STORE_UNAVAILABLE', message: new RegExp(`${log} is damaged at line 2 \\(checksum mismatch\\)`) });
    assert.equal(existsSync(join(dir, 'LOCK')), false, 'a refused open leaves no lock behind');
  });

  test('snapshots by time and by size; log lines the snapshot already holds are skipped on replay', async () => {
    const dir = freshDir();
    const log = join(dir, 'wal.log');
    let now = 0;
    let store = await EmbeddedStore.open(dir, { clock: () => now, maxLogBytes: 1e9, snapshotIntervalMs: 60_000 });
    for (let i = 0; i < 10; i++) await store.txn([], [put(`s/${i}`, String(i))]);
    copyFileSync(log, `${log}.keep`);
    assert.equal(existsSync(join(dir, 'snapshot.json')), false);
    now = 61_000;
    const r11 = (await store.txn([], [put('s/10', '10')])).revision;
    assert.equal(statSync(log).size, 0, 'the log restarts after a snapshot');
    const snapped = await store.list('s/');
    await store.close();

    // A crash between the snapshot's rename and the log's truncation leaves lines the snapshot holds in the log.
    copyFileSync(`${log}.keep`, log);
    store = await EmbeddedStore.open(dir);
    assert.deepEqual(await store.list('s/'), snapped);
    assert.equal((await store.txn([], [put('s/11', '11')])).revision, r11 + 1);
    await store.close();

    store = await EmbeddedStore.open(dir, { maxLogBytes: 300 });
    for (let i = 12; i < 30; i++) await store.txn([], [put(`s/${i}`, String(i))]);
    assert.ok(statSync(log).size < 300, 'a size-triggered snapshot restarted the log');
    const full = await store.list('s/');
    assert.equal(full.entries.length, 30);
    await store.close();
    store = await EmbeddedStore.open(dir);
    assert.deepEqual(await store.list('s/'), full);
    await store.close();
  });

  test('transactions decided while the log is written share its next write (group commit): each resolves on disk, decided on what came before it, and a read of a key waits for its write', async () => {
    const dir = freshDir();
    let store = await EmbeddedStore.open(dir);
    const base = (await store.txn([], [put('g/base', 'x')])).revision;
    // 200 at once: creates of distinct keys, then 50 that each want g/0 absent (one wins), decided in call order
    const creates = Array.from({ length: 200 }, (_, i) => store.txn([{ key: `g/${i}`, modRevision: 0 }], [put(`g/${i}`, String(i))]));
    const racers = Array.from({ length: 50 }, () => store.txn([{ key: 'g/0', modRevision: 0 }], [put('g/0', 'racer')]));
    const read = store.get('g/0');
    const results = await Promise.all(creates);
    assert.deepEqual(results.map((r) => r.revision), Array.from({ length: 200 }, (_, i) => base + 1 + i));
    assert.equal((await Promise.all(racers)).filter((r) => r.succeeded).length, 0, 'g/0 was decided created before any racer');
    assert.equal((await read)?.value, '0', 'the read waited for the write of g/0');
    await store.close();
    store = await EmbeddedStore.open(dir);
    const listed = await store.list('g/');
    assert.equal(listed.entries.length, 201);
    assert.equal(listed.revision, base + 200);
    await store.close();
  });

  test('closing ends watches with STORE_UNAVAILABLE and refuses further calls', async () => {
    const store = await EmbeddedStore.open(freshDir());
    const ended = assert.rejects(store.watch('', 0, never, new AbortController().signal), { code: 'STORE_UNAVAILABLE' });
    await store.close();
    await ended;
    await assert.rejects(store.get('x'), { code: 'STORE_UNAVAILABLE' });
  });
});

describe('EtcdStore and EtcdLeader: failover and leases', { skip: etcdSkipReason() }, () => {
  let cluster: EtcdCluster;
  before(async () => {
    cluster = await startEtcdCluster({ members: 3, dir: tmpRoot });
  });
  after(() => cluster?.stop());
  const prefix = () => `/atoll-test/${randomBytes(4).toString('hex')}/`;

  test('a txn that may have reached etcd is not resent to another endpoint; reads are', async () => {
    // An endpoint that accepts the request and resets the connection: the outcome is unknown.
    const sockets = new Set<Socket>();
    const liar = createServer((sock) => {
      sockets.add(sock);
      sock.on('data', () => sock.destroy());
    });
    await new Promise<void>((resolve) => liar.listen(0, '127.0.0.1', resolve));
    const liarUrl = `http://127.0.0.1:${(liar.address() as { port: number }).port}`;
    const store = new EtcdStore({ endpoints: [liarUrl, cluster.endpoints[1]!], prefix: prefix() });
    try {
      await assert.rejects(store.txn([{ key: 'u', modRevision: 0 }], [put('u', '1')]), { code: 'STORE_UNAVAILABLE', message: /whether it was applied is unknown/ });
      assert.equal(await store.get('u'), undefined, 'the txn was not sent to the second endpoint');
    } finally {
      await store.close();
      for (const s of sockets) s.destroy();
      liar.close();
    }
  });

  test('killing the member that serves requests: reads, txns and watches go on through the others', async () => {
    const store = new EtcdStore({ endpoints: cluster.endpoints, prefix: prefix() });
    const r1 = (await store.txn([], [put('f/a', '1')])).revision;
    const seen: WatchEvent[] = [];
    const ac = new AbortController();
    const watching = store.watch('f/', r1, (e) => seen.push(...e), ac.signal);
    try {
      await store.txn([], [put('f/b', '2')]);
      await until('the event before the kill', () => seen.length === 1);
      await cluster.kill(0, 'SIGKILL');
      assert.equal((await store.get('f/a'))?.value, '1');
      // The caller's side of the contract: on STORE_UNAVAILABLE, re-read, then retry if the txn did not apply.
      let applied = false;
      for (let attempt = 0; attempt < 5 && !applied; attempt++) {
        try {
          applied = (await store.txn([{ key: 'f/c', modRevision: 0 }], [put('f/c', '3')])).succeeded;
        } catch (err) {
          assert.equal((err as { code?: string }).code, 'STORE_UNAVAILABLE');
          applied = (await store.get('f/c')) !== undefined;
        }
      }
      assert.ok(applied);
      assert.deepEqual((await store.list('f/')).entries.map((e) => e.value), ['1', '2', '3']);
      await until('the event after the kill, through another member', () => seen.length === 2, 10_000);
      assert.deepEqual(seen.map((e) => e.key), ['f/b', 'f/c']);
    } finally {
      ac.abort();
      await watching;
      await store.close();
    }
  });

  test('a leader killed without resigning is replaced within its TTL', async () => {
    const p = prefix();
    const endpoints = cluster.endpoints.slice(1); // member 0 was killed above
    const ttlSeconds = 2;
    const child = spawn(process.execPath, [join(import.meta.dirname, '../support/etcd-elector.ts'), endpoints.join(','), p, 'http://child', String(ttlSeconds)], { stdio: ['ignore', 'pipe', 'inherit'] });
    try {
      let out = '';
      child.stdout.on('data', (d) => (out += d));
      await until('the child to lead', () => out.includes('leading'), 10_000);
      const b = new EtcdLeader({ endpoints, prefix: p, id: 'http://b', ttlSeconds });
      assert.equal(await b.leader(), 'http://child');
      const campaign = b.campaign(new AbortController().signal);
      assert.equal(await settledWithin(campaign, 500), 'pending');
      const t0 = Date.now();
      child.kill('SIGKILL');
      await campaign;
      const took = Date.now() - t0;
      assert.ok(took <= ttlSeconds * 1000 + 1000, `took over ${took} ms after the kill (TTL ${ttlSeconds} s)`);
      assert.equal(await b.leader(), 'http://b');
      await b.resign();
    } finally {
      child.kill('SIGKILL');
    }
  });

  test('lost aborts when etcd drops the lease under the leader', async () => {
    const p = prefix();
    const endpoints = cluster.endpoints.slice(1);
    const a = new EtcdLeader({ endpoints, prefix: p, id: 'http://a', ttlSeconds: 3 });
    const { lost } = await a.campaign(new AbortController().signal);
    const range = await etcdPost(endpoints[0]!, '/v3/kv/range', { key: Buffer.from(`${p}leader`).toString('base64') });
    const lease = (range.kvs as { lease: string }[])[0]!.lease;
    await etcdPost(endpoints[0]!, '/v3/lease/revoke', { ID: lease });
    // noticed at a keepalive (every TTL/3), so before the lease's TTL would have run out on its own
    await until('lost to abort', () => lost.aborted, 3000);
    assert.match(String((lost.reason as Error).message), /no longer holds its lease/);
    await a.resign();
  });
});

describe('KubeStore: a crash mid-apply, shared watches through an API server restart, a Lease taken away, objects edited by hand', () => {
  let cp: ControlPlane;
  let controller: KubeClient;
  before(async () => {
    ({ cp, controller } = await startKubeStorePlane());
  });
  after(async () => {
    controller?.close();
    await cp?.stop();
  });
  const freshName = () => `t-${randomBytes(4).toString('hex')}`;

  test('a transaction committed to the log but applied in part is seen whole, watched, and rolled forward by the next writer', async () => {
    const name = freshName();
    const a = await KubeStore.open({ kube: controller }, { name });
    const r1 = (await a.txn([], [put('x/a', '1'), put('x/gone', 'g')])).revision;
    const seen: WatchEvent[] = [];
    const ac = new AbortController();
    const watching = a.watch('x/', r1, (e) => seen.push(...e), ac.signal);
    // What a writer that died after its commit leaves: revision r1+1 in the log, its ops on no object but one.
    const path = `${STORELOGS}/${name}`;
    const log = (await cp.admin.get<LogObject>(path))!;
    const r2 = r1 + 1;
    const ops = [{ type: 'put' as const, key: 'x/a', value: '2', createRevision: r1 }, { type: 'put' as const, key: 'x/b', value: '3', createRevision: r2 }, { type: 'delete' as const, key: 'x/gone' }];
    await cp.admin.replace(path, { ...log, spec: { ...log.spec, revision: r2, appliedThrough: r1, history: [...log.spec.history, { revision: r2, ops }] } });
    const objA = (await cp.admin.list<EntryObject>(STOREENTRIES, { labelSelector: `atoll.dev/store=${name}` })).items.find((o) => o.spec.key === 'x/a')!;
    await cp.admin.replace(`${STOREENTRIES}/${objA.metadata.name}`, { ...objA, spec: { ...objA.spec, value: '2', modRevision: r2 } });

    const reader = await KubeStore.open({ kube: controller }, { name });
    const want = [{ key: 'x/a', value: '2', createRevision: r1, modRevision: r2 }, { key: 'x/b', value: '3', createRevision: r2, modRevision: r2 }];
    assert.deepEqual(await reader.list('x/'), { entries: want, revision: r2 });
    assert.equal(await reader.get('x/gone'), undefined);
    assert.deepEqual(await reader.get('x/b'), want[1]);
    await until('the committed transaction on the watch', () => seen.length === 3);
    assert.deepEqual(seen.map((e) => [e.type, e.key, e.modRevision]), [['put', 'x/a', r2], ['put', 'x/b', r2], ['delete', 'x/gone', r2]]);

    // The objects still lack it (readers never write) until a writer rolls it forward before its own commit.
    const objects = async () => (await cp.admin.list<EntryObject>(STOREENTRIES, { labelSelector: `atoll.dev/store=${name}` }))
      .items.map((o) => [o.spec.key, o.spec.value, o.spec.modRevision]).sort();
    assert.deepEqual(await objects(), [['x/a', '2', r2], ['x/gone', 'g', r1]]);
    const writer = await KubeStore.open({ kube: controller }, { name });
    const r3 = (await writer.txn([{ key: 'x/b', modRevision: r2 }], [put('y', '4')])).revision;
    assert.equal(r3, r2 + 1);
    assert.deepEqual(await objects(), [['x/a', '2', r2], ['x/b', '3', r2], ['y', '4', r3]]);
    assert.equal((await cp.admin.get<LogObject>(path))!.spec.appliedThrough, r2);
    ac.abort();
    await watching;
    await Promise.all([a, reader, writer].map((s) => s.close()));
  });

  test('watchers share one watch that outlives an API server restart; a txn meanwhile rejects STORE_UNAVAILABLE; close ends them', async () => {
    const store = await KubeStore.open({ kube: controller }, { name: freshName() });
    const r0 = (await store.txn([], [put('v/a', '0')])).revision;
    const seen: WatchEvent[][] = [[], [], []];
    const ended = seen.map((mine, i) => store.watch(i === 2 ? 'other/' : 'v/', r0, (e) => mine.push(...e), new AbortController().signal));
    await cp.killApiServer();
    try {
      await assert.rejects(store.txn([], [put('v/b', 'lost')]), { code: 'STORE_UNAVAILABLE' });
    } finally {
      await cp.startApiServer();
    }
    const r1 = (await store.txn([], [put('v/b', '1'), put('other/x', '2')])).revision;
    await until('the events after the restart', () => seen[0]!.length === 1 && seen[1]!.length === 1 && seen[2]!.length === 1, 20_000);
    assert.deepEqual(seen.map((s) => s.map((e) => [e.key, e.modRevision])), [[['v/b', r1]], [['v/b', r1]], [['other/x', r1]]]);
    const watches = /^apiserver_longrunning_requests\{[^}]*resource="storelogs"[^}]*verb="WATCH"[^}]*\} (\d+)/m.exec(await cp.admin.request<string>('GET', '/metrics'));
    assert.equal(watches?.[1], '1', 'three watchers, one Kubernetes watch');
    await store.close();
    for (const e of ended) await assert.rejects(e, { code: 'STORE_UNAVAILABLE' });
  });

  test('leader: lost aborts when the Lease is taken by another holder; leader() names the new one', async () => {
    const name = freshName();
    const a = new KubeLeaseElection({ kube: controller }, { namespace: LEASE_NAMESPACE, name, id: 'http://a', leaseDurationSeconds: 3 });
    const { lost } = await a.campaign(new AbortController().signal);
    cp.kubectl(['patch', 'lease', '-n', LEASE_NAMESPACE, name, '--type=merge', '-p', JSON.stringify({ spec: { holderIdentity: 'http://b' } })]);
    await until('lost to abort at the next renewal', () => lost.aborted, 3000);
    assert.match(String((lost.reason as Error).message), /another replica holds the Lease/);
    assert.equal(await a.leader(), 'http://b');
    await a.resign();
    assert.equal(await a.leader(), 'http://b', 'resigning a lost term leaves the new holder alone');
  });

  test('an IPBlock edited by hand to overlap another is surfaced as it is: kubectl sees it, ipam check reports it', async () => {
    const name = freshName();
    const store = await KubeStore.open({ kube: controller }, { name });
    const lease = (cidr: string, node: string) => JSON.stringify({ cidr, node, leasedAt: 1 });
    const node = (n: string) => JSON.stringify({ name: n });
    await store.txn([], [put('nodes/a', node('a')), put('nodes/b', node('b')), put('blocks/10.100.0.0-27', lease('10.100.0.0/27', 'a')), put('blocks/10.100.0.64-27', lease('10.100.0.64/27', 'b'))]);
    // A later commit marks those applied (appliedThrough); until then the log, not the objects, speaks for them.
    await store.txn([], [put('usage/a', '{}')]);
    const listed = cp.kubectl(['get', 'ipblocks', '-l', `atoll.dev/store=${name},atoll.dev/node=b`]);
    assert.match(listed, /KEY\s+NODE\s+REVISION\s+AGE/);
    assert.match(listed, new RegExp(`${name}\\.10\\.100\\.0\\.64-27\\s+blocks/10\\.100\\.0\\.64-27\\s+b\\s`));
    assert.doesNotMatch(listed, /10\.100\.0\.0-27/);
    // By hand: b's block becomes a /26 over a's.
    cp.kubectl(['patch', 'ipblock', `${name}.10.100.0.64-27`, '--type=merge', '-p', JSON.stringify({ spec: { key: 'blocks/10.100.0.0-26', value: lease('10.100.0.0/26', 'b') } })]);
    // A hand edit is no transaction: it reaches the store's view through its watch of the IPBlocks, within moments.
    const keys = async () => (await store.list('blocks/')).entries.map((e) => e.key);
    await until('the edit in the view', async () => (await keys()).includes('blocks/10.100.0.0-26'), 5000);
    assert.deepEqual(await keys(), ['blocks/10.100.0.0-26', 'blocks/10.100.0.0-27']);
    const registry = new ClusterRegistry({ store, clock: Date.now }, { clusterCidrs: [parseCidr('10.100.0.0/16') as Cidr], blockBits: 27, maxBlocksPerNode: 4, refillBelow: 8 });
    const { problems } = await registry.ipamReport();
    assert.deepEqual(problems.map((p) => p.kind), ['conflict']);
    assert.match(problems[0]!.message, /overlaps/);
    await store.close();
  });
});
