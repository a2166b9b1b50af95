/**
 * What each agent receives from the controller's watch stream (`GET /v1/watch`), for a cluster of cloud and edge
 * nodes given by flags: the bytes to join (the snapshot line) and the bytes per change made elsewhere, in the
 * viewer's community and in its site, and how long a change takes to reach each viewer. Issue #34 (a control plane for
 * 100,000 nodes) wants an edge agent's figures flat in the cluster's size once the controller scopes each agent's
 * view; until then every agent receives the whole registry, and the figures of today are the baseline.
 *
 * One run: a fresh `bin/atoll controller` on 127.0.0.1 (embedded store; bench/controller-process.ts) with a relay
 * token; N simulated nodes join through the real API (harness/join-simulator.ts, each with its own key): `--cloud`
 * cloud nodes (role `cloud`, site `cloud`) and edge nodes (role `edge`), `--site-size` to a site `s<k>` and
 * `--community-sites` sites to a community `c<j>`, each with the fields and annotations a real agent publishes (a
 * tunnel key pin, an underlay address, flannel's annotations, the tunnel role and port) and the block its join gave.
 * Then watch streams open, one per viewer: up to `--edge-viewers` edge nodes in different communities and
 * `--cloud-viewers` cloud nodes, each signing its request with its own key exactly as an agent does
 * (src/adapters/node/node-identity.ts `signRequest`, the headers ControllerClient sends), and the relay (its token;
 * the whole registry: what every agent receives today). Every byte of every stream's body is counted, by line type.
 *
 * Then the changes, one at a time: a node updates its underlay address (and flannel's public-ip annotation with it)
 * with `PUT /v1/nodes/NAME`, signed as itself (ControllerClient.update): `--changes` edge nodes away from the viewers
 * (in communities without a viewer when there are any), and for each edge viewer one node of its site and one of
 * another site of its community, and 2 cloud nodes that are not viewers. A change is over once every viewer has
 * received a line naming that node, or `--settle-ms` after the relay did (a viewer whose view leaves that node out
 * receives nothing). What a viewer receives between one change's PUT and the next one's, pings left out, is that
 * change's bytes for it, whatever the lines are; a line naming the changed node is that change's arrival, timed from
 * the PUT's answer (negative when the stream was faster than the answer) in this process, which also runs the
 * viewers: the bench's own event loop is inside the figure.
 *
 * Bytes are the NDJSON body as the agent's parser sees it; TLS records and HTTP chunk framing add a few per cent.
 * Nothing is assumed: a viewer's snapshot is counted as the controller sent it, whatever the controller filters.
 * No root needed; no targets (it reports). bench/README.md has the latest figures.
 *
 * Usage: node bench/watch-view.ts [--nodes N] [--site-size S] [--community-sites C] [--cloud K] [--edge-viewers V]
 *        [--cloud-viewers W] [--changes K] [--runs R] [--concurrency C] [--settle-ms MS] [--atoll PATH] [--smoke] [--json FILE]
 *        [--timeout SECONDS]
 */
