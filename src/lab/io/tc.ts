/**
 * The one wrapper around `tc`: qdisc changes go through `tc -batch -` (one process for many lines), in a network
 * namespace when asked. Only the lab uses it, for the delay and rate of edge uplinks.
 */
import { atollError } from '../../core/errors.ts';
import { type Exec, exec as realExec } from '../../adapters/exec.ts';

export class Tc {
  readonly #exec: Exec;

  constructor(exec: Exec = realExec) {
    this.#exec = exec;
  }

  /**
   * Applies `lines` (each a `tc` command without the leading `tc`) in one process; stops at the first failure.
   * @throws AtollError KERNEL_OP_FAILED naming the namespace and tc's message (e.g. an unknown qdisc kind).
   */
  async batch(lines: readonly string[], opts: { netns?: string } = {}): Promise<void> {
    if (lines.length === 0) return;
    const res = await this.#exec('tc', ['-batch', '-'], { input: lines.join('\n') + '\n', netns: opts.netns });
    if (res.code !== 0) {
      throw atollError('KERNEL_OP_FAILED', `tc -batch failed${opts.netns ? ` in ${opts.netns}` : ''}: ${res.stderr.trim()} (batch: ${lines.join(' ; ')})`,
        'check that the kernel has the qdisc named (netem for delay, tbf for rate)');
    }
  }
}
