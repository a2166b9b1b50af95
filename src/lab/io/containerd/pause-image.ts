/**
 * Builds the sandbox ("pause") image for the private containerd test bed without a registry.
 *
 * Why: containerd's CRI plugin needs a sandbox image to start a pod, and the test machines have no registry.
 * busybox-static gives one self-contained binary; `sleep` (a busybox applet) keeps the sandbox alive. The result
 * is a docker-archive tarball (`manifest.json` + image config + one layer) that `ctr images import` accepts.
 */
import { copyFile, mkdir, symlink } from 'node:fs/promises';
import { join } from 'node:path';
import { packImage } from '../../../adapters/image/image-archive.ts';
import { atollError } from '../../../core/errors.ts';

/** Image reference the harness configures as containerd's `sandbox_image`. */
export const PAUSE_IMAGE_REF = 'localhost/atoll-pause:test';

/** Where busybox-static installs its statically linked binary. */
export const BUSYBOX_PATH = '/bin/busybox';

/** Busybox applets linked into the image; `sleep` is the entrypoint, the rest help when debugging a sandbox. */
const APPLETS: readonly string[] = ['sleep', 'sh', 'ip', 'ping', 'cat', 'ls'];

/** Empty directories the runtime mounts over (runc creates missing ones too, but an explicit tree is clearer). */
const ROOTFS_DIRS: readonly string[] = ['bin', 'dev', 'etc', 'proc', 'sys', 'tmp', 'run'];

/** Creates the rootfs tree: /bin/busybox, applet symlinks and the empty mount-point directories. */
async function writeRootfs(rootfs: string): Promise<void> {
  for (const dir of ROOTFS_DIRS) await mkdir(join(rootfs, dir), { recursive: true });
  try {
    await copyFile(BUSYBOX_PATH, join(rootfs, 'bin', 'busybox'));
  } catch (cause) {
    throw atollError('LAB_STEP_FAILED', `pause image: cannot copy ${BUSYBOX_PATH}; install busybox-static (apt-get install busybox-static)`, undefined, cause);
  }
  for (const applet of APPLETS) await symlink('busybox', join(rootfs, 'bin', applet));
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
  await writeRootfs(rootfs);
  const tarball = join(dir, 'atoll-pause.tar');
  await packImage({ rootfs, work: join(dir, 'image'), out: tarball, ref: PAUSE_IMAGE_REF, createdBy: 'atoll src/lab/io/containerd/pause-image.ts',
    config: { Entrypoint: ['/bin/sleep'], Cmd: ['1000000'], Env: ['PATH=/bin'], WorkingDir: '/' } });
  return tarball;
}
