import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';

const MAIN = new URL('../src/cli/main.ts', import.meta.url).pathname;

/** Every command and subcommand `atoll --help` lists. */
const COMMANDS = [
  [], ['agent'], ['controller'], ['relay'], ['peers'], ['ipam', 'show'], ['ipam', 'check'], ['node', 'deregister'],
  ['status'], ['trace'], ['demo'], ['lab', 'up'], ['lab', 'run'], ['lab', 'down'], ['kubernetes', 'secret'], ['version'],
];

function atoll(args: string[]) {
  const r = spawnSync(process.execPath, [MAIN, ...args], { encoding: 'utf8', timeout: 30_000 });
  return { code: r.status, out: r.stdout, err: r.stderr };
}

for (const cmd of COMMANDS) {
  const name = ['atoll', ...cmd].join(' ');
  test(`${name} --help prints its usage on stdout and exits 0`, () => {
    const r = atoll([...cmd, '--help']);
    assert.equal(r.code, 0, r.err);
    assert.match(r.out, /^usage: atoll/);
    assert.equal(r.err, '');
  });

  test(`${name} with an unknown flag is a usage error: exit 2, a hint, no INTERNAL`, () => {
    const r = atoll([...cmd, '--no-such-flag']);
    assert.equal(r.code, 2, r.err);
    assert.match(r.err, /--no-such-flag/);
    assert.match(r.err, /--help/);
    assert.doesNotMatch(r.err, /INTERNAL/);
    assert.equal(r.out, '');
  });
}

test('a missing or unknown subcommand is a usage error', () => {
  for (const args of [['ipam'], ['ipam', 'list'], ['node', 'forget', 'x'], ['lab'], ['kubernetes'], ['no-such-command']]) {
    const r = atoll(args);
    assert.equal(r.code, 2, `${args.join(' ')}: ${r.err}`);
    assert.doesNotMatch(r.err, /INTERNAL/);
  }
});

test('missing and extra arguments are usage errors', () => {
  for (const args of [['agent'], ['node', 'deregister'], ['node', 'deregister', 'a', 'b'], ['version', 'extra'], ['agent', '--config'], ['trace', '10.0.0.1']]) {
    const r = atoll(args);
    assert.equal(r.code, 2, `${args.join(' ')}: ${r.err}`);
    assert.doesNotMatch(r.err, /INTERNAL/);
  }
});
