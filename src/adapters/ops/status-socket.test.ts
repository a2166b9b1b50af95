import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { readAgentStatus, readTunnelStatus, startStatusServer } from './status-socket.ts';
import type { AgentStatus } from '../../core/ops/agent-status.ts';

test('the status socket answers the tunnel and the whole status, and says which socket to use when given one that is not it', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'atoll-status-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const status = { node: 'n1' } as unknown as AgentStatus;
  const server = await startStatusServer(join(dir, 'atoll-status.sock'), () => undefined, () => status);
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
