import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { ERROR_CATALOGUE, type ErrorCode } from '../src/core/errors.ts';
import { agentConfigSchema } from '../src/config/agent-config.ts';
import { controllerConfigSchema, kubernetesSchema } from '../src/config/controller-config.ts';
import { relayConfigSchema } from '../src/config/relay-config.ts';
import { MAX_STDIN_BYTES } from '../src/config/cni-request.ts';
import { MAX_ENV_BYTES } from '../src/core/cni-spec/shim-protocol.ts';
import { SUPPORTED_CNI_VERSIONS } from '../src/core/cni-spec/model.ts';

test('docs/errors.md lists exactly the codes in src/core/errors.ts, with the same CNI codes', () => {
  const doc = readFileSync(new URL('../docs/errors.md', import.meta.url), 'utf8');
  const rows = new Map([...doc.matchAll(/^\| `([A-Z_]+)` \| (\d+) \|/gm)].map((m) => [m[1] as string, Number(m[2])]));
  assert.deepEqual([...rows.keys()].sort(), Object.keys(ERROR_CATALOGUE).sort());
  for (const [code, entry] of Object.entries(ERROR_CATALOGUE)) assert.equal(rows.get(code), entry.cni, code);
});

/** Catalogued codes that nothing in src/ raises, each with why it stays in the catalogue (codes are stable). */
const RESERVED: Partial<Record<ErrorCode, string>> = {
  NODE_BLOCK_LIMIT: 'a node at maxBlocksPerNode gets no further block without an error: its usage report is answered with '
    + 'the blocks it holds (docs/api.md), and its ADDs fail with IPAM_EXHAUSTED when its addresses run out',
};

test('every catalogued error code is raised somewhere in src/, or is reserved with a reason', () => {
  const src = new URL('../src/', import.meta.url);
  const files = readdirSync(src, { recursive: true, encoding: 'utf8' }).filter((f) => f.endsWith('.ts') && !f.endsWith('.test.ts'));
  const text = files.map((f) => readFileSync(new URL(f, src), 'utf8')).join('\n');
  // atollError('CODE', ...), new AtollError('CODE', ...) or a subclass's super('CODE', ...), the code possibly on the next line
  const raised = new Set([...text.matchAll(/\b(?:atollError|AtollError|super)\(\s*'([A-Z_]+)'/g)].map((m) => m[1] as string));
  for (const code of Object.keys(ERROR_CATALOGUE) as ErrorCode[]) {
    if (RESERVED[code] === undefined) assert.ok(raised.has(code), `${code} is catalogued but nothing in src/ raises it: raise it, or list it in RESERVED with a reason`);
    else assert.ok(!raised.has(code), `${code} is raised in src/: take it off RESERVED`);
  }
});

/** The `| \`key\` |` rows of one `## heading` section of docs/configuration.md. */
function documentedKeys(heading: string): Set<string> {
  const full = readFileSync(new URL('../docs/configuration.md', import.meta.url), 'utf8');
  const start = full.indexOf(`## ${heading}`);
  assert.ok(start >= 0, `docs/configuration.md lacks "## ${heading}"`);
  // the top-level keys' table ends at the next heading (subsections such as ### `kubernetes` list nested keys)
  const next = /\n##+ /.exec(full.slice(start + 1));
  const end = next ? start + 1 + next.index : -1;
  const section = full.slice(start, end < 0 ? undefined : end);
  return new Set([...section.matchAll(/^\| `([A-Za-z]+)` \|/gm)].map((m) => m[1] as string));
}

for (const [heading, schema] of [['Agent', agentConfigSchema], ['Controller', controllerConfigSchema], ['Relay', relayConfigSchema], ['The controller\'s `kubernetes` section', kubernetesSchema]] as const) {
  test(`docs/configuration.md documents every ${heading.toLowerCase()} configuration key, and no other`, () => {
    const documented = documentedKeys(heading);
    for (const key of Object.keys(schema.shape)) assert.ok(documented.has(key), `docs/configuration.md (${heading}) lacks ${key}`);
    for (const key of documented) assert.ok(key in schema.shape, `docs/configuration.md (${heading}) documents unknown key ${key}`);
  });
}

test('src/core/cni-spec/shim-protocol.ts and the native shim agree on the limits', () => {
  const c = readFileSync(new URL('../native/atoll-cni.c', import.meta.url), 'utf8');
  const define = (name: string) => {
    const m = new RegExp(`#define ${name} \\((\\d+)u (<<|\\*) (\\d+)u?\\)`).exec(c);
    assert.ok(m, `native/atoll-cni.c lacks #define ${name}`);
    return m[2] === '<<' ? Number(m[1]) << Number(m[3]) : Number(m[1]) * Number(m[3]);
  };
  assert.equal(define('MAX_STDIN'), MAX_STDIN_BYTES);
  assert.equal(define('MAX_ENV'), MAX_ENV_BYTES);
  const versions = /#define SUPPORTED_VERSIONS "(.*)"$/m.exec(c)?.[1]?.replaceAll('\\"', '"');
  assert.deepEqual(JSON.parse(`[${versions}]`), [...SUPPORTED_CNI_VERSIONS]);
});

test('docs/operations.md lists exactly the metrics the agent, the controller and the relay register', async () => {
  const { Metrics } = await import('../src/adapters/ops/metrics.ts');
  const { registerAgentMetrics } = await import('../src/agent/agent-metrics.ts');
  const { registerControllerMetrics } = await import('../src/controller/controller-metrics.ts');
  const { registerRelayMetrics } = await import('../src/relay/relay-metrics.ts');
  const m = new Metrics();
  registerAgentMetrics(m, { clock: Date.now, ipam: () => undefined, tunnel: () => undefined, link: () => undefined, policyDrops: () => undefined });
  registerControllerMetrics(m, { isLeader: () => false, watchClients: () => 0, census: async () => ({ nodes: 0, leasedBlocks: 0 }), totalBlocks: 0 });
  const stats = { connected: 0, forwardedControl: 0, droppedNoDestination: 0, droppedNotAllowed: 0, droppedQueueFull: 0, refused: 0, circuitsOffered: 0 };
  registerRelayMetrics(m, { stats, circuits: () => ({ open: 0, joined: 0, lapsed: 0, badToken: 0, bytes: 0 }), members: () => 0 });
  const registered = (await m.registry.getMetricsAsJSON()).map((x) => x.name).sort();
  const doc = readFileSync(new URL('../docs/operations.md', import.meta.url), 'utf8');
  const documented = [...doc.matchAll(/^\| (`atoll_[a-z_]+`(?:, `atoll_[a-z_]+`)*) \|/gm)].flatMap((r) => [...(r[1] as string).matchAll(/`(atoll_[a-z_]+)`/g)].map((x) => x[1] as string)).sort();
  assert.deepEqual(documented, registered);
});
