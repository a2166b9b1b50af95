/**
 * When a deleted pod's address may go to another pod: once no peer can still match it as the gone pod. Pure.
 *
 * Peers match a remote pod by its address, with the labels they were sent (src/core/policy/scope.ts). So an address
 * handed to another namespace/name while a peer still holds the old pod would be judged by the old pod's labels. The
 * controller knows what each node may hold: the view the node last acknowledged having applied (a `mark` line of the
 * policy stream, answered by `POST /v1/policy/applied`), and every view sent to it since. What a node applied stays in
 * its kernel while it is cut off, and is what it starts from after a restart (it keeps the view it received, and
 * acknowledges only after applying it), so this outlives its stream. A node that enforces NetworkPolicy and has
 * acknowledged nothing to this replica (cut off since before the replica started, say) may hold anything: the address
 * waits for it. How long an address waits is therefore not a fixed time: as long as any peer that may hold the old pod
 * has not applied a view without it; a connected peer does within about a second of the deletion.
 */
import type { NodePolicyView } from './scope.ts';

/** The node annotation an agent that enforces NetworkPolicy publishes (value `true`). */
export const ENFORCES_ANNOTATION = 'atoll.dev/network-policy';

/** An address a node released, with the pod that held it. */
export interface ReleasedAddress {
  readonly ip: string;
  readonly namespace: string;
  readonly name: string;
}

const heldAddresses = new WeakMap<NodePolicyView, ReadonlySet<string>>();

/** The pod addresses a view holds (computed once per view: views are immutable and shared). */
function addressesOf(view: NodePolicyView): ReadonlySet<string> {
  let s = heldAddresses.get(view);
  if (!s) heldAddresses.set(view, s = new Set(view.pods.map((p) => p.ip)));
  return s;
}

/** Views sent to one node since the last it applied, kept whole before they are folded into a set of addresses. */
const KEPT_SENT = 64;

interface Holding {
  /** The view the node last said it applied; `undefined` until it says so to this replica. */
  acked: NodePolicyView | undefined;
  /** Views sent since, on its current or earlier streams, in order: it may have applied any of them. */
  sent: { readonly stream: string; readonly seq: number; readonly view: NodePolicyView }[];
  /** Addresses of sent views folded in when more than {@link KEPT_SENT} awaited an acknowledgement. */
  folded: Set<string> | undefined;
}

/**
 * What each node may hold, as one controller replica knows it: the view it acknowledged last, and every view sent to
 * it since (it may have applied one and not yet said so, or said so to a connection that broke). A node holds what it
 * applied while it is cut off, so this outlives its stream.
 */
export class PeerHoldings {
  readonly #nodes = new Map<string, Holding>();

  /** Records that `view` went to `node` as mark `seq` of stream `stream`. */
  sent(node: string, stream: string, seq: number, view: NodePolicyView): void {
    let h = this.#nodes.get(node);
    if (!h) this.#nodes.set(node, h = { acked: undefined, sent: [], folded: undefined });
    h.sent.push({ stream, seq, view });
    if (h.sent.length <= KEPT_SENT) return;
    const oldest = h.sent.shift() as Holding['sent'][number];
    h.folded ??= new Set();
    for (const ip of addressesOf(oldest.view)) h.folded.add(ip);
  }

  /**
   * Records that `node` applied mark `seq` of stream `stream`: what it holds is that view and those sent after it.
   * False when that mark is not known (sent by another replica, before a restart, or folded away).
   */
  applied(node: string, stream: string, seq: number): boolean {
    const h = this.#nodes.get(node);
    const at = h ? h.sent.findIndex((e) => e.stream === stream && e.seq === seq) : -1;
    if (!h || at < 0) return false;
    h.acked = (h.sent[at] as Holding['sent'][number]).view;
    h.sent = h.sent.slice(at + 1);
    h.folded = undefined;
    return true;
  }

  /** Whether `node` may hold a pod at an address; `undefined` when this replica does not know what it holds. */
  holds(node: string): ((ip: string) => boolean) | undefined {
    const h = this.#nodes.get(node);
    if (!h?.acked) return undefined;
    const sets = [addressesOf(h.acked), ...h.sent.map((e) => addressesOf(e.view)), ...(h.folded ? [h.folded] : [])];
    return (ip) => sets.some((s) => s.has(ip));
  }
}

/** A node that may hold the releasing node's pods: whether it enforces NetworkPolicy, and what it may hold. */
export interface PeerHolding {
  readonly name: string;
  readonly enforces: boolean;
  /** Whether it may hold a pod at an address; `undefined`: not known (it may hold anything, if it enforces). */
  readonly holds: ((ip: string) => boolean) | undefined;
}

/**
 * The addresses of `released` another pod may take now: the cluster no longer has a pod at the address (`inWorld`:
 * a pod still terminating, or one whose deletion has not reached the controller, keeps it), and no peer may hold a
 * pod at it: each is known to hold none, or enforces no policy and never said what it holds.
 */
export function reusableAddresses(released: readonly ReleasedAddress[], inWorld: (ip: string) => boolean, peers: readonly PeerHolding[]): string[] {
  const known: ((ip: string) => boolean)[] = [];
  for (const p of peers) {
    if (p.holds) known.push(p.holds);
    else if (p.enforces) return [];
  }
  return released.filter((r) => !inWorld(r.ip) && !known.some((holds) => holds(r.ip))).map((r) => r.ip);
}
