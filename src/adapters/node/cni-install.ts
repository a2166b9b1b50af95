/**
 * Installs `atoll-cni` and Atoll's conflist for the container runtime. Both are written next to their final name
 * and renamed over it, so the runtime never reads half a file; unchanged files are left alone.
 */
import { chmodSync, mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { atollError } from '../../core/errors.ts';

export const PLUGIN_TYPE = 'atoll-cni';

export interface CniInstallInit {
  readonly binDir: string;
  readonly confDir: string;
  readonly confName: string;
  readonly pluginSource: string;
  readonly conflist: Record<string, unknown>;
}

function sameContent(path: string, content: Buffer): boolean {
  try {
    return readFileSync(path).equals(content);
  } catch {
    return false;
  }
}

function replaceFile(path: string, content: Buffer, mode: number): boolean {
  if (sameContent(path, content)) return false;
  const tmp = `${path}.atoll-tmp`;
  writeFileSync(tmp, content, { mode });
  chmodSync(tmp, mode);
  renameSync(tmp, path);
  return true;
}

/** Installs the plugin and the conflist; returns the paths it changed. */
export function installCni(init: CniInstallInit): string[] {
  const changed: string[] = [];
  try {
    mkdirSync(init.binDir, { recursive: true });
    mkdirSync(init.confDir, { recursive: true });
    const bin = join(init.binDir, PLUGIN_TYPE);
    if (replaceFile(bin, readFileSync(init.pluginSource), 0o755)) changed.push(bin);
    const conf = join(init.confDir, init.confName);
    if (replaceFile(conf, Buffer.from(JSON.stringify(init.conflist, null, 2) + '\n'), 0o644)) changed.push(conf);
  } catch (cause) {
    throw atollError('KERNEL_OP_FAILED', `cannot install the CNI plugin into ${init.binDir} and ${init.confDir}`,
      'check that both directories are writable and that the set-up built bin/atoll-cni', cause);
  }
  return changed;
}

/** Atoll's conflist: our plugin first, then the chained plugins from the configuration. */
export function buildConflist(opts: { network: string; cniVersion: string; socketPath: string; chained: readonly Record<string, unknown>[] }): Record<string, unknown> {
  return {
    cniVersion: opts.cniVersion,
    name: opts.network,
    plugins: [{ type: PLUGIN_TYPE, agentSocket: opts.socketPath }, ...opts.chained],
  };
}

