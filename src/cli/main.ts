/**
 * `atoll`: the command line. Each subcommand only parses its flags and wires components together.
 */
import { parseArgs } from 'node:util';
import { asAtollError } from '../core/errors.ts';
import { loadAgentConfig } from '../config/agent-config.ts';
import { jsonLogger } from '../adapters/json-logger.ts';
import { IpRoute2 } from '../adapters/iproute2.ts';
import { Agent } from '../agent/agent.ts';

const USAGE = `usage: atoll <command> [flags]

commands:
  agent --config FILE     run the node agent (root)
  controller --config FILE
                          run the cloud controller; prints the CA pin agents need
  relay --config FILE     run the relay edge nodes meet at (hole punching, relayed traffic); prints its pin
  peers [--json] [--config FILE | --socket PATH]
                          this node's tunnel peers: path (direct, relayed, down), round trip, traffic
  ipam show|check         blocks per node and their use; find leaks and conflicts (exit 1 leaks, 2 conflicts)
  node deregister NAME    release a node's blocks (ipam and node take --controller-config FILE)
  kubernetes secret       print the atoll-bootstrap Secret an install on Kubernetes needs (| kubectl apply -f -)
  demo                    single-node demo: an agent, two pods through containerd, a ping
  lab up|run|down         a cloud and NATed edge sites from network namespaces, with real agents and pods,
                          and a connectivity check of every pod pair (root; atoll lab --help)
  version                 print the version
`;

async function runAgent(argv: string[]): Promise<number> {
  const { values } = parseArgs({ args: argv, options: { config: { type: 'string' }, 'log-level': { type: 'string', default: 'info' } } });
  if (!values.config) {
    process.stderr.write('atoll agent: --config FILE is required (see docs/configuration.md)\n');
    return 2;
  }
  const log = jsonLogger({ level: values['log-level'] as 'info' }).child('agent');
  const config = loadAgentConfig(values.config);
  const agent = new Agent({ ip: new IpRoute2(), log, clock: Date.now }, config);
  await agent.start();
  await new Promise<void>((resolve) => {
    const stop = () => resolve();
    process.once('SIGTERM', stop);
    process.once('SIGINT', stop);
  });
  await agent.stop();
  return 0;
}

async function runController(argv: string[]): Promise<number> {
  const { values } = parseArgs({ args: argv, options: { config: { type: 'string' }, 'log-level': { type: 'string', default: 'info' } } });
  if (!values.config) {
    process.stderr.write('atoll controller: --config FILE is required (see docs/configuration.md)\n');
    return 2;
  }
  const { loadControllerConfig } = await import('../config/controller-config.ts');
  const { Controller } = await import('../controller/controller.ts');
  const log = jsonLogger({ level: values['log-level'] as 'info' }).child('controller');
  const controller = new Controller({ log, clock: Date.now }, loadControllerConfig(values.config));
  await controller.start();
  process.stdout.write(`controller ready; agents pin its CA with caCertHash ${controller.caCertHash}\n`);
  await new Promise<void>((resolve) => {
    process.once('SIGTERM', () => resolve());
    process.once('SIGINT', () => resolve());
  });
  await controller.stop();
  return 0;
}

async function runRelay(argv: string[]): Promise<number> {
  const { values } = parseArgs({ args: argv, options: { config: { type: 'string' }, 'log-level': { type: 'string', default: 'info' } } });
  if (!values.config) {
    process.stderr.write('atoll relay: --config FILE is required (see docs/configuration.md)\n');
    return 2;
  }
  const { loadRelayConfig } = await import('../config/relay-config.ts');
  const { Relay } = await import('../relay/relay.ts');
  const relay = new Relay(loadRelayConfig(values.config), jsonLogger({ level: values['log-level'] as 'info' }).child('relay'));
  await relay.start();
  process.stdout.write(`relay ready; agents pin it with relayPin ${relay.pin}\n`);
  await new Promise<void>((resolve) => {
    process.once('SIGTERM', () => resolve());
    process.once('SIGINT', () => resolve());
  });
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
      const { runDemo } = await import('../lab/demo.ts');
      return runDemo(rest);
    }
    case 'lab': {
      const { runLab } = await import('./lab.ts');
      return runLab(rest);
    }
    case 'version':
      process.stdout.write('atoll 0.1.0\n');
      return 0;
    case undefined:
    case 'help':
    case '--help':
    case '-h':
      process.stdout.write(USAGE);
      return cmd === undefined ? 2 : 0;
    default:
      process.stderr.write(`atoll: unknown command "${cmd}"\n${USAGE}`);
      return 2;
  }
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (err: unknown) => {
    const e = asAtollError(err);
    process.stderr.write(`atoll: ${e.message}${e.fix ? `\n  fix: ${e.fix}` : ''}\n  (code ${e.code})\n`);
    process.exitCode = 1;
  },
);