import { type ChildProcess, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import type { IncomingMessage } from 'node:http';
import { request } from 'node:https';
import { cpus, loadavg, release, tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { NodeFields } from '../src/core/cluster/model.ts';
import { formatIpv4, parseIpv4 } from '../src/core/net/ipv4.ts';
import { FLANNEL_ANNOTATION_PREFIX, flannelAnnotations } from '../src/core/overlay/flannel.ts';
import { ROLE_ANNOTATION, TUNNEL_PORT_ANNOTATION } from '../src/core/tunnel/plan.ts';
import { ControllerClient } from '../src/adapters/node/controller-client.ts';
import { type NodeIdentity, signRequest } from '../src/adapters/node/node-identity.ts';
import { ATOLL_BIN, PROJECT_NODE } from '../src/lab/agent-process.ts';
import { type JoinedNode, simulatedName, simulateJoins } from '../harness/join-simulator.ts';
import { RUN_PREFIX } from '../harness/netns.ts';
import { cleanUpOnExit, fmt, intOption, median, nearestRank, parseBenchArgs, removeRunTempDirs, runBench, table } from './common.ts';
import { BOOTSTRAP_TOKEN, type Controller, startController, stopController } from './controller-process.ts';

const RELAY_TOKEN = 'atoll-bench-relay-0123456789abcdef';
/** The agent's defaults (src/config/agent-config.ts): overlay VNI 1, tunnel port 8475; its version (AGENT_VERSION). */
const VNI = 1;
const TUNNEL_PORT = 8475;
const AGENT_VERSION = '0.1.0';
/** Underlay addresses at join: 100.64.0.0/10, one per node; changes move a node into 198.18.0.0/15. */
const JOIN_ADDRESSES = parseIpv4('100.64.0.0') as number;
const CHANGE_ADDRESSES = parseIpv4('198.18.0.0') as number;
const CLOUD_CHANGES = 2;

// ---------------------------------------------------------------------------------------------------------------
// Options

interface Options {
  readonly smoke: boolean;
  readonly nodes: number;
  readonly siteSize: number;
  readonly communitySites: number;
  readonly cloud: number;
  readonly edgeViewers: number;
  readonly cloudViewers: number;
  readonly changes: number;
  readonly runs: number;
  readonly concurrency: number;
  readonly settleMs: number;
  readonly atoll: string;
  readonly json: string | undefined;
  readonly timeoutS: number;
}

const USAGE = `usage: node bench/watch-view.ts [options]
  --nodes N            nodes in the cluster, cloud and edge (default 1000; 200 with --smoke)
  --site-size S        edge nodes per site s<k> (default 2)
  --community-sites C  sites per community c<j> (default 50)
  --cloud K            cloud nodes, site "cloud" (default 20)
  --edge-viewers V     edge nodes that watch, each in another community (default 5; fewer when there are fewer communities)
  --cloud-viewers W    cloud nodes that watch (default 2); the relay always watches too
  --changes K          changes by edge nodes away from the viewers (default 20; 4 with --smoke); each edge viewer's site
                       and community get one more each, and ${CLOUD_CHANGES} cloud nodes one each
  --runs R             runs, each with a fresh controller; the figures are medians over runs (default 3; 1 with --smoke)
  --concurrency C      join requests in flight (default 64)
  --settle-ms MS       after the relay received a change, how long to wait for viewers that did not (default 500)
  --atoll PATH         the bin/atoll whose controller runs (default this checkout's: ${ATOLL_BIN}); another
                       commit's, to compare controllers
  --smoke              the short run for CI: 200 nodes, 1 run, 4 changes elsewhere
  --json FILE          write every stream's figures, change by change, to FILE
  --timeout SECONDS    abort (and clean up) after this long (default 3600; 300 with --smoke)`;

function parseOptions(argv: readonly string[]): Options {
  const values = parseBenchArgs(argv, USAGE, {
    nodes: { type: 'string' },
    'site-size': { type: 'string' },
    'community-sites': { type: 'string' },
    cloud: { type: 'string' },
    'edge-viewers': { type: 'string' },
    'cloud-viewers': { type: 'string' },
    changes: { type: 'string' },
    runs: { type: 'string' },
    concurrency: { type: 'string' },
    'settle-ms': { type: 'string' },
    atoll: { type: 'string', default: ATOLL_BIN },
  });
  const smoke = values.smoke;
  const int = intOption(USAGE);
  const cloud = int('cloud', values.cloud, 20, 1);
  const o: Options = {
    smoke,
    nodes: int('nodes', values.nodes, smoke ? 200 : 1000, cloud + 1),
    siteSize: int('site-size', values['site-size'], 2, 1),
    communitySites: int('community-sites', values['community-sites'], 50, 1),
    cloud,
    edgeViewers: int('edge-viewers', values['edge-viewers'], 5, 0),
    cloudViewers: int('cloud-viewers', values['cloud-viewers'], 2, 0, cloud),
    changes: int('changes', values.changes, smoke ? 4 : 20, 0),
    runs: int('runs', values.runs, smoke ? 1 : 3, 1),
    concurrency: int('concurrency', values.concurrency, 64, 1),
    settleMs: int('settle-ms', values['settle-ms'], 500, 0),
    atoll: values.atoll,
    json: values.json,
    timeoutS: int('timeout', values.timeout, smoke ? 300 : 3600, 1),
  };
  return Object.freeze(o);
}

// ---------------------------------------------------------------------------------------------------------------
// The topology, as data: who is where, who watches, who changes

type Role = 'cloud' | 'edge';

interface Member {
  readonly name: string;
  readonly role: Role;
  /** Index among the nodes of its role. */
  readonly index: number;
  readonly site: string;
  readonly community: string;
}

/** How a changed node relates to a viewer. For cloud viewers and the relay every edge node is "elsewhere". */
type Relation = 'elsewhere' | 'own community' | 'own site' | 'cloud node';
const RELATIONS: readonly Relation[] = ['elsewhere', 'own community', 'own site', 'cloud node'];

interface Viewer {
  /** A node's name, or `relay`. */
  readonly key: string;
  readonly kind: Role | 'relay';
  readonly member: Member | undefined;
}

interface Topology {
  readonly cloud: readonly Member[];
  readonly edge: readonly Member[];
  readonly sites: number;
  readonly communities: number;
  readonly viewers: readonly Viewer[];
  /** The nodes that change, in the order they do. */
  readonly changes: readonly Member[];
  /** How many of them were chosen away from the edge viewers, in their sites, in their communities, among cloud nodes. */
  readonly planned: { readonly away: number; readonly site: number; readonly community: number; readonly cloud: number; readonly everyCommunityWatched: boolean };
}

const CLOUD_PREFIX = 'cloud-';
const EDGE_PREFIX = 'edge-';

function topology(o: Options): Topology {
  const edges = o.nodes - o.cloud;
  const sites = Math.ceil(edges / o.siteSize);
  const communities = Math.ceil(sites / o.communitySites);
  const cloud = Array.from({ length: o.cloud }, (_, i): Member => ({ name: simulatedName(CLOUD_PREFIX, o.cloud, i), role: 'cloud', index: i, site: 'cloud', community: '' }));
  const edge = Array.from({ length: edges }, (_, i): Member => {
    const site = Math.floor(i / o.siteSize);
    return { name: simulatedName(EDGE_PREFIX, edges, i), role: 'edge', index: i, site: `s${site}`, community: `c${Math.floor(site / o.communitySites)}` };
  });
  const firstOfSite = (s: number) => edge[s * o.siteSize] as Member;
  // edge viewers: the first node of the first site of communities spread evenly over the cluster
  const v = Math.min(o.edgeViewers, communities);
  const viewerCommunities = [...new Set(Array.from({ length: v }, (_, k) => (v === 1 ? 0 : Math.round((k * (communities - 1)) / (v - 1)))))];
  const edgeViewers = viewerCommunities.map((j) => firstOfSite(j * o.communitySites));
  const viewers: Viewer[] = [
    ...edgeViewers.map((m): Viewer => ({ key: m.name, kind: 'edge', member: m })),
    ...cloud.slice(0, o.cloudViewers).map((m): Viewer => ({ key: m.name, kind: 'cloud', member: m })),
    { key: 'relay', kind: 'relay', member: undefined },
  ];
  const taken = new Set(viewers.map((w) => w.key));
  const pick = (m: Member | undefined): Member[] => {
    if (!m || taken.has(m.name)) return [];
    taken.add(m.name);
    return [m];
  };
  const sameSite = edgeViewers.flatMap((m) => pick(edge[m.index + 1]?.site === m.site ? edge[m.index + 1] : undefined));
  const sameCommunity = edgeViewers.flatMap((m) => {
    const s = Number(m.site.slice(1));
    const lastSite = Math.min(sites - 1, (Math.floor(s / o.communitySites) + 1) * o.communitySites - 1);
    return lastSite !== s ? pick(firstOfSite(lastSite)) : [];
  });
  const local = edgeViewers.flatMap((m) => [...sameSite, ...sameCommunity].filter((c) => c.community === m.community));
  const cloudChanges = cloud.slice(o.cloudViewers, o.cloudViewers + CLOUD_CHANGES).flatMap(pick);
  // elsewhere: spread evenly over the edge nodes of communities without a viewer, or of any community when all have one
  const viewerCommunitySet = new Set(edgeViewers.map((m) => m.community));
  const away = edge.filter((m) => !taken.has(m.name) && !viewerCommunitySet.has(m.community));
  const candidates = away.length >= o.changes ? away : edge.filter((m) => !taken.has(m.name) && !edgeViewers.some((w) => w.site === m.site));
  const step = candidates.length / Math.max(1, o.changes);
  const elsewhere = Array.from({ length: Math.min(o.changes, candidates.length) }, (_, k) => candidates[Math.floor(k * step)] as Member).flatMap(pick);
  // interleaved, one of each kind in turn, so that drift over the run spreads over every kind of change
  const changes: Member[] = [];
  for (let k = 0; k < Math.max(elsewhere.length, local.length, cloudChanges.length); k++) {
    for (const q of [elsewhere, local, cloudChanges]) if (k < q.length) changes.push(q[k] as Member);
  }
  return { cloud, edge, sites, communities, viewers, changes, planned: { away: elsewhere.length, site: sameSite.length, community: sameCommunity.length, cloud: cloudChanges.length, everyCommunityWatched: candidates !== away } };
}

function relation(viewer: Viewer, changed: Member): Relation {
  if (changed.role === 'cloud') return 'cloud node';
  const m = viewer.member;
  if (viewer.kind !== 'edge' || !m) return 'elsewhere';
  if (m.site === changed.site) return 'own site';
  return m.community === changed.community ? 'own community' : 'elsewhere';
}

/** The fields a node joins with: what a real agent publishes (src/agent/agent.ts), with the node's place and address. */
function joinFields(m: Member, ordinal: number): NodeFields {
  const address = formatIpv4(JOIN_ADDRESSES + ordinal);
  const vtepMac = `02:${[24, 16, 8, 0].map((s) => ((ordinal >>> s) & 0xff).toString(16).padStart(2, '0')).join(':')}:00`;
  return {
    site: m.site, community: m.community, addresses: [address], vtepMac, agentVersion: AGENT_VERSION,
    tunnelKey: `sha256:${randomBytes(32).toString('hex')}`,
    annotations: { ...flannelAnnotations(VNI, vtepMac, address), [ROLE_ANNOTATION]: m.role, [TUNNEL_PORT_ANNOTATION]: String(TUNNEL_PORT) },
  };
}

/** The same node after its underlay address moved to `address` (flannel's public-ip annotation with it). */
function movedFields(f: NodeFields, address: string): NodeFields {
  return { ...f, addresses: [address], annotations: { ...f.annotations, [`${FLANNEL_ANNOTATION_PREFIX}/public-ip`]: address } };
}

// ---------------------------------------------------------------------------------------------------------------
// A watch stream, counted

type Auth = { readonly node: string; readonly identity: NodeIdentity } | { readonly token: string };

interface LineTally {
  lines: number;
  bytes: number;
}

/** One viewer's watch stream: every body byte counted, by line type; when each line naming a node arrived. */
class WatchTap {
  readonly viewer: Viewer;
  /** Body bytes so far, and those of lines other than pings (a ping's bytes are counted when its line ends). */
  bytes = 0;
  bytesNoPing = 0;
  lines = 0;
  readonly byType = new Map<string, LineTally>();
  snapshot: { readonly bytes: number; readonly nodes: number; readonly ms: number } | undefined;
  /** Lines naming a node (put, delete, or any line with `node.name` or `name`), with their arrival (performance.now()). */
  readonly named: { readonly name: string; readonly at: number }[] = [];
  ended: string | undefined;
  readonly #abort = new AbortController();
  #pending: Buffer[] = [];
  #pendingBytes = 0;
  #openedAt = 0;

  constructor(viewer: Viewer) {
    this.viewer = viewer;
  }

  /** Opens the stream from revision 0 (a snapshot first); resolves once the controller answered 200. */
  open(url: string, caPem: string, auth: Auth): Promise<void> {
    const path = '/v1/watch?after=0';
    const empty = Buffer.alloc(0);
    // as ControllerClient sends it: a node signs the request with its key (empty body), a relay sends its token
    const headers = 'token' in auth
      ? { 'content-type': 'application/json', 'content-length': '0', authorization: `Bearer ${auth.token}` }
      : { 'content-type': 'application/json', 'content-length': '0', ...signRequest(auth.identity, { method: 'GET', path, node: auth.node, body: empty, now: Date.now() }) };
    this.#openedAt = performance.now();
    return new Promise((resolve, reject) => {
      const req = request(new URL(path, url), { method: 'GET', headers, ca: caPem, agent: false, signal: this.#abort.signal }, (res: IncomingMessage) => {
        if (res.statusCode !== 200) {
          const body: Buffer[] = [];
          res.on('data', (d: Buffer) => body.push(d));
          res.on('end', () => reject(new Error(`watch as ${this.viewer.key}: controller ${url} answered ${res.statusCode}: ${Buffer.concat(body).toString('utf8').slice(0, 500)}`)));
          return;
        }
        resolve();
        res.on('data', (d: Buffer) => this.#data(d, performance.now()));
        res.on('end', () => (this.ended ??= 'the controller ended the stream'));
        res.on('error', (e) => (this.ended ??= e.message));
      });
      req.on('error', (e) => {
        this.ended ??= e.message;
        reject(new Error(`watch as ${this.viewer.key}: controller ${url} unreachable: ${e.message}`, { cause: e }));
      });
      req.end();
    });
  }

  close(): void {
    this.ended ??= 'closed';
    this.#abort.abort();
  }

  /** The first line naming `name` that arrived at or after `since`. */
  arrival(name: string, since: number): number | undefined {
    return this.named.find((l) => l.name === name && l.at >= since)?.at;
  }

  #data(d: Buffer, at: number): void {
    this.bytes += d.length;
    let from = 0;
    for (let nl = d.indexOf(0x0a); nl >= 0; nl = d.indexOf(0x0a, from)) {
      const piece = d.subarray(from, nl + 1);
      const line = this.#pending.length === 0 ? piece : Buffer.concat([...this.#pending, piece], this.#pendingBytes + piece.length);
      this.#pending = [];
      this.#pendingBytes = 0;
      this.#line(line, at);
      from = nl + 1;
    }
    if (from < d.length) {
      this.#pending.push(d.subarray(from));
      this.#pendingBytes += d.length - from;
    }
  }

  /** One whole line, with its newline. Unknown types are counted as they are: a scoped controller may send new ones. */
  #line(line: Buffer, at: number): void {
    this.lines++;
    let v: { type?: unknown; name?: unknown; node?: { name?: unknown }; nodes?: unknown } = {};
    try {
      v = JSON.parse(line.toString('utf8')) as typeof v;
    } catch {
      // counted as "unparsed"
    }
    const type = typeof v.type === 'string' ? v.type : 'unparsed';
    const t = this.byType.get(type) ?? { lines: 0, bytes: 0 };
    t.lines++;
    t.bytes += line.length;
    this.byType.set(type, t);
    if (type !== 'ping') this.bytesNoPing += line.length;
    if (type === 'snapshot' && !this.snapshot) {
      this.snapshot = { bytes: line.length, nodes: Array.isArray(v.nodes) ? v.nodes.length : NaN, ms: at - this.#openedAt };
      return;
    }
    const name = typeof v.node?.name === 'string' ? v.node.name : typeof v.name === 'string' ? v.name : undefined;
    if (name !== undefined) this.named.push({ name, at });
  }
}

// ---------------------------------------------------------------------------------------------------------------
// One run

/** What one viewer received for one change. */
interface ChangeSeen {
  readonly node: string;
  readonly relation: Relation;
  /** Body bytes (pings left out) from this change's PUT to the next one's (or the end). */
  readonly bytes: number;
  readonly received: boolean;
  /** From the PUT's answer, and from when it was sent, to the line naming the node; undefined when none came. */
  readonly fromAnswerMs: number | undefined;
  readonly fromSendMs: number | undefined;
}

interface ViewerRun {
  readonly viewer: string;
  readonly kind: Viewer['kind'];
  readonly site: string;
  readonly community: string;
  readonly snapshotBytes: number;
  readonly snapshotNodes: number;
  /** From sending the watch request to the snapshot line's end. */
  readonly snapshotMs: number;
  readonly totalBytes: number;
  readonly byType: Record<string, LineTally>;
  readonly changes: readonly ChangeSeen[];
}

interface ChangeMade {
  readonly node: string;
  readonly role: Role;
  readonly site: string;
  readonly community: string;
  readonly address: string;
  readonly putMs: number;
  /** How long the change waited for its last viewer (or the settle time). */
  readonly spreadMs: number;
}

interface Run {
  readonly run: number;
  readonly joinMs: number;
  readonly joinAttempts: number;
  readonly changes: readonly ChangeMade[];
  readonly viewers: readonly ViewerRun[];
  readonly loadAtEnd: number[];
}

class Fixture {
  readonly dir: string = mkdtempSync(join(tmpdir(), `${RUN_PREFIX}wview-`));
  readonly procs = new Set<ChildProcess>();
  readonly taps = new Set<WatchTap>();
  #cleaned: Promise<void> | undefined;

  /** Idempotent: closes the streams, kills our processes by PID, removes our directories. */
  cleanup(): Promise<void> {
    this.#cleaned ??= (async () => {
      for (const t of this.taps) t.close();
      for (const p of this.procs) if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
      rmSync(this.dir, { recursive: true, force: true });
      removeRunTempDirs();
    })();
    return this.#cleaned;
  }
}

