/**
 * Each agent's view of the registry: the nodes it can use, and the changes to them as watch lines. Pure.
 *
 * An edge node uses its own site (the overlay), its community's edge nodes (hole-punched paths), every cloud node
 * (dialled) and nodes whose site is not known (the overlay probes them); a node of another site and community can
 * never be its peer (src/core/tunnel/plan.ts refuses the pair), so it is not sent. A cloud node routes to every edge,
 * and a node without a tunnel role or a site cannot tell which nodes are remote: both see everything, as does the
 * relay.
 *
 * {@link NodeViews} holds the registry as one controller replica sees it (fed by one watch on the store), a bounded
 * history of its changes, and the streams of its watchers, indexed by site and community so that a change costs
 * only the watchers it concerns: a line is built once per change and handed to each of them.
 */
import type { NodeRecord } from './model.ts';
import { roleOf } from '../tunnel/plan.ts';

/** What one watcher sees: everything, or what an edge node of `site` (and `community`) can use. */
export type ViewScope =
  | { readonly all: true; readonly name: string | undefined }
  | { readonly all: false; readonly name: string; readonly site: string; readonly community: string };

/** What decides a node's place in views: its name, site, community and tunnel role (an annotation). */
export type ViewPlace = Pick<NodeRecord, 'name' | 'site' | 'community' | 'annotations'>;

/** The scope of a watch by node `viewer` (its record as registered), or by a relay (`undefined`): everything. */
export function viewScope(viewer: ViewPlace | undefined): ViewScope {
  if (!viewer || roleOf(viewer) !== 'edge' || viewer.site === '') return { all: true, name: viewer?.name };
  return { all: false, name: viewer.name, site: viewer.site, community: viewer.community };
}

/** Whether `node` is in a watcher's view of `scope`. */
export function inView(scope: ViewScope, node: ViewPlace): boolean {
  if (scope.all || node.name === scope.name || node.site === '' || node.site === scope.site) return true;
  if (roleOf(node) === 'cloud') return true;
  return scope.community !== '' && node.community === scope.community;
}

/** Whether a node's record changed in a way that changes what it sees. */
function rescoped(before: NodeRecord, after: NodeRecord): boolean {
  return before.site !== after.site || before.community !== after.community || roleOf(before) !== roleOf(after);
}

/** One line of the watch stream, serialised once for every watcher that gets it. */
export type ViewLine =
  | { readonly type: 'snapshot'; readonly revision: number; readonly nodes: readonly NodeRecord[] }
  | { readonly type: 'put'; readonly node: NodeRecord; readonly revision: number }
  | { readonly type: 'delete'; readonly name: string; readonly revision: number };

/** A change of the registry: the record before and after (`undefined`: absent), at a store revision. */
export interface NodeChange {
  readonly revision: number;
  readonly name: string;
  readonly before: NodeRecord | undefined;
  readonly after: NodeRecord | undefined;
}

/** A watcher's stream: `send` gets each line with its text (JSON, no newline). */
export interface ViewSink {
  send(line: ViewLine, text: string): void;
}

interface Watcher {
  scope: ViewScope;
  readonly sink: ViewSink;
}

/** What a watcher resuming after a revision gets: the changes it missed, or a snapshot when the history lacks them. */
export type Resume = { readonly kind: 'changes'; readonly lines: readonly ViewLine[] } | { readonly kind: 'snapshot'; readonly line: ViewLine };

/**
 * The registry and its watchers, as one controller replica holds them. Feed it the store's changes in order
 * ({@link NodeViews.apply}); it keeps the last `historyLength` changes for watchers that resume.
 */
export class NodeViews {
  readonly #nodes = new Map<string, NodeRecord>();
  /** Names of nodes by site and by community, cloud nodes, and nodes without a site: a scope's members. */
  readonly #bySite = new Map<string, Set<string>>();
  readonly #byCommunity = new Map<string, Set<string>>();
  readonly #cloud = new Set<string>();
  /** The changes kept for resuming watchers, oldest first, from index `#historyStart` (dropped in chunks). */
  readonly #history: NodeChange[] = [];
  #historyStart = 0;
  readonly #historyLength: number;
  /** The history holds every change after this revision. */
  #historyFrom = 0;
  #revision = 0;
  readonly #watchers = new Set<Watcher>();
  /** Watchers that see everything, and scoped watchers by their site and community. */
  readonly #allWatchers = new Set<Watcher>();
  readonly #watchersBySite = new Map<string, Set<Watcher>>();
  readonly #watchersByCommunity = new Map<string, Set<Watcher>>();

