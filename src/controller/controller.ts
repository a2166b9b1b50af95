/**
 * The cloud controller: opens its store, campaigns for leadership (one leader among replicas sharing an etcd;
 * always itself with the embedded store), ensures its PKI, and serves the API. Start-up errors are fatal; losing
 * leadership makes the replica a follower (writes answered "not leader") until it wins a campaign again.
 */
import { join } from 'node:path';
import { mkdirSync } from 'node:fs';
import { asAtollError } from '../core/errors.ts';
import type { Clock, Logger } from '../core/ports.ts';
import type { ClusterStore, LeaderElection } from '../core/cluster/store.ts';
import { ClusterRegistry } from '../core/cluster/registry.ts';
import type { ControllerConfig } from '../config/controller-config.ts';
import { EmbeddedLeader, EmbeddedStore } from '../adapters/store/store-embedded.ts';
import { EtcdLeader, EtcdStore } from '../adapters/store/store-etcd.ts';
import { ensureControllerPki } from '../adapters/pki.ts';
import { KubeClient } from '../adapters/kube/kube-client.ts';
import { loadKubeConnection } from '../adapters/kube/kube-config.ts';
import { ApiServer, type Leadership } from './api-server.ts';
import { ViewFeed } from './view-feed.ts';
import { KubeNodes } from './kube-nodes.ts';
import { KubePolicy } from './kube-policy.ts';
import { inView, viewScope } from '../core/cluster/view.ts';
import { ENFORCES_ANNOTATION } from '../core/policy/reuse.ts';
import type { OpsServer, Readiness } from '../adapters/ops/ops-server.ts';
import { cidrSize } from '../core/net/ipv4.ts';
import { TimedStore, type StoreObserver } from './timed-store.ts';

export interface ControllerComponents {
  readonly log: Logger;
  readonly clock: Clock;
}

export class Controller {
  readonly #c: ControllerComponents;
  readonly #cfg: ControllerConfig;
  readonly #abort = new AbortController();
  #store: ClusterStore | undefined;
  #election: LeaderElection | undefined;
  #api: ApiServer | undefined;
  #leading = false;
  #campaign: Promise<void> | undefined;
  #registry: ClusterRegistry | undefined;
  #feed: ViewFeed | undefined;
  #caHash = '';
  #kube: KubeClient | undefined;
  #kubeNodes: KubeNodes | undefined;
  #policy: KubePolicy | undefined;
  #port = 0;
  #ops: OpsServer | undefined;

  constructor(components: ControllerComponents, config: ControllerConfig) {
    this.#c = components;
    this.#cfg = config;
  }

  /** The CA pin agents need (`controller.caCertHash` in their configuration). */
  get caCertHash(): string {
    return this.#caHash;
  }

  get port(): number {
    return this.#port;
  }

  get registry(): ClusterRegistry | undefined {
    return this.#registry;
  }

  /**
   * Starts the metrics and health listener (when configured), opens the store, ensures the PKI, follows the
   * Kubernetes Nodes (when configured), serves the API and campaigns. @throws AtollError on a start-up problem.
   */
  async start(): Promise<void> {
    const cfg = this.#cfg;
    this.#c.log.info('atoll controller starting', { config: { ...cfg, bootstrapTokens: '(redacted)', adminToken: '(redacted)', relayTokens: '(redacted)' } });
    let observeStore: StoreObserver | undefined;
    if (cfg.metrics) {
      // loaded only when configured: prom-client stays out of the memory of a component without metrics
      const [{ Metrics }, { startOpsServer }, { registerControllerMetrics }] = await Promise.all([import('../adapters/ops/metrics.ts'), import('../adapters/ops/ops-server.ts'), import('./controller-metrics.ts')]);
      const metrics = new Metrics();
      observeStore = registerControllerMetrics(metrics, {
        isLeader: () => this.#leading,
        watchClients: () => this.#api?.watchClients ?? 0,
        census: async () => {
          const registry = this.#registry;
          if (!registry) return { nodes: 0, leasedBlocks: 0 };
          const [snap, leases] = await Promise.all([registry.snapshot(), registry.leases()]);
          return { nodes: snap.nodes.length, leasedBlocks: leases.length };
        },
        totalBlocks: cfg.clusterBlocks.reduce((n, c) => n + (cfg.blockBits >= c.bits ? cidrSize(c) / 2 ** (32 - cfg.blockBits) : 0), 0),
      });
      this.#ops = await startOpsServer({ listen: cfg.metrics.listen, registry: metrics.registry, readiness: () => this.readiness() });
    }
    try {
      await this.#startServing(observeStore);
    } catch (err) {
      await this.#ops?.close();
      throw err;
    }
  }

