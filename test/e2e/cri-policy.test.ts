/**
 * NetworkPolicy for pods started while the cloud is away, classified from what the node itself has: a real agent
 * with `networkPolicy` and a kept view holding "pods labelled role=db in namespace x accept only from role=web", its
 * controller out of reach, and a private containerd 1.6 that makes pods through CRI RunPodSandbox (with their labels
 * on the sandbox, as the kubelet puts them) and calls atoll-cni. The view knows none of these pods. With `criSocket`
 * each is closed for ingress (namespace x has an ingress policy that may select it) until its sandbox is read, then
 * compiled by its labels: the db pod stays isolated, web and other open. Restarted without `criSocket` the same agent
 * leaves them open (what the first test would see with the classification off); with one nothing answers on, it
 * keeps them closed until it gives up on them (30 s), then leaves them open, saying so; restarted with the real one,
 * it classifies before it serves.
 */
import { after, before, describe, test, type TestContext } from 'node:test';
import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { until } from '../../harness/wait.ts';
import type { NodePolicyView } from '../../src/core/policy/scope.ts';
import { readAgentStatus, statusSocketOf } from '../../src/adapters/ops/status-socket.ts';
import { agentLauncher, criSkipReason, type CriNode, type CriPod, runPod, startCriNode, stopCriNode } from '../support/cri-node.ts';
import { answersTcp, servePod } from '../support/pod-probe.ts';

const VIEW: NodePolicyView = {
  policies: [{
    namespace: 'x', name: 'db-from-web', podSelector: { matchLabels: { role: 'db' } }, policyTypes: ['Ingress'],
    ingress: [{ peers: [{ podSelector: { matchLabels: { role: 'web' } } }], ports: [{ protocol: 'TCP', port: 80 }] }], egress: [],
  }],
  namespaces: [{ name: 'x', labels: { 'kubernetes.io/metadata.name': 'x' } }],
  pods: [],
};
// the controller: a port nothing listens on in the node's namespace (cut off from the start)
const CUT_OFF = { urls: ['https://127.0.0.1:9'], token: 'cut-off-token-0123456789', caCertHash: `sha256:${'0'.repeat(64)}` };

describe('NetworkPolicy for a pod the kept view does not know, classified from its CRI sandbox', { skip: criSkipReason(), timeout: 300_000 }, () => {
  let node: CriNode | undefined;
  const servers: ChildProcess[] = [];
  let db: CriPod, web: CriPod, other: CriPod;

  const isolated = async () => (await readAgentStatus(statusSocketOf((node as CriNode).agent.socket))).policy?.isolatedPods ?? -1;
  const matrix = () => [`web->db: ${answersTcp(web.netns, db.ip, 80) ? 'yes' : 'no'}`, `other->db: ${answersTcp(other.netns, db.ip, 80) ? 'yes' : 'no'}`];
  const log = () => readFileSync((node as CriNode).agent.logPath, 'utf8');
  const restartAgent = async (criSocket: string | undefined) => {
    const n = node as CriNode;
    await n.agent.stop('SIGKILL');
    n.agent.rewriteConfig({ criSocket });
    writeFileSync(n.agent.logPath, '');
    await n.agent.start(15_000, agentLauncher(n)); // resolves once the CNI socket serves
  };

  before(async () => {
    node = await startCriNode('crp', ['10.87.0.0/26'], ({ agent, ctd }) => {
      agent.rewriteConfig({ networkPolicy: true, criSocket: ctd.socket, controller: CUT_OFF });
      mkdirSync(agent.dataDir, { recursive: true });
      writeFileSync(join(agent.dataDir, 'policy-view.json'), `${JSON.stringify({ type: 'snapshot', ...VIEW })}\n`);
    });
  });

  after(async () => {
    for (const s of servers) s.kill('SIGKILL');
    await stopCriNode(node);
  });

  test('a db pod started through the CRI gets an address and is isolated at once: web gets in, other does not', async (t: TestContext) => {
    const { ctd, agent } = node as CriNode;
    web = await runPod(ctd, 'web', 'x', { role: 'web' });
    other = await runPod(ctd, 'other', 'x', { role: 'other' });
    // closed while their sandboxes are read, then open: no policy selects role=web or role=other
    await until('web and other read and open', async () => (await isolated()) === 0, 2_000, 10);
    db = await runPod(ctd, 'db', 'x', { role: 'db' });
    const ran = Date.now();
    assert.match(db.ip, /^10\.87\.0\.\d+$/);
    await until('the db pod isolated', async () => (await isolated()) === 1, 2_000, 10);
    t.diagnostic(`isolated ${Date.now() - ran} ms after RunPodSandbox returned`);
    servers.push(await servePod(db.netns, 80, 'db'));
    assert.deepEqual(matrix(), ['web->db: yes', 'other->db: no'], agent.dump());
    assert.doesNotMatch(log(), /POLICY_POD_UNCLASSIFIED|CRI_UNREACHABLE/);
    const st = await readAgentStatus(statusSocketOf(agent.socket));
    assert.notEqual(st.controller?.state, 'connected', `the controller is out of reach: ${JSON.stringify(st.controller)}`);
    assert.equal(st.policy?.policies, 1, 'the kept view is in force');
  });

  test('without criSocket the same pods are not classified: the db pod is open to every pod', async () => {
    await restartAgent(undefined);
    assert.equal(await isolated(), 0);
    assert.deepEqual(matrix(), ['web->db: yes', 'other->db: yes']);
    assert.match(log(), /POLICY_POD_UNCLASSIFIED/, 'the missing criSocket is logged');
  });

  test('a criSocket nothing answers on: the pods stay closed while it is asked, then are left to the view, and that is said', async () => {
    await restartAgent(join((node as CriNode).agent.dir, 'no-runtime.sock'));
    assert.equal(await isolated(), 3, 'each pod of x closed for ingress until its sandbox is read');
    assert.deepEqual(matrix(), ['web->db: no', 'other->db: no']);
    // the classifier gives up on a sandbox after 30 s: the pods are the view's again, open
    await until('the pods given up on and open', async () => (await isolated()) === 0, 45_000, 250);
    assert.deepEqual(matrix(), ['web->db: yes', 'other->db: yes']);
    assert.equal(log().match(/"code":"CRI_UNREACHABLE"/g)?.length, 1, log());
    assert.equal(log().match(/"code":"POLICY_POD_UNCLASSIFIED"/g)?.length, 3, 'each pod given up on, said once');
  });

  test('an agent restarted with criSocket classifies the pods before it serves', async () => {
    await restartAgent((node as CriNode).ctd.socket);
    assert.equal(await isolated(), 1);
    assert.deepEqual(matrix(), ['web->db: yes', 'other->db: no']);
  });
});
