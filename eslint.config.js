// Lint, including the layering of STYLE.md: core is pure, config only parses, adapters never reach up into entry
// points, and entry points only wire.
import tseslint from 'typescript-eslint';

const nodeBuiltins = { group: ['node:*'], message: 'src/core is pure: no node: imports (put I/O in src/adapters).' };
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
    rules: { 'no-restricted-imports': ['error', { patterns: [nodeBuiltins, ...layer('config', 'adapters', 'cni', 'agent', 'controller', 'cli', 'lab')] }] },
  },
  {
    files: ['src/config/**/*.ts'],
    rules: { 'no-restricted-imports': ['error', { patterns: layer('adapters', 'cni', 'agent', 'controller', 'cli', 'lab') }] },
  },
  {
    files: ['src/adapters/**/*.ts'],
    rules: { 'no-restricted-imports': ['error', { patterns: layer('cni', 'agent', 'controller', 'cli', 'lab') }] },
  },
  {
    files: ['src/cni/**/*.ts'],
    rules: { 'no-restricted-imports': ['error', { patterns: layer('agent', 'controller', 'cli', 'lab') }] },
  },
);
