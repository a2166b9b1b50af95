/**
 * `atoll`: the command line. Each subcommand only parses its flags and wires components together.
 */
import { asAtollError } from '../core/errors.ts';
import { loadAgentConfig } from '../config/agent-config.ts';
import { jsonLogger } from '../adapters/ops/json-logger.ts';
import { IpRoute2 } from '../adapters/kernel/iproute2.ts';
import { jumpFreeWallClock } from '../adapters/timers.ts';
import { startIdleGc } from '../adapters/ops/idle-gc.ts';
import { Agent } from '../agent/agent.ts';
import { parseCommand, UsageError, usageExitCode } from './usage.ts';

const USAGE = `usage: atoll <command> [flags]

commands:
  agent --config FILE     run the node agent (root)
  controller --config FILE
                          run the cloud controller; prints the CA pin agents need
  relay --config FILE     run the relay edge nodes meet at (hole punching, relayed traffic); prints its pin
  peers [--json] [--config FILE | --socket PATH]
                          this node's tunnel peers: path (direct, relayed, down), round trip, traffic
  status [--json]         this node: the agent, the controller link and offline time, blocks and their use, peers
                          by path, versions
  trace FROM TO           how a packet from pod FROM (on this node) reaches pod TO, hop by hop, or why it cannot
  ipam show|check         blocks per node and their use; find leaks and conflicts (exit 1 leaks, 2 conflicts)
  node deregister NAME    release a node's blocks (ipam and node take --controller-config FILE)
  kubernetes secret       print the atoll-bootstrap Secret an install on Kubernetes needs (| kubectl apply -f -)
  demo                    single-node demo: an agent, two pods through containerd, a ping
  lab up|run|down         a cloud and NATed edge sites from network namespaces, with real agents and pods,
                          and a connectivity check of every pod pair (root; atoll lab --help)
  version                 print the version

Every command takes --help. Usage errors exit 2.
`;

const LEVELS = ['debug', 'info', 'warn', 'error'] as const;
type Level = (typeof LEVELS)[number];
const LOG_LEVEL = { 'log-level': { type: 'string', default: 'info' } } as const;

/** The usage of `atoll agent`, `atoll controller` and `atoll relay`, which all take a configuration file. */
function serviceUsage(name: string, what: string): string {
  return `usage: atoll ${name} --config FILE [--log-level debug|info|warn|error]

${what}
  --config FILE       its configuration (JSON; docs/configuration.md lists every key)
  --log-level LEVEL   the lowest level logged (default info); logs are JSON lines on stderr
`;
}

const AGENT_USAGE = serviceUsage('agent', 'Runs the node agent (root): the CNI socket, the pod network, the overlay and the tunnel.');
const CONTROLLER_USAGE = serviceUsage('controller', 'Runs the cloud controller: node registry, address blocks, the watch agents follow. Prints the CA pin agents need.');
const RELAY_USAGE = serviceUsage('relay', 'Runs the relay edge nodes meet at (hole punching, relayed traffic). Prints the pin agents need.');
const DEMO_USAGE = `usage: atoll demo

The single-node demo (root): a throwaway node namespace, a private containerd, an Atoll agent as its CNI, two pods
created through CRI, their IPs, a ping between them, and everything removed again.
`;
const VERSION_USAGE = 'usage: atoll version\n\nPrints the version of this atoll.\n';

function serviceFlags(command: string, usage: string, argv: string[]) {
  const { values } = parseCommand(argv, { command, usage, options: { config: { type: 'string' }, ...LOG_LEVEL } });
  if (!values.config) throw new UsageError(command, '--config FILE is required (see docs/configuration.md)', usage);
  const level = values['log-level'];
  if (!LEVELS.includes(level as Level)) throw new UsageError(command, `--log-level ${level}: must be one of ${LEVELS.join(', ')}`, usage);
  return { config: values.config, logLevel: level as Level };
}

