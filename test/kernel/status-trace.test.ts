/**
 * One real agent with its metrics listener on (loopback of its namespace): `atoll status` and `atoll trace` read its
 * status socket; /readyz and /metrics count the CNI calls, the addresses and a sticky re-use.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { TestAgent } from '../../harness/agent.ts';
import { leftoverNetns, rootSkipReason, sh } from '../../harness/netns.ts';
import { statusSocketOf } from '../../src/adapters/ops/status-socket.ts';
import type { AgentStatus } from '../../src/core/ops/agent-status.ts';

const MAIN = new URL('../../src/cli/main.ts', import.meta.url).pathname;

function atoll(args: string[]) {
  const r = spawnSync(process.execPath, [MAIN, ...args], { encoding: 'utf8', timeout: 30_000 });
  return { code: r.status, out: r.stdout, err: r.stderr };
}

describe('atoll status, atoll trace and the metrics of a real agent', { skip: rootSkipReason() }, () => {
  let agent: TestAgent;
  let socket: string;
  const get = (path: string) => sh('ip', ['netns', 'exec', agent.netns, 'curl', '-s', '-w', '\n%{http_code}', `http://127.0.0.1:9470${path}`]);
  before(async () => {
    agent = new TestAgent({ name: 'st', podCidrs: ['10.77.3.0/28'], config: { metrics: {} } });
    await agent.start();
    socket = statusSocketOf(agent.socket);
  });
  after(async () => {
    await agent.cleanup();
    assert.deepEqual(leftoverNetns().filter((n) => n.includes('st-')), []);
  });

  test('status and trace from the status socket', () => {
    const web = agent.addPod('web');
    const db = agent.addPod('db');
    const st = JSON.parse(atoll(['status', '--socket', socket, '--json']).out) as AgentStatus;
    assert.equal(st.ready, true);
    assert.equal(st.node.name, 'st');
    assert.deepEqual(st.ipam.blocks, ['10.77.3.0/28']);
    assert.equal(st.ipam.usage.allocated, 2);
    assert.deepEqual(st.ipam.pods.map((p) => `${p.namespace}/${p.name}=${p.ip}`).sort(), [`default/db=${db}`, `default/web=${web}`]);
    const text = atoll(['status', '--socket', socket]);
    assert.equal(text.code, 0, text.err);
    assert.match(text.out, /agent {5}ready, version 0\.1\.0/);
    assert.match(text.out, /addresses 2 in use, 0 reserved/);
    assert.match(text.out, /controller none configured/);

    const same = atoll(['trace', 'default/web', 'default/db', '--socket', socket]);
    assert.equal(same.code, 0, same.err);
    assert.match(same.out, new RegExp(`trace ${web.replaceAll('.', '\\.')} \\(node st\\) -> ${db.replaceAll('.', '\\.')} \\(node st\\): same node`));
    const nowhere = atoll(['trace', web, '10.99.0.1', '--socket', socket]);
    assert.equal(nowhere.code, 1);
    assert.match(nowhere.out, /BREAKS: no node holds a block containing 10\.99\.0\.1 \(no block owner\)/);
    const unasked = atoll(['trace', 'default/web', 'default/db', '--socket', socket, '--controller-config', '/nonexistent/controller.json']);
    assert.equal(unasked.code, 0, unasked.err);
    assert.match(unasked.out, /controller: the controller could not be asked \(.*\/nonexistent\/controller\.json.*\): explained from this agent's view only/);
    const foreign = atoll(['trace', '10.99.0.1', web, '--socket', socket]);
    assert.equal(foreign.code, 2);
    assert.match(foreign.err, /FROM 10\.99\.0\.1 is not in this node's blocks/);
  });

  test('/readyz, and /metrics count CNI calls, addresses and a sticky re-use', () => {
    assert.match(get('/readyz'), /^ready\n\n?200$/m);
    const podNs = agent.podNetns('db2');
    assert.equal(agent.cni(agent.env('DEL', 'c-db', '', { namespace: 'default', name: 'db' }), agent.netconf()).code, 0);
    // the same pod again under a new sandbox: it gets its reserved address back
    assert.equal(agent.cni(agent.env('ADD', 'c-db2', podNs, { namespace: 'default', name: 'db' }), agent.netconf()).code, 0);
    const m = get('/metrics');
    assert.match(m, /^atoll_cni_request_duration_seconds_count\{verb="ADD",result="ok"\} 3$/m);
    assert.match(m, /^atoll_cni_request_duration_seconds_count\{verb="DEL",result="ok"\} 1$/m);
    assert.match(m, /^atoll_ipam_allocations_total\{how="fresh"\} 2$/m);
    assert.match(m, /^atoll_ipam_allocations_total\{how="sticky"\} 1$/m);
    assert.match(m, /^atoll_ipam_addresses\{state="allocated"\} 2$/m);
    assert.match(m, /^atoll_ipam_blocks 1$/m);
    assert.match(get('/nope'), /^404$/m);
  });
});
