/**
 * Calling a CNI plugin executable as a container runtime does (libcni's invoke): `CNI_*` variables in the
 * environment, the network configuration on stdin, the result or error object on stdout. The lab creates its pods
 * this way with `--pods direct` (or when containerd is not installed).
 */
import { spawn } from 'node:child_process';
import { join } from 'node:path';

export interface CniInvocation {
  readonly binDir: string;
  /** The plugin's `type`: the executable's name in binDir. */
  readonly type: string;
  readonly command: 'ADD' | 'DEL' | 'CHECK';
  readonly containerId: string;
  /** Path of the pod's network namespace. */
  readonly netns: string;
  readonly ifname: string;
  /** CNI_ARGS pairs (K8S_POD_NAMESPACE, K8S_POD_NAME, ...). */
  readonly args: Readonly<Record<string, string>>;
  /** The plugin's network configuration (with `name` and `cniVersion`, as libcni passes it). */
  readonly config: Readonly<Record<string, unknown>>;
  readonly timeoutMs?: number;
}

export interface CniOutcome {
  /** Exit status; -1 when killed by the timeout or a signal. */
  readonly code: number;
  /** The parsed stdout: a result on success, an error object otherwise. */
  readonly output: Record<string, unknown> | undefined;
  readonly stdout: string;
  readonly stderr: string;
}

/** Runs the plugin once; resolves with what it printed; rejects only when it cannot be started. */
export function invokeCni(inv: CniInvocation): Promise<CniOutcome> {
  const args = ['IgnoreUnknown=1', ...Object.entries(inv.args).map(([k, v]) => `${k}=${v}`)].join(';');
  const env = {
    PATH: process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin',
    CNI_COMMAND: inv.command, CNI_CONTAINERID: inv.containerId, CNI_NETNS: inv.netns, CNI_IFNAME: inv.ifname, CNI_PATH: inv.binDir, CNI_ARGS: args,
  };
  return new Promise((resolve, reject) => {
    const child = spawn(join(inv.binDir, inv.type), [], { env, stdio: ['pipe', 'pipe', 'pipe'], timeout: inv.timeoutMs ?? 30_000 });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout.on('data', (d: Buffer) => out.push(d));
    child.stderr.on('data', (d: Buffer) => err.push(d));
    child.on('error', reject);
    child.on('close', (code) => {
      const stdout = Buffer.concat(out).toString('utf8');
      let output: Record<string, unknown> | undefined;
      try {
        output = stdout.trim() ? (JSON.parse(stdout) as Record<string, unknown>) : undefined;
      } catch {
        output = undefined;
      }
      resolve({ code: code ?? -1, output, stdout, stderr: Buffer.concat(err).toString('utf8') });
    });
    child.stdin.on('error', () => {});
    child.stdin.end(JSON.stringify(inv.config));
  });
}
