/**
 * A node's tunnel credentials: its key pair and the self-signed certificate that carries the public key to peers,
 * kept in its data directory. Peers trust the key by its pin (src/adapters/pki.ts `spkiPin`, published as the
 * node's `tunnelKey`), never by the certificate's fields.
 */
import { createPrivateKey, generateKeyPairSync } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { atollError } from '../../core/errors.ts';
import { writeFileDurably } from '../durable-file.ts';
import { selfSignedTunnelCert, spkiPin } from '../pki.ts';

/** A node's tunnel credentials: its private key and the self-signed certificate of its public key (both PEM). */
export interface TunnelCredentials {
  readonly keyPem: string;
  readonly certPem: string;
}

/**
 * The node's tunnel credentials kept in `dir` (`tunnel.key`, PKCS#8 Ed25519, mode 0600; `tunnel.crt`, self-signed):
 * loaded when present, created once otherwise. The pin peers check ({@link spkiPin}) stays the same across restarts.
 * A certificate missing beside an existing key is re-issued for that key (the pin does not change).
 * @throws AtollError PKI_FAILED when the key file is not a private key or the certificate cannot be issued.
 */
export function loadOrCreateTunnelCredentials(dir: string, commonName: string): TunnelCredentials {
  const keyPath = join(dir, 'tunnel.key');
  const certPath = join(dir, 'tunnel.crt');
  let keyPem: string;
  if (existsSync(keyPath)) {
    keyPem = readFileSync(keyPath, 'utf8');
  } else {
    keyPem = generateKeyPairSync('ed25519').privateKey.export({ type: 'pkcs8', format: 'pem' }) as string;
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    writeFileDurably(keyPath, keyPem, { mode: 0o600 });
  }
  try {
    createPrivateKey(keyPem);
  } catch (cause) {
    throw atollError('PKI_FAILED', `the tunnel key ${keyPath} is not a PEM private key`, 'delete it (peers learn the new key from the controller)', cause);
  }
  let certPem = existsSync(certPath) ? readFileSync(certPath, 'utf8') : '';
  if (!certPem || spkiPin(certPem) !== spkiPin(keyPem)) {
    certPem = selfSignedTunnelCert(keyPem, commonName);
    writeFileDurably(certPath, certPem, { mode: 0o644 });
  }
  return { keyPem, certPem };
}
