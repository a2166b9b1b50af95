/**
 * A few thousand generated bad requests against a real controller API (in process, embedded store, TLS on
 * 127.0.0.1): malformed and mistyped bodies, unknown keys, bodies over the limit (declared and streamed), bad or
 * missing bootstrap tokens, unsigned, wrongly signed, stale, future and replayed requests, a node acting on another
 * node, bad paths and methods, admin routes without the admin token, bytes that are not UTF-8. Every one must be
 * answered with the 4xx and the catalogued error code its case calls for, as a JSON {code, message}; be logged as
 * refused; and leave the store exactly as it was (same revision, same contents).
 *
 * Requests are written byte for byte over TLS (node:tls), so that malformed HTTP and exact replays can be sent.
 * The cases come from a seeded PRNG: ATOLL_FUZZ_SEED=<n> reproduces a run (the seed is printed), and
 * ATOLL_FUZZ_CASES=<n> sets how many (default 3000).
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomInt } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { connect } from 'node:tls';
import { ERROR_CATALOGUE, type ErrorCode } from '../../src/core/errors.ts';
import { parseControllerConfig } from '../../src/config/controller-config.ts';
import { jsonLogger } from '../../src/adapters/ops/json-logger.ts';
import { type NodeIdentity, signRequest } from '../../src/adapters/node/node-identity.ts';
import { Controller } from '../../src/controller/controller.ts';
import { memoryIdentity } from '../../harness/join-simulator.ts';
import { RUN_PREFIX } from '../../harness/netns.ts';
import { freePort } from '../../harness/ports.ts';

const SEED = process.env.ATOLL_FUZZ_SEED !== undefined ? Number(process.env.ATOLL_FUZZ_SEED) : randomInt(2 ** 31);
const CASES = Number(process.env.ATOLL_FUZZ_CASES ?? '3000');
const IN_FLIGHT = 8;
const BOOTSTRAP_TOKEN = 'atoll-fuzz-bootstrap-0123456789';
const ADMIN_TOKEN = 'atoll-fuzz-admin-0123456789abcdef';
const MAX_BODY = 64 * 1024;
const MINUTE = 60_000;

// ---------------------------------------------------------------------------------------------------------------
// Seeded randomness

/** mulberry32: small, fast, and the same sequence for the same seed everywhere. */
class Rng {
  #s: number;

  constructor(seed: number) {
    this.#s = seed >>> 0;
  }

  next(): number {
    let t = (this.#s = (this.#s + 0x6d2b79f5) >>> 0);
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }

  int(n: number): number {
    return Math.floor(this.next() * n);
  }

  range(lo: number, hi: number): number {
    return lo + this.int(hi - lo + 1);
  }

  pick<T>(items: readonly T[]): T {
    return items[this.int(items.length)] as T;
  }

  bytes(n: number): Buffer {
    const b = Buffer.alloc(n);
    for (let i = 0; i < n; i++) b[i] = this.int(256);
    return b;
  }

  word(n: number): string {
    const alphabet = 'abcdefghijklmnopqrstuvwxyz0123456789';
    let s = '';
    for (let i = 0; i < n; i++) s += alphabet[this.int(alphabet.length)];
    return s;
  }

  /** Lower-case hex, as nonces are. */
  hex(n: number): string {
    let s = '';
    for (let i = 0; i < n; i++) s += '0123456789abcdef'[this.int(16)];
    return s;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Raw HTTP/1.1 over TLS

interface RawRequest {
  readonly method: string;
  readonly target: string | Buffer;
  readonly headers: readonly (readonly [string | Buffer, string | Buffer])[];
  readonly body: Buffer;
  /** Send the body chunked in pieces of this size instead of with a content-length. */
  readonly chunked?: number;
  /** Keep this content-length header instead of the body's length (a declared size). */
  readonly contentLength?: number;
}

interface Answer {
  readonly status: number;
  readonly text: string;
}

function head(r: RawRequest): Buffer {
  const lines: Buffer[] = [Buffer.from(`${r.method} `), Buffer.from(r.target), Buffer.from(' HTTP/1.1\r\nhost: 127.0.0.1\r\n')];
  for (const [k, v] of r.headers) lines.push(Buffer.from(k), Buffer.from(': '), Buffer.from(v), Buffer.from('\r\n'));
  if (r.chunked !== undefined) lines.push(Buffer.from('transfer-encoding: chunked\r\n'));
  else lines.push(Buffer.from(`content-length: ${r.contentLength ?? r.body.length}\r\n`));
  lines.push(Buffer.from('\r\n'));
  return Buffer.concat(lines);
}

/** The exact bytes of a request with a content-length (what a replay resends). */
function encode(r: RawRequest): Buffer {
  return Buffer.concat([head(r), r.body]);
}

/**
 * Sends `r` (or exact `bytes`) on a new TLS connection and reads one response (status line, headers, a body of
 * content-length bytes), then closes. Rejects when the connection ends without a complete response.
 */
function exchange(port: number, ca: string, r: RawRequest | Buffer): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const socket = connect({ host: '127.0.0.1', port, ca });
    let buf = Buffer.alloc(0);
    let settled = false;
    const timer = setTimeout(() => finish(new Error('no complete answer within 10 s')), 10_000);
    const finish = (v: Answer | Error) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      socket.destroy();
      if (v instanceof Error) reject(v);
      else resolve(v);
    };
    socket.on('secureConnect', () => {
      if (Buffer.isBuffer(r)) {
        socket.write(r);
        return;
      }
      socket.write(head(r));
      if (r.chunked === undefined) {
        socket.write(r.body);
        return;
      }
      for (let i = 0; i < r.body.length; i += r.chunked) {
        const piece = r.body.subarray(i, i + r.chunked);
        socket.write(`${piece.length.toString(16)}\r\n`);
        socket.write(piece);
        socket.write('\r\n');
      }
      socket.write('0\r\n\r\n');
    });
    socket.on('data', (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      const end = buf.indexOf('\r\n\r\n');
      if (end < 0) return;
      const headText = buf.subarray(0, end).toString('latin1');
      const length = Number(/\r\ncontent-length: *(\d+)/i.exec(headText)?.[1] ?? NaN);
      const status = Number(/^HTTP\/1\.1 (\d{3}) /.exec(headText)?.[1] ?? NaN);
      if (!Number.isFinite(length)) return finish(new Error(`an answer without content-length: ${JSON.stringify(headText)}`));
      if (buf.length - end - 4 >= length) finish({ status, text: buf.subarray(end + 4, end + 4 + length).toString('utf8') });
    });
    socket.on('error', (e) => finish(new Error(`connection failed before a complete answer: ${e.message}; got ${JSON.stringify(buf.toString('latin1').slice(0, 300))}`)));
    socket.on('close', () => finish(new Error(`connection closed before a complete answer; got ${JSON.stringify(buf.toString('latin1').slice(0, 300))}`)));
  });
}

