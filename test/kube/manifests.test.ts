/**
 * The install artefacts against the real thing: deploy/atoll.yaml is the Helm chart's default render (helm v3.19
 * built from its Go module), and the real kube-apiserver validates every object of it (`kubectl apply
 * --dry-run=server`); the bootstrap Secret `atoll kubernetes secret` prints is accepted too and holds what the
 * manifest's pods mount.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { kubeBinDir, startControlPlane, type ControlPlane } from '../../harness/kube.ts';

const MANIFEST = 'deploy/atoll.yaml';

describe('install artefacts', { timeout: 300_000 }, () => {
  const dir = mkdtempSync(join(tmpdir(), 'atoll-manifests-'));
  let cp: ControlPlane;
  before(async () => {
    cp = await startControlPlane(dir);
  });
  after(async () => {
    await cp?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  test('deploy/atoll.yaml is the chart rendered with its default values', () => {
    const rendered = execFileSync(join(kubeBinDir(), 'helm'), ['template', 'atoll', 'deploy/helm/atoll', '--include-crds', '--namespace', 'atoll-system'], { encoding: 'utf8' });
    // the file is its header (comment lines up to the first document) and then exactly the render
    const text = readFileSync(MANIFEST, 'utf8');
    const body = text.slice(text.indexOf('---\n'));
    assert.match(text.slice(0, text.indexOf('---\n')), /^(#.*\n)+$/);
    assert.equal(body, rendered, 'render the chart again into deploy/atoll.yaml (its header says how)');
  });

  test('the API server accepts every object, the chart with other values too, and the bootstrap Secret', () => {
    cp.kubectl(['create', 'namespace', 'atoll-system']);
    // CRDs first: objects of their kinds (none in the manifest) would need them
    const out = cp.kubectl(['apply', '--dry-run=server', '-f', MANIFEST]);
    for (const kind of ['namespace', 'serviceaccount', 'clusterrole.rbac.authorization.k8s.io', 'role.rbac.authorization.k8s.io', 'configmap', 'customresourcedefinition.apiextensions.k8s.io', 'daemonset.apps', 'deployment.apps', 'service']) {
      assert.match(out, new RegExp(`^${kind.replace(/\./g, '\\.')}/\\S+ (created|configured|unchanged) \\(server dry run\\)$`, 'm'), `${kind} validated`);
    }
    const other = execFileSync(join(kubeBinDir(), 'helm'), ['template', 'atoll', 'deploy/helm/atoll', '--namespace', 'atoll-system',
      '--set', 'relay.enabled=false', '--set', 'controller.apiServer=http://127.0.0.1:10261', '--set', 'community=c1', '--set', 'image.tag=0.2.0',
      '--set', 'networkPolicy.enabled=true', '--set', 'networkPolicy.criSocket=/run/k3s/containerd/containerd.sock'], { encoding: 'utf8' });
    assert.doesNotMatch(other, /kind: Deployment\nmetadata:\n  name: atoll-relay/);
    assert.match(readFileSync(MANIFEST, 'utf8'), /kind: Deployment\nmetadata:\n  name: atoll-relay/);
    assert.match(other, /"server": "http:\/\/127.0.0.1:10261"/);
    // NetworkPolicy on: both agents' configurations name the CRI socket, whose folder both agents mount read-only
    assert.equal(other.match(/"criSocket": "\/run\/k3s\/containerd\/containerd.sock",\n\s+"metrics"[^]*?"networkPolicy": true/g)?.length, 2);
    assert.equal(other.match(/- name: cri\n {10}mountPath: \/run\/k3s\/containerd\n {10}readOnly: true/g)?.length, 2);
    assert.doesNotMatch(readFileSync(MANIFEST, 'utf8'), /criSocket|name: cri$/m);
    cp.kubectl(['apply', '--dry-run=server', '-f', '-'], other);
    const secret = execFileSync(process.execPath, ['src/cli/main.ts', 'kubernetes', 'secret'], { encoding: 'utf8' });
    const keys = Object.keys((JSON.parse(secret) as { stringData: Record<string, string> }).stringData);
    for (const k of readFileSync(MANIFEST, 'utf8').matchAll(/- \{key: ([\w.-]+), path/g)) assert.ok(keys.includes(k[1] as string), `the Secret holds ${k[1]}`);
    assert.match(cp.kubectl(['apply', '--dry-run=server', '-f', '-'], secret), /secret\/atoll-bootstrap created \(server dry run\)/);
  });
});
