// Lint, including the layering of the project's design guide (shared among its engineers outside this repository:
// ../shared/STYLE.md beside the checkout, "Do this" 1 and 4). The rules, in short: src/core and src/lab/plan are pure
// (no node: imports); src/config only parses; src/adapters and src/lab/io never reach up into entry points; entry
// points (src/agent with its CNI front end, src/controller, src/relay, src/lab, src/cli) only wire and do not import each other,
// except that src/cli imports the ones it starts; nothing but src/lab, src/cli, bench/ and test/ imports src/lab; only
// src/adapters (and the lab's own adapters, src/lab/io) starts processes, only src/adapters calls the kernel through
// FFI; nothing in src/ but its unit tests imports harness/. docs/architecture.md ("Layers") describes the tree.
import { dirname, join, normalize, relative } from 'node:path';
import tseslint from 'typescript-eslint';

const ROOT = import.meta.dirname;

/**
 * What each folder (or file) may not import, as repository paths. A file follows the deepest folder listed that
 * holds it, at any depth below it. `allow` lists exceptions inside the forbidden folders.
 */
const LAYERS = {
  'src/core': { forbid: ['src/config', 'src/adapters', 'src/agent', 'src/controller', 'src/relay', 'src/cli', 'src/lab'] },
  'src/config': { forbid: ['src/adapters', 'src/agent', 'src/controller', 'src/relay', 'src/cli', 'src/lab'] },
  'src/adapters': { forbid: ['src/agent', 'src/controller', 'src/relay', 'src/cli', 'src/lab'] },
  'src/agent': { forbid: ['src/controller', 'src/relay', 'src/cli', 'src/lab'] },
  // the CNI front end (what src/cni was) decodes and answers requests through core ports: none of the agent's wiring
  'src/agent/cni-handler.ts': { forbid: ['src/agent', 'src/controller', 'src/relay', 'src/cli', 'src/lab'], allow: ['src/agent/cni-handler.ts'] },
  'src/controller': { forbid: ['src/agent', 'src/relay', 'src/cli', 'src/lab'] },
  'src/relay': { forbid: ['src/agent', 'src/controller', 'src/cli', 'src/lab'] },
  // the lab runs real processes, through adapters; what it shares with the agent lives in core or adapters
  'src/lab': { forbid: ['src/agent', 'src/controller', 'src/relay', 'src/cli'] },
  // the lab's pure planning: only the core and itself
  'src/lab/plan': { forbid: ['src/config', 'src/adapters', 'src/agent', 'src/controller', 'src/relay', 'src/cli', 'src/lab'], allow: ['src/lab/plan'] },
  // the lab's own adapters (containerd, the Kubernetes binaries, child processes, tc): adapters, core, the lab's plan
  'src/lab/io': { forbid: ['src/config', 'src/agent', 'src/controller', 'src/relay', 'src/cli', 'src/lab'], allow: ['src/lab/io', 'src/lab/plan'] },
  // the CLI wires: besides core, config, adapters and src/lab it imports only the entry points it starts
  'src/cli': { forbid: ['src/agent', 'src/controller', 'src/relay'], allow: ['src/agent/agent.ts', 'src/controller/controller.ts', 'src/relay/relay.ts'] },
  'scripts': { forbid: ['src/lab'] },
};

/**
 * The test bed that test/ and bench/ share (real agents, controllers, etcd, a kube-apiserver, namespaces; harness/):
 * a harness like them, outside the layers. Product code never imports it; src/'s unit tests (`*.test.ts`) may.
 */
const HARNESS = 'harness';

const within = (path, folder) => path === folder || path.startsWith(`${folder}/`);

/**
 * `atoll/layers`: a relative import resolved against the importing file, checked against {@link LAYERS}, and, for
 * src/ but its tests, against {@link HARNESS}.
 */
