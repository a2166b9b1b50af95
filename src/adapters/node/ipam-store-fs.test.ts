import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { AtollError } from '../../core/errors.ts';
import type { IpamRecord } from '../../core/ipam/sticky-pool.ts';
import { FsIpamStore } from './ipam-store-fs.ts';

const rec = (ip: number, name: string, containerId = `c-${name}`, releasedAt?: number): IpamRecord => ({
  ip: (10 << 24) + ip, namespace: 'ns', name, containerId, ifName: 'eth0', ...(releasedAt === undefined ? {} : { releasedAt }),
});

async function withStore(fn: (store: FsIpamStore) => Promise<void>): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'atoll-ipam-'));
  try {
    const store = new FsIpamStore(dir, 'net');
    store.load();
    await fn(store);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

test('queued writes land on disk, each file with its last change, and load back', () => withStore(async (store) => {
  const a = rec(2, 'a');
  const b = rec(3, 'b');
  // Queued back to back: the first starts a batch, the others join the next one.
  await Promise.all([
    store.persistQueued([{ op: 'put', record: a }]),
    store.persistQueued([{ op: 'put', record: b }]),
    store.persistQueued([{ op: 'put', record: { ...a, releasedAt: 5 } }]),
    store.persistQueued([{ op: 'remove', record: b }]),
    store.persistQueued([]),
  ]);
  assert.deepEqual(readdirSync(store.dir), ['10.0.0.2_ns_a']);
  assert.deepEqual(store.load().records, [{ ...a, releasedAt: 5 }]);
}));

test('a reclaimed address: the old owner\'s file is removed and the new one written, in one batch', () => withStore(async (store) => {
  const old = rec(4, 'old', 'c-old', 1);
  await store.persistQueued([{ op: 'put', record: old }]);
  const fresh = rec(4, 'new');
  await store.persistQueued([{ op: 'remove', record: old }, { op: 'put', record: fresh }]);
  assert.deepEqual(readdirSync(store.dir), ['10.0.0.4_ns_new']);
  assert.match(readFileSync(join(store.dir, '10.0.0.4_ns_new'), 'utf8'), /^c-new\neth0/);
}));

test('a failed batch rejects every waiter in it with IPAM_STORE_FAILED naming the file; later batches still run', () => withStore(async (store) => {
  const blocker = join(store.dir, '.tmp-10.0.0.5_ns_x'); // the temporary file cannot be created: a directory is in the way
  mkdirSync(blocker);
  const first = store.persistQueued([{ op: 'put', record: rec(4, 'ok') }]); // starts a batch at once
  const failing = store.persistQueued([{ op: 'put', record: rec(5, 'x') }]); // these two share the next batch
  const sharing = store.persistQueued([{ op: 'put', record: rec(6, 'y') }]);
  await first;
  const isStoreError = (err: unknown) => err instanceof AtollError && err.code === 'IPAM_STORE_FAILED' && err.message.includes('10.0.0.5_ns_x');
  await assert.rejects(failing, isStoreError);
  await assert.rejects(sharing, isStoreError);
  rmSync(blocker, { recursive: true });
  await store.persistQueued([{ op: 'put', record: rec(7, 'z') }]);
  assert.ok(readdirSync(store.dir).includes('10.0.0.7_ns_z'));
}));

test('a batch whose directory vanished fails with IPAM_STORE_FAILED', () => withStore(async (store) => {
  rmSync(store.dir, { recursive: true });
  await assert.rejects(store.persistQueued([{ op: 'put', record: rec(8, 'w') }]), (err: unknown) => err instanceof AtollError && err.code === 'IPAM_STORE_FAILED' && err.message.includes('10.0.0.8_ns_w'));
}));
