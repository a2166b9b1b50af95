/**
 * The controller's TLS: its own CA, a server certificate that CA signs, and the agents' side of trusting it. Also the
 * one place that runs `openssl` and computes key pins: the tunnel's self-signed certificates and SPKI pins
 * (src/adapters/tunnel/tunnel-credentials.ts) come from here too.
 *
 * Why a private CA pinned by hash (as kubeadm's `--discovery-token-ca-cert-hash`): an agent joining over the
 * internet has no trust store that knows the controller, and copying a CA file to every edge node is the step
 * operators get wrong. Instead the controller prints `sha256:<hex>` of its CA's public key (SubjectPublicKeyInfo DER)
 * at start; the agent connects once trusting nothing, accepts the chain only if its CA has that hash and signed the
 * server certificate for the address dialled, then keeps the CA and verifies TLS normally from then on.
 *
 * Why the `openssl` CLI: Node can parse and verify certificates but cannot issue them. Keys are EC P-256 (every TLS
 * stack speaks it). The CA is never replaced once it exists, as that would cut off every agent that pinned it; the
 * server certificate is re-issued whenever it does not suit (new listen address, near expiry, damaged), which
 * agents do not notice.
 *
 * Files in the PKI directory (0700): `ca.key` and `server.key` (0600), `ca.crt` and `server.crt` (0644). Each is
 * written crash-safely (temporary files left by a crash are removed on the next run); the CA key is written before
 * its certificate, and a CA certificate missing beside its key is issued again from that key, which keeps its hash.
 * One controller process owns a directory at a time.
 */
import { createHash, createPrivateKey, createPublicKey, randomBytes, X509Certificate, type KeyObject } from 'node:crypto';
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { isIP } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { connect } from 'node:tls';
import { atollError } from '../core/errors.ts';
import type { Clock } from '../core/ports.ts';
import { exec as defaultExec, type Exec, type ExecResult } from './exec.ts';
import { TMP_PREFIX, writeFileDurably } from './durable-file.ts';

/** What the controller serves TLS with, and the pin it prints for agents. */
export interface ControllerPki {
  /** The CA certificate (PEM). */
  readonly caPem: string;
  /** The server certificate then the CA certificate (PEM): the `cert` of `https.createServer`. */
  readonly certChainPem: string;
  /** The server private key (PEM): the `key` of `https.createServer`. */
  readonly keyPem: string;
  /** `sha256:<hex>` of the CA's SubjectPublicKeyInfo DER: what agents pin. */
  readonly caHash: string;
}

export interface EnsurePkiOptions {
  /** The IP addresses and DNS names agents dial, all put in the server certificate's subjectAltName. */
  readonly hosts: readonly string[];
  readonly exec?: Exec;
  /** Decides when the server certificate is near expiry. */
  readonly clock?: Clock;
}

const CA_DAYS = 3650;
const SERVER_DAYS = 730;
const DAY_MS = 86_400_000;
/** A server certificate with less validity left than this is re-issued. */
const RENEW_BEFORE_MS = 30 * DAY_MS;
const DNS_NAME = /^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$/;
const PIN = /^sha256:[0-9a-f]{64}$/;

const NEVER_REPLACED = 'Atoll never replaces the CA, because every agent pins its hash: restore the file from a backup (to start over ' +
  'with a new CA instead, remove ca.key and ca.crt and join every node again with the new hash)';

/**
 * Makes sure `dir` holds a CA and a server certificate for `opts.hosts`, creating what is missing; returns them.
 * Idempotent: an existing CA is always kept; the server certificate is kept when that CA signed it, it matches
 * `server.key`, names every requested host and has more than 30 days left, and is issued again (for exactly
 * `opts.hosts`, with a new key) otherwise.
 * @throws AtollError PKI_FAILED naming the file or openssl step: a host that is neither an IP address nor a DNS
 *   name, a CA file that is unreadable, damaged, alone or not matching its partner, openssl missing or failing.
 */
