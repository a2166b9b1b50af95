/**
 * Where Atoll is installed: the directory holding its package.json. Found by walking up from this module, so it
 * holds both when running the TypeScript sources and when running the bundle the set-up builds (build/atoll.mjs).
 */
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { atollError } from '../core/errors.ts';

let root: string | undefined;

/** @throws AtollError INSTALL_ROOT_MISSING when no folder above this module holds a package.json. */
export function installRoot(): string {
  if (root) return root;
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, 'package.json'))) {
    const up = dirname(dir);
    if (up === dir) {
      throw atollError('INSTALL_ROOT_MISSING', `cannot find Atoll's package.json above ${fileURLToPath(import.meta.url)}`,
        'run Atoll where it was installed (its checkout, or /opt/atoll in the image): the folder with its package.json is where bin/ is found');
    }
    dir = up;
  }
  root = dir;
  return dir;
}