async function runAgent(argv: string[]): Promise<number> {
  const flags = serviceFlags('atoll agent', AGENT_USAGE, argv);
  const log = jsonLogger({ level: flags.logLevel }).child('agent');
  const config = loadAgentConfig(flags.config);
  const agent = new Agent({ ip: new IpRoute2(), log, clock: Date.now, ageClock: jumpFreeWallClock }, config);
  await agent.start();
  const idleGc = startIdleGc();
  await new Promise<void>((resolve) => {
    const stop = () => resolve();
    process.once('SIGTERM', stop);
    process.once('SIGINT', stop);
  });
  idleGc.stop();
  await agent.stop();
  return 0;
}

async function runController(argv: string[]): Promise<number> {
  const flags = serviceFlags('atoll controller', CONTROLLER_USAGE, argv);
  const { loadControllerConfig } = await import('../config/controller-config.ts');
  const { Controller } = await import('../controller/controller.ts');
  const log = jsonLogger({ level: flags.logLevel }).child('controller');
  const controller = new Controller({ log, clock: Date.now }, loadControllerConfig(flags.config));
  await controller.start();
  process.stdout.write(`controller ready; agents pin its CA with caCertHash ${controller.caCertHash}\n`);
  const idleGc = startIdleGc();
  await new Promise<void>((resolve) => {
    process.once('SIGTERM', () => resolve());
    process.once('SIGINT', () => resolve());
  });
  idleGc.stop();
  await controller.stop();
  return 0;
}

async function runRelay(argv: string[]): Promise<number> {
  const flags = serviceFlags('atoll relay', RELAY_USAGE, argv);
  const { loadRelayConfig } = await import('../config/relay-config.ts');
  const { Relay } = await import('../relay/relay.ts');
  const relay = new Relay(loadRelayConfig(flags.config), jsonLogger({ level: flags.logLevel }).child('relay'));
  await relay.start();
  process.stdout.write(`relay ready; agents pin it with relayPin ${relay.pin}\n`);
  const idleGc = startIdleGc();
  await new Promise<void>((resolve) => {
    process.once('SIGTERM', () => resolve());
    process.once('SIGINT', () => resolve());
  });
  idleGc.stop();
  relay.stop();
  return 0;
}

async function main(argv: string[]): Promise<number> {
  const [cmd, ...rest] = argv;
  switch (cmd) {
    case 'agent':
      return runAgent(rest);
    case 'controller':
      return runController(rest);
    case 'relay':
      return runRelay(rest);
    case 'peers': {
      const { runPeers } = await import('./peers.ts');
      return runPeers(rest);
    }
    case 'status': {
      const { runStatus } = await import('./status.ts');
      return runStatus(rest);
    }
    case 'trace': {
      const { runTrace } = await import('./status.ts');
      return runTrace(rest);
    }
    case 'ipam': {
      const { runIpam } = await import('./admin.ts');
      return runIpam(rest);
    }
    case 'node': {
      const { runNode } = await import('./admin.ts');
      return runNode(rest);
    }
    case 'kubernetes': {
      const { runKubernetes } = await import('./kubernetes.ts');
      return runKubernetes(rest);
    }
    case 'demo': {
      parseCommand(rest, { command: 'atoll demo', usage: DEMO_USAGE, options: {} });
      const { runDemo } = await import('../lab/demo.ts');
      return runDemo();
    }
    case 'lab': {
      const { runLab } = await import('./lab.ts');
      return runLab(rest);
    }
    case 'version':
      parseCommand(rest, { command: 'atoll version', usage: VERSION_USAGE, options: {} });
      process.stdout.write('atoll 0.1.0\n');
      return 0;
    case 'help':
    case '--help':
    case '-h':
      process.stdout.write(USAGE);
      return 0;
    default:
      throw new UsageError('atoll', cmd === undefined ? 'a command is needed' : `unknown command "${cmd}"`, USAGE);
  }
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (err: unknown) => {
    const usage = usageExitCode(err, (s) => process.stdout.write(s), (s) => process.stderr.write(s));
    if (usage !== undefined) {
      process.exitCode = usage;
      return;
    }
    const e = asAtollError(err);
    process.stderr.write(`atoll: ${e.message}${e.fix ? `\n  fix: ${e.fix}` : ''}\n  (code ${e.code})\n`);
    process.exitCode = 1;
  },
);
