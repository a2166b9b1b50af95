/**
 * The controller PKI with the real openssl, and pinned CA discovery against real TLS servers on loopback.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { createHash, createPrivateKey, X509Certificate } from 'node:crypto';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, unlinkSync, writeFileSync } from 'node:fs';
import { createServer as createHttpsServer, get, type Server } from 'node:https';
import { createServer as createTcpServer, type AddressInfo, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { AtollError } from '../../src/core/errors.ts';
import { caHashOf, discoverPinnedCa, ensureControllerPki, type ControllerPki } from '../../src/adapters/pki.ts';

const opensslSkip = spawnSync('openssl', ['version']).status === 0 ? false : 'needs the openssl CLI on PATH';
const HOSTS = ['127.0.0.1', 'localhost'];
const DAY_MS = 86_400_000;

const certs = (chainPem: string) => chainPem.split(/(?<=-----END CERTIFICATE-----\n)/).filter((p) => p.trim() !== '').map((p) => new X509Certificate(p));
const leafOf = (pki: ControllerPki) => certs(pki.certChainPem)[0] as X509Certificate;

async function serve(cert: string, key: string): Promise<{ server: Server; url: string }> {
  const server = createHttpsServer({ cert, key }, (_req, res) => res.end('hello'));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { server, url: `https://127.0.0.1:${(server.address() as AddressInfo).port}` };
}

function fetchText(url: string, ca?: string): Promise<string> {
  return new Promise((resolve, reject) => {
    get(url, { agent: false, ...(ca === undefined ? {} : { ca }) }, (res) => {
      let body = '';
      res.on('data', (d: Buffer) => (body += d.toString()));
      res.on('end', () => resolve(body));
    }).on('error', reject);
  });
}

function isError(code: string, ...patterns: RegExp[]) {
  return (err: unknown) => {
    assert.ok(err instanceof AtollError, String(err));
    assert.equal(err.code, code, err.message);
    for (const p of patterns) assert.match(`${err.message}\nfix: ${err.fix ?? ''}`, p);
    return true;
  };
}

describe('controller PKI', { skip: opensslSkip }, () => {
  let tmp: string;
  const dirs: Record<string, string> = {};
  const servers: Server[] = [];
  let pki: ControllerPki;
  let url: string;

  before(async () => {
    tmp = mkdtempSync(join(tmpdir(), 'atoll-pki-'));
    for (const name of ['main', 'rogue', 'forged', 'narrow', 'heal', 'grow']) dirs[name] = join(tmp, name);
    pki = await ensureControllerPki(dirs.main as string, { hosts: HOSTS });
    const s = await serve(pki.certChainPem, pki.keyPem);
    servers.push(s.server);
    url = s.url;
  });

  after(async () => {
    for (const s of servers) {
      s.closeAllConnections();
      await new Promise((resolve) => s.close(resolve));
    }
    rmSync(tmp, { recursive: true, force: true });
  });

  test('issues an EC P-256 CA for 10 years and a server certificate for ~2 years naming the hosts', () => {
    const dir = dirs.main as string;
    assert.deepEqual(readdirSync(dir).sort(), ['ca.crt', 'ca.key', 'server.crt', 'server.key'], 'no temporary file is left');
    for (const key of ['ca.key', 'server.key']) assert.equal(statSync(join(dir, key)).mode & 0o777, 0o600, key);
    assert.equal(statSync(dir).mode & 0o777, 0o700);
    const ca = new X509Certificate(pki.caPem);
    const [leaf, chainCa, ...rest] = certs(pki.certChainPem);
    assert.ok(leaf && chainCa && rest.length === 0);
    assert.equal(chainCa.fingerprint256, ca.fingerprint256, 'the chain is the leaf then the CA');
    assert.equal(ca.ca, true);
    assert.equal(leaf.ca, false);
    assert.ok(leaf.verify(ca.publicKey) && leaf.checkIssued(ca));
    assert.ok(leaf.checkIP('127.0.0.1') && leaf.checkHost('localhost', { subject: 'never' }));
    const years = (c: X509Certificate) => (c.validToDate.getTime() - c.validFromDate.getTime()) / (365 * DAY_MS);
    assert.ok(Math.abs(years(ca) - 10) < 0.02, `CA valid ${years(ca)} years`);
    assert.ok(Math.abs(years(leaf) - 2) < 0.02, `server certificate valid ${years(leaf)} years`);
    assert.ok(leaf.checkPrivateKey(createPrivateKey(pki.keyPem)));
    for (const k of [pki.keyPem, readFileSync(join(dir, 'ca.key'), 'utf8')]) assert.equal(createPrivateKey(k).asymmetricKeyDetails?.namedCurve, 'prime256v1');
  });

  test('the CA hash is sha256 over the SubjectPublicKeyInfo DER, as openssl computes it', () => {
    const pubPem = execFileSync('openssl', ['x509', '-pubkey', '-noout'], { input: pki.caPem });
    const der = execFileSync('openssl', ['pkey', '-pubin', '-outform', 'der'], { input: pubPem });
    assert.equal(pki.caHash, `sha256:${createHash('sha256').update(der).digest('hex')}`);
    assert.equal(caHashOf(pki.caPem), pki.caHash);
    assert.throws(() => caHashOf('not a certificate'), isError('PKI_FAILED', /not a PEM certificate/));
  });

  test('discovery with the right pin returns the CA, and normal verification with it then succeeds', async () => {
    await assert.rejects(fetchText(url), /self-signed|unable to verify/, 'the CA is not trusted by default');
    const ca = await discoverPinnedCa(url, pki.caHash);
    assert.equal(new X509Certificate(ca).fingerprint256, new X509Certificate(pki.caPem).fingerprint256);
    assert.equal(await discoverPinnedCa(url, pki.caHash.toUpperCase().replace('SHA256', 'sha256')), ca, 'hex case does not matter');
    assert.equal(await fetchText(url, ca), 'hello');
  });

  test('discovery with a wrong pin fails naming the URL, both hashes and the fix', async () => {
    const wrong = `sha256:${'ab'.repeat(32)}`;
    await assert.rejects(discoverPinnedCa(url, wrong), isError('CONTROLLER_UNTRUSTED', new RegExp(url), new RegExp(wrong),
      new RegExp(pki.caHash), /prints its CA hash/));
    await assert.rejects(discoverPinnedCa(url, 'sha256:1234'), isError('CONTROLLER_UNTRUSTED', /not sha256:<64 hex digits>/));
  });

  test('a server presenting the pinned CA beside a certificate another CA signed is refused', async () => {
    const rogue = await ensureControllerPki(dirs.rogue as string, { hosts: HOSTS });
    assert.notEqual(rogue.caHash, pki.caHash);
    const s = await serve(leafOf(rogue).toString() + pki.caPem, rogue.keyPem);
    servers.push(s.server);
    await assert.rejects(discoverPinnedCa(s.url, pki.caHash), isError('CONTROLLER_UNTRUSTED', /no CA certificate that issued its server certificate .*not the pinned CA/, new RegExp(s.url)));
  });

  test('a forged certificate naming the pinned CA as its issuer, key identifier included, is refused', async () => {
    // A rogue CA with the pinned CA's subject and subject key identifier: TLS stacks link the forged leaf to the
    // pinned CA by name and key identifier, and only the signature check tells them apart.
    const dir = dirs.forged as string;
    mkdirSync(dir, { mode: 0o700 });
    const pinned = new X509Certificate(pki.caPem);
    const skid = /Subject Key Identifier:\s*\n\s*([0-9A-F:]+)/.exec(execFileSync('openssl', ['x509', '-noout', '-ext', 'subjectKeyIdentifier'], { input: pki.caPem, encoding: 'utf8' }))?.[1];
    assert.ok(skid);
    writeFileSync(join(dir, 'ca.key'), execFileSync('openssl', ['genpkey', '-algorithm', 'EC', '-pkeyopt', 'ec_paramgen_curve:P-256']), { mode: 0o600 });
    writeFileSync(join(dir, 'forge.cnf'), ['[req]', 'prompt = no', 'distinguished_name = dn', '[dn]', pinned.subject, '[ext]',
      'basicConstraints = critical, CA:TRUE', 'keyUsage = critical, keyCertSign', `subjectKeyIdentifier = ${skid}`, ''].join('\n'));
    writeFileSync(join(dir, 'ca.crt'), execFileSync('openssl', ['req', '-new', '-x509', '-config', join(dir, 'forge.cnf'), '-extensions', 'ext',
      '-key', join(dir, 'ca.key'), '-days', '30']));
    const forged = await ensureControllerPki(dir, { hosts: HOSTS });
    const leaf = leafOf(forged);
    assert.equal(leaf.issuer, pinned.subject);
    assert.ok(leaf.checkIssued(pinned), 'the forged leaf names the pinned CA as its issuer');
    const s = await serve(leaf.toString() + pki.caPem, forged.keyPem);
    servers.push(s.server);
    await assert.rejects(discoverPinnedCa(s.url, pki.caHash), isError('CONTROLLER_UNTRUSTED', /presented the pinned CA .* is not signed by it/, new RegExp(s.url)));
  });

  test('a certificate from the pinned CA that does not name the host dialled is refused', async () => {
    const narrow = await ensureControllerPki(dirs.narrow as string, { hosts: ['10.9.9.9', 'controller.example'] });
    const s = await serve(narrow.certChainPem, narrow.keyPem);
    servers.push(s.server);
    await assert.rejects(discoverPinnedCa(s.url, narrow.caHash), isError('CONTROLLER_UNTRUSTED', /does not name 127\.0\.0\.1/, /10\.9\.9\.9/));
  });

  test('an unreachable or silent controller, or a non-https URL, is CONTROLLER_UNREACHABLE', async () => {
    const accepted: Socket[] = [];
    const silent = createTcpServer((socket) => accepted.push(socket));
    await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve));
    const port = (silent.address() as AddressInfo).port;
    try {
      await assert.rejects(discoverPinnedCa(`https://127.0.0.1:${port}`, pki.caHash, 200), isError('CONTROLLER_UNREACHABLE', /no TLS handshake within 200 ms/));
    } finally {
      for (const socket of accepted) socket.destroy();
      await new Promise((resolve) => silent.close(resolve));
    }
    await assert.rejects(discoverPinnedCa(`https://127.0.0.1:${port}`, pki.caHash), isError('CONTROLLER_UNREACHABLE', /ECONNREFUSED/, /firewalls/));
    await assert.rejects(discoverPinnedCa('http://127.0.0.1:1', pki.caHash), isError('CONTROLLER_UNREACHABLE', /not https/));
  });

  test('ensuring again keeps everything; a new host re-issues only the server certificate', async () => {
    const dir = dirs.grow as string;
    const first = await ensureControllerPki(dir, { hosts: HOSTS });
    assert.deepEqual(await ensureControllerPki(dir, { hosts: HOSTS }), first);
    assert.deepEqual(await ensureControllerPki(dir, { hosts: ['localhost'] }), first, 'a subset of the hosts is already covered');
    const grown = await ensureControllerPki(dir, { hosts: [...HOSTS, '10.1.2.3', '::1'] });
    assert.equal(grown.caPem, first.caPem);
    assert.equal(grown.caHash, first.caHash);
    assert.notEqual(grown.certChainPem, first.certChainPem);
    assert.notEqual(grown.keyPem, first.keyPem);
    assert.ok(leafOf(grown).checkIP('10.1.2.3') && leafOf(grown).checkIP('::1') && leafOf(grown).checkIP('127.0.0.1'));
    assert.deepEqual(await ensureControllerPki(dir, { hosts: [...HOSTS, '10.1.2.3', '::1'] }), grown);
    for (const key of ['ca.key', 'server.key']) assert.equal(statSync(join(dir, key)).mode & 0o777, 0o600, key);
  });

  test('a server certificate within 30 days of expiry is re-issued under the same CA', async () => {
    const dir = dirs.grow as string;
    const before = await ensureControllerPki(dir, { hosts: HOSTS });
    const later = await ensureControllerPki(dir, { hosts: HOSTS, clock: () => Date.now() + 710 * DAY_MS });
    assert.equal(later.caPem, before.caPem);
    assert.notEqual(later.certChainPem, before.certChainPem);
  });

  test('a CA certificate lost beside its key is issued again from it, keeping the pin and the agents working', async () => {
    const dir = dirs.heal as string;
    const first = await ensureControllerPki(dir, { hosts: HOSTS });
    unlinkSync(join(dir, 'ca.crt'));
    const healed = await ensureControllerPki(dir, { hosts: HOSTS });
    assert.equal(healed.caHash, first.caHash);
    assert.notEqual(healed.caPem, first.caPem);
    assert.equal(healed.certChainPem.split('-----END CERTIFICATE-----')[0], first.certChainPem.split('-----END CERTIFICATE-----')[0], 'the server certificate is kept');
    const s = await serve(healed.certChainPem, healed.keyPem);
    servers.push(s.server);
    assert.equal(await fetchText(s.url, first.caPem), 'hello', 'an agent holding the old CA certificate still connects');
  });

  test('a CA key that is missing or damaged is an error, and nothing is replaced', async () => {
    const dir = dirs.heal as string;
    const caCert = readFileSync(join(dir, 'ca.crt'), 'utf8');
    const caKey = readFileSync(join(dir, 'ca.key'), 'utf8');
    unlinkSync(join(dir, 'ca.key'));
    await assert.rejects(ensureControllerPki(dir, { hosts: HOSTS }), isError('PKI_FAILED', /ca\.crt exists but its key .*ca\.key does not/, /never replaces the CA/));
    assert.equal(readFileSync(join(dir, 'ca.crt'), 'utf8'), caCert);
    const rogueKey = readFileSync(join(dirs.rogue as string, 'ca.key'), 'utf8');
    for (const [content, message] of [['garbage', /not a PEM private key/], [rogueKey, /are not a pair/]] as const) {
      writeFileSync(join(dir, 'ca.key'), content);
      await assert.rejects(ensureControllerPki(dir, { hosts: HOSTS }), isError('PKI_FAILED', message, /restore the file from a backup/));
      assert.equal(readFileSync(join(dir, 'ca.crt'), 'utf8'), caCert);
    }
    writeFileSync(join(dir, 'ca.key'), caKey);
  });

  test('bad hosts and a missing openssl are PKI_FAILED saying what to do', async () => {
    const dir = join(tmp, 'never');
    for (const hosts of [[], ['https://controller'], ['10.0.0.1:6443'], ['*.example.com'], ['fe80::1%eth0']]) {
      await assert.rejects(ensureControllerPki(dir, { hosts }), isError('PKI_FAILED', /host|no host/, /list/), JSON.stringify(hosts));
    }
    const noOpenssl = async () => {
      throw Object.assign(new Error('spawn openssl ENOENT'), { code: 'ENOENT' });
    };
    await assert.rejects(ensureControllerPki(dir, { hosts: HOSTS, exec: noOpenssl }), isError('PKI_FAILED', /cannot run openssl genpkey/, /install openssl/));
    assert.deepEqual(readdirSync(dir), [], 'nothing half-made is left');
  });
});
