/**
 * Packs a root filesystem into a single-layer container image as a docker-archive tarball (`manifest.json`, the
 * image config, one layer), which `ctr -n k8s.io images import` loads: how images are made here without a Docker
 * engine or a registry. Used for the test bed's sandbox image and for Atoll's own image (`make image`).
 */
import { createHash } from 'node:crypto';
import { execFile } from 'node:child_process';
import { mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { atollError } from '../../core/errors.ts';

// not an ESM import, whose facade loads far more (the rule in eslint.config.js says why)
const { promisify } = process.getBuiltinModule('node:util');

const run = promisify(execFile);

/**
 * Maps Node's `process.arch` to the OCI architecture names containerd matches on import.
 * @throws AtollError IMAGE_ARCH_UNSUPPORTED for an architecture it does not know.
 */
export function ociArchitecture(arch: string): string {
  const names: Record<string, string> = { x64: 'amd64', arm64: 'arm64', arm: 'arm', ppc64: 'ppc64le', s390x: 's390x' };
  const name = names[arch];
  if (name === undefined) {
    throw atollError('IMAGE_ARCH_UNSUPPORTED', `image: no OCI architecture known for Node arch "${arch}" (this machine's); no image is packed`,
      `build images on ${Object.keys(names).join(', ')}, or add "${arch}" to ociArchitecture() in src/adapters/image/image-archive.ts`);
  }
  return name;
}

export interface PackImageInit {
  /** The root filesystem to pack (owned by root in the layer, mtimes zeroed, sorted: the same tree packs the same). */
  readonly rootfs: string;
  /** A scratch directory (made and removed). */
  readonly work: string;
  /** The tarball to write. */
  readonly out: string;
  /** The image reference, e.g. atoll.dev/atoll:0.1.0. */
  readonly ref: string;
  /** The image config's `config` (Entrypoint, Cmd, Env, WorkingDir). */
  readonly config: Readonly<Record<string, unknown>>;
  readonly createdBy: string;
}

/** @throws when `tar` fails (the error names the step). */
export async function packImage(init: PackImageInit): Promise<void> {
  await mkdir(init.work, { recursive: true });
  try {
    const layer = join(init.work, 'layer.tar');
    await run('tar', ['--create', '--file', layer, '--directory', init.rootfs, '--owner=0', '--group=0', '--numeric-owner', '--sort=name', '--mtime=@0', '.']);
    const diffId = `sha256:${createHash('sha256').update(await readFile(layer)).digest('hex')}`;
    const config = JSON.stringify({
      architecture: ociArchitecture(process.arch), os: 'linux', created: '1970-01-01T00:00:00Z', config: init.config,
      rootfs: { type: 'layers', diff_ids: [diffId] },
      history: [{ created: '1970-01-01T00:00:00Z', created_by: init.createdBy }],
    });
    const configName = `${createHash('sha256').update(config).digest('hex')}.json`;
    await writeFile(join(init.work, configName), config);
    await writeFile(join(init.work, 'manifest.json'), JSON.stringify([{ Config: configName, RepoTags: [init.ref], Layers: ['layer.tar'] }]));
    await run('tar', ['--create', '--file', init.out, '--directory', init.work, 'manifest.json', configName, 'layer.tar']);
  } finally {
    await rm(init.work, { recursive: true, force: true });
  }
}