const layers = {
  meta: { type: 'problem', schema: [], messages: { layer: '{{file}} ({{layer}}) may not import {{target}}: see the layers in eslint.config.js and docs/architecture.md.' } },
  create(context) {
    const file = relative(ROOT, context.filename);
    const product = within(file, 'src') && !file.endsWith('.test.ts');
    const layer = Object.keys(LAYERS).filter((f) => within(file, f)).sort((a, b) => b.length - a.length)[0];
    if (layer === undefined && !product) return {};
    const { forbid = [], allow = [] } = LAYERS[layer] ?? {};
    const forbidden = product ? [...forbid, HARNESS] : forbid;
    const check = (source) => {
      if (source?.type !== 'Literal' || typeof source.value !== 'string' || !source.value.startsWith('.')) return;
      const target = normalize(join(dirname(file), source.value));
      if (forbidden.some((f) => within(target, f)) && !allow.some((a) => within(target, a))) {
        context.report({ node: source, messageId: 'layer', data: { file, layer, target } });
      }
    };
    return {
      ImportDeclaration: (n) => check(n.source),
      ExportNamedDeclaration: (n) => check(n.source),
      ExportAllDeclaration: (n) => check(n.source),
      ImportExpression: (n) => check(n.source),
    };
  },
};

const nodeBuiltins = { group: ['node:*'], message: 'src/core and src/lab/plan are pure: no node: imports (put I/O in src/adapters or src/lab/io).' };
const koffi = { name: 'koffi', message: 'only src/adapters calls the kernel through FFI (libc through src/adapters/kernel/libc.ts; bin/libatoll-dp.so through src/adapters/tunnel/native-library.ts).' };
// Only src/adapters starts processes (and src/lab/io, the lab's own adapters) or loads koffi (one wrapper per kernel
// tool). test/, bench/, harness/ and scripts/ are harnesses outside the layers: they start agents, etcd and iperf3
// themselves.
const processes = [
  { name: 'node:child_process', message: 'only src/adapters starts processes: call an adapter (exec.ts, iproute2.ts, ...; the lab: src/lab/io/child-process.ts).' },
  { name: 'child_process', message: 'only src/adapters starts processes: call an adapter (exec.ts, iproute2.ts, ...; the lab: src/lab/io/child-process.ts).' },
  koffi,
];

// libc is opened in one module, which declares every call into it (typed); a `load` of libc anywhere else fails
const libcLoad = {
  selector: "CallExpression:matches([callee.property.name='load'], [callee.name='load']):matches([arguments.0.value=/libc/], [arguments.0.quasis.0.value.raw=/libc/])",
  message: 'libc is opened only in src/adapters/kernel/libc.ts: declare the call there (typed) and import it.',
};
// an ESM import of either module makes Node read every export of it, lazy getters included: http's WebSocket loads
// undici and http2 (13 MB of RSS), util's setTraceSigInt worker_threads (docs/architecture.md, "Memory")
const httpUtil = {
  selector: "ImportDeclaration[importKind='value'][source.value=/^node:(http|util)$/]",
  message: "read node:http and node:util with process.getBuiltinModule('node:http') (types by `import type`): their ESM facade loads undici, http2 and worker_threads.",
};

export default tseslint.config(
  { ignores: ['node_modules/**', 'bin/**', 'build/**'] },
  ...tseslint.configs.recommended,
  {
    plugins: { atoll: { rules: { layers } } },
    rules: {
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_', ignoreRestSiblings: true }],
      'atoll/layers': 'error',
    },
  },
  // no-restricted-imports takes its options from the last block that matches a file: each file matches one of these
  {
    files: ['src/**/*.ts'],
    ignores: ['src/adapters/**', 'src/lab/io/**'],
    rules: { 'no-restricted-imports': ['error', { paths: processes }] },
  },
  {
    files: ['src/lab/io/**/*.ts'],
    rules: { 'no-restricted-imports': ['error', { paths: [koffi] }] },
  },
  {
    files: ['src/core/**/*.ts', 'src/lab/plan/**/*.ts'],
    ignores: ['**/*.test.ts'],
    rules: { 'no-restricted-imports': ['error', { paths: processes, patterns: [nodeBuiltins] }] },
  },
  // no-restricted-syntax likewise: the last of these that matches a file decides
  { files: ['**/*.ts'], rules: { 'no-restricted-syntax': ['error', libcLoad] } },
  { files: ['src/**/*.ts'], rules: { 'no-restricted-syntax': ['error', httpUtil, libcLoad] } },
  { files: ['src/adapters/kernel/libc.ts'], rules: { 'no-restricted-syntax': ['error', httpUtil] } },
);
