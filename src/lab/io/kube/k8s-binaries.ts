/**
 * The folder of the pinned Kubernetes binaries (kube-apiserver, kubelet, kube-scheduler, kube-controller-manager,
 * kube-proxy, kubectl, etcd, helm, yurthub): `sh scripts/k8s.sh all` prints it on its last line, building them the first
 * time (tens of minutes on 2 cores) into a cache outside the checkout. ATOLL_K8S_BIN overrides it.
 */
import { join } from 'node:path';
import { exec } from '../../../adapters/exec.ts';
import { installRoot } from '../../../adapters/install-root.ts';
import { atollError } from '../../../core/errors.ts';

/** @throws AtollError LAB_STEP_FAILED naming the script's failure (no Go toolchain, a failed build). */
export async function kubeBinaries(): Promise<string> {
  const given = process.env['ATOLL_K8S_BIN'];
  if (given) return given;
  const script = join(installRoot(), 'scripts', 'k8s.sh');
  const res = await exec('sh', [script, 'all']);
  const dir = res.stdout.trim().split('\n').pop();
  if (res.code !== 0 || !dir) {
    throw atollError('LAB_STEP_FAILED', `sh ${script} all failed (status ${res.code}): ${res.stderr.trim().split('\n').slice(-5).join('\n')}`,
      'the script builds the Kubernetes binaries with Go: fix what its output names, or set ATOLL_K8S_BIN to a folder that holds them');
  }
  return dir;
}
