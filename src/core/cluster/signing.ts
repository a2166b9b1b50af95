/**
 * Signed agent requests. After joining, an agent signs every request to the controller with its node key over a
 * canonical text of the request; the controller checks the signature with the key it recorded at join, then asks a
 * {@link ReplayGuard} whether the request is fresh. Pure: the key operations live in src/adapters/node/node-identity.ts.
 */

/** The HTTP headers that carry a request's signature (lower-case, as Node presents incoming headers). */
export const SIGNATURE_HEADERS = {
  node: 'x-atoll-node',
  time: 'x-atoll-time',
  nonce: 'x-atoll-nonce',
  signature: 'x-atoll-signature',
} as const;

/** First line of every canonical request: names the scheme, so a signature can never be taken for another kind. */
const CANONICAL_VERSION = 'ATOLL-REQUEST-V1';
const NONCE = /^[0-9a-f]{16,64}$/;
const HEX_SHA256 = /^[0-9a-f]{64}$/;
const METHOD = /^[A-Za-z]+$/;
// Control characters, and spaces in paths, would let two different requests share one canonical text.
const CONTROL = /[\x00-\x1f\x7f]/;

/** What a request signature covers. */
export interface SignedRequestFields {
  /** HTTP method, any case; upper-cased in the canonical text. */
  readonly method: string;
  /** Path and query exactly as sent (`/v1/nodes/a?watch=1`). */
  readonly path: string;
  /** Name of the node signing the request. */
  readonly node: string;
  /** Milliseconds since the epoch, an integer, on the signer's clock. */
  readonly time: number;
  /** 16 to 64 lower-case hex characters, fresh for each request. */
  readonly nonce: string;
  /** Lower-case hex SHA-256 of the request body (of the empty string when there is none). */
  readonly bodySha256: string;
}

/**
 * The text a request signature covers: a version line, then method (upper-cased), path, node, time, nonce and body
 * hash, one per line. Every field is checked first so that no two different requests share one text.
 * @throws RangeError when a field could make the text ambiguous (a line break or control character in the path or
 *   node, a space in the path, a method that is not letters, a time that is not a non-negative integer, a nonce or
 *   body hash that is not lower-case hex). A signer never hits this with well-formed input; a verifier treats it as
 *   a malformed request.
 */
export function canonicalRequest(r: SignedRequestFields): string {
  const problem =
    !METHOD.test(r.method) ? `method ${JSON.stringify(r.method)} is not letters only`
    : !r.path.startsWith('/') || CONTROL.test(r.path) || r.path.includes(' ') ? `path ${JSON.stringify(r.path)} is not an absolute request path`
    : r.node === '' || CONTROL.test(r.node) ? `node name ${JSON.stringify(r.node)} is empty or holds control characters`
    : !Number.isSafeInteger(r.time) || r.time < 0 ? `time ${r.time} is not a non-negative integer of milliseconds`
    : !NONCE.test(r.nonce) ? `nonce ${JSON.stringify(r.nonce)} is not 16 to 64 lower-case hex characters`
    : !HEX_SHA256.test(r.bodySha256) ? `body hash ${JSON.stringify(r.bodySha256)} is not 64 lower-case hex characters`
    : undefined;
  if (problem !== undefined) throw new RangeError(`no canonical request: ${problem}`);
  return [CANONICAL_VERSION, r.method.toUpperCase(), r.path, r.node, String(r.time), r.nonce, r.bodySha256].join('\n');
}

/** Why {@link ReplayGuard.check} refused a request, or `ok`. */
export type ReplayVerdict = 'ok' | 'stale' | 'future' | 'replayed' | 'malformed';

export interface ReplayGuardInit {
  /** How far a request's time may be from the verifier's clock, either way, in milliseconds. */
  readonly windowMs: number;
  /** Most (node, nonce) pairs remembered at once; bounds memory. */
  readonly maxEntries: number;
  /**
   * Requests signed at or before this time are refused as `stale`. Pass the process start time: the memory does
   * not survive a restart, and this keeps requests captured before it from being accepted once more after it (all
   * of them when the signers' clocks are not ahead of this one).
   */
  readonly notBefore?: number;
}