// ---------------------------------------------------------------------------------------------------------------
// Signing

interface SignOptions {
  /** Signs as this node (the x-atoll-node header); default the node's own name. */
  readonly as?: string;
  readonly time?: number;
  readonly nonce?: string;
}

function signed(id: NodeIdentity, node: string, method: string, target: string, body: Buffer, opts: SignOptions = {}): [string, string][] {
  return Object.entries(signRequest(id, { method, path: target, node: opts.as ?? node, body, now: opts.time ?? Date.now(), nonce: opts.nonce }));
}

function json(v: unknown): Buffer {
  return Buffer.from(JSON.stringify(v));
}

// ---------------------------------------------------------------------------------------------------------------
// The cases

interface Expect {
  readonly status: number;
  readonly code: ErrorCode;
}

const BAD_REQUEST: Expect = { status: 400, code: 'API_BAD_REQUEST' };
const UNAUTHENTICATED: Expect = { status: 401, code: 'API_UNAUTHENTICATED' };
const FORBIDDEN: Expect = { status: 403, code: 'API_FORBIDDEN' };
const TOO_LARGE: Expect = { status: 413, code: 'API_TOO_LARGE' };
const HEADERS_TOO_LARGE: Expect = { status: 431, code: 'API_TOO_LARGE' };
const IDENTITY_TAKEN: Expect = { status: 409, code: 'NODE_IDENTITY_MISMATCH' };

interface Case {
  readonly kind: string;
  readonly expect: Expect;
  /** Builds the request at send time (signatures carry the current time). */
  readonly request: () => RawRequest | Buffer;
}

/** The cluster the cases aim at: two joined nodes, and requests the API accepted, kept byte for byte. */
interface Target {
  readonly a: NodeIdentity;
  readonly b: NodeIdentity;
  readonly fieldsA: Record<string, unknown>;
  readonly accepted: readonly Buffer[];
}

const NODE_A = 'node-a';
const NODE_B = 'node-b';

