/**
 * Where Atoll is installed: the directory holding its package.json. Found by walking up from this module, so it
 * holds both when running the TypeScript sources and when running the bundle the set-up builds (build/atoll.mjs).
 */
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

let root: string | undefined;

export function installRoot(): string {
  if (root) return root;
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, 'package.json'))) {
    const up = dirname(dir);
    if (up === dir) throw new Error(`cannot find Atoll's package.json above ${fileURLToPath(import.meta.url)}`);
    dir = up;
  }
  root = dir;
  return dir;
}
