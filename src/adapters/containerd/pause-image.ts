/**
 * Builds the sandbox ("pause") image for the private containerd test bed without a registry.
 *
 * Why: containerd's CRI plugin needs a sandbox image to start a pod, and the test machines have no registry.
 * busybox-static gives one self-contained binary; `sleep` (a busybox applet) keeps the sandbox alive. The result
 * is a docker-archive tarball (`manifest.json` + image config + one layer) that `ctr images import` accepts.
 */
import { createHash } from 'node:crypto';
import { execFile } from 'node:child_process';
import { copyFile, mkdir, readFile, symlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);

/** Image reference the harness configures as containerd's `sandbox_image`. */
export const PAUSE_IMAGE_REF = 'localhost/atoll-pause:test';

/** Where busybox-static installs its statically linked binary. */
export const BUSYBOX_PATH = '/bin/busybox';

/** Busybox applets linked into the image; `sleep` is the entrypoint, the rest help when debugging a sandbox. */
const APPLETS: readonly string[] = ['sleep', 'sh', 'ip', 'ping', 'cat', 'ls'];

/** Empty directories the runtime mounts over (runc creates missing ones too, but an explicit tree is clearer). */
const ROOTFS_DIRS: readonly string[] = ['bin', 'dev', 'etc', 'proc', 'sys', 'tmp', 'run'];

/** Maps Node's `process.arch` to the OCI architecture names containerd matches on import. */
function ociArchitecture(arch: string): string {
  const names: Record<string, string> = { x64: 'amd64', arm64: 'arm64', arm: 'arm', ppc64: 'ppc64le', s390x: 's390x' };
  const name = names[arch];
  if (name === undefined) {
    throw new Error(`pause image: no OCI architecture known for Node arch "${arch}"; extend ociArchitecture()`);
  }
  return name;
}

/** Creates the rootfs tree: /bin/busybox, applet symlinks and the empty mount-point directories. */
async function writeRootfs(rootfs: string): Promise<void> {
  for (const dir of ROOTFS_DIRS) await mkdir(join(rootfs, dir), { recursive: true });
  try {
    await copyFile(BUSYBOX_PATH, join(rootfs, 'bin', 'busybox'));
  } catch (cause) {
    throw new Error(`pause image: cannot copy ${BUSYBOX_PATH}; install busybox-static (apt-get install busybox-static)`, {
      cause,
    });
  }
  for (const applet of APPLETS) await symlink('busybox', join(rootfs, 'bin', applet));
}

/** Packs `rootfs` as an uncompressed layer owned by root and returns the layer's sha256 (its diff id). */
async function packLayer(rootfs: string, layerPath: string): Promise<string> {
  await run('tar', ['--create', '--file', layerPath, '--directory', rootfs, '--owner=0', '--group=0', '--numeric-owner', '--sort=name', '--mtime=@0', '.']);
  const digest = createHash('sha256').update(await readFile(layerPath)).digest('hex');
  return `sha256:${digest}`;
}

/** Renders the image config JSON (OCI/docker image config) for a single-layer image running `sleep`. */
function imageConfig(diffId: string): string {
  return JSON.stringify({
    architecture: ociArchitecture(process.arch),
    os: 'linux',
    created: '1970-01-01T00:00:00Z',
    config: {
      Entrypoint: ['/bin/sleep'],
      Cmd: ['1000000'],
      Env: ['PATH=/bin'],
      WorkingDir: '/',
    },
    rootfs: { type: 'layers', diff_ids: [diffId] },
    history: [{ created: '1970-01-01T00:00:00Z', created_by: 'atoll test/support/pause-image.ts' }],
  });
}

/**
 * Builds a docker-archive tarball of the sandbox image {@link PAUSE_IMAGE_REF} inside `dir`.
 *
 * The image holds `/bin/busybox` from busybox-static plus applet symlinks, and runs `/bin/sleep 1000000`.
 * Precondition: `dir` exists or can be created and is private to the caller; files in it are overwritten, but
 * `dir/rootfs` must not already hold the symlinks (use a fresh directory).
 *
 * @returns the path of the tarball, ready for `ctr -n k8s.io images import`.
 * @throws if busybox-static is missing or `tar` fails (the error names the step).
 */
export async function buildPauseImage(dir: string): Promise<string> {
  const rootfs = join(dir, 'rootfs');
  const image = join(dir, 'image');
  await mkdir(image, { recursive: true });
  await writeRootfs(rootfs);
  const diffId = await packLayer(rootfs, join(image, 'layer.tar'));
  const config = imageConfig(diffId);
  const configName = `${createHash('sha256').update(config).digest('hex')}.json`;
  await writeFile(join(image, configName), config);
  const manifest = [{ Config: configName, RepoTags: [PAUSE_IMAGE_REF], Layers: ['layer.tar'] }];
  await writeFile(join(image, 'manifest.json'), JSON.stringify(manifest));
  const tarball = join(dir, 'atoll-pause.tar');
  await run('tar', ['--create', '--file', tarball, '--directory', image, 'manifest.json', configName, 'layer.tar']);
  return tarball;
}