function generateCases(rng: Rng, n: number, t: Target): Case[] {
  let fresh = 0;
  const freshName = () => `fz-${SEED.toString(36)}-${fresh++}`;
  const validJoin = (name: string, id: NodeIdentity) => ({ site: 'edge-1', community: '', addresses: ['198.51.100.7'], vtepMac: '02:00:00:00:00:07', tunnelKey: '', agentVersion: 'fuzz', token: BOOTSTRAP_TOKEN, name, identity: id.publicKey });
  const validUsage = () => ({ capacity: 64, allocated: rng.int(64), reserved: 0, free: rng.int(64) });
  /** A value of the wrong type for every field (no strings: a string is valid for most fields). */
  const wrongValue = (key: string): unknown => {
    const v = rng.pick<unknown>([42, -1, 1.5, true, false, null, [], {}, [7], { a: 1 }, 1e308]);
    return key === 'addresses' && Array.isArray(v) && v.length === 0 ? 7 : v; // [] is a valid address list
  };
  const notJson = (): Buffer => {
    const whole = JSON.stringify(validJoin(freshName(), t.a));
    return rng.pick<() => Buffer>([
      () => Buffer.alloc(0),
      () => Buffer.from(whole.slice(0, rng.int(whole.length))),
      () => Buffer.from(`${whole}${rng.pick(['}', ',', 'x', ']'])}`),
      () => Buffer.from(rng.word(rng.range(1, 40))),
      () => rng.bytes(rng.range(1, 200)),
      () => Buffer.from(rng.pick(['{', '[', '"', "{'a':1}", '{"a":}', 'NaN', '{"token":undefined}', '\u0000'])),
    ])();
  };
  /** A join body the schema refuses: a wrong type, an unknown key, or a bad value, with the right token. */
  const badJoinBody = (name: string, id: NodeIdentity): { kind: string; body: Buffer } => {
    const body: Record<string, unknown> = validJoin(name, id);
    const key = rng.pick(Object.keys(body));
    switch (rng.int(4)) {
      case 0:
        body[key] = wrongValue(key);
        return { kind: `join wrong type of ${key}`, body: json(body) };
      case 1:
        body[rng.pick(['admin', 'blocks', 'observedAddress', 'registeredAt', '__proto__x', rng.word(6)])] = wrongValue('');
        return { kind: 'join unknown key', body: json(body) };
      case 2: {
        const [field, value] = rng.pick<[string, unknown]>([
          ['name', 'Upper-Case'], ['name', ''], ['name', 'a/b'], ['name', 'x'.repeat(300)], ['name', '-lead'], ['name', 'a..b/'],
          ['identity', 'not base64!'], ['identity', 'A'.repeat(300)], ['addresses', ['300.1.1.1']], ['addresses', ['10.0.0.1/24']],
          ['addresses', Array.from({ length: 17 }, (_, i) => `10.0.0.${i}`)], ['vtepMac', '02:00:00:00:00:0A'], ['vtepMac', '02:00:00:00:00'],
          ['site', 'x'.repeat(64)], ['site', 'bad label!'], ['agentVersion', 'v'.repeat(65)], ['tunnelKey', 'k'.repeat(513)], ['tunnelKey', 'k1'], ['tunnelKey', `sha256:${'AB'.repeat(32)}`], ['token', 't'.repeat(257)],
        ]);
        body[field] = value;
        return { kind: `join bad ${field}`, body: json(body) };
      }
      default:
        delete body[rng.pick(['token', 'name', 'identity'])];
        return { kind: 'join missing field', body: json(body) };
    }
  };
  const nodeRoutes = (name: string) => [
    { method: 'PUT', target: `/v1/nodes/${name}`, body: () => json(t.fieldsA) },
    { method: 'POST', target: `/v1/nodes/${name}/usage`, body: () => json(validUsage()) },
    { method: 'GET', target: `/v1/nodes/${name}/blocks`, body: () => Buffer.alloc(0) },
  ];

  const makers: (() => Case)[] = [
    // bodies that are not JSON, on every route that reads one
    () => {
      const body = notJson();
      return rng.int(2) === 0
        ? { kind: 'join not JSON', expect: BAD_REQUEST, request: () => ({ method: 'POST', target: '/v1/join', headers: [], body }) }
        : { kind: 'signed PUT not JSON', expect: BAD_REQUEST, request: () => ({ method: 'PUT', target: `/v1/nodes/${NODE_A}`, headers: signed(t.a, NODE_A, 'PUT', `/v1/nodes/${NODE_A}`, body), body }) };
    },
    // joins with the right token and a valid signature, refused by the schema (else a node would be added)
    () => {
      const id = memoryIdentity();
      const name = freshName();
      const { kind, body } = badJoinBody(name, id);
      return { kind, expect: BAD_REQUEST, request: () => ({ method: 'POST', target: '/v1/join', headers: signed(id, name, 'POST', '/v1/join', body), body }) };
    },
    // a node's own routes with bodies the schema refuses
    () => {
      const usage = rng.int(2) === 0;
      const target = usage ? `/v1/nodes/${NODE_A}/usage` : `/v1/nodes/${NODE_A}`;
      const method = usage ? 'POST' : 'PUT';
      const base: Record<string, unknown> = usage ? validUsage() : { ...t.fieldsA };
      const key = rng.pick(Object.keys(base));
      const variant = rng.int(3);
      if (variant === 0) base[key] = usage ? rng.pick<unknown>([-1, 1.5, '3', null, [], true]) : wrongValue(key);
      else if (variant === 1) base[rng.pick(['identity', 'name', 'blocks', rng.word(5)])] = 'x';
      else if (usage) delete base[key];
      else base.addresses = ['not-an-ip'];
      const body = json(base);
      return { kind: `signed ${method} invalid body`, expect: BAD_REQUEST, request: () => ({ method, target, headers: signed(t.a, NODE_A, method, target, body), body }) };
    },
    // bootstrap tokens: missing (schema), empty, garbage, almost right, another secret
    () => {
      const id = memoryIdentity();
      const name = freshName();
      const join: Record<string, unknown> = validJoin(name, id);
      const variant = rng.int(6);
      if (variant === 0) delete join.token;
      else join.token = [() => '', () => rng.word(rng.range(1, 60)), () => ADMIN_TOKEN, () => BOOTSTRAP_TOKEN.slice(0, -1), () => `${BOOTSTRAP_TOKEN}x`,
        () => BOOTSTRAP_TOKEN.toUpperCase(), () => ` ${BOOTSTRAP_TOKEN}`][rng.int(7)]!();
      const body = json(join);
      return { kind: variant === 0 ? 'join without token' : 'join wrong token', expect: variant === 0 ? BAD_REQUEST : UNAUTHENTICATED,
        request: () => ({ method: 'POST', target: '/v1/join', headers: signed(id, name, 'POST', '/v1/join', body), body }) };
    },
    // joins with the right token and a bad signature: none, another key, another name, tampered, out of time
    () => {
      const id = memoryIdentity();
      const other = memoryIdentity();
      const name = freshName();
      const body = json(validJoin(name, id));
      const variant = rng.int(8);
      const kinds = ['unsigned', 'signed by another key', 'signed as another name', 'tampered body', 'stale', 'future', 'garbage signature', 'bad nonce'];
      return {
        kind: `join ${kinds[variant]}`,
        expect: UNAUTHENTICATED,
        request: () => {
          const now = Date.now();
          const opts: SignOptions = variant === 2 ? { as: freshName() } : variant === 4 ? { time: now - rng.range(6, 600) * MINUTE } : variant === 5 ? { time: now + rng.range(6, 600) * MINUTE } : {};
          let headers = variant === 0 ? [] : signed(variant === 1 ? other : id, name, 'POST', '/v1/join', body, opts);
          if (variant === 6) headers = headers.map(([k, v]) => [k, k === 'x-atoll-signature' ? rng.pick([Buffer.alloc(64).toString('base64'), 'AAAA', '!!', v.slice(1)]) : v]);
          if (variant === 7) headers = headers.map(([k, v]) => [k, k === 'x-atoll-nonce' ? rng.pick(['ABCDEF0123456789', '123', 'zz'.repeat(10), '']) : v]);
          const sent = variant === 3 ? json({ ...validJoin(name, id), site: 'edge-2' }) : body;
          return { method: 'POST', target: '/v1/join', headers, body: sent };
        },
      };
    },
    // a valid join for a name that is registered with another key
    () => {
      const id = memoryIdentity();
      const name = rng.pick([NODE_A, NODE_B]);
      const body = json(validJoin(name, id));
      return { kind: 'join a taken name', expect: IDENTITY_TAKEN, request: () => ({ method: 'POST', target: '/v1/join', headers: signed(id, name, 'POST', '/v1/join', body), body }) };
    },
    // a node's routes: unsigned, partly signed, signed by a wrong key or an unknown node, out of time, tampered
    () => {
      const route = rng.pick(nodeRoutes(NODE_A));
      const body = route.body();
      const variant = rng.int(8);
      const kinds = ['unsigned', 'missing a signature header', 'wrong key', 'unregistered signer', 'stale', 'future', 'tampered path', 'repeated signature header'];
      return {
        kind: `${route.method} ${kinds[variant]}`,
        expect: UNAUTHENTICATED,
        request: () => {
          const now = Date.now();
          let headers: [string, string][] = [];
          if (variant === 1) {
            const drop = rng.pick(['x-atoll-node', 'x-atoll-time', 'x-atoll-nonce', 'x-atoll-signature']);
            headers = signed(t.a, NODE_A, route.method, route.target, body).filter(([k]) => k !== drop);
          } else if (variant === 2) headers = signed(memoryIdentity(), NODE_A, route.method, route.target, body);
          else if (variant === 3) headers = signed(memoryIdentity(), NODE_A, route.method, route.target, body, { as: freshName() });
          else if (variant === 4) headers = signed(t.a, NODE_A, route.method, route.target, body, { time: now - rng.range(6, 6000) * MINUTE });
          else if (variant === 5) headers = signed(t.a, NODE_A, route.method, route.target, body, { time: now + rng.range(6, 6000) * MINUTE });
          else if (variant === 6) headers = signed(t.a, NODE_A, route.method, `${route.target}?x=1`, body);
          else if (variant === 7) {
            headers = signed(t.a, NODE_A, route.method, route.target, body);
            headers.push(['x-atoll-signature', headers.find(([k]) => k === 'x-atoll-signature')?.[1] ?? '']);
          }
          return { method: route.method, target: route.target, headers, body };
        },
      };
    },
    // replays of requests the API accepted, byte for byte
    () => {
      const bytes = rng.pick(t.accepted);
      return { kind: 'replay of an accepted request', expect: UNAUTHENTICATED, request: () => bytes };
    },
    // a node acting on another node (or one that does not exist), with a valid signature of its own
    () => {
      const victim = rng.pick([NODE_B, NODE_B, 'ghost', freshName()]);
      const route = rng.pick(nodeRoutes(victim));
      const body = route.body();
      return { kind: `${route.method} on another node`, expect: FORBIDDEN, request: () => ({ method: route.method, target: route.target, headers: signed(t.a, NODE_A, route.method, route.target, body), body }) };
    },
    // a node claiming to be another one while signing with its own key
    () => {
      const route = rng.pick(nodeRoutes(NODE_B));
      const body = route.body();
      return { kind: `${route.method} impersonating`, expect: UNAUTHENTICATED, request: () => ({ method: route.method, target: route.target, headers: signed(t.a, NODE_A, route.method, route.target, body, { as: NODE_B }), body }) };
    },
    // routes that do not exist, and methods a route does not take
    () => {
      const plain: [string, string][] = [
        ['GET', '/'], ['GET', '/v1'], ['GET', '/v1/'], ['GET', '/v1/nodes'], ['GET', '/v1/nodes/'], ['GET', '/v2/join'], ['POST', '/v1/join/'],
        ['GET', '/v1/join'], ['PUT', '/v1/join'], ['POST', '/v1/health'], ['DELETE', '/v1/health'], ['POST', '/v1/ipam'], ['PUT', '/v1/ipam'],
        ['GET', '/v1/ipam/x'], ['GET', `/v1/nodes/${NODE_A}/blocks/x`], ['GET', `/v1/nodes/${NODE_A}/other`], ['OPTIONS', '*'], ['TRACE', '/v1/join'],
        ['PATCH', '/v1/join'], ['GET', '//['], ['GET', '/v1/nodes/%zz'], ['PUT', '/v1/nodes/%E0%A4%A'], ['GET', '/../../etc/passwd'],
        ['GET', `/v1/${rng.word(8)}`], ['POST', '/v1/watch'], ['DELETE', '/v1/watch'],
      ];
      const self: [string, string][] = [['PATCH', `/v1/nodes/${NODE_A}`], ['GET', `/v1/nodes/${NODE_A}`], ['POST', `/v1/nodes/${NODE_A}`], ['PUT', `/v1/nodes/${NODE_A}/usage`],
        ['POST', `/v1/nodes/${NODE_A}/blocks`], ['DELETE', `/v1/nodes/${NODE_A}/usage`], ['GET', `/v1/nodes/${NODE_A}/usage`], ['GET', '/v1/watch?after=abc'],
        ['GET', '/v1/watch?after=-1'], ['GET', `/v1/watch?after=${'9'.repeat(20)}`]];
      if (rng.int(3) > 0) {
        const [method, target] = rng.pick(plain);
        return { kind: `no route ${method}`, expect: BAD_REQUEST, request: () => ({ method, target, headers: [], body: Buffer.alloc(0) }) };
      }
      const [method, target] = rng.pick(self);
      const unsigned = rng.int(2) === 0;
      return {
        kind: `${unsigned ? 'unsigned' : 'signed'} ${method} on a node route it lacks`,
        expect: unsigned ? UNAUTHENTICATED : BAD_REQUEST,
        request: () => ({ method, target, headers: unsigned ? [] : signed(t.a, NODE_A, method, target, Buffer.alloc(0)), body: Buffer.alloc(0) }),
      };
    },
    // admin routes without the admin token
    () => {
      const [method, target] = rng.pick<[string, string]>([['GET', '/v1/ipam'], ['DELETE', `/v1/nodes/${NODE_A}`], ['DELETE', `/v1/nodes/${NODE_B}`], ['DELETE', '/v1/nodes/ghost']]);
      const auth = rng.pick<string | undefined>([undefined, '', 'Bearer', 'Bearer ', `Bearer ${BOOTSTRAP_TOKEN}`, `Bearer ${ADMIN_TOKEN.slice(0, -1)}`, `Bearer ${ADMIN_TOKEN}x`,
        `bearer ${ADMIN_TOKEN}`, `Basic ${Buffer.from(`admin:${ADMIN_TOKEN}`).toString('base64')}`, `Bearer  ${ADMIN_TOKEN}`, `Bearer ${rng.word(40)}`, ADMIN_TOKEN]);
      const headers: [string, string][] = auth === undefined ? [] : [['authorization', auth]];
      if (rng.int(2) === 0) headers.push(...signed(t.a, NODE_A, method, target, Buffer.alloc(0)));
      return { kind: `admin ${method} without the admin token`, expect: UNAUTHENTICATED, request: () => ({ method, target, headers, body: Buffer.alloc(0) }) };
    },
    // bodies over the limit: declared, or streamed without a length
    () => {
      const route = rng.pick([['POST', '/v1/join'], ['PUT', `/v1/nodes/${NODE_A}`], ['POST', `/v1/nodes/${NODE_A}/usage`], ['GET', '/v1/health'], ['GET', '/v1/ipam'], ['POST', '/nowhere']] as const);
      const size = rng.pick([MAX_BODY + 1, MAX_BODY + rng.range(2, 4096), rng.range(2, 4) * MAX_BODY]);
      const body = Buffer.alloc(size, rng.pick(['a', '{', ' ', '\u00ff']));
      const variant = rng.int(3);
      if (variant === 0) return { kind: `${route[0]} with a declared body over the limit`, expect: TOO_LARGE, request: () => ({ method: route[0], target: route[1], headers: [], body }) };
      if (variant === 1) {
        // the length alone: the answer must come without waiting for a body that is never sent
        return { kind: `${route[0]} declaring a body over the limit`, expect: TOO_LARGE, request: () => ({ method: route[0], target: route[1], headers: [], body: body.subarray(0, 10), contentLength: size }) };
      }
      const chunk = rng.pick([1024, 8192, 16384, 65536]);
      return { kind: `${route[0]} with a streamed body over the limit`, expect: TOO_LARGE, request: () => ({ method: route[0], target: route[1], headers: [], body, chunked: chunk }) };
    },
    // bytes that are not UTF-8: in a signed body (valid JSON around them), in the path, in a header name, in a header value
    () => {
      const variant = rng.int(5);
      const bad = rng.pick([Buffer.from([0xff]), Buffer.from([0xc3, 0x28]), Buffer.from([0xe2, 0x82]), Buffer.from([0xed, 0xa0, 0x80]), Buffer.from([0xf8, 0x88, 0x80, 0x80, 0x80])]);
      if (variant <= 1) {
        // a join for a new node (right token, right signature) or a node's own update, valid but for the bytes
        const id = variant === 0 ? memoryIdentity() : t.a;
        const name = variant === 0 ? freshName() : NODE_A;
        const text = JSON.stringify(variant === 0 ? validJoin(name, id) : t.fieldsA).replace('"fuzz"', '"fuzz@@"');
        const [pre, post] = text.split('@@') as [string, string];
        const body = Buffer.concat([Buffer.from(pre), bad, Buffer.from(post)]);
        const [method, target] = variant === 0 ? ['POST', '/v1/join'] : ['PUT', `/v1/nodes/${NODE_A}`];
        return { kind: `${method} body not UTF-8`, expect: BAD_REQUEST, request: () => ({ method, target, headers: signed(id, name, method, target, body), body }) };
      }
      if (variant === 2) {
        return { kind: 'path not UTF-8', expect: BAD_REQUEST, request: () => ({ method: 'GET', target: Buffer.concat([Buffer.from('/v1/nodes/'), bad]), headers: [], body: Buffer.alloc(0) }) };
      }
      if (variant === 3) {
        return { kind: 'header name not UTF-8', expect: BAD_REQUEST, request: () => ({ method: 'GET', target: '/v1/health', headers: [[Buffer.concat([Buffer.from('x-'), bad]), 'v']], body: Buffer.alloc(0) }) };
      }
      // obs-text in a header value is legal HTTP; as the signer's name it is an unknown node
      return { kind: 'signer name not UTF-8', expect: UNAUTHENTICATED, request: () => ({ method: 'GET', target: `/v1/nodes/${NODE_A}/blocks`,
        headers: signed(t.a, NODE_A, 'GET', `/v1/nodes/${NODE_A}/blocks`, Buffer.alloc(0)).map(([k, v]) => [k, k === 'x-atoll-node' ? Buffer.concat([Buffer.from(v), bad]) : v]), body: Buffer.alloc(0) }) };
    },
    // malformed HTTP: bad method token, conflicting lengths, bad chunking, headers over the limit
    () => {
      const variant = rng.int(5);
      if (variant === 0) return { kind: 'unknown method', expect: BAD_REQUEST, request: () => ({ method: rng.pick(['FOO', 'get', 'P0ST', 'BREW']), target: '/v1/health', headers: [], body: Buffer.alloc(0) }) };
      if (variant === 1) {
        const length = rng.pick(['abc', '-1', '1e3', '0x10', '5, 6']);
        return { kind: 'bad content-length', expect: BAD_REQUEST, request: () => Buffer.from(`POST /v1/join HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: ${length}\r\n\r\n{}`) };
      }
      if (variant === 2) {
        return { kind: 'content-length and chunked', expect: BAD_REQUEST,
          request: () => Buffer.from('POST /v1/join HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n') };
      }
      if (variant === 3) return { kind: 'bad chunk', expect: BAD_REQUEST, request: () => Buffer.from(`POST /v1/join HTTP/1.1\r\nhost: 127.0.0.1\r\ntransfer-encoding: chunked\r\n\r\n${rng.pick(['zz', '-1', 'ffffffffffffffffff'])}\r\nabc\r\n0\r\n\r\n`) };
      return { kind: 'headers over the limit', expect: HEADERS_TOO_LARGE, request: () => ({ method: 'GET', target: '/v1/health', headers: [['x-padding', 'p'.repeat(rng.range(17, 40) * 1024)]], body: Buffer.alloc(0) }) };
    },
  ];
  return Array.from({ length: n }, () => rng.pick(makers)());
}