export async function ensureControllerPki(dir: string, opts: EnsurePkiOptions): Promise<ControllerPki> {
  const hosts = checkHosts(opts.hosts);
  const openssl = opensslRunner(opts.exec ?? defaultExec, dir);
  try {
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    for (const f of readdirSync(dir)) if (f.startsWith(TMP_PREFIX)) rmSync(join(dir, f), { force: true });
  } catch (cause) {
    throw atollError('PKI_FAILED', `cannot prepare the PKI directory ${dir}: ${(cause as Error).message}`, 'check the path and its permissions', cause);
  }
  const files = { caKey: join(dir, 'ca.key'), caCert: join(dir, 'ca.crt'), serverKey: join(dir, 'server.key'), serverCert: join(dir, 'server.crt') };
  const conf = join(dir, `${TMP_PREFIX}openssl-${randomBytes(6).toString('hex')}.cnf`);
  try {
    // The CA.
    let caKeyPem = readIfPresent(files.caKey);
    let caCertPem = readIfPresent(files.caCert);
    if (caKeyPem === undefined) {
      if (caCertPem !== undefined) throw atollError('PKI_FAILED', `${files.caCert} exists but its key ${files.caKey} does not`, NEVER_REPLACED);
      caKeyPem = await openssl(['genpkey', '-algorithm', 'EC', '-pkeyopt', 'ec_paramgen_curve:P-256']);
      writeDurably(files.caKey, caKeyPem, 0o600);
    }
    const caKey = parseKey(caKeyPem, files.caKey);
    if (caCertPem === undefined) {
      writeDurably(conf, opensslConfig(`atoll-ca-${spkiSha256(createPublicKey(caKey)).slice(0, 16)}`, hosts), 0o600);
      caCertPem = await openssl(['req', '-new', '-x509', '-config', conf, '-extensions', 'ca_ext', '-key', files.caKey,
        '-days', String(CA_DAYS), '-sha256', '-set_serial', randomSerial()]);
      writeDurably(files.caCert, caCertPem, 0o644);
    }
    const ca = parseCert(caCertPem, files.caCert);
    if (!ca.checkPrivateKey(caKey)) throw atollError('PKI_FAILED', `${files.caCert} and ${files.caKey} are not a pair`, NEVER_REPLACED);

    // The server certificate.
    const now = (opts.clock ?? Date.now)();
    let keyPem = readIfPresent(files.serverKey);
    let certPem = readIfPresent(files.serverCert);
    if (keyPem === undefined || certPem === undefined || !serverCertSuits(certPem, keyPem, ca, hosts, now)) {
      keyPem = await openssl(['genpkey', '-algorithm', 'EC', '-pkeyopt', 'ec_paramgen_curve:P-256']);
      writeDurably(files.serverKey, keyPem, 0o600);
      writeDurably(conf, opensslConfig('atoll-controller', hosts), 0o600);
      const csr = await openssl(['req', '-new', '-config', conf, '-key', files.serverKey]);
      certPem = await openssl(['x509', '-req', '-CA', files.caCert, '-CAkey', files.caKey, '-days', String(SERVER_DAYS), '-sha256',
        '-set_serial', randomSerial(), '-extfile', conf, '-extensions', 'server_ext'], csr);
      writeDurably(files.serverCert, certPem, 0o644);
    }
    return { caPem: caCertPem, certChainPem: certPem + caCertPem, keyPem, caHash: caHashOf(caCertPem) };
  } finally {
    rmSync(conf, { force: true });
  }
}

/**
 * `sha256:<hex>` of the certificate's SubjectPublicKeyInfo DER: the same value as kubeadm's
 * `--discovery-token-ca-cert-hash`, and what `openssl x509 -pubkey -noout | openssl pkey -pubin -outform der |
 * sha256sum` prints.
 * @throws AtollError PKI_FAILED when `pem` is not a PEM certificate.
 */
