/**
 * What every configuration reader shares: reading a JSON file with an error that names it, and listing a schema's
 * complaints with the path of each key.
 */
import { readFileSync } from 'node:fs';
import type { z } from 'zod';
import { atollError, type ErrorCode } from '../core/errors.ts';

/** `key.path: message` of every issue, joined with `; ` (the top level named `(top)`). */
export function describeIssues(error: z.ZodError): string {
  return error.issues.map((i) => `${i.path.join('.') || '(top)'}: ${i.message}`).join('; ');
}

/**
 * The parsed JSON of the file at `path`, which holds `what` (e.g. "the relay configuration").
 * @throws AtollError `code` when the file cannot be read (fix: pass an existing file with `flag`) or is not JSON.
 */
export function readJsonFile(path: string, what: string, code: ErrorCode, flag: string): unknown {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (cause) {
    throw atollError(code, `cannot read ${what} ${path}`, `pass an existing file with ${flag}`, cause);
  }
  try {
    return JSON.parse(text);
  } catch (cause) {
    throw atollError(code, `${what} ${path} is not JSON`, 'fix its syntax', cause);
  }
}