let changeSeq = 0;

async function oneRun(fx: Fixture, o: Options, topo: Topology, run: number): Promise<Run> {
  const c: Controller = await startController(fx, `run${run}`, { store: { type: 'embedded' }, relayTokens: [RELAY_TOKEN] }, o.atoll);
  const taps: WatchTap[] = [];
  try {
    // the cluster: cloud nodes, then edge nodes, each with its own key, through the real join
    const fields = new Map<string, NodeFields>();
    const keys = new Map<string, NodeIdentity>();
    const t0 = performance.now();
    let attempts = 0;
    for (const [prefix, members, offset] of [[CLOUD_PREFIX, topo.cloud, 0], [EDGE_PREFIX, topo.edge, topo.cloud.length]] as const) {
      const report = await simulateJoins({
        urls: [c.url], caPem: c.caPem, token: BOOTSTRAP_TOKEN, count: members.length, prefix, deadlineMs: o.timeoutS * 1000,
        concurrency: o.concurrency, requestTimeoutMs: 120_000,
        fields: (i, name) => {
          const f = joinFields(members[i] as Member, offset + i);
          fields.set(name, f);
          return f;
        },
        onJoined: (j: JoinedNode) => keys.set(j.name, j.identity),
      });
      attempts += report.attempts;
      if (report.failed > 0) throw new Error(`${report.failed} of ${members.length} nodes (${prefix}*) failed to join: ${JSON.stringify(report.errors.slice(0, 5))}`);
      const noBlock = Object.entries(report.blocks).filter(([, b]) => b.length === 0).map(([n]) => n);
      if (noBlock.length > 0) throw new Error(`the join gave ${noBlock.length} nodes no block (${noBlock.slice(0, 5).join(', ')})`);
    }
    const joinMs = performance.now() - t0;
    process.stderr.write(`#   run ${run + 1}: ${o.nodes} nodes joined in ${(joinMs / 1000).toFixed(1)} s\n`);

    // the viewers' streams, each signed as its node (the relay with its token)
    for (const v of topo.viewers) {
      const tap = new WatchTap(v);
      taps.push(tap);
      fx.taps.add(tap);
    }
    await Promise.all(taps.map((t) => t.open(c.url, c.caPem, t.viewer.member ? { node: t.viewer.key, identity: keys.get(t.viewer.key) as NodeIdentity } : { token: RELAY_TOKEN })));
    await waitFor('every viewer\'s snapshot line', () => taps.every((t) => t.snapshot !== undefined), 120_000, taps);
    const relay = taps.find((t) => t.viewer.kind === 'relay') as WatchTap;
    if (relay.snapshot?.nodes !== o.nodes) throw new Error(`the relay's snapshot lists ${relay.snapshot?.nodes} nodes, not the ${o.nodes} that joined`);

    // the changes, one at a time; each viewer's byte count is read at every PUT
    const made: ChangeMade[] = [];
    const marks: number[][] = []; // marks[i][v]: viewer v's bytes (no pings) when change i was sent
    const times: { sent: number; answered: number }[] = [];
    for (const m of topo.changes) {
      const address = formatIpv4(CHANGE_ADDRESSES + changeSeq++);
      const next = movedFields(fields.get(m.name) as NodeFields, address);
      const client = new ControllerClient({ urls: [c.url], caPem: c.caPem, identity: keys.get(m.name) as NodeIdentity, nodeName: m.name });
      marks.push(taps.map((t) => t.bytesNoPing));
      const sent = performance.now();
      let answered: number;
      try {
        await client.update(next);
        answered = performance.now();
      } finally {
        client.close();
      }
      fields.set(m.name, next);
      times.push({ sent, answered });
      await waitFor(`node ${m.name}'s change to reach the viewers`, () => {
        if (taps.every((t) => t.arrival(m.name, sent) !== undefined)) return true;
        const r = relay.arrival(m.name, sent);
        return r !== undefined && performance.now() - r >= o.settleMs;
      }, 60_000, taps, 2);
      made.push({ node: m.name, role: m.role, site: m.site, community: m.community, address, putMs: answered - sent, spreadMs: performance.now() - sent });
    }
    await sleep(Math.min(o.settleMs, 200)); // stragglers of the last change
    const end = taps.map((t) => t.bytesNoPing);

    const viewers = taps.map((t, vi): ViewerRun => ({
      viewer: t.viewer.key, kind: t.viewer.kind, site: t.viewer.member?.site ?? '', community: t.viewer.member?.community ?? '',
      snapshotBytes: t.snapshot?.bytes ?? NaN, snapshotNodes: t.snapshot?.nodes ?? NaN, snapshotMs: t.snapshot?.ms ?? NaN,
      totalBytes: t.bytes, byType: Object.fromEntries(t.byType),
      changes: topo.changes.map((m, i): ChangeSeen => {
        const at = t.arrival(m.name, (times[i] as { sent: number }).sent);
        const { sent, answered } = times[i] as { sent: number; answered: number };
        return {
          node: m.name, relation: relation(t.viewer, m), bytes: ((marks[i + 1] ?? end)[vi] as number) - ((marks[i] as number[])[vi] as number), received: at !== undefined,
          fromAnswerMs: at === undefined ? undefined : at - answered, fromSendMs: at === undefined ? undefined : at - sent,
        };
      }),
    }));
    return { run, joinMs, joinAttempts: attempts, changes: made, viewers, loadAtEnd: loadavg() };
  } finally {
    for (const t of taps) {
      t.close();
      fx.taps.delete(t);
    }
    await stopController(fx, c);
  }
}

