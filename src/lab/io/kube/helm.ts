/**
 * `helm template`: renders a chart with values to the manifest an install applies (helm 3, from `make k8s`). Only
 * rendering: nothing talks to a cluster here, the caller applies the result with kubectl as a user would pipe it.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { exec } from '../../../adapters/exec.ts';
import { atollError } from '../../../core/errors.ts';

/** Options of {@link helmTemplate}. */
export interface HelmTemplateInit {
  /** The helm binary. */
  readonly binary: string;
  /** The chart's directory. */
  readonly chart: string;
  readonly release: string;
  readonly namespace: string;
  /** Values over the chart's defaults (written to a values file for `-f`). */
  readonly values: Readonly<Record<string, unknown>>;
}

/**
 * Renders the chart with its CRDs (`helm template RELEASE CHART --include-crds --namespace NS -f values`) and
 * resolves with the manifest. @throws AtollError LAB_STEP_FAILED with helm's stderr when it fails.
 */
export async function helmTemplate(init: HelmTemplateInit): Promise<string> {
  const dir = mkdtempSync(join(tmpdir(), 'atoll-helm-'));
  try {
    const valuesPath = join(dir, 'values.json');
    writeFileSync(valuesPath, JSON.stringify(init.values));
    const res = await exec(init.binary, ['template', init.release, init.chart, '--include-crds', '--namespace', init.namespace, '-f', valuesPath]);
    if (res.code !== 0) throw atollError('LAB_STEP_FAILED', `helm template ${init.chart} failed (status ${res.code}): ${res.stderr.trim()}`, 'helm names the template or value at fault');
    return res.stdout;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