export function caHashOf(pem: string): string {
  return `sha256:${spkiSha256(parseCert(pem, 'the CA certificate given').publicKey)}`;
}

/**
 * Fetches the controller's CA from `url` (`https://host:port`), trusting it only if it has the pinned `caHash`:
 * connects without verifying anything, then checks that the presented chain holds a CA certificate with that hash,
 * that this CA signed the server certificate, and that the server certificate names the host of `url`. Returns the
 * CA PEM, to be used as `ca` (with normal verification) from then on. Sends nothing over the connection.
 * @throws AtollError CONTROLLER_UNTRUSTED when the pin is malformed or any check fails (naming the URL, the expected
 *   and the found hashes); CONTROLLER_UNREACHABLE when the URL is not `https://` or the TLS handshake fails or
 *   takes longer than `timeoutMs`.
 */
export async function discoverPinnedCa(url: string, caHash: string, timeoutMs = 10_000): Promise<string> {
  const pin = caHash.toLowerCase();
  if (!PIN.test(pin)) {
    throw atollError('CONTROLLER_UNTRUSTED', `cannot check the controller at ${url}: the CA hash ${JSON.stringify(caHash)} is not sha256:<64 hex digits>`,
      'copy the hash exactly as the controller prints it at start');
  }
  const target = parseHttpsUrl(url);
  const chain = await peerChain(url, target, timeoutMs);
  const [leaf] = chain;
  const ca = chain.find((c) => `sha256:${spkiSha256(c.publicKey)}` === pin);
  const fixPin = `check the hash given to the agent: the controller prints its CA hash (sha256:<hex>) when it starts; if it is ${pin}, ` +
    `something other than the Atoll controller answers at ${url}`;
  if (leaf === undefined || ca === undefined) {
    const cas = chain.slice(1).map((c) => `sha256:${spkiSha256(c.publicKey)} (${oneLine(c.subject)})`);
    const found = leaf === undefined ? 'no certificate'
      : cas.length === 0 ? `no CA certificate that issued its server certificate (${oneLine(leaf.subject)}, issuer ${oneLine(leaf.issuer)})`
      : `CA ${cas.join(' then ')}`;
    throw atollError('CONTROLLER_UNTRUSTED', `the controller at ${url} presented ${found}, not the pinned CA ${pin}`, fixPin);
  }
  if (!leaf.checkIssued(ca) || !leaf.verify(ca.publicKey)) {
    throw atollError('CONTROLLER_UNTRUSTED', `the controller at ${url} presented the pinned CA ${pin}, but its server certificate ` +
      `(${oneLine(leaf.subject)}, issuer ${oneLine(leaf.issuer)}) is not signed by it`, fixPin);
  }
  if ((isIP(target.host) ? leaf.checkIP(target.host) : leaf.checkHost(target.host)) === undefined) {
    throw atollError('CONTROLLER_UNTRUSTED', `the controller at ${url} has a certificate from the pinned CA ${pin} that does not name ` +
      `${target.host} (it names ${leaf.subjectAltName ?? 'nothing'})`, `dial one of the names it lists, or add ${target.host} to the controller's listen hosts and restart it`);
  }
  return ca.toString();
}

/** `sha256:<hex>` of the SubjectPublicKeyInfo DER of a PEM public key, private key or certificate: a tunnel key pin. */
export function spkiPin(pem: string): string {
  return `sha256:${spkiSha256(pem.includes('CERTIFICATE') ? new X509Certificate(pem).publicKey : createPublicKey(pem))}`;
}

/**
 * Issues a self-signed certificate for `keyPem` (Ed25519, P-256 or RSA) with the `openssl` CLI (Node cannot issue
 * certificates). The certificate only carries the key to a peer that pins it (the tunnel): its fields and dates are
 * not checked. Synchronous, unlike the controller's PKI: a node's tunnel credentials are loaded once at start, and
 * tests issue certificates in synchronous set-up.
 * @throws AtollError PKI_FAILED when openssl is missing or refuses the key.
 */
