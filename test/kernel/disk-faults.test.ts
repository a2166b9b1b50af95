/**
 * Disk faults under a real agent (issue #39): its data directory is a throwaway mount made here (a small tmpfs),
 * filled to ENOSPC, remounted read-only, or given a torn record file, while pods are added and deleted through the
 * real `atoll-cni`. Each fault must give the runtime a CNI error with our catalogued code, leave nothing half-done
 * (no veth, no record, no address in the pod), and after the fault clears, a restart must lose, duplicate or leak
 * nothing that was acknowledged. Every mount is unmounted in `after`, also when a test fails.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readdirSync, readFileSync, rmSync, truncateSync } from 'node:fs';
import { join } from 'node:path';
import { TestAgent } from '../../harness/agent.ts';
import { fill, mountTmpfs, remount, unmount } from '../../harness/disk.ts';
import { rootSkipReason, sh } from '../../harness/netns.ts';
import { hostVethName } from '../../src/core/plan/pod-plan.ts';

interface Pod {
  readonly name: string;
  readonly cid: string;
  readonly netns: string;
}

/** The records in the agent's IPAM directory: file name, and whether it is an active allocation (two lines). */
function records(agent: TestAgent): { file: string; active: boolean }[] {
  const dir = join(agent.dataDir, 'atoll');
  return readdirSync(dir).map((file) => ({ file, active: readFileSync(join(dir, file), 'utf8').trim().split('\n').length === 2 }));
}

function podAddress(agent: TestAgent, pod: Pod): string | undefined {
  const res = agent.execIn(pod.netns, 'ip', ['-j', '-4', 'addr', 'show', 'dev', 'eth0']);
  if (res.code !== 0) return undefined;
  return JSON.parse(res.out)[0]?.addr_info?.[0]?.local as string | undefined;
}

function hostVethExists(agent: TestAgent, pod: Pod): boolean {
  return spawnSync('ip', ['-n', agent.netns, 'link', 'show', hostVethName(pod.cid, 'eth0')]).status === 0;
}

/** Asserts a failed ADD left nothing: no veth on either side, no record file (nor a temporary one) for the pod. */
function assertNothingOf(agent: TestAgent, pod: Pod): void {
  assert.equal(hostVethExists(agent, pod), false, `host veth of ${pod.name} left behind`);
  assert.equal(agent.execIn(pod.netns, 'ip', ['link', 'show', 'eth0']).code === 0, false, `eth0 left in ${pod.name}'s namespace`);
  const left = records(agent).filter((r) => r.file.includes(`_default_${pod.name}`));
  assert.deepEqual(left, [], `record files left for ${pod.name}`);
}

/** Asserts the CNI call failed with code 5 (I/O failure) and our catalogued code. */
function assertStoreFailure(res: { code: number; json: Record<string, unknown> | undefined; stdout: string }, what: string): void {
  assert.notEqual(res.code, 0, `${what} should fail`);
  assert.equal(res.json?.code, 5, `${what}: CNI code 5 (I/O failure) expected: ${res.stdout}`);
  assert.match(String(res.json?.details), /atoll code IPAM_STORE_FAILED/, res.stdout);
}

