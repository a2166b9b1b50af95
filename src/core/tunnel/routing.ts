/**
 * Which peer a tunnel packet goes to, and whether a peer may send a packet: longest-prefix match over the peers'
 * pod blocks, and the source check that keeps a peer from speaking for addresses it does not own. Pure: no I/O, no
 * `node:` imports.
 *
 * Packets here are as the TUN device gives them with IFF_VNET_HDR: a 10-byte virtio-net header, then the IP packet.
 */
import { atollError } from '../errors.ts';
import { type Cidr, cidrContains, formatCidr } from '../net/ipv4.ts';

/** Bytes of the virtio-net header in front of every packet (TUNSETVNETHDRSZ). */
export const VNET_HDR_LEN = 10;
const IPV4_MIN_HEADER = 20;

/** One remote node the tunnel carries packets to: a stable id and the pod blocks it owns. */
export interface TunnelPeer {
  readonly id: string;
  readonly blocks: readonly Cidr[];
}

/** The IPv4 destination of a packet (virtio header first), or undefined when it is not an IPv4 packet. */
export function packetDestination(pkt: Uint8Array): number | undefined {
  if (pkt.length < VNET_HDR_LEN + IPV4_MIN_HEADER || pkt[VNET_HDR_LEN]! >> 4 !== 4) return undefined;
  const o = VNET_HDR_LEN + 16;
  return ((pkt[o]! << 24) >>> 0) + (pkt[o + 1]! << 16) + (pkt[o + 2]! << 8) + pkt[o + 3]!;
}

/** The IPv4 source of a packet (virtio header first), or undefined when it is not an IPv4 packet. */
export function packetSource(pkt: Uint8Array): number | undefined {
  if (pkt.length < VNET_HDR_LEN + IPV4_MIN_HEADER || pkt[VNET_HDR_LEN]! >> 4 !== 4) return undefined;
  const o = VNET_HDR_LEN + 12;
  return ((pkt[o]! << 24) >>> 0) + (pkt[o + 1]! << 16) + (pkt[o + 2]! << 8) + pkt[o + 3]!;
}

/**
 * The peers' blocks as a lookup table. Immutable: build a new one when peers or blocks change.
 * @throws AtollError ROUTE_BLOCK_CONFLICT when two peers claim the same block (the same prefix twice): the peers come
 *   from the cluster's node records, which should never hold that.
 */
export class PeerRoutes {
  /** Longest prefix first, so the first match wins. */
  private readonly entries: readonly { readonly block: Cidr; readonly peer: string }[];
  private readonly byPeer: ReadonlyMap<string, readonly Cidr[]>;

  constructor(peers: readonly TunnelPeer[]) {
    const entries: { block: Cidr; peer: string }[] = [];
    const seen = new Map<string, string>();
    for (const p of peers) {
      for (const b of p.blocks) {
        const key = formatCidr(b);
        const other = seen.get(key);
        if (other !== undefined && other !== p.id) {
          throw atollError('ROUTE_BLOCK_CONFLICT', `block ${key} is claimed by both ${other} and ${p.id}`,
            `the controller leases a block to one node only: run atoll ipam check on the controller host, and release ${key} from the node that should not hold it (atoll node deregister)`);
        }
        seen.set(key, p.id);
        entries.push({ block: b, peer: p.id });
      }
    }
    entries.sort((a, b) => b.block.bits - a.block.bits);
    this.entries = entries;
    this.byPeer = new Map(peers.map((p) => [p.id, p.blocks]));
  }

  /** The peer owning `ip` by longest prefix, or undefined when no peer does. */
  lookup(ip: number): string | undefined {
    for (const e of this.entries) if (cidrContains(e.block, ip)) return e.peer;
    return undefined;
  }

  /**
   * Whether `ip` belongs to `peer`: the longest prefix holding it is one of that peer's blocks. So a peer owning a
   * wide block cannot speak for a narrower block inside it that another peer owns.
   */
  sourceAllowed(peer: string, ip: number): boolean {
    return this.lookup(ip) === peer;
  }

  /** The ids of the peers in the table. */
  peers(): string[] {
    return [...this.byPeer.keys()];
  }

  /** Whether a packet from `peer` may enter this node: IPv4 with a source inside the peer's blocks. */
  acceptFrom(peer: string, pkt: Uint8Array): boolean {
    const src = packetSource(pkt);
    return src !== undefined && this.sourceAllowed(peer, src);
  }
}