export function selfSignedTunnelCert(keyPem: string, commonName: string): string {
  // The key goes through a private temporary file: openssl cannot read a key from a pipe on stdin.
  const dir = mkdtempSync(join(tmpdir(), 'atoll-tunnel-cert-'));
  let r;
  try {
    const keyFile = join(dir, 'key.pem');
    writeFileSync(keyFile, keyPem, { mode: 0o600 });
    r = spawnSync('openssl', ['req', '-x509', '-new', '-key', keyFile, '-subj', `/CN=${commonName.replace(/[^A-Za-z0-9.-]/g, '-')}`, '-days', '36500'],
      { encoding: 'utf8', timeout: 10_000 });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  if (r.status !== 0 || !r.stdout.includes('BEGIN CERTIFICATE')) {
    throw atollError('PKI_FAILED', `could not issue the tunnel certificate for ${commonName}: ${(r.stderr || String(r.error ?? '')).trim()}`,
      'install openssl and check that the tunnel key file holds a private key');
  }
  return r.stdout;
}

function checkHosts(hosts: readonly string[]): string[] {
  if (hosts.length === 0) {
    throw atollError('PKI_FAILED', 'cannot issue the controller certificate: no host given', 'list the IP addresses and DNS names agents dial');
  }
  for (const h of hosts) {
    if (isIP(h) === 0 ? !DNS_NAME.test(h) : h.includes('%')) {
      throw atollError('PKI_FAILED', `cannot issue the controller certificate for host ${JSON.stringify(h)}: not an IP address or DNS name`,
        'list bare IP addresses and DNS names (no scheme, port, brackets, zone or wildcard)');
    }
  }
  return [...new Set(hosts)];
}

/** One openssl config for both certificates: the request's subject and the extensions of each kind. */
function opensslConfig(commonName: string, hosts: readonly string[]): string {
  const san = hosts.map((h) => (isIP(h) === 0 ? `DNS:${h}` : `IP:${h}`)).join(', ');
  return [
    '[req]', 'prompt = no', 'distinguished_name = dn', '',
    '[dn]', `CN = ${commonName}`, '',
    '[ca_ext]', 'basicConstraints = critical, CA:TRUE, pathlen:0', 'keyUsage = critical, keyCertSign, cRLSign', 'subjectKeyIdentifier = hash', '',
    '[server_ext]', 'basicConstraints = critical, CA:FALSE', 'keyUsage = critical, digitalSignature', 'extendedKeyUsage = serverAuth',
    'subjectKeyIdentifier = hash', 'authorityKeyIdentifier = keyid', `subjectAltName = ${san}`, '',
  ].join('\n');
}

function serverCertSuits(certPem: string, keyPem: string, ca: X509Certificate, hosts: readonly string[], now: number): boolean {
  try {
    const cert = new X509Certificate(certPem);
    return cert.checkIssued(ca) && cert.verify(ca.publicKey) && cert.checkPrivateKey(createPrivateKey(keyPem)) &&
      cert.validToDate.getTime() - now > RENEW_BEFORE_MS &&
      hosts.every((h) => (isIP(h) === 0 ? cert.checkHost(h, { subject: 'never' }) : cert.checkIP(h)) !== undefined);
  } catch {
    return false; // damaged: the server certificate is re-issued, which no agent notices
  }
}

function opensslRunner(exec: Exec, dir: string) {
  return async (args: string[], input?: string): Promise<string> => {
    const what = `openssl ${args[0]} (for the controller PKI in ${dir})`;
    let r: ExecResult;
    try {
      r = await exec('openssl', args, input === undefined ? undefined : { input });
    } catch (cause) {
      throw atollError('PKI_FAILED', `cannot run ${what}: ${(cause as Error).message}`, 'install openssl (Debian: apt-get install openssl) and put it on PATH', cause);
    }
    if (r.code !== 0) {
      throw atollError('PKI_FAILED', `${what} failed with exit code ${r.code}: ${r.stderr.trim()}`, `check that ${dir} is writable and not full`);
    }
    return r.stdout;
  };
}

function readIfPresent(path: string): string | undefined {
  try {
    return readFileSync(path, 'utf8');
  } catch (cause) {
    if ((cause as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw atollError('PKI_FAILED', `cannot read ${path}: ${(cause as Error).message}`, 'check that the controller can read its PKI directory', cause);
  }
}

function writeDurably(path: string, content: string, mode: number): void {
  try {
    writeFileDurably(path, content, { mode });
  } catch (cause) {
    throw atollError('PKI_FAILED', `cannot write ${path}: ${(cause as Error).message}`, 'check that the PKI directory is writable and the disk not full', cause);
  }
}

function parseKey(pem: string, path: string): KeyObject {
  try {
    return createPrivateKey(pem);
  } catch (cause) {
    throw atollError('PKI_FAILED', `${path} is not a PEM private key: ${(cause as Error).message}`, NEVER_REPLACED, cause);
  }
}

function parseCert(pem: string, where: string): X509Certificate {
  try {
    return new X509Certificate(pem);
  } catch (cause) {
    throw atollError('PKI_FAILED', `${where} is not a PEM certificate: ${(cause as Error).message}`, NEVER_REPLACED, cause);
  }
}

/** A distinguished name as X509Certificate prints it (one attribute a line), on one line. */
function oneLine(name: string): string {
  return name.replaceAll('\n', ', ');
}

function spkiSha256(key: KeyObject): string {
  return createHash('sha256').update(key.export({ type: 'spki', format: 'der' })).digest('hex');
}

/** A random positive 127-bit serial, as RFC 5280 asks serials to be unique per CA. */
function randomSerial(): string {
  const b = randomBytes(16);
  b[0] = (b[0] as number) & 0x7f;
  return `0x${b.toString('hex')}`;
}

function parseHttpsUrl(url: string): { host: string; port: number } {
  let u: URL | undefined;
  try {
    u = new URL(url);
  } catch {
    u = undefined;
  }
  if (u?.protocol !== 'https:') {
    throw atollError('CONTROLLER_UNREACHABLE', `the controller URL ${JSON.stringify(url)} is not https://host:port`, 'give the controller address as https://host:port');
  }
  return { host: u.hostname.replace(/^\[(.*)\]$/, '$1'), port: Number(u.port || 443) };
}

/** The certificates the server presents, leaf first, unverified. */
function peerChain(url: string, target: { host: string; port: number }, timeoutMs: number): Promise<X509Certificate[]> {
  return new Promise((resolve, reject) => {
    const socket = connect({ host: target.host, port: target.port, rejectUnauthorized: false });
    const fail = (why: string, cause?: unknown) => {
      clearTimeout(timer);
      socket.destroy();
      reject(atollError('CONTROLLER_UNREACHABLE', `cannot reach the controller at ${url}: ${why}`,
        'check the URL, that the controller runs, and that firewalls let this node reach its port', cause));
    };
    const timer = setTimeout(() => fail(`no TLS handshake within ${timeoutMs} ms`), timeoutMs);
    socket.once('error', (err) => fail(err.message, err));
    socket.once('secureConnect', () => {
      clearTimeout(timer);
      const chain: X509Certificate[] = [];
      const seen = new Set<string>();
      for (let c = socket.getPeerCertificate(true); c?.raw !== undefined && !seen.has(c.fingerprint256); c = c.issuerCertificate) {
        seen.add(c.fingerprint256);
        chain.push(new X509Certificate(c.raw));
      }
      socket.destroy();
      resolve(chain);
    });
  });
}
