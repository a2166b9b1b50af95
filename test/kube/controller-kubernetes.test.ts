/**
 * The controller on a real kube-apiserver (v1.34, with etcd 3.6; harness/kube.ts), installed from
 * deploy/atoll.yaml and running under the atoll-controller ServiceAccount's token, so RBAC is the manifest's: a
 * missing permission fails here. It reaches the API through a loopback proxy set as `kubernetes.server`, as it would
 * through an edge cache (yurthub). Nodes admit agents, labels and Communities place them, a label change moves a
 * node, network state is published as annotations, a deleted Node releases its blocks after the grace period, bad
 * labels and Communities change nothing, and the API server killed for 60 s changes nothing.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer, connect, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Controller } from '../../src/controller/controller.ts';
import { parseControllerConfig } from '../../src/config/controller-config.ts';
import { jsonLogger } from '../../src/adapters/ops/json-logger.ts';
import { ControllerClient } from '../../src/adapters/node/controller-client.ts';
import type { NodeFields, NodeRecord } from '../../src/core/cluster/model.ts';
import { ROLE_ANNOTATION } from '../../src/core/tunnel/plan.ts';
import { HeldPolicyView, type PolicyLine } from '../../src/core/policy/scope.ts';
import { ENFORCES_ANNOTATION } from '../../src/core/policy/reuse.ts';
import { memoryIdentity } from '../../harness/join-simulator.ts';
import { freePort } from '../../harness/ports.ts';
import { until } from '../../harness/wait.ts';
import { startControlPlane, type ControlPlane } from '../../harness/kube.ts';

const BOOTSTRAP = 'atoll-test-bootstrap-0123456789';
const ADMIN = 'atoll-test-admin-0123456789abcdef';
const NS = 'atoll-system';

/** A TCP proxy on loopback to the API server: what an edge cache would be to the controller. */
function startProxy(target: URL): Promise<{ url: string; server: Server; sockets: Set<Socket> }> {
  const sockets = new Set<Socket>();
  const server = createServer((c) => {
    const up = connect(Number(target.port), target.hostname);
    for (const s of [c, up]) {
      sockets.add(s);
      s.on('close', () => sockets.delete(s));
      s.on('error', () => { c.destroy(); up.destroy(); });
    }
    c.pipe(up).pipe(c);
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve({ url: `https://127.0.0.1:${(server.address() as { port: number }).port}`, server, sockets })));
}

