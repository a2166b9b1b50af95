/**
 * What the datagram path (src/adapters/tunnel/datagram-path.ts) holds of one peer: its keys and address here, its times
 * in the core's terms (src/core/tunnel/datagram-peer.ts). The path keeps the table of them; the stream key exchange
 * (datagram-keys.ts), the hellos (datagram-hello-exchange.ts), the kept region (datagram-kept-peers.ts), receiving
 * and sending work on its entries.
 */
import type { PeerTimes } from '../../core/tunnel/datagram-peer.ts';
import { ipv4Number, type SealKey } from './datagram-native.ts';
import type { Ephemeral } from './datagram-hello.ts';

export interface SendKey {
  readonly id: number;
  /** The key and its counter (native: src/adapters/tunnel/datagram-native.ts). */
  readonly key: SealKey;
  readonly createdAt: number;
}

/** A peer's address, with the numbers the native side and the receive ring use. */
export interface Endpoint {
  readonly host: string;
  readonly port: number;
  /** IPv4, host order. */
  readonly addr: number;
  /** addr * 65536 + port, as {@link UdpBatchSocket.sourceKey}. */
  readonly key: number;
}

/** A peer: its keys and address here, its times in the core's terms (src/core/tunnel/datagram-peer.ts). */
export interface PeerState extends PeerTimes {
  readonly id: string;
  /** Its tag in the native key table. */
  readonly tag: number;
  endpoint: Endpoint | undefined;
  /** The address its last `udp-key` announced. */
  announced: { host: string; port: number } | undefined;
  send: SendKey | undefined;
  pending: { readonly id: number; readonly key: SealKey; readonly at: number } | undefined;
  /** Its receiving keys' ids, oldest first. */
  readonly recvIds: number[];
  readonly pin: string;
  /** The hello handshake (src/core/tunnel/hello.ts): what we remember of the peer's and our ephemeral keys. */
  seenGeneration: number;
  theirEph: Uint8Array | undefined;
  myEph: (Ephemeral & { generation: number }) | undefined;
  myEphUsedWith: Uint8Array | undefined;
}

export function parseEndpoint(text: string | undefined): Endpoint | undefined {
  const m = text === undefined ? null : /^(\d{1,3}(?:\.\d{1,3}){3}):(\d{1,5})$/.exec(text);
  return m ? endpointOf(m[1] as string, Number(m[2])) : undefined;
}

export function endpointOf(host: string, port: number): Endpoint {
  const addr = ipv4Number(host) ?? 0;
  return { host, port, addr, key: addr * 65_536 + port };
}
