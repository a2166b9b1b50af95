/**
 * Operator commands that talk to the controller with its admin token: `atoll ipam show|check`,
 * `atoll node deregister NAME`. They read the controller's own configuration file for its URL, admin token and
 * CA, so they run on the controller host (or anywhere with a copy of those).
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { NodeUsage } from '../core/cluster/model.ts';
import type { LeaseProblem } from '../core/cluster/blocks.ts';
import { loadControllerConfig } from '../config/controller-config.ts';
import { adminRequest } from '../adapters/node/controller-client.ts';
import { parseCommand, subcommand } from './usage.ts';

const CONNECTION_HELP = `  --controller-config FILE   the controller's configuration, for its URL, admin token and CA
                             (default /etc/atoll/controller.json)`;

const IPAM_USAGE = `usage: atoll ipam show|check [--json] [--controller-config FILE]

  show    blocks per node and their use (used, reserved, free)
  check   leaks and conflicts between leases and use: exit 0 clean, 1 leaks only, 2 conflicts
  --json  as JSON
${CONNECTION_HELP}
`;

const NODE_USAGE = `usage: atoll node deregister NAME [--controller-config FILE]

  deregister NAME   release the node's blocks and forget it; it may join again later and get new ones
${CONNECTION_HELP}
`;

export interface IpamReport {
  readonly nodes: { name: string; blocks: string[]; usage?: NodeUsage }[];
  readonly problems: LeaseProblem[];
}

export const CONNECTION = { 'controller-config': { type: 'string', default: '/etc/atoll/controller.json' } } as const;

/** The admin connection to the controller its configuration file names (URL, admin token, CA). */
export function connection(values: { 'controller-config': string; json?: boolean }) {
  const cfg = loadControllerConfig(values['controller-config'] as string);
  const ca = readFileSync(join(cfg.pkiDir ?? join(cfg.dataDir, 'pki'), 'ca.crt'), 'utf8');
  const call = (method: string, path: string) => adminRequest(cfg.advertiseUrl, ca, cfg.adminToken, method, path);
  return { call, json: values.json === true };
}

/** `atoll ipam show|check`. check exits 0 when clean, 1 with leaks only, 2 with conflicts (leaks or not). */
export async function runIpam(argv: string[]): Promise<number> {
  const [sub, rest] = subcommand(argv, 'atoll ipam', ['show', 'check'], IPAM_USAGE);
  const { values } = parseCommand(rest, { command: `atoll ipam ${sub}`, usage: IPAM_USAGE, options: { ...CONNECTION, json: { type: 'boolean', default: false } } });
  const { call, json } = connection(values);
  const report = (await call('GET', '/v1/ipam')) as IpamReport;
  if (sub === 'show') {
    if (json) process.stdout.write(JSON.stringify(report, null, 2) + '\n');
    else {
      const rows = report.nodes.map((n) => [n.name, n.blocks.join(' '), n.usage ? `${n.usage.allocated}/${n.usage.capacity}` : '-', n.usage ? String(n.usage.reserved) : '-', n.usage ? String(n.usage.free) : '-']);
      printTable(['NODE', 'BLOCKS', 'USED', 'RESERVED', 'FREE'], rows);
      if (report.problems.length > 0) process.stdout.write(`\n${report.problems.length} problem(s): run atoll ipam check\n`);
    }
    return 0;
  }
  const leaks = report.problems.filter((p) => p.kind === 'leak');
  const conflicts = report.problems.filter((p) => p.kind === 'conflict');
  if (json) process.stdout.write(JSON.stringify({ leaks, conflicts }, null, 2) + '\n');
  else if (report.problems.length === 0) process.stdout.write('ipam check: no leaks, no conflicts\n');
  else for (const p of report.problems) process.stdout.write(`${p.kind.toUpperCase()}: ${p.message}\n`);
  return conflicts.length > 0 ? 2 : leaks.length > 0 ? 1 : 0;
}

/** `atoll node deregister NAME`: releases the node's blocks; it may register again later and get new ones. */
export async function runNode(argv: string[]): Promise<number> {
  const [, rest] = subcommand(argv, 'atoll node', ['deregister'], NODE_USAGE);
  const { values, positionals } = parseCommand(rest, { command: 'atoll node deregister', usage: NODE_USAGE, options: CONNECTION, positionals: { min: 1, max: 1 } });
  const { call } = connection(values);
  const name = positionals[0] as string;
  const { released } = (await call('DELETE', `/v1/nodes/${encodeURIComponent(name)}`)) as { released: string[] };
  process.stdout.write(`node ${name} deregistered; released ${released.length ? released.join(', ') : 'no blocks'}\n`);
  return 0;
}

function printTable(head: string[], rows: string[][]): void {
  const widths = head.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  for (const r of [head, ...rows]) process.stdout.write(r.map((c, i) => c.padEnd(widths[i] ?? 0)).join('  ').trimEnd() + '\n');
}
