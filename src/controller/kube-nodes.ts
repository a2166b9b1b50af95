/**
 * The controller on Kubernetes: Node objects drive the registry. Follows Nodes and Communities by list + watch
 * (src/adapters/kube/reflector.ts) and reconciles level-triggered from that cache:
 * - admission: an agent joins (or updates itself) only under the name of an existing Node, and its site, community
 *   and tunnel role are the Node's (labels, Community objects: src/core/kube/placement.ts), never the agent's say;
 * - a label change moves a registered node: its record is rewritten, and agents and the relay follow through the
 *   registry's watch;
 * - a deleted Node is deregistered and its blocks released `nodeDeleteGraceSeconds` after the deletion, unless a
 *   Node of that name comes back first;
 * - each registered node's network state is published on its Node as annotations (merge patch), best effort: never
 *   on the data path, never blocking a join.
 * Only the leader writes. Malformed labels or Communities are logged once per distinct problem with a coded error and
 * change nothing (the node keeps its last good placement).
 */
import { asAtollError, atollError, type AtollError } from '../core/errors.ts';
import type { Clock, Logger } from '../core/ports.ts';
import type { ClusterRegistry } from '../core/cluster/registry.ts';
import type { NodeFields, NodeRecord } from '../core/cluster/model.ts';
import { ROLE_ANNOTATION } from '../core/tunnel/plan.ts';
import {
  annotationPatch, type CommunityIndex, indexCommunities, type Placement, placementOf, publishedAnnotations,
} from '../core/kube/placement.ts';
import type { KubeClient, KubeObject } from '../adapters/kube/kube-client.ts';
import { Reflector } from '../adapters/kube/reflector.ts';
import { sleep } from '../adapters/timers.ts';
import { Backoff } from '../core/retry.ts';

export const COMMUNITIES_PATH = '/apis/atoll.dev/v1alpha1/communities';
const NODES_PATH = '/api/v1/nodes';
/** A full pass this often even without events: heals anything a missed event or a failed patch left. */
const RESYNC_MS = 30_000;
/** Changes arriving within this window are reconciled in one pass. */
const COALESCE_MS = 100;

type KubeNode = KubeObject;
interface KubeCommunity extends KubeObject {
  readonly spec?: { readonly members?: readonly string[] };
}

export interface KubeNodesComponents {
  readonly kube: KubeClient;
  readonly registry: ClusterRegistry;
  readonly log: Logger;
  readonly clock: Clock;
  readonly isLeader: () => boolean;
}

export interface KubeNodesInit {
  readonly nodeDeleteGraceMs: number;
}

export class KubeNodes {
  readonly #c: KubeNodesComponents;
  readonly #init: KubeNodesInit;
  readonly #abort = new AbortController();
  readonly #nodes: Reflector<KubeNode>;
  readonly #communities: Reflector<KubeCommunity>;
  /** The last good placement of each node (kept when its labels turn malformed). */
  readonly #placed = new Map<string, Placement>();
  /** Registered nodes without a Node object, and since when (controller clock). */
  readonly #goneSince = new Map<string, number>();
  /** Problems already logged, so each is logged once while it lasts. */
  #reported = new Set<string>();
  /** Problems met in the current reconcile pass. */
  #seen = new Set<string>();
  #index: CommunityIndex = { byNode: new Map(), problems: [] };
  #timer: NodeJS.Timeout | undefined;
  #resync: NodeJS.Timeout | undefined;
  #running: Promise<void> = Promise.resolve();
  #registryWatch: Promise<void> = Promise.resolve();

  constructor(components: KubeNodesComponents, init: KubeNodesInit) {
    this.#c = components;
    this.#init = init;
    this.#nodes = new Reflector<KubeNode>({ kube: components.kube, log: components.log }, { path: NODES_PATH, what: 'Nodes' });
    this.#communities = new Reflector<KubeCommunity>({ kube: components.kube, log: components.log }, { path: COMMUNITIES_PATH, what: 'Communities' });
  }

