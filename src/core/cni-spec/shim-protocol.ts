/**
 * The wire between `atoll-cni` (the native shim) and the agent, over a unix stream socket. Binary, so the shim
 * needs no JSON code:
 *
 *   request:  "ATL1" | u32 envLen | env (KEY=VALUE entries, each ended by NUL) | u32 stdinLen | stdin
 *   response: u32 exitCode | u32 stdoutLen | stdout | u32 stderrLen | stderr
 *
 * Integers are big-endian. The shim sends only CNI_* variables and at most MAX_STDIN_BYTES + 1 bytes of stdin.
 * The shim's C source is native/atoll-cni.c; keep both in step. Pure, in core because both ends use it: the agent's
 * CNI server (src/agent/cni-server.ts) and the lab, which asks a starting agent for its VERSION.
 */
import { atollError } from '../errors.ts';

export const MAGIC = 'ATL1';
export const MAX_ENV_BYTES = 64 * 1024;

/** What the agent answers the shim: its exit code and what it prints. */
export interface CniResponse {
  readonly exitCode: number;
  readonly stdout: string;
  readonly stderr: string;
}

export interface CniInvocation {
  readonly env: Record<string, string>;
  readonly stdin: Buffer;
}

/**
 * Decodes a complete request; returns undefined while more bytes are needed.
 * @throws AtollError CNI_FRAME_INVALID on a malformed frame.
 */
export function decodeRequest(buf: Buffer, maxStdin: number): CniInvocation | undefined {
  if (buf.length < 8) return undefined;
  if (buf.subarray(0, 4).toString('latin1') !== MAGIC) throw frameInvalid('not an atoll-cni request (bad magic)');
  const envLen = buf.readUInt32BE(4);
  if (envLen > MAX_ENV_BYTES) throw frameInvalid(`environment block of ${envLen} bytes is over ${MAX_ENV_BYTES}`);
  if (buf.length < 8 + envLen + 4) return undefined;
  const stdinLen = buf.readUInt32BE(8 + envLen);
  if (stdinLen > maxStdin + 1) throw frameInvalid(`stdin of ${stdinLen} bytes is over the frame limit of ${maxStdin + 1}`);
  const end = 12 + envLen + stdinLen;
  if (buf.length < end) return undefined;
  const entries: [string, string][] = [];
  for (const entry of buf.subarray(8, 8 + envLen).toString('utf8').split('\0')) {
    const eq = entry.indexOf('=');
    if (eq > 0) entries.push([entry.slice(0, eq), entry.slice(eq + 1)]);
  }
  // fromEntries defines each key as the object's own, so a variable named __proto__ is kept, not taken for the setter
  return { env: Object.fromEntries(entries), stdin: buf.subarray(12 + envLen, end) };
}

function frameInvalid(what: string) {
  return atollError('CNI_FRAME_INVALID', `the agent's CNI socket got a malformed request: ${what}`,
    'the atoll-cni on this node is not the agent\'s (the agent installs its own into the CNI bin dir at start), or something else writes to the socket');
}

export function encodeRequest(inv: CniInvocation): Buffer {
  const env = Buffer.from(Object.entries(inv.env).map(([k, v]) => `${k}=${v}\0`).join(''), 'utf8');
  const head = Buffer.alloc(8);
  head.write(MAGIC, 0, 'latin1');
  head.writeUInt32BE(env.length, 4);
  const mid = Buffer.alloc(4);
  mid.writeUInt32BE(inv.stdin.length, 0);
  return Buffer.concat([head, env, mid, inv.stdin]);
}

export function encodeResponse(r: CniResponse): Buffer {
  const out = Buffer.from(r.stdout, 'utf8');
  const err = Buffer.from(r.stderr, 'utf8');
  const b = Buffer.alloc(12 + out.length + err.length);
  b.writeUInt32BE(r.exitCode, 0);
  b.writeUInt32BE(out.length, 4);
  out.copy(b, 8);
  b.writeUInt32BE(err.length, 8 + out.length);
  err.copy(b, 12 + out.length);
  return b;
}
