/**
 * The one wrapper around `nft`: applies a ruleset as one atomic `nft -f -` transaction, in the agent's namespace or
 * the one given. The agent's overlay replaces Atoll's table this way on every sync (src/core/overlay/nft.ts: the
 * ruleset declares, deletes and re-creates the table), so nothing is read back or diffed; the lab applies its NAT
 * routers' rulesets and its faults' cuts through it too.
 */
import { atollError } from '../../core/errors.ts';
import { NETLINK_NETFILTER } from '../../core/net/netlink-codec.ts';
import { type Exec, exec as realExec } from '../exec.ts';
import { RtnlSocket } from './netlink.ts';

export class Nft {
  readonly #exec: Exec;

  constructor(exec: Exec = realExec) {
    this.#exec = exec;
  }

  /**
   * Applies a rendered ruleset transaction; nothing changes if any part of it fails.
   * @param opts.netns path of a network namespace to apply it in (the lab's routers); the caller's when absent.
   */
  async apply(ruleset: string, opts: { netns?: string } = {}): Promise<void> {
    const res = await this.#exec('nft', ['-f', '-'], { input: ruleset, netns: opts.netns });
    if (res.code !== 0) {
      throw atollError('KERNEL_OP_FAILED', `nft -f failed${opts.netns ? ` in ${opts.netns}` : ''}: ${res.stderr.trim()}`, 'check that nftables is installed and the kernel has nf_tables');
    }
  }

  /**
   * The packet counts of table `family name`'s named counters, by counter name (`nft -j list counters table`: a read,
   * which commits nothing and so leaves the ruleset generation as it was).
   * @throws AtollError KERNEL_OP_FAILED when nft fails (the table does not exist) or answers something else than JSON.
   */
  async counters(table: string, opts: { netns?: string } = {}): Promise<Map<string, number>> {
    const res = await this.#exec('nft', ['-j', 'list', 'counters', 'table', ...table.split(' ')], { netns: opts.netns });
    if (res.code !== 0) throw atollError('KERNEL_OP_FAILED', `nft list counters table ${table} failed${opts.netns ? ` in ${opts.netns}` : ''}: ${res.stderr.trim()}`, 'nothing to do if the table is not applied yet; else check nftables');
    try {
      const items = (JSON.parse(res.stdout) as { nftables: { counter?: { name: string; packets: number } }[] }).nftables;
      return new Map(items.flatMap((i) => (i.counter ? [[i.counter.name, i.counter.packets] as const] : [])));
    } catch (cause) {
      throw atollError('KERNEL_OP_FAILED', `nft -j list counters table ${table} answered something that is not its JSON`, 'run a supported nftables (1.0 or later)', cause);
    }
  }

  /**
   * The calling namespace's nftables ruleset generation (every committed transaction, anyone's, moves it by one),
   * read over netlink without spawning `nft`. Callers compare it with the generation their own last commit left to
   * know whether their tables are as they left them.
   * @throws AtollError KERNEL_OP_FAILED when it cannot be read (nf_tables not loaded yet at the first request of a boot).
   */
  async generation(): Promise<number> {
    const sock = RtnlSocket.open("the agent's namespace", NETLINK_NETFILTER);
    try {
      return await sock.nftGeneration();
    } finally {
      sock.close();
    }
  }
}