  /** Ready: the store is open, the API serves, and on Kubernetes the Nodes have been read (/readyz). */
  readiness(): Readiness {
    const reasons = [
      ...(this.#store ? [] : ['the store is not open yet']),
      ...(this.#port > 0 ? [] : ['the API does not serve yet']),
      ...(this.#cfg.kubernetes && !this.#kubeNodes?.synced ? ['the Kubernetes Nodes have not been read yet'] : []),
      ...(this.#abort.signal.aborted ? ['stopping'] : []),
    ];
    return { ready: reasons.length === 0, reasons };
  }

  /** The port of the metrics and health listener, when it runs. */
  get opsPort(): number | undefined {
    return this.#ops?.port;
  }

  async #startServing(observeStore: StoreObserver | undefined): Promise<void> {
    const cfg = this.#cfg;
    const log = this.#c.log;
    mkdirSync(cfg.dataDir, { recursive: true, mode: 0o700 });
    const advertiseHost = new URL(cfg.advertiseUrl).hostname.replace(/^\[|\]$/g, '');
    const hosts = [...new Set([advertiseHost, ...cfg.tlsHosts, ...(cfg.listenHost === '0.0.0.0' ? [] : [cfg.listenHost])])];
    const pki = await ensureControllerPki(cfg.pkiDir ?? join(cfg.dataDir, 'pki'), { hosts });
    this.#caHash = pki.caHash;
    const kube = cfg.kubernetes && new KubeClient(loadKubeConnection({ kubeconfig: cfg.kubernetes.kubeconfig, server: cfg.kubernetes.server, userAgent: cfg.kubernetes.userAgent }));
    this.#kube = kube;
    const opened = await openStore(cfg, kube);
    const store = observeStore ? new TimedStore(opened.store, observeStore) : opened.store;
    const election = opened.election;
    this.#store = store;
    this.#election = election;
    this.#registry = new ClusterRegistry(
      { store, clock: this.#c.clock },
      { clusterCidrs: cfg.clusterBlocks, blockBits: cfg.blockBits, maxBlocksPerNode: cfg.maxBlocksPerNode, refillBelow: cfg.refillBelow },
    );
    const leadership: Leadership = { isLeader: () => this.#leading, leaderUrl: () => election.leader().catch(() => undefined) };
    if (kube && cfg.kubernetes) {
      this.#kubeNodes = new KubeNodes({ kube, registry: this.#registry, log: log.child('kubernetes'), clock: this.#c.clock, isLeader: () => this.#leading },
        { nodeDeleteGraceMs: cfg.kubernetes.nodeDeleteGraceSeconds * 1000 });
      await this.#kubeNodes.start();
      log.info('following Kubernetes Nodes', { server: kube.server });
    }
    const feed = new ViewFeed({ registry: this.#registry, log: log.child('views') });
    this.#feed = feed;
    feed.start();
    if (kube) {
      // NetworkPolicies are served once read; joins and the node watch do not wait for them
      const reachable = (viewer: string, other: string) => {
        const there = feed.views.node(other);
        return there === undefined || inView(viewScope(feed.views.node(viewer)), there);
      };
      // every node whose view holds the owner: its policies may name the owner's pods (O(nodes) per question)
      const peersOf = function* (owner: string) {
        for (const n of feed.views.nodes()) if (reachable(n.name, owner)) yield { name: n.name, enforces: n.annotations[ENFORCES_ANNOTATION] === 'true' };
      };
      // only a replica that is alone (the embedded store) sees every node's acknowledgements
      this.#policy = new KubePolicy({ kube, log: log.child('policy'), reachable, peersOf, soleReplica: cfg.store.type === 'embedded', clock: this.#c.clock, instance: advertiseHost });
      this.#policy.start().then(() => log.info('following NetworkPolicies, Namespaces and Pods', { policies: this.#policy?.policyCount }), (err: unknown) => log.error('following NetworkPolicies failed', { err: asAtollError(err).message }));
    }
    this.#api = new ApiServer(
      { registry: this.#registry, feed, admission: this.#kubeNodes, policy: this.#policy, log: log.child('api'), clock: this.#c.clock, leadership },
      { host: cfg.listenHost, port: cfg.listenPort, key: pki.keyPem, certChain: pki.certChainPem, bootstrapTokens: cfg.bootstrapTokens, adminToken: cfg.adminToken, relayTokens: cfg.relayTokens, maxBodyBytes: cfg.maxBodyBytes, watchBufferBytes: cfg.watchBufferBytes },
    );
    this.#port = await this.#api.start();
    this.#campaign = this.#campaignLoop();
    log.info('atoll controller serving', { url: cfg.advertiseUrl, port: this.#port, caCertHash: pki.caHash, store: cfg.store.type });
  }

  /** Campaigns, leads until the term is lost, campaigns again; until stop. */
  async #campaignLoop(): Promise<void> {
    const election = this.#election as LeaderElection;
    while (!this.#abort.signal.aborted) {
      try {
        const { lost } = await election.campaign(this.#abort.signal);
        this.#leading = true;
        this.#kubeNodes?.poke();
        this.#c.log.info('leading the controller replicas', { url: this.#cfg.advertiseUrl });
        await new Promise<void>((resolve) => {
          if (lost.aborted || this.#abort.signal.aborted) return resolve();
          lost.addEventListener('abort', () => resolve(), { once: true });
          this.#abort.signal.addEventListener('abort', () => resolve(), { once: true });
        });
        this.#leading = false;
        if (!this.#abort.signal.aborted) this.#c.log.warn('lost leadership; following', { reason: String(lost.reason) });
      } catch (err) {
        this.#leading = false;
        if (this.#abort.signal.aborted) break;
        this.#c.log.warn('campaign failed; retrying', { err: asAtollError(err).message });
        await new Promise((r) => setTimeout(r, 1000));
      }
    }
  }

  async stop(): Promise<void> {
    this.#abort.abort();
    await this.#api?.stop();
    await this.#feed?.stop();
    await this.#kubeNodes?.stop();
    await this.#policy?.stop();
    await this.#election?.resign().catch(() => undefined);
    await this.#campaign;
    await this.#store?.close();
    this.#kube?.close();
    await this.#ops?.close();
    this.#c.log.info('atoll controller stopped');
  }
}

/** The configured store and its leader election. */
async function openStore(cfg: ControllerConfig, kube: KubeClient | undefined): Promise<{ store: ClusterStore; election: LeaderElection }> {
  const s = cfg.store;
  switch (s.type) {
    case 'embedded':
      return { store: await EmbeddedStore.open(join(cfg.dataDir, 'store')), election: new EmbeddedLeader({ id: cfg.advertiseUrl }) };
    case 'etcd': {
      const etcd = { endpoints: s.endpoints, prefix: s.prefix };
      return { store: new EtcdStore(etcd), election: new EtcdLeader({ ...etcd, id: cfg.advertiseUrl, ttlSeconds: s.leaseTtlSeconds }) };
    }
    case 'kubernetes': {
      const { openKubeStore } = await import('../adapters/store/store-kube.ts');
      return openKubeStore(kube as KubeClient, { id: cfg.advertiseUrl, namespace: s.leaseNamespace, leaseName: s.leaseName, leaseDurationSeconds: s.leaseDurationSeconds });
    }
  }
}
