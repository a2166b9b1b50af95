/**
 * The wrapper around iproute2's `ip` for everything off the pod hot path: in the agent the bridge, the overlay's VXLAN
 * device, neighbours and routes, the tunnel's routes, start-up checks, reconcile and CHECK; in the lab its namespaces,
 * links and route lookups. Writes go through `ip -batch -` (one process for many changes), reads through `ip -json`.
 * A pod's ADD and DEL talk rtnetlink directly (netlink.ts), since each `ip` forks the agent. The other callers of
 * `ip`: the TUN adapter sets up its own device (tun.ts), the demo adds its namespace, and the lab starts processes
 * under `ip netns exec`.
 */
import { atollError } from '../core/errors.ts';
import { type Exec, exec as realExec } from './exec.ts';

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
