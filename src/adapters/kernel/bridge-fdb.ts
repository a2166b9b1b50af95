/**
 * The one wrapper around iproute2's `bridge` for forwarding-database entries of Atoll's VXLAN device: writes in one
 * `bridge -batch -` process (the overlay reads them over netlink, src/adapters/kernel/netlink.ts).
 */
import { atollError } from '../../core/errors.ts';
import { type Exec, exec as realExec } from '../exec.ts';

export class BridgeFdb {
  readonly #exec: Exec;

  constructor(exec: Exec = realExec) {
    this.#exec = exec;
  }

  /** Applies `bridge -batch` lines; stops at the first failure. */
  async batch(lines: readonly string[]): Promise<void> {
    if (lines.length === 0) return;
    const res = await this.#exec('bridge', ['-batch', '-'], { input: lines.join('\n') + '\n' });
    if (res.code !== 0) throw atollError('KERNEL_OP_FAILED', `bridge -batch failed: ${res.stderr.trim()}`, 'check `bridge fdb show`; the next resync retries');
  }
}
