/**
 * `atoll kubernetes secret`: prints the atoll-bootstrap Secret an install on Kubernetes needs (deploy/atoll.yaml
 * reads every secret from it): fresh random tokens (bootstrap, admin, relay), a new controller CA and its pin, and
 * the relay's tunnel key and its pin. Pipe it to `kubectl apply -f -`; nothing is written to disk, nothing is
 * committed. Run it once per cluster: agents pin the CA and the relay key it made.
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ensureControllerPki, spkiPin } from '../adapters/pki.ts';
import { loadOrCreateTunnelCredentials } from '../adapters/tunnel/tunnel-credentials.ts';
import { parseCommand, subcommand } from './usage.ts';

const USAGE = `usage: atoll kubernetes secret [--namespace NAME]

Prints the atoll-bootstrap Secret (tokens, the controller CA, the relay key and their pins) as JSON, for
  atoll kubernetes secret | kubectl apply -f -
before applying deploy/atoll.yaml or the Helm chart (namespace default atoll-system).
`;

export async function runKubernetes(argv: string[]): Promise<number> {
  const [, rest] = subcommand(argv, 'atoll kubernetes', ['secret'], USAGE);
  const { values } = parseCommand(rest, { command: 'atoll kubernetes secret', usage: USAGE, options: { namespace: { type: 'string', default: 'atoll-system' } } });
  const dir = mkdtempSync(join(tmpdir(), 'atoll-bootstrap-'));
  try {
    // the CA only matters here; each controller replica issues its own server certificate from it at start
    const pki = await ensureControllerPki(join(dir, 'pki'), { hosts: ['atoll-controller'] });
    const relay = loadOrCreateTunnelCredentials(join(dir, 'relay'), 'atoll-relay');
    const token = () => randomBytes(24).toString('base64url');
    const secret = {
      apiVersion: 'v1', kind: 'Secret', type: 'Opaque',
      metadata: { name: 'atoll-bootstrap', namespace: values.namespace, labels: { 'app.kubernetes.io/name': 'atoll', 'app.kubernetes.io/part-of': 'atoll' } },
      stringData: {
        'bootstrap-token': token(), 'admin-token': token(), 'relay-token': token(),
        'ca.crt': pki.caPem, 'ca.key': readFileSync(join(dir, 'pki', 'ca.key'), 'utf8'), 'ca-cert-hash': pki.caHash,
        'relay-tunnel.key': relay.keyPem, 'relay-tunnel.crt': relay.certPem, 'relay-pin': spkiPin(relay.certPem),
      },
    };
    process.stdout.write(`${JSON.stringify(secret, null, 2)}\n`);
    return 0;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
