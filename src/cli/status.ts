/**
 * `atoll status` and `atoll trace`: what the agent on this node knows, read from its status socket
 * (src/adapters/ops/status-socket.ts) and explained by the pure core (src/core/ops/).
 */
import { renderStatus } from '../core/ops/agent-status.ts';
import { blockOwner, type ControllerView, renderTrace, resolvePodRef, tracePath } from '../core/ops/trace.ts';
import { asAtollError } from '../core/errors.ts';
import type { IpamReport } from './admin.ts';
import { parseIpv4 } from '../core/net/ipv4.ts';
import { parseL4, type PolicyTrace, renderPolicyTrace } from '../core/ops/policy-trace.ts';
import { readAgentStatus, readPolicyTrace } from '../adapters/ops/status-socket.ts';
import { parseCommand, UsageError } from './usage.ts';
import { SOCKET_OPTIONS, statusSocketFrom } from './peers.ts';

const SOCKET_HELP = `  --config FILE   the agent's configuration (its socketPath locates the status socket)
  --socket PATH   the status socket itself (default /run/atoll/atoll-status.sock)`;

const STATUS_USAGE = `usage: atoll status [--json] [--config FILE | --socket PATH]

This node as its agent sees it (root): the agent (ready, version, uptime), the link to the controller and how long it
has been offline, the blocks and their use (in use, reserved, free, sticky re-uses), the site's peers, the tunnel's
peers by path (direct, hole-punched, relayed, down), the relay, and the agent versions in the cluster.
  --json          the agent's answer as JSON
${SOCKET_HELP}
`;

const TRACE_USAGE = `usage: atoll trace FROM TO [--port PROTOCOL/PORT] [--json] [--config FILE | --socket PATH] [--controller-config FILE]

Explains hop by hop how a packet from pod FROM (on this node) reaches pod TO, from this node's agent (root): same
node; same site over VXLAN to a node's VTEP, or a direct route; beyond the site the tunnel, direct, hole-punched or
relayed through the relay; or why there is no path (communities differ, the peer down since when, no block owner, outside an edge node's view,
hole punching failed and the relay down) and where it breaks. With networkPolicy on, it also says, from the rules the
agent enforces, which NetworkPolicy and rule let the packet out of FROM and into TO (when TO is on this node), or
which side drops it and which policies isolate that pod. Exit 0 with a path the policies allow, 1 without.
  FROM, TO        a pod IPv4 address, or namespace/name of a pod on this node
  --port PROTOCOL/PORT
                  the packet's protocol and destination port (tcp/80, udp/53, sctp/9): one verdict, allowed or
                  dropped; without it, every rule that lets FROM reach TO is listed with the ports it allows, and
                  the verdict is dropped only when some side allows nothing at all
  --json          the explanation as JSON
${SOCKET_HELP}
  --controller-config FILE
                  also ask the controller (its configuration file: URL, admin token, CA) who holds TO's block,
                  and say where this agent's view differs; when it is unreachable, say so and explain anyway
`;

const write = (s: string) => process.stdout.write(s);

export async function runStatus(argv: string[]): Promise<number> {
  const { values } = parseCommand(argv, { command: 'atoll status', usage: STATUS_USAGE, options: { json: { type: 'boolean', default: false }, ...SOCKET_OPTIONS } });
  const st = await readAgentStatus(statusSocketFrom(values));
  if (values.json) write(`${JSON.stringify(st, null, 2)}\n`);
  else for (const line of renderStatus(st)) write(`${line}\n`);
  return 0;
}

export async function runTrace(argv: string[]): Promise<number> {
  const { values, positionals } = parseCommand(argv, { command: 'atoll trace', usage: TRACE_USAGE, options: { json: { type: 'boolean', default: false }, port: { type: 'string' }, ...SOCKET_OPTIONS, 'controller-config': { type: 'string' } }, positionals: { min: 2, max: 2 } });
  const [fromRef, toRef] = positionals as [string, string];
  const l4 = values.port === undefined ? undefined : parseL4(values.port);
  if (values.port !== undefined && !l4) throw new UsageError('atoll trace', `--port ${values.port}: give PROTOCOL/PORT, tcp, udp or sctp and 1 to 65535 (tcp/80)`, TRACE_USAGE);
  const socket = statusSocketFrom(values);
  const st = await readAgentStatus(socket);
  const from = resolvePodRef(fromRef, st);
  const to = resolvePodRef(toRef, st);
  const bad = (message: string) => new UsageError('atoll trace', message, TRACE_USAGE);
  if (!from) throw bad(`FROM ${fromRef}: no pod of that name on node ${st.node.name} (give its IPv4 address, or namespace/name of a pod on this node)`);
  if (!to) throw bad(`TO ${toRef}: no pod of that name on node ${st.node.name} (pods of other nodes are known by address only)`);
  if (!blockOwner([st.node], parseIpv4(from) as number)) {
    const elsewhere = blockOwner(st.nodes, parseIpv4(from) as number);
    throw bad(`FROM ${from} is not in this node's blocks${elsewhere ? `: it is on node ${elsewhere.name}, run atoll trace there` : ''}`);
  }
  const controllerConfig = values['controller-config'];
  let view: ControllerView | undefined;
  let unreachable = '';
  if (controllerConfig) {
    try {
      const { connection } = await import('./admin.ts');
      view = ((await connection({ 'controller-config': controllerConfig }).call('GET', '/v1/ipam')) as IpamReport).nodes;
    } catch (err) {
      unreachable = `the controller could not be asked (${asAtollError(err).message}): explained from this agent's view only`;
    }
  }
  const t = tracePath(st, from, to, view);
  const out = unreachable ? { ...t, controller: unreachable } : t;
  // NetworkPolicy: from the plan the agent enforces, when it enforces one
  let policy: { trace: PolicyTrace; lines: string[]; verdict: 'allowed' | 'dropped' | 'depends' } | undefined;
  if (st.policy?.hasView) {
    const trace = await readPolicyTrace(socket, { from, to, ...(values.port ? { port: values.port } : {}) });
    policy = { trace, ...renderPolicyTrace(trace, { from, to, ...(l4 ? { l4 } : {}), self: st.node.name, toNode: t.to.node }) };
  }
  if (values.json) write(`${JSON.stringify(policy ? { ...out, policy: { verdict: policy.verdict, sides: policy.trace.sides } } : out, null, 2)}\n`);
  else {
    for (const line of renderTrace(out)) write(`${line}\n`);
    if (policy) {
      write(`  policy: ${policy.verdict === 'depends' ? 'allowed on some ports only' : policy.verdict}${l4 ? ` (${values.port})` : ''}\n`);
      for (const line of policy.lines) write(`    ${line}\n`);
    } else if (st.policy) write('  policy: no view yet (the ruleset in the kernel, if any, is in force)\n');
  }
  return t.path === 'broken' || t.path === 'not allowed' || policy?.verdict === 'dropped' ? 1 : 0;
}