  /** Starts following; resolves once both caches hold their first list (joins are refused until then). */
  async start(): Promise<void> {
    const signal = this.#abort.signal;
    for (const r of [this.#nodes, this.#communities]) {
      r.onChange(() => {
        this.#reindex();
        this.poke();
      });
      r.start(signal);
    }
    await Promise.all([this.#nodes.synced(signal), this.#communities.synced(signal)]);
    this.#resync = setInterval(() => this.poke(), RESYNC_MS);
    this.#registryWatch = this.#followRegistry(signal);
    this.poke();
  }

  /** A pass after every registry change too (a join, a new block): the annotations follow within moments. */
  async #followRegistry(signal: AbortSignal): Promise<void> {
    const backoff = new Backoff({ minMs: 500, maxMs: 30_000 }, sleep);
    while (!signal.aborted) {
      try {
        const { revision } = await this.#c.registry.snapshot();
        await this.#c.registry.watchNodes(revision, () => {
          backoff.reset();
          this.poke();
        }, signal);
      } catch (err) {
        if (signal.aborted) break;
        this.#c.log.debug('registry watch ended; following again', { err: asAtollError(err).message });
        await backoff.wait(signal);
      }
    }
  }

  get synced(): boolean {
    return this.#nodes.hasSynced && this.#communities.hasSynced;
  }

  /**
   * The fields a node may register or update with, its placement taken from its Node.
   * @throws AtollError NODE_NOT_IN_CLUSTER when no Node has that name (or it is being deleted), NODE_LABELS_INVALID
   * when its labels are malformed and it has no last good placement.
   */
  admit(name: string, fields: NodeFields): NodeFields {
    if (!this.synced) throw atollError('NODE_NOT_IN_CLUSTER', `node ${name}: the controller has not read the Nodes yet`, 'retry in a few seconds');
    const node = this.#nodes.get(name);
    if (!node || node.metadata.deletionTimestamp) {
      throw atollError('NODE_NOT_IN_CLUSTER', `node ${name} has no Node object in the cluster${node ? ' (it is being deleted)' : ''}`,
        'the agent must run under its Node\'s name (spec.nodeName from the downward API); register the node with Kubernetes first');
    }
    const p = this.#placementOf(node);
    if (!p) throw this.#labelProblem(node) as AtollError;
    const tunnel = fields.annotations?.[ROLE_ANNOTATION] !== undefined;
    return { ...fields, site: p.site, community: p.community, annotations: tunnel ? { ...fields.annotations, [ROLE_ANNOTATION]: p.role } : fields.annotations };
  }