/**
 * Refuses replayed and out-of-time requests. Call {@link check} only for requests whose signature has been verified
 * (so that only real nodes can fill the memory), and answer the request only on `ok`.
 *
 * Guarantee: `check` returns `ok` at most once for any (node, time, nonce) triple over the guard's life, whatever
 * the order of the calls and even if `now` goes backwards; as the time and nonce are signed, a captured request can
 * never be accepted twice. (Within the window a node's nonce is also refused with another time: `replayed`.) How:
 * - a request is refused as `future` when its time is after `now + windowMs`, and as `stale` when it is before
 *   `H - windowMs`, where H is the latest `now` seen; each accepted pair is remembered until H passes its time by
 *   more than `windowMs`, after which any repeat is stale;
 * - when more than `maxEntries` pairs are remembered, the pairs with the oldest request times are forgotten early,
 *   and from then on every request whose time is not after the newest forgotten time is refused as `stale`: a
 *   repeat of a forgotten pair carries its original, signed time, so it is refused too.
 *
 * The memory is the process's: pass `notBefore` to cover restarts, and note that each controller replica has its
 * own guard (a request may be accepted once by each replica that serves it).
 *
 * The cost: under a flood of more than `maxEntries` requests per window, requests that arrive late (older than the
 * requests already remembered) are refused as stale and must be retried with a fresh time and nonce; so size
 * `maxEntries` well above the busiest window's request count. If the verifier's clock steps back, requests timed
 * within `windowMs` of the new clock but before `H - windowMs` are refused until the clock catches up.
 */
export class ReplayGuard {
  readonly windowMs: number;
  readonly maxEntries: number;
  readonly #seen = new Set<string>();
  readonly #byTime = new MinHeap();
  #latestNow = -Infinity;
  /** Requests timed at or before this are refused: pairs up to it may have been forgotten. */
  #forgottenUpTo: number;

  constructor(init: ReplayGuardInit) {
    if (!(init.windowMs > 0) || !Number.isSafeInteger(init.maxEntries) || init.maxEntries < 1) {
      throw new RangeError(`ReplayGuard needs windowMs > 0 and an integer maxEntries >= 1, got ${init.windowMs} and ${init.maxEntries}`);
    }
    this.windowMs = init.windowMs;
    this.maxEntries = init.maxEntries;
    this.#forgottenUpTo = init.notBefore ?? -Infinity;
  }

  /** How many (node, nonce) pairs are remembered now. */
  get size(): number {
    return this.#seen.size;
  }

  /**
   * Judges a request from `node`, signed with `time` and `nonce`, at `now` (all times in milliseconds), and
   * remembers it when the answer is `ok`. `malformed`: empty node, a time that is not an integer, or a nonce that is
   * not 16 to 64 lower-case hex characters.
   */
  check(node: string, time: number, nonce: string, now: number): ReplayVerdict {
    if (node === '' || !Number.isSafeInteger(time) || !NONCE.test(nonce)) return 'malformed';
    if (time > now + this.windowMs) return 'future';
    this.#latestNow = Math.max(this.#latestNow, now);
    const horizon = this.#latestNow - this.windowMs;
    for (let top = this.#byTime.peek(); top !== undefined && top.time < horizon; top = this.#byTime.peek()) this.#forgetOldest();
    if (time < horizon || time <= this.#forgottenUpTo) return 'stale';
    const key = `${nonce} ${node}`;
    if (this.#seen.has(key)) return 'replayed';
    this.#seen.add(key);
    this.#byTime.push({ time, key });
    while (this.#seen.size > this.maxEntries) {
      this.#forgottenUpTo = Math.max(this.#forgottenUpTo, this.#forgetOldest().time);
    }
    return 'ok';
  }

  #forgetOldest(): HeapItem {
    const oldest = this.#byTime.pop() as HeapItem;
    this.#seen.delete(oldest.key);
    return oldest;
  }
}

interface HeapItem {
  readonly time: number;
  readonly key: string;
}

/** A binary min-heap of remembered pairs by request time. */
class MinHeap {
  readonly #items: HeapItem[] = [];

  peek(): HeapItem | undefined {
    return this.#items[0];
  }

  push(item: HeapItem): void {
    const a = this.#items;
    a.push(item);
    for (let i = a.length - 1; i > 0;) {
      const parent = (i - 1) >> 1;
      if ((a[parent] as HeapItem).time <= (a[i] as HeapItem).time) break;
      [a[parent], a[i]] = [a[i] as HeapItem, a[parent] as HeapItem];
      i = parent;
    }
  }

  /** Removes and returns the item with the smallest time. */
  pop(): HeapItem | undefined {
    const a = this.#items;
    const top = a[0];
    const last = a.pop();
    if (last === undefined || a.length === 0) return top;
    a[0] = last;
    for (let i = 0; ;) {
      const l = 2 * i + 1;
      const r = l + 1;
      let min = i;
      if (l < a.length && (a[l] as HeapItem).time < (a[min] as HeapItem).time) min = l;
      if (r < a.length && (a[r] as HeapItem).time < (a[min] as HeapItem).time) min = r;
      if (min === i) return top;
      [a[min], a[i]] = [a[i] as HeapItem, a[min] as HeapItem];
      i = min;
    }
  }
}
