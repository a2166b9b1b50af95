import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { NodeRecord } from './model.ts';
import { inView, NodeViews, type ViewLine, viewScope } from './view.ts';
import { ROLE_ANNOTATION } from '../tunnel/plan.ts';

const rec = (name: string, site: string, community: string, role: 'cloud' | 'edge' | '', extra: Partial<NodeRecord> = {}): NodeRecord => ({
  name, identity: '', site, community, addresses: ['192.0.2.1'], observedAddress: '', vtepMac: '', tunnelKey: '', agentVersion: '',
  annotations: role ? { [ROLE_ANNOTATION]: role } : {}, blocks: [], registeredAt: 0, updatedAt: 0, ...extra,
});

/** Two clouds; communities c1 and c2 of two sites each, two nodes a site. */
function topology(): NodeRecord[] {
  const out = [rec('cloud-1', 'cloud', '', 'cloud'), rec('cloud-2', 'cloud', '', 'cloud')];
  for (const [community, sites] of [['c1', ['s1', 's2']], ['c2', ['s3', 's4']]] as const) {
    for (const site of sites) for (const i of [1, 2]) out.push(rec(`${site}-${i}`, site, community, 'edge'));
  }
  return out;
}

class Sink {
  readonly lines: ViewLine[] = [];
  readonly texts: string[] = [];
  send(line: ViewLine, text: string): void {
    this.lines.push(line);
    this.texts.push(text);
  }
}

const names = (line: ViewLine | undefined) => (line?.type === 'snapshot' ? line.nodes.map((n) => n.name).sort() : []);

test('an edge node sees its site, its community, the clouds and nodes of no site; a cloud node, a relay or a node without a role or site sees all', () => {
  const edge = viewScope(rec('s1-1', 's1', 'c1', 'edge'));
  assert.equal(edge.all, false);
  assert.equal(inView(edge, rec('s1-2', 's1', 'c1', 'edge')), true);
  assert.equal(inView(edge, rec('s2-1', 's2', 'c1', 'edge')), true);
  assert.equal(inView(edge, rec('s3-1', 's3', 'c2', 'edge')), false);
  assert.equal(inView(edge, rec('cloud-1', 'cloud', '', 'cloud')), true);
  assert.equal(inView(edge, rec('x', '', '', 'edge')), true);
  assert.equal(inView(edge, rec('norole', 's9', '', '')), false);
  assert.equal(inView(viewScope(rec('s5-1', 's5', '', 'edge')), rec('s1-1', 's1', 'c1', 'edge')), false, 'no community: only its site and the clouds');
  for (const all of [undefined, rec('cloud-1', 'cloud', '', 'cloud'), rec('n', 's1', 'c1', ''), rec('e', '', 'c1', 'edge')]) {
    assert.equal(viewScope(all).all, true, JSON.stringify(all?.name));
  }
});

test('a snapshot holds exactly the view', () => {
  const v = new NodeViews(100);
  v.load(topology(), 7);
  assert.deepEqual(names(v.snapshot(viewScope(v.node('s1-1')))), ['cloud-1', 'cloud-2', 's1-1', 's1-2', 's2-1', 's2-2']);
  assert.equal(v.snapshot(viewScope(v.node('s1-1'))).type === 'snapshot' && v.snapshot(viewScope(undefined)).revision, 7);
  assert.equal(names(v.snapshot(viewScope(v.node('cloud-1')))).length, 10);
});

test('a change goes only to the watchers whose view it is in, as one text built once', () => {
  const v = new NodeViews(100);
  v.load(topology(), 1);
  const sinks = new Map(['cloud-1', 's1-1', 's2-1', 's3-1'].map((n) => [n, new Sink()]));
  for (const [n, sink] of sinks) v.watch(viewScope(v.node(n)), sink);
  const relay = new Sink();
  v.watch(viewScope(undefined), relay);
  v.apply([{ revision: 2, name: 's3-2', after: rec('s3-2', 's3', 'c2', 'edge', { addresses: ['192.0.2.9'] }) }]);
  assert.deepEqual([...sinks].filter(([, s]) => s.lines.length > 0).map(([n]) => n), ['cloud-1', 's3-1']);
  assert.equal(relay.lines.length, 1);
  assert.equal(sinks.get('s3-1')?.texts[0], relay.texts[0]);
  assert.deepEqual(JSON.parse(relay.texts[0] as string), relay.lines[0]);
  // a cloud node's change goes to everyone
  v.apply([{ revision: 3, name: 'cloud-2', after: rec('cloud-2', 'cloud', '', 'cloud', { addresses: ['192.0.2.8'] }) }]);
  assert.deepEqual([...sinks].map(([, s]) => s.lines.at(-1)?.revision), [3, 3, 3, 3]);
  // changes of an earlier revision than the views' are ignored (a replayed watch)
  v.apply([{ revision: 3, name: 's1-2', after: undefined }]);
  assert.equal(v.node('s1-2')?.name, 's1-2');
});

