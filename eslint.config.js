// Lint, including the layering of STYLE.md: core is pure, config only parses, adapters never reach up into entry
// points, entry points only wire, and only adapters start processes or call the kernel through FFI.
// (ESLint takes a rule's options from the last matching block, so each folder has one block that lists all it may not import.)
import tseslint from 'typescript-eslint';

const nodeBuiltins = { group: ['node:*'], message: 'src/core is pure: no node: imports (put I/O in src/adapters).' };
// Only src/adapters starts processes or loads koffi (STYLE.md 4: one wrapper per kernel tool). test/, bench/ and
// scripts/ are harnesses outside the layers: they start agents, etcd and iperf3 themselves by design.
const processes = [
  { name: 'node:child_process', message: 'only src/adapters starts processes: call an adapter (exec.ts, child-process.ts, iproute2.ts, ...).' },
  { name: 'child_process', message: 'only src/adapters starts processes: call an adapter (exec.ts, child-process.ts, iproute2.ts, ...).' },
  { name: 'koffi', message: 'only src/adapters calls the kernel through FFI (netlink.ts, netns.ts, tun.ts).' },
];
const layer = (...dirs) => dirs.map((d) => ({ group: [`../${d}/*`, `../../${d}/*`], message: `this layer may not import from src/${d}.` }));

export default tseslint.config(
  { ignores: ['node_modules/**', 'bin/**', 'build/**'] },
  ...tseslint.configs.recommended,
  {
    rules: {
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_', ignoreRestSiblings: true }],
    },
  },
  {
    files: ['src/core/**/*.ts'],
    ignores: ['src/core/**/*.test.ts'],
    rules: { 'no-restricted-imports': ['error', { paths: processes, patterns: [nodeBuiltins, ...layer('config', 'adapters', 'cni', 'agent', 'controller', 'cli', 'lab')] }] },
  },
  {
    files: ['src/config/**/*.ts'],
    rules: { 'no-restricted-imports': ['error', { paths: processes, patterns: layer('adapters', 'cni', 'agent', 'controller', 'cli', 'lab') }] },
  },
  {
    files: ['src/adapters/**/*.ts'],
    rules: { 'no-restricted-imports': ['error', { patterns: layer('cni', 'agent', 'controller', 'cli', 'lab') }] },
  },
  {
    files: ['src/cni/**/*.ts'],
    rules: { 'no-restricted-imports': ['error', { paths: processes, patterns: layer('agent', 'controller', 'cli', 'lab') }] },
  },
  {
    files: ['src/agent/**/*.ts', 'src/controller/**/*.ts', 'src/relay/**/*.ts'],
    rules: { 'no-restricted-imports': ['error', { paths: processes }] },
  },
  {
    // the lab runs real processes, through adapters; what it shares with the agent lives in core or adapters
    files: ['src/lab/**/*.ts'],
    rules: { 'no-restricted-imports': ['error', { paths: processes, patterns: layer('cni', 'agent', 'controller', 'relay', 'cli') }] },
  },
  {
    // the lab's own adapters start processes (containerd, the Kubernetes binaries, CNI invocation)
    files: ['src/lab/io/**/*.ts'],
    rules: { 'no-restricted-imports': ['error', { paths: processes.filter((p) => p.name === 'koffi'), patterns: layer('cni', 'agent', 'controller', 'relay', 'cli') }] },
  },
  {
    // the CLI wires: besides core, config and adapters it imports only the entry points it starts
    files: ['src/cli/**/*.ts'],
    rules: {
      'no-restricted-imports': ['error', {
        paths: processes,
        patterns: [...layer('cni'), {
          group: ['../agent/*', '!../agent/agent.ts', '../controller/*', '!../controller/controller.ts', '../relay/*', '!../relay/relay.ts'],
          message: 'src/cli imports only the entry points it starts (agent.ts, controller.ts, relay.ts, src/lab): move shared code to src/core or src/adapters.',
        }],
      }],
    },
  },
  {
    // an ESM import of either module makes Node read every export of it, lazy getters included: http's WebSocket
    // loads undici and http2 (13 MB of RSS), util's setTraceSigInt worker_threads (docs/architecture.md, "Memory")
    files: ['src/**/*.ts'],
    rules: {
      'no-restricted-syntax': ['error', {
        selector: "ImportDeclaration[importKind='value'][source.value=/^node:(http|util)$/]",
        message: "read node:http and node:util with process.getBuiltinModule('node:http') (types by `import type`): their ESM facade loads undici, http2 and worker_threads.",
      }],
    },
  },
);