// ---------------------------------------------------------------------------------------------------------------
// The test


interface StoreView {
  readonly revision: number;
  readonly nodes: unknown;
  readonly leases: unknown;
  readonly ipam: unknown;
}

describe('controller API under bad requests', { timeout: 300_000 }, () => {
  const dir = mkdtempSync(join(tmpdir(), `${RUN_PREFIX}fuzz-`));
  const logLines: string[] = [];
  let controller: Controller;
  let port = 0;
  let ca = '';
  let target: Target;

  const view = async (): Promise<StoreView> => {
    const registry = controller.registry;
    assert.ok(registry);
    const { nodes, revision } = await registry.snapshot();
    return { revision, nodes, leases: await registry.leases(), ipam: await registry.ipamReport() };
  };

  before(async () => {
    port = await freePort();
    const config = parseControllerConfig({
      listenHost: '127.0.0.1', listenPort: port, advertiseUrl: `https://127.0.0.1:${port}`, clusterCidrs: ['10.100.0.0/16'], blockBits: 26,
      dataDir: join(dir, 'data'), bootstrapTokens: [BOOTSTRAP_TOKEN], adminToken: ADMIN_TOKEN, maxBodyBytes: MAX_BODY,
    });
    const log = jsonLogger({ level: 'info', write: (line) => void logLines.push(line) });
    controller = new Controller({ log, clock: Date.now }, config);
    await controller.start();
    assert.equal(controller.port, port, 'the controller reports the port it listens on');
    ca = readFileSync(join(dir, 'data', 'pki', 'ca.crt'), 'utf8');

    // Two nodes join; the requests the API accepts are kept, byte for byte, to be replayed.
    const a = memoryIdentity();
    const b = memoryIdentity();
    const fieldsA = { site: 'edge-1', community: '', addresses: ['198.51.100.10'], vtepMac: '02:00:00:00:00:0a', tunnelKey: '', agentVersion: 'fuzz' };
    const accepted: Buffer[] = [];
    const ok = async (id: NodeIdentity, node: string, method: string, path: string, body: Buffer) => {
      const bytes = encode({ method, target: path, headers: signed(id, node, method, path, body), body });
      const ans = await exchange(port, ca, bytes);
      assert.equal(ans.status, 200, `${method} ${path} by ${node}: ${ans.text}`);
      accepted.push(bytes);
    };
    await ok(a, NODE_A, 'POST', '/v1/join', json({ ...fieldsA, token: BOOTSTRAP_TOKEN, name: NODE_A, identity: a.publicKey }));
    await ok(b, NODE_B, 'POST', '/v1/join', json({ ...fieldsA, addresses: ['198.51.100.11'], token: BOOTSTRAP_TOKEN, name: NODE_B, identity: b.publicKey }));
    await ok(a, NODE_A, 'POST', '/v1/join', json({ ...fieldsA, token: BOOTSTRAP_TOKEN, name: NODE_A, identity: a.publicKey }));
    await ok(a, NODE_A, 'PUT', `/v1/nodes/${NODE_A}`, json(fieldsA));
    await ok(a, NODE_A, 'GET', `/v1/nodes/${NODE_A}/blocks`, Buffer.alloc(0));
    await ok(a, NODE_A, 'POST', `/v1/nodes/${NODE_A}/usage`, json({ capacity: 62, allocated: 3, reserved: 0, free: 59 }));
    await ok(b, NODE_B, 'POST', `/v1/nodes/${NODE_B}/usage`, json({ capacity: 62, allocated: 0, reserved: 0, free: 62 }));
    target = { a, b, fieldsA, accepted };
  });

  after(async () => {
    await controller?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  test(`${CASES} bad requests: each refused with its 4xx and code, logged, and the store unchanged (seed ${SEED})`, async (t) => {
    t.diagnostic(`ATOLL_FUZZ_SEED=${SEED} ATOLL_FUZZ_CASES=${CASES}`);
    const before = await view();
    assert.equal((before.nodes as unknown[]).length, 2);
    const refusedBefore = logLines.filter((l) => l.includes('"API request refused"')).length;
    const cases = generateCases(new Rng(SEED), CASES, target);
    const failures: string[] = [];
    const byKind = new Map<string, number>();
    let next = 0;
    const worker = async () => {
      for (let i = next++; i < cases.length; i = next++) {
        const c = cases[i] as Case;
        byKind.set(c.kind, (byKind.get(c.kind) ?? 0) + 1);
        let problem: string | undefined;
        let ans: Answer | undefined;
        try {
          ans = await exchange(port, ca, c.request());
          let body: { code?: unknown; message?: unknown } | undefined;
          try {
            body = JSON.parse(ans.text) as typeof body;
          } catch {
            body = undefined;
          }
          if (ans.status !== c.expect.status) problem = `status ${ans.status}, expected ${c.expect.status}`;
          else if (typeof body?.code !== 'string' || !(body.code in ERROR_CATALOGUE)) problem = 'no catalogued code in a JSON body';
          else if (body.code !== c.expect.code) problem = `code ${body.code}, expected ${c.expect.code}`;
          else if (typeof body.message !== 'string' || body.message === '') problem = 'no message';
        } catch (e) {
          problem = (e as Error).message;
        }
        if (problem !== undefined) failures.push(`case #${i} (${c.kind}): ${problem}; answer ${JSON.stringify(ans?.text.slice(0, 300))}`);
      }
    };
    await Promise.all(Array.from({ length: IN_FLIGHT }, worker));
    t.diagnostic(`kinds: ${[...byKind].sort((x, y) => y[1] - x[1]).map(([k, v]) => `${k} ${v}`).join(', ')}`);
    assert.deepEqual(failures.slice(0, 20), [], `${failures.length} of ${CASES} cases failed (ATOLL_FUZZ_SEED=${SEED})`);

    const after = await view();
    assert.equal(after.revision, before.revision, 'the store revision is unchanged');
    assert.deepEqual(after, before, 'the store contents are unchanged');

    const refused = logLines.filter((l) => l.includes('"API request refused"'));
    assert.equal(refused.length - refusedBefore, CASES, 'each refused request is logged once');
    const line = JSON.parse(refused.at(-1) as string) as { component?: string; code?: string };
    assert.equal(line.component, 'api');
    assert.ok(line.code !== undefined && line.code in ERROR_CATALOGUE);
  });

  test('a body that never arrives: 408 API_REQUEST_TIMEOUT after 10 s and the connection closed, while other clients are answered', async () => {
    const started = performance.now();
    const slow = new Promise<{ head: string; closedMs: number; bytes: number }>((resolve, reject) => {
      const socket = connect({ host: '127.0.0.1', port, ca });
      let got = Buffer.alloc(0);
      let trickle: NodeJS.Timeout | undefined;
      socket.on('secureConnect', () => {
        // declares 1,000 bytes, sends 10, then one more every second: a slowloris
        socket.write('POST /v1/join HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{"token":"');
        trickle = setInterval(() => socket.writable && socket.write('a'), 1000);
      });
      socket.on('data', (d: Buffer) => (got = Buffer.concat([got, d])));
      socket.on('error', () => undefined); // the server closing under a write: the close below says enough
      socket.on('close', () => {
        clearInterval(trickle);
        resolve({ head: got.toString('latin1'), closedMs: performance.now() - started, bytes: got.length });
      });
      setTimeout(() => reject(new Error(`the slow connection was not closed within 20 s; got ${JSON.stringify(got.toString('latin1'))}`)), 20_000).unref();
    });
    // meanwhile, others are answered at once
    await new Promise((r) => setTimeout(r, 1000));
    const t0 = performance.now();
    const health = await exchange(port, ca, { method: 'GET', target: '/v1/health', headers: [], body: Buffer.alloc(0) });
    assert.equal(health.status, 200);
    assert.ok(performance.now() - t0 < 2000, `health answered in ${Math.round(performance.now() - t0)} ms beside the slow client`);
    const { head: answer, closedMs } = await slow;
    assert.match(answer, /^HTTP\/1\.1 408 /, answer);
    assert.match(answer, /"code":"API_REQUEST_TIMEOUT"/);
    assert.match(answer, /\r\nconnection: close\r\n/i);
    assert.ok(closedMs >= 9_500 && closedMs < 15_000, `closed ${Math.round(closedMs)} ms after the connection`);
    assert.ok(logLines.some((l) => l.includes('"code":"API_REQUEST_TIMEOUT"')), 'logged as refused');
  });
});
