/**
 * The one wrapper around iproute2's `bridge` for forwarding-database entries of Atoll's VXLAN device: reads with
 * `bridge -json fdb show`, writes in one `bridge -batch -` process.
 */
import { atollError } from '../core/errors.ts';
import type { FdbEntry } from '../core/overlay/plan.ts';
import { type Exec, exec as realExec } from './exec.ts';

interface FdbJson {
  readonly mac: string;
  readonly dst?: string;
  readonly ifname?: string;
  readonly state?: string;
  readonly flags?: readonly string[];
}

export class BridgeFdb {
  readonly #exec: Exec;

  constructor(exec: Exec = realExec) {
    this.#exec = exec;
  }

  /** Static unicast entries with a remote destination on `dev` (the default all-zero entry is not ours). */
  async list(dev: string): Promise<FdbEntry[]> {
    const res = await this.#exec('bridge', ['-json', 'fdb', 'show', 'dev', dev]);
    if (res.code !== 0) {
      if (/does not exist|Cannot find device/.test(res.stderr)) return [];
      throw atollError('KERNEL_OP_FAILED', `bridge fdb show dev ${dev} failed: ${res.stderr.trim()}`);
    }
    const text = res.stdout.trim();
    const rows = text === '' ? [] : (JSON.parse(text) as FdbJson[]);
    return rows.filter((r) => r.dst && r.mac !== '00:00:00:00:00:00').map((r) => ({ mac: r.mac, dst: r.dst as string, dev }));
  }

  /** Applies `bridge -batch` lines; stops at the first failure. */
  async batch(lines: readonly string[]): Promise<void> {
    if (lines.length === 0) return;
    const res = await this.#exec('bridge', ['-batch', '-'], { input: lines.join('\n') + '\n' });
    if (res.code !== 0) throw atollError('KERNEL_OP_FAILED', `bridge -batch failed: ${res.stderr.trim()}`, 'check `bridge fdb show`; the next resync retries');
  }
}