describe('the controller on a real kube-apiserver', { timeout: 400_000 }, () => {
  const dir = mkdtempSync(join(tmpdir(), 'atoll-kube-'));
  let cp: ControlPlane;
  let proxy: Awaited<ReturnType<typeof startProxy>>;
  let controller: Controller;
  let url = '';
  let agentCa = '';
  const logs: Record<string, unknown>[] = [];

  const node = (name: string, labels: Record<string, string>) =>
    cp.admin.create('/api/v1/nodes', { apiVersion: 'v1', kind: 'Node', metadata: { name, labels } });
  const fields = (over: Partial<NodeFields> = {}): NodeFields => ({
    site: 'claimed-by-agent', community: '', addresses: ['192.0.2.50'], vtepMac: '02:00:00:00:00:01', tunnelKey: 'sha256:' + 'ab'.repeat(32),
    agentVersion: 'test', annotations: { [ROLE_ANNOTATION]: 'cloud' }, ...over,
  });
  const record = async (name: string) => controller.registry?.node(name);
  const kubeNode = async (name: string) => cp.admin.get<{ metadata: { annotations?: Record<string, string> } }>(`/api/v1/nodes/${name}`);

  before(async () => {
    cp = await startControlPlane(dir);
    cp.kubectl(['create', 'namespace', NS]);
    cp.kubectl(['apply', '--server-side', '-f', 'deploy/atoll.yaml']);
    cp.kubectl(['wait', '--for=condition=Established', '--timeout=60s', 'crd/communities.atoll.dev']);
    proxy = await startProxy(new URL(cp.server));
    const token = await cp.serviceAccountToken(NS, 'atoll-controller');
    const port = await freePort();
    url = `https://127.0.0.1:${port}`;
    await node('cloud-1', { 'atoll.dev/site': 'cloud' });
    await node('edge-a1', { 'node-role.kubernetes.io/edge': '', 'atoll.dev/site': 'a', 'atoll.dev/community': 'c1' });
    await node('edge-b1', { 'openyurt.io/is-edge-worker': 'true', 'topology.kubernetes.io/zone': 'b' });
    await cp.admin.create('/apis/atoll.dev/v1alpha1/communities', { apiVersion: 'atoll.dev/v1alpha1', kind: 'Community', metadata: { name: 'c1' }, spec: { members: ['edge-b1'] } });
    const cfg = parseControllerConfig({
      listenHost: '127.0.0.1', listenPort: port, advertiseUrl: url, clusterCidrs: ['10.100.0.0/16'], blockBits: 26,
      dataDir: join(dir, 'controller'), bootstrapTokens: [BOOTSTRAP], adminToken: ADMIN,
      kubernetes: { kubeconfig: cp.kubeconfig(token, 'atoll-controller'), server: proxy.url, nodeDeleteGraceSeconds: 3 },
    });
    const log = jsonLogger({ level: 'debug', write: (line) => logs.push(JSON.parse(line) as Record<string, unknown>) });
    controller = new Controller({ log, clock: Date.now }, cfg);
    await controller.start();
    // agents pin the CA; these test agents read it from the controller's directory
    agentCa = readFileSync(join(dir, 'controller', 'pki', 'ca.crt'), 'utf8');
  });
  const clients = new Map<string, ControllerClient>();
  const joined = (name: string, f: NodeFields = fields()) => {
    const identity = memoryIdentity();
    const client = new ControllerClient({ urls: [url], caPem: agentCa, nodeName: name, identity });
    clients.set(name, client);
    return client.join(BOOTSTRAP, identity.publicKey, f);
  };

  after(async () => {
    await controller?.stop();
    proxy?.server.close();
    for (const s of proxy?.sockets ?? []) s.destroy();
    await cp?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  test('an agent whose name has no Node is refused with NODE_NOT_IN_CLUSTER', async () => {
    await assert.rejects(joined('no-such-node'), (err: Error & { code?: string }) => err.code === 'NODE_NOT_IN_CLUSTER' && /no-such-node/.test(err.message));
    assert.equal(await record('no-such-node'), undefined);
  });

  test('site, community and role come from the Node, not from what the agent says', async () => {
    const a = await joined('edge-a1');
    assert.equal(a.node.site, 'a');
    assert.equal(a.node.community, 'c1');
    assert.equal(a.node.annotations[ROLE_ANNOTATION], 'edge');
    const b = await joined('edge-b1', fields({ community: 'whatever' }));
    assert.deepEqual([b.node.site, b.node.community, b.node.annotations[ROLE_ANNOTATION]], ['b', 'c1', 'edge'], 'zone label, Community object, OpenYurt label');
    const c = await joined('cloud-1', fields({ annotations: { [ROLE_ANNOTATION]: 'edge' } }));
    assert.deepEqual([c.node.site, c.node.community, c.node.annotations[ROLE_ANNOTATION]], ['cloud', '', 'cloud']);
    assert.ok(c.blocks.length > 0);
  });

  test('each node\'s network state is published on its Node as annotations', async () => {
    const rec = await record('edge-a1') as NodeRecord;
    await until('blocks annotation', async () => (await kubeNode('edge-a1'))?.metadata.annotations?.['atoll.dev/blocks'] === rec.blocks.join(','), 10_000);
    const ann = (await kubeNode('edge-a1'))?.metadata.annotations ?? {};
    assert.deepEqual(JSON.parse(ann['atoll.dev/backend-data'] as string), { VtepMAC: '02:00:00:00:00:01' });
    assert.equal(ann['atoll.dev/public-ip'], '127.0.0.1');
    assert.equal(ann['atoll.dev/tunnel-pin'], 'sha256:' + 'ab'.repeat(32));
  });

  test('a label change moves the node within seconds, and watchers see it', async () => {
    const seen: NodeRecord[] = [];
    const ac = new AbortController();
    const identity = memoryIdentity();
    // a watcher is a registered node, as agents are
    await node('watcher', {});
    const w = new ControllerClient({ urls: [url], caPem: agentCa, nodeName: 'watcher', identity });
    // the controller learns of the new Node from its watch, a moment after it is created
    await until('the watcher\'s Node seen', () => w.join(BOOTSTRAP, identity.publicKey, fields()).then(() => true, () => false), 10_000);
    const watching = w.watch(0, (line) => {
      if (line.type === 'put') seen.push(line.node);
    }, ac.signal).catch(() => undefined);
    const t0 = Date.now();
    cp.kubectl(['label', 'node', 'edge-a1', 'atoll.dev/community=c2', 'atoll.dev/site=a2', '--overwrite']);
    await until('community moved', async () => (await record('edge-a1'))?.community === 'c2', 10_000);
    assert.equal((await record('edge-a1'))?.site, 'a2');
    await until('watch event', () => seen.some((n) => n.name === 'edge-a1' && n.community === 'c2'), 10_000);
    assert.ok(Date.now() - t0 < 10_000);
    ac.abort();
    await watching;
  });

  test('malformed labels and Communities are reported with a coded error and change nothing', async () => {
    const before = await record('edge-b1');
    cp.kubectl(['label', 'node', 'edge-b1', 'openyurt.io/is-edge-worker=maybe', '--overwrite']);
    await cp.admin.create('/apis/atoll.dev/v1alpha1/communities', { apiVersion: 'atoll.dev/v1alpha1', kind: 'Community', metadata: { name: 'ghosts' }, spec: { members: ['ghost-1'] } });
    await until('label problem logged', () => logs.some((l) => l.code === 'NODE_LABELS_INVALID' && String(l.err).includes('edge-b1')), 10_000);
    await until('community problem logged', () => logs.some((l) => l.code === 'COMMUNITY_INVALID' && String(l.err).includes('ghost-1')), 10_000);
    // a node in two communities: in neither through them; its record keeps its last good placement
    await cp.admin.create('/apis/atoll.dev/v1alpha1/communities', { apiVersion: 'atoll.dev/v1alpha1', kind: 'Community', metadata: { name: 'c3' }, spec: { members: ['edge-b1'] } });
    await until('double membership logged', () => logs.some((l) => l.code === 'COMMUNITY_INVALID' && /edge-b1 is a member of 2/.test(String(l.err))), 10_000);
    const after = await record('edge-b1');
    assert.deepEqual([after?.site, after?.community, after?.annotations[ROLE_ANNOTATION], after?.blocks], [before?.site, before?.community, before?.annotations[ROLE_ANNOTATION], before?.blocks]);
    cp.kubectl(['delete', 'community', 'c3', 'ghosts']);
    cp.kubectl(['label', 'node', 'edge-b1', 'openyurt.io/is-edge-worker=true', '--overwrite']);
  });

  test('the controller\'s account can do what it needs and nothing else; the agent\'s and relay\'s can do nothing', () => {
    const can = (who: string, verb: string, what: string) =>
      cp.kubectl(['auth', 'can-i', verb, what, `--as=system:serviceaccount:${NS}:${who}`, '-n', NS], undefined).trim() === 'yes';
    const canNot = (who: string, verb: string, what: string) => {
      try {
        return !can(who, verb, what);
      } catch (err) {
        return /no/.test(String((err as { stdout?: string }).stdout));
      }
    };
    assert.ok(can('atoll-controller', 'watch', 'nodes'));
    assert.ok(can('atoll-controller', 'patch', 'nodes'));
    assert.ok(can('atoll-controller', 'update', 'leases.coordination.k8s.io'));
    // NetworkPolicy: reads the policies and the pods and namespaces they select, writes none of them
    for (const what of ['networkpolicies.networking.k8s.io', 'pods', 'namespaces']) assert.ok(can('atoll-controller', 'watch', what), `controller may watch ${what}`);
    // and reports a policy it enforces more strictly than written as an Event: creates them, changes none
    assert.ok(can('atoll-controller', 'create', 'events.events.k8s.io'));
    for (const [verb, what] of [['update', 'events.events.k8s.io'], ['delete', 'events.events.k8s.io'], ['create', 'events'], ['get', 'secrets'], ['delete', 'pods'], ['patch', 'pods'], ['update', 'networkpolicies.networking.k8s.io'], ['delete', 'nodes'], ['create', 'deployments.apps'], ['update', 'communities.atoll.dev']]) {
      assert.ok(canNot('atoll-controller', verb as string, what as string), `controller may not ${verb} ${what}`);
    }
    for (const who of ['atoll-agent', 'atoll-relay']) {
      for (const [verb, what] of [['get', 'nodes'], ['get', 'secrets'], ['list', 'communities.atoll.dev']]) {
        assert.ok(canNot(who, verb as string, what as string), `${who} may not ${verb} ${what}`);
      }
    }
  });

  test('the API server away for 60 s changes nothing; list/watch recovers', async () => {
    const snap = async () => (await controller.registry?.snapshot())?.nodes.map((n) => `${n.name}:${n.site}:${n.community}:${n.blocks.join(',')}`).sort();
    const leases = async () => (await controller.registry?.leases())?.map((l) => `${l.cidr}=${l.node}`).sort();
    const [nodesBefore, leasesBefore] = [await snap(), await leases()];
    await cp.killApiServer();
    try {
      // agents keep working with the controller meanwhile: an update is admitted from the cache, nothing is released
      const updated = await (clients.get('edge-a1') as ControllerClient).update(fields({ agentVersion: 'during-outage' }));
      assert.equal(updated.node.agentVersion, 'during-outage');
      assert.equal(updated.node.community, 'c2');
      await new Promise((r) => setTimeout(r, 60_000));
    } finally {
      await cp.startApiServer();
    }
    assert.deepEqual(await snap(), nodesBefore);
    assert.deepEqual(await leases(), leasesBefore);
    cp.kubectl(['label', 'node', 'cloud-1', 'atoll.dev/site=cloud-2', '--overwrite']);
    await until('a label change after the outage arrives', async () => (await record('cloud-1'))?.site === 'cloud-2', 60_000);
    assert.deepEqual(await leases(), leasesBefore, 'no block released, duplicated or re-leased');
  });

  test('kubectl delete node deregisters it and releases its blocks after the grace period', async () => {
    const blocks = (await record('edge-b1'))?.blocks ?? [];
    assert.ok(blocks.length > 0);
    const t0 = Date.now();
    cp.kubectl(['delete', 'node', 'edge-b1']);
    await until('edge-b1 deregistered', async () => (await record('edge-b1')) === undefined, 20_000);
    assert.ok(Date.now() - t0 >= 2_500, 'not before the grace period');
    const leased = new Set((await controller.registry?.leases())?.map((l) => l.cidr));
    for (const b of blocks) assert.ok(!leased.has(b), `${b} released`);
  });
  test('each node is sent its part of the NetworkPolicy state, then only what changes (the RBAC of the manifest)', async () => {
    const pods = [['shop', 'web', 'edge-a1', '10.1.0.2', 'web'], ['db', 'pg', 'cloud-1', '10.2.0.2', 'pg'], ['db', 'other', 'edge-a1', '10.1.0.3', 'other']] as const;
    cp.kubectl(['apply', '-f', '-'], [
      ...['shop', 'db'].map((ns) => `apiVersion: v1\nkind: Namespace\nmetadata: {name: ${ns}, labels: {team: ${ns}}}\n`),
      ...pods.map(([ns, name, nodeName, , app]) => `apiVersion: v1\nkind: Pod\nmetadata: {name: ${name}, namespace: ${ns}, labels: {app: ${app}}}\nspec: {nodeName: ${nodeName}, containers: [{name: c, image: agnhost, ports: [{name: sql, containerPort: 5432}]}]}\n`),
      'apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: web-out, namespace: shop}\nspec: {podSelector: {matchLabels: {app: web}}, policyTypes: [Egress], egress: [{to: [{namespaceSelector: {matchLabels: {team: db}}, podSelector: {matchLabels: {app: pg}}}], ports: [{port: sql}]}]}\n',
    ].join('---\n'));
    for (const [ns, name, , ip] of pods) {
      cp.kubectl(['patch', 'pod', name, '-n', ns, '--subresource=status', '--type=merge', '-p', JSON.stringify({ status: { phase: 'Running', podIP: ip, podIPs: [{ ip }] } })]);
    }
    const lines: PolicyLine[] = [];
    const ac = new AbortController();
    const watching = (clients.get('edge-a1') as ControllerClient).watchPolicy((l) => lines.push(l), ac.signal).catch((e: unknown) => e);
    try {
      const held = new HeldPolicyView();
      const view = () => {
        for (const l of lines.splice(0)) held.apply(l);
        return held.view();
      };
      // the controller's reflectors may still be backing off (up to 30 s) from the API server's outage in a test above
      await until('edge-a1 holding the policy of its pod and the pod it names', () => {
        const v = view();
        return v.policies.length === 1 && v.pods.length === 3;
      }, 60_000);
      const v = view();
      assert.deepEqual(v.policies.map((p) => `${p.namespace}/${p.name}`), ['shop/web-out']);
      assert.deepEqual(v.policies[0]?.egress, [{ peers: [{ namespaceSelector: { matchLabels: { team: 'db' } }, podSelector: { matchLabels: { app: 'pg' } } }], ports: [{ protocol: 'TCP', port: 'sql' }] }]);
      // its own two pods, and the cloud pod its policy names; namespaces with their labels
      assert.deepEqual(v.pods.map((p) => `${p.namespace}/${p.name}@${p.node} ${p.ip}`), ['db/other@edge-a1 10.1.0.3', 'db/pg@cloud-1 10.2.0.2', 'shop/web@edge-a1 10.1.0.2']);
      assert.deepEqual(v.namespaces.find((n) => n.name === 'db')?.labels, { team: 'db', 'kubernetes.io/metadata.name': 'db' });
      // a label change on the named pod arrives as one put, not a new snapshot
      cp.kubectl(['label', 'pod', 'pg', '-n', 'db', 'tier=gold']);
      await until('the label change sent', () => lines.some((l) => l.type === 'put' && l.pod?.name === 'pg' && l.pod.labels.tier === 'gold'), 10_000);
      assert.ok(lines.every((l) => l.type !== 'snapshot'), 'changes, not snapshots');
      // the policy deleted: a delete line
      cp.kubectl(['delete', 'networkpolicy', 'web-out', '-n', 'shop']);
      await until('the policy delete sent', () => lines.some((l) => l.type === 'delete' && l.policy === 'shop/web-out'), 10_000);
      assert.ok(view().pods.every((p) => p.node === 'edge-a1'), 'the remote pod goes with the policy that named it');
    } finally {
      ac.abort();
      await watching;
    }
  });

  test('an address another pod may take: not while the API has a pod there, nor while an enforcing peer may hold one', async () => {
    const owner = clients.get('cloud-1') as ControllerClient;
    const peer = clients.get('edge-a1') as ControllerClient;
    const ask = async (ip: string, name = 'ghost') => [...await owner.reusable([{ ip, namespace: 'db', name }])];
    assert.deepEqual(await ask('10.2.0.9'), ['10.2.0.9'], 'no peer enforces NetworkPolicy yet');
    await peer.update(fields({ annotations: { [ROLE_ANNOTATION]: 'edge', [ENFORCES_ANNOTATION]: 'true' } }));
    await until('edge-a1 known to enforce, and to have applied nothing', async () => (await ask('10.2.0.9')).length === 0, 10_000);
    // edge-a1's policy names pg (on cloud-1); it follows its stream, and answers marks only when the test says so
    cp.kubectl(['apply', '-f', '-'], 'apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: web-out, namespace: shop}\nspec: {podSelector: {matchLabels: {app: web}}, policyTypes: [Egress], egress: [{to: [{namespaceSelector: {matchLabels: {team: db}}, podSelector: {matchLabels: {app: pg}}}]}]}\n');
    const lines: PolicyLine[] = [];
    const marks: { from: string; stream: string; seq: number }[] = [];
    const ac = new AbortController();
    const watching = peer.watchPolicy((l, from) => {
      lines.push(l);
      if (l.type === 'mark') marks.push({ from, stream: l.stream, seq: l.seq });
    }, ac.signal).catch((e: unknown) => e);
    try {
      const held = new HeldPolicyView();
      await until('edge-a1 sent pg, then a mark', () => {
        for (const l of lines.splice(0)) held.apply(l);
        return held.view().pods.some((p) => p.name === 'pg') && marks.length > 0;
      }, 20_000);
      const first = marks.at(-1) as (typeof marks)[number];
      assert.deepEqual(await ask('10.2.0.9'), [], 'sent is not applied');
      assert.equal(await peer.policyApplied(first.from, first.stream, first.seq), true);
      assert.deepEqual(await ask('10.2.0.9'), ['10.2.0.9'], 'edge-a1 holds no pod there');
      assert.deepEqual(await ask('10.2.0.2', 'pg'), [], 'the API still has pg there, and edge-a1 holds it');
      marks.length = 0;
      cp.kubectl(['delete', 'pod', 'pg', '-n', 'db', '--grace-period=0', '--force']);
      await until('the delete of pg sent, then a mark', () => {
        for (const l of lines.splice(0)) held.apply(l);
        return !held.view().pods.some((p) => p.name === 'pg') && marks.length > 0;
      }, 20_000);
      assert.deepEqual(await ask('10.2.0.2', 'pg'), [], 'edge-a1 has not said it applied the view without pg');
      const gone = marks.at(-1) as (typeof marks)[number];
      assert.equal(await owner.policyApplied(gone.from, gone.stream, gone.seq), false, 'a node cannot answer another\'s mark');
      assert.equal(await peer.policyApplied(gone.from, gone.stream, gone.seq), true);
      assert.deepEqual(await ask('10.2.0.2', 'pg'), ['10.2.0.2']);
      await assert.rejects(owner.reusable([{ ip: 'x', namespace: 'db', name: 'pg' }]), (e: Error & { code?: string }) => e.code === 'API_BAD_REQUEST' && /ip/.test(e.message));
    } finally {
      ac.abort();
      await watching;
    }
  });

  test('a policy the controller enforces more strictly than written is an Event on its namespace, once per generation, and logged once', async () => {
    // the API server refuses such a policy (protocol ICMP); one written to its storage (by another version, or
    // restored from a backup) is served as it is: written here through etcd's JSON gateway
    const uid = randomUUID();
    const put = (generation: number, protocol: string) => fetch(`${cp.etcd}/v3/kv/put`, { method: 'POST', body: JSON.stringify({
      key: Buffer.from('/registry/networkpolicies/shop/odd').toString('base64'),
      value: Buffer.from(JSON.stringify({ kind: 'NetworkPolicy', apiVersion: 'networking.k8s.io/v1',
        metadata: { name: 'odd', namespace: 'shop', uid, generation, creationTimestamp: '2026-01-01T00:00:00Z' },
        spec: { podSelector: {}, policyTypes: ['Ingress'], ingress: [{ ports: [{ protocol, port: 80 }] }] } })).toString('base64'),
    }) }).then((r) => assert.equal(r.status, 200));
    const events = async () => (await cp.admin.list<{ metadata: { name: string }; reason: string; type: string; note: string; regarding: { kind: string; name: string; uid: string }; reportingController: string }>('/apis/events.k8s.io/v1/namespaces/shop/events')).items
      .filter((e) => e.regarding.kind === 'NetworkPolicy' && e.regarding.name === 'odd');
    const logged = () => logs.filter((l) => l.code === 'POLICY_UNSUPPORTED' && /NetworkPolicy shop\/odd: spec.ingress\[0\].ports\[0\] has protocol "ICMP"/.test(String(l.err))).length;
    await put(1, 'ICMP');
    await until('the Event posted', async () => (await events()).length === 1, 60_000);
    const [e] = await events();
    assert.deepEqual([e?.type, e?.reason, e?.regarding.uid, e?.reportingController], ['Warning', 'PolicyUnsupported', uid, 'atoll.dev/controller']);
    assert.match(String(e?.note), /POLICY_UNSUPPORTED.*has protocol "ICMP", not TCP, UDP or SCTP; that port matches nothing/);
    // other changes make the controller pass over the policies again: no second Event, no second log line
    for (const v of ['1', '2', '3']) {
      cp.kubectl(['label', 'namespace', 'shop', `pass=${v}`, '--overwrite']);
      await new Promise((r) => setTimeout(r, 300));
    }
    assert.equal((await events()).length, 1, 'one Event per policy generation');
    assert.equal(logged(), 1, 'logged once');
    // a new generation with the problem still in it: a new Event; fixed: none more
    await put(2, 'SCTP-ish');
    await until('the second generation\'s Event', async () => (await events()).length === 2, 20_000);
    await put(3, 'TCP');
    await new Promise((r) => setTimeout(r, 1000));
    assert.equal((await events()).length, 2);
    cp.kubectl(['delete', 'networkpolicy', 'odd', '-n', 'shop']);
  });
});
