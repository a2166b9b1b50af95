/**
 * The one wrapper around iproute2's `ip`. Writes go through `ip -batch -` (one process for many changes), reads
 * through `ip -json`. In the agent it serves the bridge, the overlay's VXLAN device, neighbours and routes, the
 * tunnel's routes, start-up checks, reconcile and CHECK; in the lab and the demo their namespaces, links and route
 * lookups. A pod's ADD and DEL talk rtnetlink directly (netlink.ts), since each `ip` forks the agent.
 * {@link ipSync} serves the one synchronous caller, opening a TUN device (tun.ts). Besides this file, only the
 * process launchers name `ip`, to start processes under `ip netns exec`.
 */
import { spawnSync } from 'node:child_process';
import { atollError } from '../../core/errors.ts';
import { type Exec, exec as realExec } from '../exec.ts';

export interface IpOptions {
  /** Network namespace path to act in; the agent's own namespace when absent. */
  readonly netns?: string;
  /** batch only: carry on past a failed line (`ip -force`), then report the failures. */
  readonly force?: boolean;
}

export interface IpLink {
  readonly ifname: string;
  readonly ifindex: number;
  readonly address?: string;
  readonly mtu: number;
  readonly master?: string;
  readonly operstate?: string;
  readonly flags?: readonly string[];
  readonly linkinfo?: { readonly info_kind?: string; readonly info_slave_kind?: string; readonly info_slave_data?: Record<string, unknown> };
}

export interface IpAddrInfo {
  readonly family: string;
  readonly local: string;
  readonly prefixlen: number;
}

export interface IpAddr {
  readonly ifname: string;
  readonly addr_info: readonly IpAddrInfo[];
}

export interface IpRoute {
  readonly dst: string;
  readonly gateway?: string;
  readonly dev?: string;
  readonly protocol?: string;
  readonly scope?: string;
  readonly type?: string;
}

const NO_DEVICE = /Cannot find device|does not exist|No such device/;

/** iproute2 bound to an injected process runner. */
export class IpRoute2 {
  readonly #exec: Exec;

  constructor(exec: Exec = realExec) {
    this.#exec = exec;
  }

  /**
   * Applies `lines` (each an `ip` command without the leading `ip`) in one process; stops at the first failure, or
   * with `force` carries on past it.
   * @throws AtollError KERNEL_OP_FAILED naming the failed line and the kernel's message.
   */
  async batch(lines: readonly string[], opts: IpOptions = {}): Promise<void> {
    if (lines.length === 0) return;
    const res = await this.#exec('ip', [...(opts.force ? ['-force'] : []), '-batch', '-'], { input: lines.join('\n') + '\n', netns: opts.netns });
    if (res.code !== 0) {
      const where = opts.netns ? ` in network namespace ${opts.netns}` : '';
      throw atollError('KERNEL_OP_FAILED', `ip -batch failed${where}: ${res.stderr.trim()} (batch: ${lines.join(' ; ')})`,
        'check the kernel log and `ip -d link`; the change was rolled back where it could be');
    }
  }

  /** Runs a read-only `ip -json ...` query and parses its answer. */
  async json<T>(args: readonly string[], opts: IpOptions = {}): Promise<T[]> {
    const res = await this.#exec('ip', ['-json', ...args], { netns: opts.netns });
    if (res.code !== 0) {
      if (NO_DEVICE.test(res.stderr)) return [];
      throw atollError('KERNEL_OP_FAILED', `ip -json ${args.join(' ')} failed: ${res.stderr.trim()}`);
    }
    const text = res.stdout.trim();
    return text === '' ? [] : (JSON.parse(text) as T[]);
  }

  /** The link named `name`, with details, or undefined when there is none. */
  async link(name: string, opts: IpOptions = {}): Promise<IpLink | undefined> {
    return (await this.json<IpLink>(['-details', 'link', 'show', 'dev', name], opts))[0];
  }

  async links(opts: IpOptions = {}): Promise<IpLink[]> {
    return this.json<IpLink>(['-details', 'link', 'show'], opts);
  }

  async addrs(opts: IpOptions = {}): Promise<IpAddr[]> {
    return this.json<IpAddr>(['addr', 'show'], opts);
  }

  async routes(opts: IpOptions = {}): Promise<IpRoute[]> {
    return this.json<IpRoute>(['route', 'show', 'table', 'all'], opts);
  }
}

/**
 * Runs one `ip` command and waits for it, blocking: for opening a TUN device (tun.ts), which is synchronous so the
 * device comes up with its settings or not at all. `opts.netns`: the path of a named namespace (/var/run/netns/NAME),
 * passed as `ip -n NAME`. `what` names the object in the error.
 * @throws AtollError KERNEL_OP_FAILED with the command and the kernel's message.
 */
export function ipSync(args: readonly string[], what: string, opts: Pick<IpOptions, 'netns'> = {}): void {
  const full = opts.netns ? ['-n', opts.netns.split('/').pop() as string, ...args] : [...args];
  const r = spawnSync('ip', full, { encoding: 'utf8', timeout: 10_000 });
  if (r.status !== 0) {
    throw atollError('KERNEL_OP_FAILED', `${what}: \`ip ${full.join(' ')}\` failed: ${(r.stderr || String(r.error ?? '')).trim()}`,
      'check that iproute2 is installed and the device exists');
  }
}
