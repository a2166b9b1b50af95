import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { readAgentStatus, readPolicyTrace, readTunnelStatus, startStatusServer } from './status-socket.ts';
import type { AgentStatus } from '../../core/ops/agent-status.ts';
import type { PolicyTrace } from '../../core/ops/policy-trace.ts';
import { atollError } from '../../core/errors.ts';

test('the status socket answers the tunnel and the whole status, and says which socket to use when given one that is not it', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'atoll-status-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const status = { node: 'n1' } as unknown as AgentStatus;
  const server = await startStatusServer(join(dir, 'atoll-status.sock'), { tunnel: () => undefined, status: () => status });
  t.after(() => server.close());
  assert.equal(await readTunnelStatus(join(dir, 'atoll-status.sock')), null);
  assert.deepEqual(await readAgentStatus(join(dir, 'atoll-status.sock')), status);

  // something that accepts and closes without an HTTP answer, as the CNI socket (agent.sock) does
  const cni = createServer((s) => s.once('data', () => s.destroy()));
  await new Promise<void>((resolve) => cni.listen(join(dir, 'agent.sock'), resolve));
  t.after(() => cni.close());
  await assert.rejects(readTunnelStatus(join(dir, 'agent.sock')), (err: Error & { code?: string; fix?: string }) => {
    assert.equal(err.code, 'AGENT_UNREACHABLE');
    assert.match(err.message, /agent\.sock accepted the connection and closed it without an answer: not an agent's status socket, or the agent stopped while answering/);
    assert.match(String(err.fix), new RegExp(`its status socket is ${join(dir, 'atoll-status.sock')}`));
    return true;
  });

  await assert.rejects(readAgentStatus(join(dir, 'none.sock')), /cannot read the agent's status at .*none\.sock: connect ENOENT/);
});

test('the status socket answers a policy trace from the agent, 400 with the code for a question it cannot read, 404 without policy', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'atoll-status-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const trace: PolicyTrace = { sides: [{ direction: 'ingress', pod: 'x/a', isolatedBy: ['x/deny'], allowedBy: [] }] };
  const asked: unknown[] = [];
  const server = await startStatusServer(join(dir, 'on.sock'), { tunnel: () => undefined, status: () => ({}) as AgentStatus, policyTrace: (q) => {
    asked.push(q);
    if (q.port === 'icmp/1') throw atollError('POLICY_TRACE_INVALID', 'not a port', 'fix');
    return trace;
  } });
  t.after(() => server.close());
  assert.deepEqual(await readPolicyTrace(join(dir, 'on.sock'), { from: '10.0.0.1', to: '10.0.0.2', port: 'tcp/80' }), trace);
  assert.deepEqual(asked, [{ from: '10.0.0.1', to: '10.0.0.2', port: 'tcp/80' }]);
  await assert.rejects(readPolicyTrace(join(dir, 'on.sock'), { from: '10.0.0.1', to: '10.0.0.2', port: 'icmp/1' }), /HTTP 400/);
  const off = await startStatusServer(join(dir, 'off.sock'), { tunnel: () => undefined, status: () => ({}) as AgentStatus });
  t.after(() => off.close());
  await assert.rejects(readPolicyTrace(join(dir, 'off.sock'), { from: '10.0.0.1', to: '10.0.0.2' }), /HTTP 404/);
});