  /** Asks for a reconcile pass soon (changes arriving together are handled in one pass). */
  poke(): void {
    if (this.#timer || this.#abort.signal.aborted) return;
    this.#timer = setTimeout(() => {
      this.#timer = undefined;
      this.#running = this.#running.then(() => this.#reconcile()).catch((err: unknown) => {
        this.#c.log.warn('Kubernetes reconcile failed; retrying at the next change or resync', { err: asAtollError(err).message });
      });
    }, COALESCE_MS);
  }

  async stop(): Promise<void> {
    this.#abort.abort();
    clearTimeout(this.#timer);
    clearInterval(this.#resync);
    await Promise.all([this.#nodes.stopped(), this.#communities.stopped(), this.#running, this.#registryWatch]);
  }

  #placementOf(node: KubeNode): Placement | undefined {
    const name = node.metadata.name;
    const p = placementOf(name, node.metadata.labels ?? {}, this.#index);
    if ('role' in p) {
      this.#placed.set(name, p);
      return p;
    }
    this.#report(p);
    return this.#placed.get(name);
  }

  #labelProblem(node: KubeNode): AtollError | undefined {
    const p = placementOf(node.metadata.name, node.metadata.labels ?? {}, this.#index);
    return 'role' in p ? undefined : p;
  }

  #report(err: AtollError): void {
    const key = `${err.code}:${err.message}`;
    this.#seen.add(key);
    if (this.#reported.has(key)) return;
    this.#reported.add(key);
    this.#c.log.warn('Kubernetes object refused', { code: err.code, err: err.message, fix: err.fix });
  }

  /** Recomputes the community index from the caches (cheap; on every change, so admission never uses a stale one). */
  #reindex(): void {
    const names = new Set(this.#nodes.list().map((n) => n.metadata.name));
    const communities = this.#communities.list().map((c) => ({ name: c.metadata.name, members: c.spec?.members ?? [] }));
    this.#index = indexCommunities(communities, names);
  }

  async #reconcile(): Promise<void> {
    const nodes = this.#nodes.list();
    this.#seen = new Set();
    for (const p of this.#index.problems) this.#report(p);
    await this.#reconcileNodes(nodes);
    // problems are logged once while they last: forget those gone, so a recurrence is logged again
    this.#reported = new Set([...this.#reported].filter((k) => this.#seen.has(k)));
  }

  async #reconcileNodes(nodes: KubeNode[]): Promise<void> {
    if (!this.#c.isLeader()) {
      for (const n of nodes) this.#placementOf(n);
      return;
    }
    const { nodes: records } = await this.#c.registry.snapshot();
    const now = this.#c.clock();
    for (const rec of records) {
      const node = this.#nodes.get(rec.name);
      if (!node || node.metadata.deletionTimestamp) {
        await this.#whenGone(rec.name, now);
        continue;
      }
      this.#goneSince.delete(rec.name);
      const p = this.#placementOf(node);
      if (p) await this.#move(rec, p);
      await this.#publish(node, rec);
    }
    for (const name of this.#goneSince.keys()) if (!records.some((r) => r.name === name)) this.#goneSince.delete(name);
    for (const n of nodes) if (!records.some((r) => r.name === n.metadata.name)) this.#placementOf(n);
  }

  /** Deregisters a node whose Node has been gone for the grace period. */
  async #whenGone(name: string, now: number): Promise<void> {
    const since = this.#goneSince.get(name);
    if (since === undefined) {
      this.#goneSince.set(name, now);
      this.#c.log.info('a registered node has no Node object; releasing it after the grace period unless it returns', { node: name, graceMs: this.#init.nodeDeleteGraceMs });
      if (this.#init.nodeDeleteGraceMs > 0) {
        setTimeout(() => this.poke(), this.#init.nodeDeleteGraceMs).unref();
        return;
      }
    } else if (now - since < this.#init.nodeDeleteGraceMs) return;
    const released = await this.#c.registry.deregister(name).catch((err: unknown) => {
      if (asAtollError(err).code === 'NODE_NOT_REGISTERED') return [];
      throw err;
    });
    this.#goneSince.delete(name);
    this.#placed.delete(name);
    this.#c.log.info('node deleted from Kubernetes: deregistered, blocks released', { node: name, released });
  }

  /** Rewrites a registered node's placement when its labels moved it. */
  async #move(rec: NodeRecord, p: Placement): Promise<void> {
    // the role annotation exists only for nodes that run a tunnel (src/core/tunnel/plan.ts)
    const tunnel = rec.annotations[ROLE_ANNOTATION] !== undefined;
    if (rec.site === p.site && rec.community === p.community && (!tunnel || rec.annotations[ROLE_ANNOTATION] === p.role)) return;
    const annotations = tunnel ? { ...rec.annotations, [ROLE_ANNOTATION]: p.role } : rec.annotations;
    await this.#c.registry.update(rec.name, { site: p.site, community: p.community, addresses: rec.addresses, vtepMac: rec.vtepMac, tunnelKey: rec.tunnelKey, agentVersion: rec.agentVersion, annotations });
    this.#c.log.info('node moved by its labels', { node: rec.name, site: p.site, community: p.community, role: p.role, was: { site: rec.site, community: rec.community } });
  }

  /** Publishes the node's network state on its Node; failures are logged and retried at the next pass. */
  async #publish(node: KubeNode, rec: NodeRecord): Promise<void> {
    const desired = publishedAnnotations({ vtepMac: rec.vtepMac, observedAddress: rec.observedAddress, addresses: rec.addresses, blocks: rec.blocks, tunnelPin: rec.tunnelKey });
    const patch = annotationPatch(node.metadata.annotations ?? {}, desired);
    if (!patch) return;
    try {
      await this.#c.kube.mergePatch(`${NODES_PATH}/${encodeURIComponent(rec.name)}`, { metadata: { annotations: patch } }, this.#abort.signal);
    } catch (err) {
      if (!this.#abort.signal.aborted) this.#c.log.warn('publishing annotations on a Node failed; retrying at the next pass', { node: rec.name, err: asAtollError(err).message });
    }
  }
}