describe('disk faults under a real agent', { skip: rootSkipReason() }, () => {
  let agent: TestAgent;
  const pods = new Map<string, Pod>();
  /** Addresses acknowledged by a successful ADD, by pod name: none may be lost or given twice. */
  const acked = new Map<string, string>();

  const pod = (name: string): Pod => {
    let p = pods.get(name);
    if (!p) {
      p = { name, cid: `c-${name}`, netns: agent.podNetns(name) };
      pods.set(name, p);
    }
    return p;
  };
  const cni = (verb: string, p: Pod) => agent.cni(agent.env(verb, p.cid, p.netns, { namespace: 'default', name: p.name }), agent.netconf());
  const add = (name: string): string => {
    const p = pod(name);
    const res = cni('ADD', p);
    assert.equal(res.code, 0, `ADD ${name}: ${res.stdout}`);
    const ip = ((res.json?.ips as { address: string }[])[0]?.address ?? '').split('/')[0] as string;
    acked.set(name, ip);
    return ip;
  };

  /** Restarts the agent (SIGKILL: a crash), then checks every acknowledged pod kept its address, veth and record. */
  const restartAndAudit = async (live: readonly string[]) => {
    await agent.stop('SIGKILL');
    await agent.start();
    const recs = records(agent);
    const ips = recs.map((r) => r.file.split('_')[0]);
    assert.equal(new Set(ips).size, ips.length, `an address recorded twice: ${ips.join(' ')}`);
    assert.deepEqual(recs.filter((r) => r.active).map((r) => r.file.split('_').slice(1).join('_')).sort(), live.map((n) => `default_${n}`).sort(),
      'the active records are exactly the live pods');
    for (const name of live) {
      const p = pod(name);
      assert.equal(podAddress(agent, p), acked.get(name), `${name} lost its address`);
      assert.ok(hostVethExists(agent, p), `${name}'s veth was removed by the restart`);
      // a repeated ADD (the runtime retrying) hands back the same address
      const again = cni('ADD', p);
      assert.equal(again.code, 0, again.stdout);
      assert.equal(((again.json?.ips as { address: string }[])[0]?.address ?? '').split('/')[0], acked.get(name));
    }
    const held = live.map((n) => podAddress(agent, pod(n)));
    assert.equal(new Set(held).size, held.length, `an address configured in two pods: ${held.join(' ')}`);
  };

  before(async () => {
    agent = new TestAgent({ name: 'df', podCidrs: ['10.83.0.0/24'] });
    mountTmpfs(agent.dataDir, 256 * 1024);
    await agent.start();
  });

  after(async () => {
    try {
      await agent?.stop('SIGKILL');
    } finally {
      if (agent) {
        unmount(agent.dataDir);
        await agent.cleanup();
      }
    }
  });

  test('disk full: ADD and DEL fail with code 5 and leave nothing half-done; after space returns, a restart keeps every acknowledged address', async () => {
    try {
      add('full-a');
      add('full-c');
      const filler = fill(agent.dataDir);
      const b = pod('full-b');
      assertStoreFailure(cni('ADD', b), 'ADD on a full disk');
      assertNothingOf(agent, b);
      // DEL on a full disk: the veth goes, the release cannot be written, so the runtime is told to retry
      const c = pod('full-c');
      assertStoreFailure(cni('DEL', c), 'DEL on a full disk');
      assert.equal(hostVethExists(agent, c), false);
      assert.ok(records(agent).some((r) => r.file.endsWith('_default_full-c') && r.active), 'the unreleased record stays as it was');
      rmSync(filler);
      add('full-b');
      assert.equal(cni('DEL', c).code, 0, 'the retried DEL succeeds once space is back');
      acked.delete('full-c');
      assert.ok(records(agent).some((r) => r.file.endsWith('_default_full-c') && !r.active), 'full-c kept as a reservation');
      await restartAndAudit(['full-a', 'full-b']);
    } catch (err) {
      console.error(agent.dump());
      throw err;
    }
  });

  test('read-only file system: ADD fails with code 5 and leaves nothing; the agent restarts and serves on it; after rw, a restart keeps everything', async () => {
    try {
      remount(agent.dataDir, 'ro');
      const d = pod('ro-d');
      assertStoreFailure(cni('ADD', d), 'ADD on a read-only disk');
      assertNothingOf(agent, d);
      // full-b's sandbox dies while the disk is read-only: the restart's reconcile cannot write its release
      const b = pod('full-b');
      sh('ip', ['-n', agent.netns, 'link', 'del', hostVethName(b.cid, 'eth0')]);
      acked.delete('full-b');
      // an agent (re)started on a read-only disk serves: CHECK of the existing pods works, ADD says why it cannot
      await agent.stop('SIGKILL');
      await agent.start();
      const a = pod('full-a');
      const check = agent.cni(agent.env('CHECK', a.cid, a.netns, { namespace: 'default', name: a.name }), agent.netconf('1.0.0', {
        prevResult: { cniVersion: '1.0.0', interfaces: [{ name: 'eth0', sandbox: a.netns }], ips: [{ address: `${acked.get('full-a')}/24`, interface: 0 }] },
      }));
      assert.equal(check.code, 0, `CHECK on a read-only disk: ${check.stdout}`);
      assert.match(readFileSync(agent.logPath, 'utf8'), /cannot write IPAM records: releases and expiries wait.*"code":"IPAM_STORE_FAILED".*EROFS/, 'the agent says what it cannot do');
      assertStoreFailure(cni('ADD', d), 'ADD after a restart on a read-only disk');
      assertNothingOf(agent, d);
      remount(agent.dataDir, 'rw', agent.pid);
      add('ro-d');
      await restartAndAudit(['full-a', 'ro-d']);
      assert.ok(records(agent).some((r) => r.file.endsWith('_default_full-b') && !r.active), 'full-b kept as a reservation once the disk is writable');
    } catch (err) {
      console.error(agent.dump());
      throw err;
    }
  });

  test('a record torn by a power cut: the restart says so with a code, and its address goes to no other pod', async () => {
    try {
      // the unit tests try every offset (src/core/ipam/record-codec.test.ts); here one, under a real restart
      const a = pod('full-a');
      const ip = acked.get('full-a') as string;
      const file = join(agent.dataDir, 'atoll', `${ip}_default_full-a`);
      await agent.stop('SIGKILL');
      truncateSync(file, 3);
      await agent.start();
      const log = readFileSync(agent.logPath, 'utf8');
      assert.ok(log.split('\n').some((l) => l.includes('"code":"IPAM_RECORD_DAMAGED"') && l.includes(`${ip}_default_full-a`)), 'the damaged record is logged with its code');
      // its container is unknown now, so its veth went at the restart's reconcile (before any ADD was served)
      assert.equal(hostVethExists(agent, a), false);
      const other = add('torn-e');
      assert.notEqual(other, ip, 'the damaged record\'s address went to another pod');
      // the pod re-created (a new sandbox) gets its address back, and the record is whole again
      const again: Pod = { name: 'full-a', cid: 'c-full-a-2', netns: agent.podNetns('full-a2') };
      pods.set('full-a', again);
      const res = cni('ADD', again);
      assert.equal(res.code, 0, res.stdout);
      assert.equal(((res.json?.ips as { address: string }[])[0]?.address ?? '').split('/')[0], ip, 'the re-created pod lost its sticky address');
      assert.equal(readFileSync(file, 'utf8'), 'c-full-a-2\neth0\n');
      await restartAndAudit(['full-a', 'ro-d', 'torn-e']);
    } catch (err) {
      console.error(agent.dump());
      throw err;
    }
  });

  test('fsync failing (libfiu): ADD fails with code 5 and leaves nothing; once fsync works, a restart keeps everything', { skip: fiuSkipReason() }, async () => {
    try {
      // fiu-run preloads libfiu with nothing enabled; fiu-ctrl then fails fsync(2) in the agent's process alone (its
      // children, `ip` and `nft`, and every other call keep working: failing every write would abort Node itself)
      await agent.stop('SIGKILL');
      // (its control pipes, one pair per process, go into the agent's directory, removed with it)
      const fifos = join(agent.dir, 'fiu-ctrl');
      await agent.start(15_000, ['ip', 'netns', 'exec', agent.netns, 'fiu-run', '-x', '-f', fifos]);
      const pid = String(agent.pid);
      sh('fiu-ctrl', ['-f', fifos, '-c', 'enable name=posix/io/sync/fsync,failinfo=5', pid]); // errno 5: EIO
      const f = pod('fsync-f');
      const res = cni('ADD', f);
      assertStoreFailure(res, 'ADD with fsync failing');
      assert.match(String(res.json?.details), /EIO/, res.stdout);
      assertNothingOf(agent, f);
      sh('fiu-ctrl', ['-f', fifos, '-c', 'disable name=posix/io/sync/fsync', pid]);
      add('fsync-f');
      await restartAndAudit(['full-a', 'ro-d', 'torn-e', 'fsync-f']);
    } catch (err) {
      console.error(agent.dump());
      throw err;
    }
  });
});

/** Why the fsync test skips here (Debian's fiu-utils gives fiu-run and fiu-ctrl), or false. */
function fiuSkipReason(): string | false {
  return spawnSync('fiu-run', ['-h']).error ? 'needs fiu-run and fiu-ctrl (apt-get install fiu-utils)' : false;
}