  constructor(historyLength: number) {
    this.#historyLength = historyLength;
  }

  /** The revision the views are at. */
  get revision(): number {
    return this.#revision;
  }

  get size(): number {
    return this.#nodes.size;
  }

  get watchers(): number {
    return this.#watchers.size;
  }

  node(name: string): NodeRecord | undefined {
    return this.#nodes.get(name);
  }

  /** Every node, in no order. */
  nodes(): IterableIterator<NodeRecord> {
    return this.#nodes.values();
  }

  /**
   * Starts over from a listing of the store at `revision` (at start, or after the store compacted the changes the
   * views missed): every watcher gets a snapshot, as what it holds may have missed changes.
   */
  load(nodes: readonly NodeRecord[], revision: number): void {
    for (const n of [...this.#nodes.values()]) this.#remove(n);
    for (const n of nodes) this.#add(n);
    this.#history.length = 0;
    this.#historyStart = 0;
    this.#historyFrom = revision;
    this.#revision = revision;
    for (const w of this.#watchers) {
      const own = w.scope.name === undefined ? undefined : this.#nodes.get(w.scope.name);
      if (own) this.#rescope(w, own);
      this.#sendSnapshot(w);
    }
  }

  /** Applies the store's changes (a put's record, or a delete), in order; each goes to the watchers it concerns. */
  apply(changes: readonly { readonly revision: number; readonly name: string; readonly after: NodeRecord | undefined }[]): void {
    for (const c of changes) {
      if (c.revision <= this.#revision) continue;
      const before = this.#nodes.get(c.name);
      if (before) this.#remove(before);
      if (c.after) this.#add(c.after);
      this.#revision = c.revision;
      const change: NodeChange = { revision: c.revision, name: c.name, before, after: c.after };
      this.#remember(change);
      this.#fanOut(change);
    }
  }

  /** The snapshot line of `scope`'s view now. */
  snapshot(scope: ViewScope): ViewLine {
    return { type: 'snapshot', revision: this.#revision, nodes: this.#members(scope) };
  }

  /**
   * What a watcher of `scope` that holds the views as of revision `after` is missing: the lines of the changes since
   * (a put for each node now in its view, a delete for each that was and is no more), or a snapshot when the history
   * no longer reaches back to `after`, when `after` is ahead of these views (a store restored from a backup), or when
   * the watcher's own node moved meanwhile (what it holds is another view's).
   */
  resume(scope: ViewScope, after: number): Resume {
    if (after < this.#historyFrom || after > this.#revision) return { kind: 'snapshot', line: this.snapshot(scope) };
    const lines: ViewLine[] = [];
    for (let i = this.#firstAfter(after); i < this.#history.length; i++) {
      const c = this.#history[i] as NodeChange;
      if (c.name === scope.name && c.before && c.after && rescoped(c.before, c.after)) return { kind: 'snapshot', line: this.snapshot(scope) };
      const line = lineFor(scope, c);
      if (line) lines.push(line);
    }
    return { kind: 'changes', lines };
  }

  /** Starts sending `sink` the changes to `scope`'s view from now on; returns the function that stops it. */
  watch(scope: ViewScope, sink: ViewSink): () => void {
    const w: Watcher = { scope, sink };
    this.#watchers.add(w);
    this.#index(w, true);
    return () => {
      if (this.#watchers.delete(w)) this.#index(w, false);
    };
  }

  #remember(change: NodeChange): void {
    this.#history.push(change);
    if (this.#history.length - this.#historyStart <= this.#historyLength) return;
    this.#historyFrom = (this.#history[this.#historyStart] as NodeChange).revision;
    this.#historyStart++;
    if (this.#historyStart >= this.#historyLength) {
      this.#history.splice(0, this.#historyStart);
      this.#historyStart = 0;
    }
  }

  /** The index in the history of the first change after revision `after` (a binary search: revisions ascend). */
  #firstAfter(after: number): number {
    let lo = this.#historyStart;
    let hi = this.#history.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if ((this.#history[mid] as NodeChange).revision <= after) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }

  #rescope(w: Watcher, own: NodeRecord): void {
    this.#index(w, false);
    w.scope = viewScope(own);
    this.#index(w, true);
  }

  #fanOut(c: NodeChange): void {
    const texts = new Map<ViewLine['type'], string>();
    const text = (line: ViewLine) => {
      let t = texts.get(line.type);
      if (t === undefined) texts.set(line.type, t = JSON.stringify(line));
      return t;
    };
    for (const w of this.#concerned(c)) {
      if (c.name === w.scope.name && c.before && c.after && rescoped(c.before, c.after)) {
        // the watcher itself moved (a new site, community or role): its whole view changes
        this.#rescope(w, c.after);
        this.#sendSnapshot(w);
        continue;
      }
      const line = lineFor(w.scope, c);
      if (line) w.sink.send(line, text(line));
    }
  }

  /** The watchers a change may concern: a superset, each then checked exactly. */
  #concerned(c: NodeChange): Iterable<Watcher> {
    const records = [c.before, c.after].filter((r): r is NodeRecord => r !== undefined);
    if (records.some((r) => r.site === '' || roleOf(r) === 'cloud')) return [...this.#watchers];
    const out = new Set(this.#allWatchers);
    for (const r of records) {
      for (const w of this.#watchersBySite.get(r.site) ?? []) out.add(w);
      if (r.community !== '') for (const w of this.#watchersByCommunity.get(r.community) ?? []) out.add(w);
    }
    return out;
  }

  #sendSnapshot(w: Watcher): void {
    const line = this.snapshot(w.scope);
    w.sink.send(line, JSON.stringify(line));
  }

  #members(scope: ViewScope): NodeRecord[] {
    if (scope.all) return [...this.#nodes.values()];
    const names = new Set([...this.#bySite.get('') ?? [], ...this.#bySite.get(scope.site) ?? [], ...this.#cloud]);
    if (scope.community !== '') for (const n of this.#byCommunity.get(scope.community) ?? []) names.add(n);
    names.add(scope.name);
    return [...names].flatMap((n) => this.#nodes.get(n) ?? []);
  }

  #add(n: NodeRecord): void {
    this.#nodes.set(n.name, n);
    setIn(this.#bySite, n.site).add(n.name);
    if (n.community !== '') setIn(this.#byCommunity, n.community).add(n.name);
    if (roleOf(n) === 'cloud') this.#cloud.add(n.name);
  }

  #remove(n: NodeRecord): void {
    this.#nodes.delete(n.name);
    dropFrom(this.#bySite, n.site, n.name);
    dropFrom(this.#byCommunity, n.community, n.name);
    this.#cloud.delete(n.name);
  }

  #index(w: Watcher, add: boolean): void {
    const s = w.scope;
    if (s.all) {
      if (add) this.#allWatchers.add(w);
      else this.#allWatchers.delete(w);
      return;
    }
    if (add) {
      setIn(this.#watchersBySite, s.site).add(w);
      if (s.community !== '') setIn(this.#watchersByCommunity, s.community).add(w);
    } else {
      dropFrom(this.#watchersBySite, s.site, w);
      dropFrom(this.#watchersByCommunity, s.community, w);
    }
  }
}

/** The line a change makes in `scope`'s view: a put when the node is in it now, a delete when it was and is no more. */
function lineFor(scope: ViewScope, c: NodeChange): ViewLine | undefined {
  if (c.after && inView(scope, c.after)) return { type: 'put', node: c.after, revision: c.revision };
  if (c.before && inView(scope, c.before)) return { type: 'delete', name: c.name, revision: c.revision };
  return undefined;
}

function setIn<K, V>(m: Map<K, Set<V>>, k: K): Set<V> {
  let s = m.get(k);
  if (!s) m.set(k, s = new Set());
  return s;
}

function dropFrom<K, V>(m: Map<K, Set<V>>, k: K, v: V): void {
  const s = m.get(k);
  if (!s) return;
  s.delete(v);
  if (s.size === 0) m.delete(k);
}
