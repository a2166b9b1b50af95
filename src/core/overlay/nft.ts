/**
 * Atoll's nftables ruleset, rendered as one `nft -f` transaction. Pure.
 *
 * One table of ours (`ip atoll`), replaced atomically each time (declare, delete, re-create in one transaction), with
 * sets instead of a rule per pod or per peer: pod traffic leaving the cluster ranges is masqueraded; pod-to-pod
 * traffic (any destination inside the cluster ranges) never is.
 */
import { type Cidr, formatCidr } from '../net/ipv4.ts';

export const NFT_TABLE = 'atoll';

function elements(cidrs: readonly Cidr[]): string {
  return cidrs.length === 0 ? '' : ` elements = { ${cidrs.map(formatCidr).join(', ')} };`;
}

/** The whole ruleset transaction for `nft -f -`. */
export function renderNftRuleset(opts: { localBlocks: readonly Cidr[]; clusterCidrs: readonly Cidr[] }): string {
  return [
    `table ip ${NFT_TABLE}`,
    `delete table ip ${NFT_TABLE}`,
    `table ip ${NFT_TABLE} {`,
    `  comment "managed by atoll; do not edit"`,
    `  set local_pods { type ipv4_addr; flags interval;${elements(opts.localBlocks)} }`,
    `  set cluster { type ipv4_addr; flags interval;${elements(opts.clusterCidrs)} }`,
    `  chain postrouting {`,
    `    type nat hook postrouting priority srcnat; policy accept;`,
    `    ip saddr @local_pods ip daddr != @cluster masquerade comment "pod traffic leaving the cluster"`,
    `  }`,
    `}`,
    '',
  ].join('\n');
}
