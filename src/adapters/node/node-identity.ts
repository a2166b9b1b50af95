/**
 * The node's identity: an ed25519 key pair the agent generates once and keeps. The controller records the public
 * key when the node joins and from then on knows the node by it, so the private key is never replaced behind the
 * operator's back: a missing file is created, a damaged one is an error.
 *
 * Why ed25519: small keys, fast deterministic signatures, no parameters to choose. Why PKCS#8 PEM: `openssl pkey`
 * reads it. The file is created crash-safely and without ever overwriting: written to a private temporary file,
 * fsynced, then hard-linked into place (a link, unlike a rename, fails when the target exists, so two agents
 * starting at once end up with one key), and the directory fsynced.
 *
 * Requests are signed over {@link canonicalRequest} and carry {@link SIGNATURE_HEADERS}.
 */
import { createHash, createPrivateKey, createPublicKey, generateKeyPairSync, randomBytes, sign, verify, type KeyObject } from 'node:crypto';
import { closeSync, fchmodSync, fsyncSync, linkSync, mkdirSync, openSync, readFileSync, rmSync, writeSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';
import { atollError } from '../../core/errors.ts';
import { canonicalRequest, SIGNATURE_HEADERS, type ReplayGuard } from '../../core/cluster/signing.ts';
import { syncDir, TMP_PREFIX } from '../durable-file.ts';

/** A node's key pair, as the agent uses it. */
export interface NodeIdentity {
  /** Base64 of the public key's SubjectPublicKeyInfo DER: what the controller records at join. */
  readonly publicKey: string;
  /** Signs `data` with the private key; returns the base64 signature. */
  sign(data: string | Buffer): string;
}

const REFUSE_FIX = 'Atoll does not replace it, because the controller knows the node by this key: restore it from a backup, or ' +
  "delete it and the node's record on the controller, then join the node again with a new bootstrap token";

/**
 * Loads the node key from `path` (PKCS#8 PEM, ed25519), or creates it there (mode 0600, parent directories 0700)
 * when the file does not exist. Idempotent: later calls, and concurrent first calls, return the same identity.
 * @throws AtollError NODE_IDENTITY_INVALID when the file exists but cannot be read or is not an ed25519 private key;
 *   NODE_STATE_WRITE_FAILED when it cannot be created (a full or read-only disk); naming the path.
 */
export function loadOrCreateIdentity(path: string): NodeIdentity {
  let pem: string;
  try {
    pem = readFileSync(path, 'utf8');
  } catch (cause) {
    if ((cause as NodeJS.ErrnoException).code !== 'ENOENT') {
      throw atollError('NODE_IDENTITY_INVALID', `cannot read the node key ${path}: ${(cause as Error).message}`,
        'check that the file is readable by the agent (it runs as root) and is a regular file', cause);
    }
    pem = createKeyFile(path);
  }
  return identityFromPem(pem, path);
}

/**
 * The identity of the node key `pem` (the text of the key file at `path`).
 * @throws AtollError NODE_IDENTITY_INVALID when it is not a PEM ed25519 private key.
 */
export function identityFromPem(pem: string, path: string): NodeIdentity {
  let key: KeyObject;
  try {
    key = createPrivateKey({ key: pem, format: 'pem' });
  } catch (cause) {
    throw atollError('NODE_IDENTITY_INVALID', `the node key ${path} is not a PEM private key: ${(cause as Error).message}`, REFUSE_FIX, cause);
  }
  if (key.asymmetricKeyType !== 'ed25519') {
    throw atollError('NODE_IDENTITY_INVALID', `the node key ${path} is a ${key.asymmetricKeyType ?? 'unknown'} key, not ed25519`, REFUSE_FIX);
  }
  return {
    publicKey: createPublicKey(key).export({ type: 'spki', format: 'der' }).toString('base64'),
    sign: (data) => sign(null, toBuffer(data), key).toString('base64'),
  };
}

/** Creates the key file unless another process got there first; returns the PEM now in the file. */
function createKeyFile(path: string): string {
  const pem = generateKeyPairSync('ed25519').privateKey.export({ type: 'pkcs8', format: 'pem' }) as string;
  const dir = dirname(path);
  const tmp = join(dir, `${TMP_PREFIX}${basename(path)}-${randomBytes(6).toString('hex')}`);
  try {
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    const fd = openSync(tmp, 'wx', 0o600);
    try {
      fchmodSync(fd, 0o600);
      writeSync(fd, pem);
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    try {
      linkSync(tmp, path);
    } catch (cause) {
      if ((cause as NodeJS.ErrnoException).code === 'EEXIST') return readFileSync(path, 'utf8');
      throw cause;
    }
    syncDir(dir);
    return pem;
  } catch (cause) {
    throw atollError('NODE_STATE_WRITE_FAILED', `cannot create the node key ${path}: ${(cause as Error).message}`,
      "check that its directory is writable by the agent and the disk is not full; the agent works from local state and does not join the controller until the key is on disk", cause);
  } finally {
    rmSync(tmp, { force: true });
  }
}

/**
 * True when `signatureB64` is a valid ed25519 signature of `data` by `publicKeyB64` (base64 SPKI DER). False on any
 * malformed input (bad base64, another key type, wrong length); never throws.
 */
export function verifySignature(publicKeyB64: string, data: string | Buffer, signatureB64: string): boolean {
  try {
    const der = strictBase64(publicKeyB64);
    const signature = strictBase64(signatureB64);
    if (der === undefined || signature?.length !== 64) return false;
    const key = createPublicKey({ key: der, format: 'der', type: 'spki' });
    return key.asymmetricKeyType === 'ed25519' && verify(null, toBuffer(data), key, signature);
  } catch {
    return false;
  }
}

/** Lower-case hex SHA-256 of `data` (strings as UTF-8). */
export function sha256Hex(data: string | Buffer): string {
  return createHash('sha256').update(data).digest('hex');
}

/** What {@link signRequest} signs. */
export interface RequestToSign {
  readonly method: string;
  /** Path and query exactly as they will be sent. */
  readonly path: string;
  /** This node's name, as registered with the controller. */
  readonly node: string;
  /** The exact body bytes that will be sent (empty for none). */
  readonly body: Buffer | string;
  /** Milliseconds since the epoch (an integer, e.g. `Date.now()`). */
  readonly now: number;
  /** Defaults to 16 random bytes in hex; pass one only in tests. */
  readonly nonce?: string;
}

/**
 * The four {@link SIGNATURE_HEADERS} that authenticate a request from this node. Send the body exactly as given.
 * @throws RangeError when a field cannot be signed unambiguously (see {@link canonicalRequest}).
 */
export function signRequest(identity: NodeIdentity, req: RequestToSign): Record<string, string> {
  const nonce = req.nonce ?? randomBytes(16).toString('hex');
  const canonical = canonicalRequest({ method: req.method, path: req.path, node: req.node, time: req.now, nonce, bodySha256: sha256Hex(req.body) });
  return {
    [SIGNATURE_HEADERS.node]: req.node,
    [SIGNATURE_HEADERS.time]: String(req.now),
    [SIGNATURE_HEADERS.nonce]: nonce,
    [SIGNATURE_HEADERS.signature]: identity.sign(canonical),
  };
}

/** The result of {@link verifyRequest}; `reason` is for logs and the 401 body, never for control flow. */
export type VerifyResult = { readonly ok: true; readonly node: string } | { readonly ok: false; readonly reason: string };

/**
 * Checks a signed request: the headers are present and well-formed, the signature over method, path, node, time,
 * nonce and body is by `publicKeyB64`, and `guard` finds the request fresh (it then remembers it, so verify each
 * request once). `publicKeyB64` is the key recorded at join for the node named in the `x-atoll-node` header: read
 * that header first to look it up. `path` is the request target as received (path and query). Never throws.
 */
export function verifyRequest(
  publicKeyB64: string,
  headers: Record<string, string | string[] | undefined>,
  method: string,
  path: string,
  body: Buffer | string,
  guard: ReplayGuard,
  now: number,
): VerifyResult {
  const h: Partial<Record<keyof typeof SIGNATURE_HEADERS, string>> = {};
  for (const [field, name] of Object.entries(SIGNATURE_HEADERS) as [keyof typeof SIGNATURE_HEADERS, string][]) {
    const value = headers[name];
    if (typeof value !== 'string' || value === '') return { ok: false, reason: `missing or repeated header ${name}` };
    h[field] = value;
  }
  const { node = '', time: timeText = '', nonce = '', signature = '' } = h;
  if (!/^\d{1,16}$/.test(timeText)) return { ok: false, reason: `header ${SIGNATURE_HEADERS.time} is not milliseconds since the epoch` };
  const time = Number(timeText);
  let canonical: string;
  try {
    canonical = canonicalRequest({ method, path, node, time, nonce, bodySha256: sha256Hex(body) });
  } catch (err) {
    return { ok: false, reason: `malformed request (${(err as Error).message})` };
  }
  if (!verifySignature(publicKeyB64, canonical, signature)) {
    return { ok: false, reason: `bad signature for node ${node} (wrong key, or the method, path, body, time or nonce changed)` };
  }
  const verdict = guard.check(node, time, nonce, now);
  switch (verdict) {
    case 'ok':
      return { ok: true, node };
    case 'replayed':
      return { ok: false, reason: `replayed request: node ${node} already used nonce ${nonce}` };
    case 'stale':
    case 'future':
      return { ok: false, reason: `request time ${time} is ${verdict === 'stale' ? 'too old' : 'too far ahead'} for the controller's clock ${now} ` +
        `(allowed skew ${guard.windowMs} ms, less when the replay cache is full): check the node's clock (NTP) and retry with a fresh request` };
    case 'malformed':
      return { ok: false, reason: 'malformed request: bad node or nonce' };
  }
}

function toBuffer(data: string | Buffer): Buffer {
  return typeof data === 'string' ? Buffer.from(data, 'utf8') : data;
}

/** Decodes canonical base64 only (Buffer.from skips bad characters silently). */
function strictBase64(s: string): Buffer | undefined {
  const b = Buffer.from(s, 'base64');
  return b.length > 0 && b.toString('base64') === s ? b : undefined;
}
