/**
 * A tunnel node for root tests, run inside a node namespace with `ip netns exec`: opens the TUN device, listens or
 * dials one peer over a pinned TLS stream (or neither: a node that must find its peer without one), with `udp` also the datagram path (wired as src/agent/tunnel.ts does), and
 * writes its counters as JSON to a file every 200 ms.
 * Argument: one JSON object (see {@link TunnelNodeSpec}).
 */
import { readFileSync, renameSync, writeFileSync } from 'node:fs';
import { parseCidr } from '../../src/core/net/ipv4.ts';
import { openTun } from '../../src/adapters/tunnel/tun.ts';
import { dialTunnel, listenTunnel } from '../../src/adapters/tunnel/tunnel-dial.ts';
import type { TunnelStream } from '../../src/adapters/tunnel/tunnel-stream.ts';
import { TunnelEndpoint } from '../../src/adapters/tunnel/tunnel-endpoint.ts';
import { DatagramPath } from '../../src/adapters/tunnel/datagram-path.ts';
import { type DatagramLocalState, DatagramStateFile } from '../../src/adapters/tunnel/datagram-state-file.ts';
import { innerMtu } from '../../src/core/tunnel/datagram.ts';
import type { ControlMessage } from '../../src/core/tunnel/messages.ts';

export interface TunnelNodeSpec {
  readonly tun: string;
  readonly keyFile: string;
  readonly certFile: string;
  readonly peer: { readonly id: string; readonly pin: string; readonly blocks: readonly string[] };
  readonly listen?: { readonly host: string; readonly port: number };
  readonly dial?: { readonly host: string; readonly port: number };
  readonly statsFile: string;
  /** The datagram path: bind this address and port; the TUN device's MTU becomes innerMtu(underlayMtu). */
  readonly udp?: { readonly host: string; readonly port: number; readonly underlayMtu: number };
  /** With udp: the datagram path's local state file, which turns its hellos on (paths rebuilt without a stream). */
  readonly udpStatePath?: string;
}

const spec = JSON.parse(process.argv[2] ?? '{}') as TunnelNodeSpec;
const credentials = { keyPem: readFileSync(spec.keyFile, 'utf8'), certPem: readFileSync(spec.certFile, 'utf8') };
const tun = openTun({ name: spec.tun, ...(spec.udp ? { mtu: innerMtu(spec.udp.underlayMtu) } : {}) });
const endpoint = new TunnelEndpoint(tun, [{ id: spec.peer.id, blocks: spec.peer.blocks.map((b) => {
  const c = parseCidr(b);
  if (!c) throw new Error(`peer block ${b} is not a prefix`);
  return c;
}) }]);
let datagrams: DatagramPath | undefined;
if (spec.udp) {
  const stateFile = spec.udpStatePath ? new DatagramStateFile(spec.udpStatePath) : undefined;
  datagrams = new DatagramPath({
    streamOf: (id) => endpoint.streamOf(id), publicHost: () => '', onPacket: (id, pkt, datagrams, bytes) => endpoint.fromDatagram(id, pkt, datagrams, bytes),
    ...(stateFile ? { state: { load: () => stateFile.load(), save: (s: DatagramLocalState) => stateFile.save(s) } } : {}),
  }, { ...spec.udp, ...(stateFile ? { identityKeyPem: credentials.keyPem } : {}) });
  await datagrams.start();
  datagrams.setPeers([{ id: spec.peer.id, pin: spec.peer.pin }]);
  endpoint.useDatagrams(datagrams);
}
endpoint.start();
let refused = 0;
let stream: TunnelStream | undefined;
const use = (s: TunnelStream) => {
  stream = s;
  endpoint.attach(spec.peer.id, s);
  const d = datagrams;
  if (d) {
    s.on('control', (msg: ControlMessage) => {
      if (msg.t === 'udp-key' || msg.t === 'udp-key-ack') d.onControl(spec.peer.id, s, msg);
    });
    d.offerKey(spec.peer.id, s);
  }
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
  writeFileSync(tmp, JSON.stringify({ endpoint: endpoint.stats, tun: tun.stats, tunPacketsOut: tun.packetsOut, stream: stream?.stats, connected: stream?.alive ?? false, refused,
    path: endpoint.pathOf(spec.peer.id), udp: datagrams?.stats }));
  renameSync(tmp, spec.statsFile);
};
setInterval(report, 200);
report();
process.on('SIGTERM', () => {
  report();
  datagrams?.close();
  endpoint.close();
  process.exit(0);
});
