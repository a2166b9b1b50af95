/**
 * What the property-based tests of the decoders share (issue #39): the run parameters, and the two properties.
 *
 * - {@link decodesOrRefuses}: for any input a decoder returns a value or throws an AtollError with one of the codes it
 *   documents; any other exception, or a case slower than {@link FUZZ_CASE_MS}, fails the property.
 * - a round trip, where an encoder exists, is checked in each test with `fc.assert` and {@link fuzzParams}.
 *
 * Unit runs use a fixed seed and a few hundred cases per property. Long runs on demand:
 *   ATOLL_FUZZ_RUNS=100000 node_modules/.bin/node --test "src/**\/*.property.test.ts"
 * ATOLL_FUZZ_SEED picks another seed; a failure prints its seed and path, which reproduce it with these parameters.
 * A hang inside a synchronous decoder cannot be interrupted in-process: the per-case bound catches inputs that make a
 * decoder slow, and the test runner's timeout ends a run that never returns.
 */
import fc from 'fast-check';
import { AtollError, type ErrorCode } from '../src/core/errors.ts';

const envInt = (name: string): number | undefined => {
  const v = process.env[name];
  return v !== undefined && /^\d+$/.test(v) ? Number(v) : undefined;
};

/** Cases per property: ATOLL_FUZZ_RUNS, else each test's own small default. */
export const FUZZ_RUNS = envInt('ATOLL_FUZZ_RUNS');
/** The seed of every property: ATOLL_FUZZ_SEED, else 39 (the issue), so unit runs are repeatable. */
export const FUZZ_SEED = envInt('ATOLL_FUZZ_SEED') ?? 39;
/** The longest one case may take, in ms (ATOLL_FUZZ_CASE_MS); generous, for a loaded 2-core machine. */
export const FUZZ_CASE_MS = envInt('ATOLL_FUZZ_CASE_MS') ?? 2000;

/** fast-check parameters: the fixed seed, and `runs` cases unless ATOLL_FUZZ_RUNS says otherwise. */
export function fuzzParams<T>(runs = 300): fc.Parameters<T> {
  return { seed: FUZZ_SEED, numRuns: FUZZ_RUNS ?? runs, endOnFailure: false };
}

/**
 * Runs `decode()`, which must return or throw an AtollError with one of `codes`, within {@link FUZZ_CASE_MS}.
 * @returns what it returned, or the AtollError it threw.
 * @throws Error naming the foreign exception or the time taken, with the original as its cause.
 */
export function decodesOrRefuses<T>(decode: () => T, codes: readonly ErrorCode[]): T | AtollError {
  const started = performance.now();
  let out: T | AtollError;
  try {
    out = decode();
  } catch (err) {
    if (!(err instanceof AtollError)) throw new Error(`the decoder threw a ${(err as Error)?.name ?? typeof err}, not an AtollError: ${(err as Error)?.message ?? String(err)}`, { cause: err });
    if (!codes.includes(err.code)) throw new Error(`the decoder threw AtollError ${err.code}, not one of ${codes.join(', ')}: ${err.message}`, { cause: err });
    out = err;
  }
  const ms = performance.now() - started;
  if (ms > FUZZ_CASE_MS) throw new Error(`the decoder took ${ms.toFixed(0)} ms on one input (bound ${FUZZ_CASE_MS} ms)`);
  return out;
}

/** One edit of a byte string: overwrite, insert or delete a byte, or cut the rest. */
type Edit = { op: 'set' | 'insert'; at: number; byte: number } | { op: 'delete' | 'cut'; at: number };

const edit: fc.Arbitrary<Edit> = fc.oneof(
  fc.record({ op: fc.constantFrom('set' as const, 'insert' as const), at: fc.nat(), byte: fc.integer({ min: 0, max: 255 }) }),
  fc.record({ op: fc.constantFrom('delete' as const, 'cut' as const), at: fc.nat() }),
);

/** Encodings from `valid`, each with 1 to 8 random byte edits: inputs close to the real ones, where decoders break. */
export function mutatedBytes(valid: fc.Arbitrary<Uint8Array>): fc.Arbitrary<Uint8Array> {
  return fc.tuple(valid, fc.array(edit, { minLength: 1, maxLength: 8 })).map(([bytes, edits]) => {
    const b = [...bytes];
    for (const e of edits) {
      const at = b.length === 0 ? 0 : e.at % (b.length + (e.op === 'insert' ? 1 : 0));
      if (e.op === 'set' && b.length > 0) b[at] = e.byte;
      else if (e.op === 'insert') b.splice(at, 0, e.byte);
      else if (e.op === 'delete') b.splice(at, 1);
      else if (e.op === 'cut') b.length = at;
    }
    return Uint8Array.from(b);
  });
}

/** {@link mutatedBytes} of texts, read back as UTF-8 (broken sequences become U+FFFD, as a reader's would). */
export function mutatedText(valid: fc.Arbitrary<string>): fc.Arbitrary<string> {
  return mutatedBytes(valid.map((s) => new TextEncoder().encode(s))).map((b) => new TextDecoder().decode(b));
}

/**
 * Values from `valid` with one part replaced by any JSON value, or removed: the right shape, one field wrong. Objects
 * are walked by key, arrays by index.
 */
export function mutatedJson(valid: fc.Arbitrary<unknown>): fc.Arbitrary<unknown> {
  return fc.tuple(valid, fc.array(fc.nat(), { minLength: 1, maxLength: 6 }), fc.option(fc.jsonValue({ maxDepth: 3 }), { nil: undefined, freq: 5 }))
    .map(([v, path, replacement]) => replaceAt(structuredClone(v), path, replacement));
}

function replaceAt(v: unknown, path: number[], replacement: unknown): unknown {
  if (path.length === 0 || v === null || typeof v !== 'object') return replacement;
  const keys = Object.keys(v);
  if (keys.length === 0) return replacement;
  const [step, ...rest] = path as [number, ...number[]];
  const key = keys[step % keys.length] as string;
  const o = v as Record<string, unknown>;
  // stop here one time in three, so shallow fields are hit as often as deep ones
  if (rest.length === 0 || step % 3 === 0) {
    if (replacement === undefined && !Array.isArray(o)) delete o[key];
    else o[key] = replacement ?? null;
  } else {
    o[key] = replaceAt(o[key], rest, replacement);
  }
  return v;
}

/** Any text a peer might send: mostly printable, sometimes any UTF-16 (lone surrogates too), sometimes JSON-ish. */
export const anyText: fc.Arbitrary<string> = fc.oneof(
  fc.string({ maxLength: 200 }),
  fc.string({ unit: 'binary', maxLength: 200 }),
  fc.jsonValue({ maxDepth: 4 }).map((v) => JSON.stringify(v)),
);

/** Any bytes, up to `max`. */
export const anyBytes = (max = 512): fc.Arbitrary<Uint8Array> => fc.uint8Array({ maxLength: max });

/** Whether `s` is well-formed UTF-16 (no lone surrogate), so UTF-8 carries it unchanged. */
export const wellFormed = (s: string): boolean => new TextDecoder().decode(new TextEncoder().encode(s)) === s;
