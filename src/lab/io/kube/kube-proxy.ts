/**
 * A real kube-proxy (v1.34) in a lab node's network namespace, so ClusterIP Services answer on every node.
 *
 * Why this shape:
 * - nftables mode: its rules go into tables of its own (`ip kube-proxy`, `ip6 kube-proxy`) in the node's namespace,
 *   beside Atoll's and the lab's, never in the machine's.
 * - `conntrack.maxPerCore: 0` and `min: 0`: kube-proxy leaves nf_conntrack_max alone (a machine-wide setting);
 *   the TCP timeouts it would set are per namespace anyway, and left at their defaults.
 * - Health and metrics on the namespace's loopback; it authenticates as `system:kube-proxy` (bound to
 *   system:node-proxier by the apiserver's bootstrap RBAC) with a bearer token.
 * Stopped by PID.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Child, logTail } from '../child-process.ts';
import { atollError } from '../../../core/errors.ts';
import { renderTokenKubeconfig } from './token-kubeconfig.ts';

/** Options of {@link startKubeProxy}. */
export interface KubeProxyInit {
  /** The kube-proxy binary (`sh scripts/k8s.sh all`). */
  readonly binary: string;
  /** A private directory: config, kubeconfig and log go below it. */
  readonly dir: string;
  /** The node's network namespace (a path, /var/run/netns/NAME). */
  readonly netnsPath: string;
  readonly nodeName: string;
  /** The pods' range: traffic from outside it to a Service is masqueraded. */
  readonly clusterCidr: string;
  /** The apiserver as this node reaches it, its CA (PEM) and a token of user system:kube-proxy. */
  readonly apiServer: { readonly server: string; readonly ca: string; readonly token: string };
}

/** A running kube-proxy. */
export interface KubeProxy {
  readonly pid: number;
  readonly running: boolean;
  logTail(lines?: number): string;
  /** SIGTERM (SIGKILL after 5 s). Idempotent. */
  stop(): Promise<void>;
}

/** The KubeProxyConfiguration (JSON is YAML). */
export function renderKubeProxyConfig(init: { kubeconfig: string; nodeName: string; clusterCidr: string }): string {
  return `${JSON.stringify({
    apiVersion: 'kubeproxy.config.k8s.io/v1alpha1',
    kind: 'KubeProxyConfiguration',
    mode: 'nftables',
    clientConnection: { kubeconfig: init.kubeconfig },
    hostnameOverride: init.nodeName,
    clusterCIDR: init.clusterCidr,
    conntrack: { maxPerCore: 0, min: 0 },
    healthzBindAddress: '127.0.0.1:10256',
    metricsBindAddress: '127.0.0.1:10249',
  }, null, 2)}\n`;
}

/** Starts kube-proxy in `init.netnsPath`; returns once it runs (it syncs its rules as Services and endpoints appear). */
export function startKubeProxy(init: KubeProxyInit): KubeProxy {
  mkdirSync(init.dir, { recursive: true, mode: 0o700 });
  const caPath = join(init.dir, 'ca.crt');
  const kubeconfig = join(init.dir, 'kube-proxy.kubeconfig');
  const configPath = join(init.dir, 'kube-proxy.json');
  const logPath = join(init.dir, 'kube-proxy.log');
  writeFileSync(caPath, init.apiServer.ca);
  writeFileSync(kubeconfig, renderTokenKubeconfig(init.apiServer.server, caPath, init.apiServer.token), { mode: 0o600 });
  writeFileSync(configPath, renderKubeProxyConfig({ kubeconfig, nodeName: init.nodeName, clusterCidr: init.clusterCidr }));
  const child = new Child(['nsenter', `--net=${init.netnsPath}`, '--', init.binary, '--config', configPath, '--v=1'], { output: { log: logPath }, detached: true });
  if (child.pid === undefined) throw atollError('LAB_STEP_FAILED', `kube-proxy for node ${init.nodeName}: could not start ${init.binary} (nsenter missing?)`, 'install util-linux (nsenter)');
  const pid = child.pid;
  let stopping: Promise<void> | undefined;
  return {
    pid,
    get running() {
      return child.running;
    },
    logTail: (lines = 30) => logTail(logPath, lines),
    stop: () => (stopping ??= child.stop()),
  };
}