/** Polls `fn` every `stepMs`; throws naming `what` (and any stream that ended) after `timeoutMs`. */
async function waitFor(what: string, fn: () => boolean, timeoutMs: number, taps: readonly WatchTap[], stepMs = 20): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  while (!fn()) {
    const ended = taps.filter((t) => t.ended !== undefined).map((t) => `${t.viewer.key}: ${t.ended}`);
    if (ended.length > 0) throw new Error(`waiting for ${what}, watch streams ended: ${ended.join('; ')}`);
    if (performance.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(stepMs);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Summary: per viewer, the median over runs of each run's figure

interface ViewerSummary {
  readonly viewer: string;
  readonly kind: Viewer['kind'];
  readonly place: string;
  readonly snapshotNodes: number;
  readonly snapshotBytes: number;
  readonly snapshotMs: number;
  /** Median bytes per change, by relation; NaN when no change had it. */
  readonly perChange: Record<Relation, number>;
  readonly received: number;
  readonly changes: number;
  readonly p50Ms: number;
  readonly p99Ms: number;
}

function summarize(runs: readonly Run[]): ViewerSummary[] {
  const first = runs[0];
  if (!first) return [];
  return first.viewers.map((v0, vi) => {
    const mine = runs.map((r) => r.viewers[vi] as ViewerRun);
    const perRun = <T>(f: (v: ViewerRun) => T) => mine.map(f);
    const perChange = Object.fromEntries(RELATIONS.map((rel) => [rel, median(perRun((v) => median(v.changes.filter((c) => c.relation === rel).map((c) => c.bytes))).filter(Number.isFinite))])) as Record<Relation, number>;
    const delays = (v: ViewerRun) => v.changes.flatMap((c) => (c.fromAnswerMs === undefined ? [] : [c.fromAnswerMs]));
    return {
      viewer: v0.viewer, kind: v0.kind, place: v0.kind === 'relay' ? '(all)' : v0.kind === 'cloud' ? 'cloud' : `${v0.site} ${v0.community}`,
      snapshotNodes: median(perRun((v) => v.snapshotNodes)), snapshotBytes: median(perRun((v) => v.snapshotBytes)), snapshotMs: median(perRun((v) => v.snapshotMs)),
      perChange,
      received: median(perRun((v) => v.changes.filter((c) => c.received).length)), changes: median(perRun((v) => v.changes.length)),
      p50Ms: median(perRun((v) => nearestRank(delays(v), 50))), p99Ms: median(perRun((v) => nearestRank(delays(v), 99))),
    };
  });
}

function report(o: Options, topo: Topology, runs: readonly Run[], summary: readonly ViewerSummary[]): string {
  const kib = (b: number) => fmt(b / 1024, 1);
  const head = ['viewer', 'place', 'snapshot nodes', 'join KiB', 'join ms', ...RELATIONS.map((r) => `B/change ${r}`), 'received', 'p50 ms', 'p99 ms'];
  const rows = summary.map((s) => [s.viewer, s.place, fmt(s.snapshotNodes, 0), kib(s.snapshotBytes), fmt(s.snapshotMs, 0), ...RELATIONS.map((r) => fmt(s.perChange[r], 0)),
    `${fmt(s.received, 0)}/${fmt(s.changes, 0)}`, fmt(s.p50Ms, 1), fmt(s.p99Ms, 1)]);
  return [
    `\n## What each viewer receives (${o.nodes} nodes: ${topo.cloud.length} cloud, ${topo.edge.length} edge in ${topo.sites} sites of ${o.siteSize}, ` +
      `${topo.communities} communities of ${o.communitySites} sites; medians over ${runs.length} run(s))\n`,
    `changes per run: ${topo.changes.length} (${topo.planned.away} edge nodes away from the edge viewers` +
      `${topo.planned.everyCommunityWatched ? ' (every community has a viewer: other sites of theirs)' : ''}, ${topo.planned.community} in their communities, ` +
      `${topo.planned.site} in their sites, ${topo.planned.cloud} cloud nodes); join = the snapshot line; B/change = body bytes, pings left out, ` +
      'median over the changes of that kind; p50/p99 = from the PUT\'s answer to the line naming the node\n',
    table([head, ...rows], 2),
    `\njoin phase ${runs.map((r) => `${(r.joinMs / 1000).toFixed(1)} s`).join(', ')}; PUT p50 ${fmt(median(runs.flatMap((r) => r.changes.map((c) => c.putMs))), 1)} ms`,
  ].join('\n');
}

// ---------------------------------------------------------------------------------------------------------------
// Main

async function main(): Promise<number> {
  const o = parseOptions(process.argv.slice(2));
  const topo = topology(o);
  const fx = new Fixture();
  const watchdog = cleanUpOnExit(fx, o.timeoutS);
  const machine = { cpus: cpus().length, cpu: cpus()[0]?.model, kernel: release(), node: spawnSync(PROJECT_NODE, ['--version'], { encoding: 'utf8' }).stdout.trim(), loadAtStart: loadavg() };
  process.stdout.write(`# watch-view: ${o.nodes} nodes (${o.cloud} cloud), ${topo.viewers.length} viewers, ${topo.changes.length} changes x ${o.runs} run(s); ` +
    `${machine.cpus} CPUs, node ${machine.node}, load ${machine.loadAtStart.map((l) => l.toFixed(2)).join(' ')}\n`);
  try {
    const runs: Run[] = [];
    for (let r = 0; r < o.runs; r++) runs.push(await oneRun(fx, o, topo, r));
    const summary = summarize(runs);
    process.stdout.write(`${report(o, topo, runs, summary)}\n`);
    if (o.json) {
      writeFileSync(o.json, JSON.stringify({
        options: o, machine: { ...machine, loadAtEnd: loadavg() },
        topology: { sites: topo.sites, communities: topo.communities, viewers: topo.viewers.map((v) => ({ key: v.key, kind: v.kind, ...v.member })), changes: topo.changes },
        summary, runs,
      }, null, 2));
    }
    process.stdout.write(`\n# load at end ${loadavg().map((l) => l.toFixed(2)).join(' ')}\n`);
    return 0;
  } finally {
    clearTimeout(watchdog);
    await fx.cleanup();
  }
}

runBench(main);
