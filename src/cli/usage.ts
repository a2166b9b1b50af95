/**
 * How every `atoll` command parses its arguments: one usage text per command, `--help`/`-h` anywhere prints it on
 * stdout (exit 0), and a mistake in the arguments (unknown flag, missing value, missing or extra argument) is a usage
 * error: a one-line reason on stderr, the hint to run `--help`, exit 2. Commands throw; src/cli/main.ts prints and
 * chooses the exit code in one place ({@link usageExitCode}).
 */
import type { ParseArgsOptionsConfig } from 'node:util';

// not an ESM import, whose facade loads far more (the rule in eslint.config.js says why)
const { parseArgs } = process.getBuiltinModule('node:util');

/** Thrown when the arguments are wrong; `usage` is the command's usage text. */
export class UsageError extends Error {
  readonly usage: string;
  readonly command: string;
  constructor(command: string, message: string, usage: string) {
    super(message);
    this.name = 'UsageError';
    this.command = command;
    this.usage = usage;
  }
}

/** Thrown when `--help` was asked for: not a failure. */
export class HelpRequested extends Error {
  readonly usage: string;
  constructor(usage: string) {
    super('help requested');
    this.name = 'HelpRequested';
    this.usage = usage;
  }
}

export interface CommandSpec<O extends ParseArgsOptionsConfig> {
  /** How the command is called, as in `atoll peers`: names it in error messages. */
  readonly command: string;
  readonly usage: string;
  readonly options: O;
  /** How many positional arguments it takes, at least and at most (default none). */
  readonly positionals?: { readonly min: number; readonly max: number };
}

/**
 * Parses `argv` strictly against `spec.options` plus `--help`/`-h`.
 * @throws HelpRequested on --help; UsageError on an unknown flag, a flag without its value, or a wrong count of
 * positional arguments.
 */
export function parseCommand<const O extends ParseArgsOptionsConfig>(argv: readonly string[], spec: CommandSpec<O>) {
  let parsed;
  try {
    parsed = parseArgs({ args: [...argv], options: { ...spec.options, help: { type: 'boolean', short: 'h' } }, allowPositionals: true, strict: true });
  } catch (err) {
    // node:util's advice on positionals that start with '-' does not apply to these commands
    throw new UsageError(spec.command, (err as Error).message.replace(/\. To specify a positional argument.*$/s, ''), spec.usage);
  }
  if ((parsed.values as { help?: boolean }).help) throw new HelpRequested(spec.usage);
  const { min, max } = spec.positionals ?? { min: 0, max: 0 };
  const n = parsed.positionals.length;
  if (n > max) throw new UsageError(spec.command, `unexpected argument "${parsed.positionals[max]}"`, spec.usage);
  if (n < min) throw new UsageError(spec.command, `${min - n} more argument${min - n === 1 ? '' : 's'} needed`, spec.usage);
  return parsed;
}

/**
 * Picks the subcommand from `argv[0]` among `names`.
 * @throws HelpRequested for `help`, `--help`, `-h`; UsageError when it is missing or unknown.
 */
export function subcommand<const N extends string>(argv: readonly string[], command: string, names: readonly N[], usage: string): [N, string[]] {
  const [sub, ...rest] = argv;
  if (sub === 'help' || sub === '--help' || sub === '-h') throw new HelpRequested(usage);
  if (sub === undefined) throw new UsageError(command, `a subcommand is needed (${names.join(', ')})`, usage);
  if (!(names as readonly string[]).includes(sub)) throw new UsageError(command, `unknown subcommand "${sub}" (${names.join(', ')})`, usage);
  return [sub as N, rest];
}

/**
 * The exit code for a {@link HelpRequested} (0, usage on `out`) or a {@link UsageError} (2, the reason and a hint
 * on `err`); undefined for any other error, which the caller reports itself.
 */
export function usageExitCode(e: unknown, out: (s: string) => void, err: (s: string) => void): number | undefined {
  if (e instanceof HelpRequested) {
    out(e.usage.endsWith('\n') ? e.usage : `${e.usage}\n`);
    return 0;
  }
  if (e instanceof UsageError) {
    const first = e.usage.split('\n').find((l) => l.startsWith('usage:'));
    err(`${e.command}: ${e.message}\n${first ? `${first}\n` : ''}run \`${e.command} --help\` for more\n`);
    return 2;
  }
  return undefined;
}
