/**
 * What the controller keeps about the cluster, and where in the store it keeps it. Pure.
 */
import { type Cidr, formatCidr, parseCidr } from '../net/ipv4.ts';

/** A registered node, as agents and the controller see it. */
export interface NodeRecord {
  readonly name: string;
  /** The node's identity: base64 SPKI DER of the ed25519 public key it joined with. */
  readonly identity: string;
  /** Site label ('' when unset): nodes of one site reach each other's underlay directly. */
  readonly site: string;
  /** Community label ('' when unset): edge nodes tunnel directly only within one community. */
  readonly community: string;
  /** Underlay addresses as the node sees them. */
  readonly addresses: readonly string[];
  /** The address the controller saw the node's connection come from (its NAT's public side, say). */
  readonly observedAddress: string;
  readonly vtepMac: string;
  readonly tunnelKey: string;
  readonly agentVersion: string;
  /** Annotations the node publishes about itself (e.g. flannel's backend-data), as Kubernetes Node annotations. */
  readonly annotations: Readonly<Record<string, string>>;
  /** The node's pod blocks, so peers can route to them (kept in step with the block leases). */
  readonly blocks: readonly string[];
  readonly registeredAt: number;
  readonly updatedAt: number;
}

/** The fields a node may set about itself. */
export type NodeFields = Pick<NodeRecord, 'site' | 'community' | 'addresses' | 'vtepMac' | 'tunnelKey' | 'agentVersion'> & {
  readonly annotations?: NodeRecord['annotations'];
};

/** A block leased to a node. Leases end only when the node is deregistered. */
export interface BlockLease {
  readonly cidr: string;
  readonly node: string;
  readonly leasedAt: number;
}

/** A node's last reported address usage. */
export interface NodeUsage {
  readonly capacity: number;
  readonly allocated: number;
  readonly reserved: number;
  readonly free: number;
  readonly at: number;
}

export const NODES_PREFIX = 'nodes/';
export const BLOCKS_PREFIX = 'blocks/';
export const USAGE_PREFIX = 'usage/';

export function nodeKey(name: string): string {
  return `${NODES_PREFIX}${name}`;
}

/** `blocks/10.244.1.0-26`: one key per block, so leasing a block is "create this key if it does not exist". */
export function blockKey(cidr: Cidr): string {
  return `${BLOCKS_PREFIX}${formatCidr(cidr).replace('/', '-')}`;
}

export function blockOfKey(key: string): Cidr | undefined {
  return parseCidr(key.slice(BLOCKS_PREFIX.length).replace('-', '/'));
}

export function usageKey(name: string): string {
  return `${USAGE_PREFIX}${name}`;
}
