/**
 * What every configuration reader shares: reading a JSON file with an error that names it, listing a schema's
 * complaints with the path of each key, and the English wording of those complaints.
 */
import { readFileSync } from 'node:fs';
import { en } from 'zod/locales';
import * as z from 'zod/mini';
import { atollError, type ErrorCode } from '../core/errors.ts';

// zod/mini loads no locale (classic zod loads English itself): without one, every complaint a schema does not word
// itself reads "Invalid input". Every schema module imports this file, so the wording is set before anything parses.
// (en from zod/locales, not z.locales.en: the namespace would bundle all of zod's ~50 locales.)
z.config(en());

/**
 * One line of a controller stream (`stream`, e.g. "the watch stream of controller https://..."), decoded against
 * `schema` as a `what` ("watch line").
 * @throws AtollError CONTROLLER_WATCH_INVALID when the text is not JSON or not such a line; the message names the
 *   stream, the fields and the line's start, `fix` says what the reader does about it.
 */
export function decodeStreamLine<S extends z.ZodMiniType>(schema: S, text: string, what: string, stream: string, fix: string): z.output<S> {
  const excerpt = JSON.stringify(text.length > 80 ? `${text.slice(0, 80)}...` : text);
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (cause) {
    throw atollError('CONTROLLER_WATCH_INVALID', `${stream} sent a line that is not JSON: ${excerpt}`, fix, cause);
  }
  const res = schema.safeParse(raw);
  if (!res.success) throw atollError('CONTROLLER_WATCH_INVALID', `${stream} sent a line that is not a ${what} (${describeIssues(res.error)}): ${excerpt}`, fix);
  return res.data;
}

/** `key.path: message` of every issue, joined with `; ` (the top level named `(top)`). */
export function describeIssues(error: z.core.$ZodError): string {
  return error.issues.map((i) => `${i.path.join('.') || '(top)'}: ${i.message}`).join('; ');
}

/**
 * The parsed JSON of the file at `path`, which holds `what` (e.g. "the relay configuration"). Any value written as
 * `{"fromFile": "/abs/path"}` is replaced by that file's text, trimmed, and any value written as `{"fromEnv": "NAME"}`
 * by that environment variable: secrets (tokens, pins) then come from a mounted Kubernetes Secret and the node's name
 * and address from the downward API, while the rest of the configuration sits in a ConfigMap.
 * @throws AtollError `code` when the file cannot be read (fix: pass an existing file with `flag`), is not JSON, or a
 * `fromFile` names a file that cannot be read.
 */
export function readJsonFile(path: string, what: string, code: ErrorCode, flag: string): unknown {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (cause) {
    throw atollError(code, `cannot read ${what} ${path}`, `pass an existing file with ${flag}`, cause);
  }
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (cause) {
    throw atollError(code, `${what} ${path} is not JSON`, 'fix its syntax', cause);
  }
  return resolveIndirect(doc, `${what} ${path}`, code, '');
}

function resolveIndirect(v: unknown, where: string, code: ErrorCode, at: string): unknown {
  if (Array.isArray(v)) return v.map((x, i) => resolveIndirect(x, where, code, `${at}[${i}]`));
  if (v === null || typeof v !== 'object') return v;
  const o = v as Record<string, unknown>;
  const keys = Object.keys(o);
  if (keys.length === 1 && keys[0] === 'fromFile') {
    const file = o.fromFile;
    if (typeof file !== 'string' || !file.startsWith('/')) throw atollError(code, `${where}: ${at || '(top)'}.fromFile must be an absolute path`, 'write {"fromFile": "/path/to/file"}');
    try {
      return readFileSync(file, 'utf8').trim();
    } catch (cause) {
      throw atollError(code, `${where}: ${at || '(top)'} names ${file}, which cannot be read`, 'mount the Secret holding it, or fix the path', cause);
    }
  }
  if (keys.length === 1 && keys[0] === 'fromEnv') {
    const name = o.fromEnv;
    const value = typeof name === 'string' ? process.env[name] : undefined;
    if (value === undefined || value === '') throw atollError(code, `${where}: ${at || '(top)'} names environment variable ${String(name)}, which is not set`, 'set it (in a pod: env from the downward API), or write the value itself');
    return value;
  }
  return Object.fromEntries(keys.map((k) => [k, resolveIndirect(o[k], where, code, at ? `${at}.${k}` : k)]));
}
