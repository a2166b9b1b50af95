/**
 * Kubernetes' own NetworkPolicy conformance tests against the Kubernetes lab, reduced to a few specs (`make netpol`
 * runs all of them): scripts/netpol-e2e.ts builds the `[sig-network] Netpol` suite and agnhost from the pinned
 * module, brings up `atoll lab up --kubernetes --policy` with agnhost's image on every node, runs the focused specs
 * (each creates namespaces x, y, z with pods a, b, c, applies its policies and probes every pod pair through
 * `kubectl exec`) and removes the lab. The specs: a default deny of ingress (TCP and UDP), an ingress rule on a named
 * port, and an egress rule to a CIDR with an except. Needs root, containerd, the Kubernetes binaries (make k8s), Go
 * (the suite's build) and the image (make image); skips otherwise.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { ATOLL_IMAGE_TAG, atollImageTarball } from '../../src/lab/lab-kube-install.ts';
import { REPO_ROOT } from '../../src/lab/agent-process.ts';
import { rootSkipReason } from '../../harness/netns.ts';
import { runCommand } from '../support/atoll-cli.ts';

const hasContainerd = ['/usr/bin/containerd', '/usr/sbin/runc', '/bin/busybox', '/usr/lib/cni/loopback'].every((p) => existsSync(p));
const skip = rootSkipReason() || (hasContainerd ? false : 'needs containerd, runc, busybox-static and the CNI loopback plugin')
  || (existsSync(atollImageTarball(ATOLL_IMAGE_TAG)) ? false : `needs the image ${atollImageTarball(ATOLL_IMAGE_TAG)} (make image)`);

const FOCUS = 'default-deny-ingress|allow ingress access on one named port|except clause while egress access to server in CIDR block';

test('Kubernetes\' Netpol suite, focused: default deny (TCP, UDP), a named port, an egress CIDR with except; every spec passes on the lab', { skip, timeout: 900_000 }, async () => {
  const { code, out } = await runCommand([join(REPO_ROOT, 'node_modules/.bin/node'), 'scripts/netpol-e2e.ts', '--focus', FOCUS], 840_000, REPO_ROOT);
  const tail = out.split('\n').filter((l) => !/^\s*I\d{4} /.test(l)).slice(-60).join('\n');
  assert.equal(code, 0, `the suite failed:\n${tail}`);
  // the JUnit report: each focused spec ran and passed (a focus that matched nothing would pass vacuously)
  const junit = readFileSync(join(REPO_ROOT, 'build/netpol/junit.xml'), 'utf8');
  const ran = [...junit.matchAll(/<testcase name="([^"]+)"[^>]*status="passed"/g)].map((m) => (m[1] as string).replaceAll('&#39;', '\''));
  for (const spec of ['should support a \'default-deny-ingress\' policy', 'using UDP should support a \'default-deny-ingress\' policy', 'should allow ingress access on one named port',
    'should enforce except clause while egress access to server in CIDR block']) {
    assert.ok(ran.some((n) => n.includes(spec)), `${spec} passed:\n${ran.join('\n')}\n${tail}`);
  }
  assert.doesNotMatch(junit, /status="failed"/, tail);
});