test('a node that moves to another community is deleted from the old one\'s views and put into the new one\'s', () => {
  const v = new NodeViews(100);
  v.load(topology(), 1);
  const inC1 = new Sink();
  const inC2 = new Sink();
  v.watch(viewScope(v.node('s2-1')), inC1);
  v.watch(viewScope(v.node('s3-1')), inC2);
  v.apply([{ revision: 5, name: 's1-1', after: rec('s1-1', 's1', 'c2', 'edge') }]);
  assert.deepEqual(inC1.lines, [{ type: 'delete', name: 's1-1', revision: 5 }]);
  assert.deepEqual(inC2.lines.map((l) => l.type), ['put']);
  v.apply([{ revision: 6, name: 's1-1', after: undefined }]);
  assert.equal(inC1.lines.length, 1, 'nothing more for a node it no longer sees');
  assert.deepEqual(inC2.lines.at(-1), { type: 'delete', name: 's1-1', revision: 6 });
});

test('a watcher whose own node moves gets a snapshot of its new view, and the new view\'s changes after it', () => {
  const v = new NodeViews(100);
  v.load(topology(), 1);
  const sink = new Sink();
  v.watch(viewScope(v.node('s1-1')), sink);
  v.apply([{ revision: 2, name: 's1-1', after: rec('s1-1', 's1', 'c2', 'edge') }]);
  assert.equal(sink.lines[0]?.type, 'snapshot');
  assert.deepEqual(names(sink.lines[0]), ['cloud-1', 'cloud-2', 's1-1', 's1-2', 's3-1', 's3-2', 's4-1', 's4-2']);
  v.apply([{ revision: 3, name: 's2-1', after: rec('s2-1', 's2', 'c1', 'edge', { addresses: ['192.0.2.7'] }) }]);
  v.apply([{ revision: 4, name: 's4-1', after: rec('s4-1', 's4', 'c2', 'edge', { addresses: ['192.0.2.7'] }) }]);
  assert.deepEqual(sink.lines.slice(1).map((l) => l.revision), [4]);
});

test('a watcher resumes from its revision while the history reaches back to it, and gets a snapshot otherwise', () => {
  const v = new NodeViews(3);
  v.load(topology(), 10);
  const scope = viewScope(v.node('s1-1'));
  for (let r = 11; r <= 20; r++) v.apply([{ revision: r, name: r % 2 ? 's1-2' : 's3-1', after: rec(r % 2 ? 's1-2' : 's3-1', r % 2 ? 's1' : 's3', r % 2 ? 'c1' : 'c2', 'edge', { updatedAt: r }) }]);
  const recent = v.resume(scope, 18);
  assert.equal(recent.kind, 'changes');
  assert.deepEqual(recent.kind === 'changes' && recent.lines.map((l) => l.revision), [19], 'only its own view\'s changes');
  assert.deepEqual(v.resume(scope, 20), { kind: 'changes', lines: [] });
  assert.equal(v.resume(scope, 17).kind, 'changes', 'the last 3 changes are kept');
  assert.equal(v.resume(scope, 16).kind, 'snapshot', 'older ones are gone');
  assert.equal(v.resume(scope, 21).kind, 'snapshot', 'a revision ahead of the views');
  // the history drops its oldest in chunks; what it keeps stays in order
  for (let r = 21; r <= 40; r++) v.apply([{ revision: r, name: 's1-2', after: rec('s1-2', 's1', 'c1', 'edge', { updatedAt: r }) }]);
  const tail = v.resume(scope, 37);
  assert.deepEqual(tail.kind === 'changes' && tail.lines.map((l) => l.revision), [38, 39, 40]);
});

test('a watcher whose own node moved while it was away resumes with a snapshot of its new view', () => {
  const v = new NodeViews(100);
  v.load(topology(), 10);
  v.apply([{ revision: 11, name: 's1-1', after: rec('s1-1', 's1', 'c2', 'edge') }]);
  const r = v.resume(viewScope(v.node('s1-1')), 10);
  assert.equal(r.kind, 'snapshot');
  assert.deepEqual(r.kind === 'snapshot' && names(r.line), ['cloud-1', 'cloud-2', 's1-1', 's1-2', 's3-1', 's3-2', 's4-1', 's4-2']);
  assert.equal(v.resume(viewScope(v.node('s2-1')), 10).kind, 'changes', 'another watcher resumes with the changes');
});

test('loading a fresh listing (the store compacted what the views missed) sends every watcher a snapshot', () => {
  const v = new NodeViews(100);
  v.load(topology(), 1);
  const sink = new Sink();
  v.watch(viewScope(v.node('s1-1')), sink);
  v.load(topology().filter((n) => n.name !== 's2-2'), 50);
  assert.deepEqual(sink.lines.map((l) => [l.type, l.revision]), [['snapshot', 50]]);
  assert.deepEqual(names(sink.lines[0]), ['cloud-1', 'cloud-2', 's1-1', 's1-2', 's2-1']);
});

test('a watcher that stops gets nothing more', () => {
  const v = new NodeViews(100);
  v.load(topology(), 1);
  const sink = new Sink();
  const stop = v.watch(viewScope(undefined), sink);
  stop();
  v.apply([{ revision: 2, name: 'cloud-1', after: undefined }]);
  assert.equal(sink.lines.length, 0);
  assert.equal(v.watchers, 0);
});
