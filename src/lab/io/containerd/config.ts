/**
 * Where a private containerd (containerd.ts beside it) keeps its files below its workDir (config, root, state,
 * sockets, logs), and the config it runs with: TOML version 2, the CRI plugin on overlayfs and runc, the pause image
 * as its sandbox image, the CNI directories given, the plugins it never needs disabled.
 */
import { join } from 'node:path';
import { PAUSE_IMAGE_REF } from './pause-image.ts';
import type { ContainerdInit } from './containerd.ts';

/** File layout of one instance below workDir. */
export interface Paths {
  config: string;
  root: string;
  state: string;
  socket: string;
  ttrpcSocket: string;
  opt: string;
  log: string;
  podLogs: string;
  pauseImageDir: string;
  cgroupKeep: string;
}

/** Computes the file layout below `workDir`. */
export function layout(workDir: string): Paths {
  return {
    config: join(workDir, 'containerd.toml'),
    root: join(workDir, 'root'),
    state: join(workDir, 'state'),
    socket: join(workDir, 'containerd.sock'),
    ttrpcSocket: join(workDir, 'containerd.sock.ttrpc'),
    opt: join(workDir, 'opt'),
    log: join(workDir, 'containerd.log'),
    podLogs: join(workDir, 'pod-logs'),
    pauseImageDir: join(workDir, 'pause-image'),
    cgroupKeep: join(workDir, 'cgroup-keep'),
  };
}

/** Plugins the harness never needs; disabling them keeps start-up quiet and free of probing. */
const DISABLED_PLUGINS: readonly string[] = [
  'io.containerd.snapshotter.v1.aufs',
  'io.containerd.snapshotter.v1.btrfs',
  'io.containerd.snapshotter.v1.devmapper',
  'io.containerd.snapshotter.v1.zfs',
  'io.containerd.tracing.processor.v1.otlp',
  'io.containerd.internal.v1.tracing',
];

/** Renders containerd's config (TOML version 2). JSON string syntax is valid TOML for basic strings and arrays. */
export function renderConfig(p: Paths, init: ContainerdInit): string {
  const q = JSON.stringify;
  const cri = '[plugins."io.containerd.grpc.v1.cri"';
  return `${[
    'version = 2',
    `root = ${q(p.root)}`,
    `state = ${q(p.state)}`,
    `disabled_plugins = ${q(DISABLED_PLUGINS)}`,
    '',
    '[grpc]',
    `  address = ${q(p.socket)}`,
    '[ttrpc]',
    `  address = ${q(p.ttrpcSocket)}`,
    '[debug]',
    `  level = ${q(init.logLevel ?? 'info')}`,
    '[plugins."io.containerd.internal.v1.opt"]',
    `  path = ${q(p.opt)}`,
    `${cri}]`,
    `  sandbox_image = ${q(PAUSE_IMAGE_REF)}`,
    '  restrict_oom_score_adj = true',
    '  disable_apparmor = true',
    '  disable_tcp_service = true',
    '  stream_server_address = "127.0.0.1"',
    '  stream_server_port = "0"',
    `  netns_mounts_under_state_dir = ${init.netnsUnderStateDir ?? true}`,
    `${cri}.containerd]`,
    '  snapshotter = "overlayfs"',
    '  default_runtime_name = "runc"',
    `${cri}.containerd.runtimes.runc]`,
    '  runtime_type = "io.containerd.runc.v2"',
    `${cri}.cni]`,
    `  bin_dir = ${q(init.cniBinDir)}`,
    `  conf_dir = ${q(init.cniConfDir)}`,
    '  max_conf_num = 1',
  ].join('\n')}\n`;
}
