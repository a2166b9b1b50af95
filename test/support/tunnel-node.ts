/**
 * A tunnel node for root tests, run inside a node namespace with `ip netns exec`: opens the TUN device, listens or
 * dials one peer over a pinned TLS stream, and writes its counters as JSON to a file every 200 ms.
 * Argument: one JSON object (see {@link TunnelNodeSpec}).
 */
import { readFileSync, renameSync, writeFileSync } from 'node:fs';
import { parseCidr } from '../../src/core/net/ipv4.ts';
import { openTun } from '../../src/adapters/tun.ts';
import { dialTunnel, listenTunnel } from '../../src/adapters/tunnel-dial.ts';
import type { TunnelStream } from '../../src/adapters/tunnel-stream.ts';
import { TunnelEndpoint } from '../../src/adapters/tunnel-endpoint.ts';

export interface TunnelNodeSpec {
  readonly tun: string;
  readonly keyFile: string;
  readonly certFile: string;
  readonly peer: { readonly id: string; readonly pin: string; readonly blocks: readonly string[] };
  readonly listen?: { readonly host: string; readonly port: number };
  readonly dial?: { readonly host: string; readonly port: number };
  readonly statsFile: string;
}

const spec = JSON.parse(process.argv[2] ?? '{}') as TunnelNodeSpec;
const credentials = { keyPem: readFileSync(spec.keyFile, 'utf8'), certPem: readFileSync(spec.certFile, 'utf8') };
const tun = openTun({ name: spec.tun });
const endpoint = new TunnelEndpoint(tun, [{ id: spec.peer.id, blocks: spec.peer.blocks.map((b) => {
  const c = parseCidr(b);
  if (!c) throw new Error(`peer block ${b} is not a prefix`);
  return c;
}) }]);
endpoint.start();
let refused = 0;
let stream: TunnelStream | undefined;
const use = (s: TunnelStream) => {
  stream = s;
  endpoint.attach(spec.peer.id, s);
};
if (spec.listen) {
  await listenTunnel({
    ...spec.listen, credentials, acceptPin: (pin) => pin === spec.peer.pin, onStream: use,
    onRefused: (reason) => {
      refused++;
      process.stderr.write(`refused: ${reason}\n`);
    },
  });
}
if (spec.dial) {
  for (let i = 0; ; i++) {
    try {
      use(await dialTunnel({ ...spec.dial, credentials, peerPin: spec.peer.pin, timeoutMs: 3000 }));
      break;
    } catch (err) {
      if (i >= 50) throw err;
      await new Promise((r) => setTimeout(r, 100));
    }
  }
}
const report = () => {
  const tmp = `${spec.statsFile}.tmp`;
  writeFileSync(tmp, JSON.stringify({ endpoint: endpoint.stats, tun: tun.stats, tunPacketsOut: tun.packetsOut, stream: stream?.stats, connected: stream?.alive ?? false, refused }));
  renameSync(tmp, spec.statsFile);
};
setInterval(report, 200);
report();
process.on('SIGTERM', () => {
  report();
  endpoint.close();
  process.exit(0);
});
