/**
 * The one wrapper around `nft`: Atoll's table is replaced in one atomic `nft -f -` transaction (see
 * src/core/overlay/nft.ts) and read back with `nft -j`.
 */
import { atollError } from '../core/errors.ts';
import { NFT_TABLE } from '../core/overlay/nft.ts';
import { type Exec, exec as realExec } from './exec.ts';

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

  /** Atoll's table as `nft list` prints it, or '' when absent. */
  async listTable(): Promise<string> {
    const res = await this.#exec('nft', ['list', 'table', 'ip', NFT_TABLE]);
    return res.code === 0 ? res.stdout : '';
  }
}
