/**
 * The one wrapper around `nft`: applies a ruleset as one atomic `nft -f -` transaction, in the agent's namespace or
 * the one given. The agent's overlay replaces Atoll's table this way on every sync (src/core/overlay/nft.ts: the
 * ruleset declares, deletes and re-creates the table), so nothing is read back or diffed; the lab applies its NAT
 * routers' rulesets and its faults' cuts through it too.
 */
import { atollError } from '../../core/errors.ts';
import { type Exec, exec as realExec } from '../exec.ts';

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
}
