/**
 * `atoll peers [--json] [--config FILE | --socket PATH]`: this node's tunnel peers, read from the agent's status
 * socket (src/adapters/ops/status-socket.ts): the path each takes now (direct, relayed, down), its round trip, the traffic,
 * hole punching, the peers left out with why, and the tunnel's drop counters.
 */
import { renderPeers } from '../core/tunnel/status.ts';
import { loadAgentConfig } from '../config/agent-config.ts';
import { readTunnelStatus, statusSocketOf } from '../adapters/ops/status-socket.ts';
import { parseCommand } from './usage.ts';

const USAGE = `usage: atoll peers [--json] [--config FILE | --socket PATH]

This node's tunnel peers, from its agent's status socket (root): the path each takes (direct, relayed, down), the
round trip, the traffic, hole punching, the peers left out and why, and the tunnel's drop counters.
  --json          the agent's answer as JSON
  --config FILE   the agent's configuration (its socketPath locates the status socket)
  --socket PATH   the status socket itself (default /run/atoll/atoll-status.sock)
`;

/** The options that locate the agent's status socket, shared by `atoll peers`, `atoll status` and `atoll trace`. */
export const SOCKET_OPTIONS = { config: { type: 'string' }, socket: { type: 'string' } } as const;

/** The status socket `--socket` names, or the one beside the CNI socket of `--config` (default /run/atoll). */
export function statusSocketFrom(values: { config?: string | undefined; socket?: string | undefined }): string {
  return values.socket ?? statusSocketOf(values.config ? loadAgentConfig(values.config).socketPath : '/run/atoll/atoll.sock');
}

export async function runPeers(argv: string[]): Promise<number> {
  const { values } = parseCommand(argv, { command: 'atoll peers', usage: USAGE, options: { json: { type: 'boolean', default: false }, ...SOCKET_OPTIONS } });
  const tunnel = await readTunnelStatus(statusSocketFrom(values));
  // a reader that went away (`atoll peers | head`) is not an error
  process.stdout.on('error', (err: NodeJS.ErrnoException) => {
    if (err.code !== 'EPIPE') throw err;
  });
  if (values.json) {
    process.stdout.write(`${JSON.stringify(tunnel, null, 2)}\n`);
    return 0;
  }
  if (!tunnel) {
    process.stdout.write('this node runs no tunnel (no `tunnel` section in its agent configuration)\n');
    return 0;
  }
  for (const line of renderPeers(tunnel, Date.now())) process.stdout.write(`${line}\n`);
  return 0;
}
