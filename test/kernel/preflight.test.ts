/**
 * The agent refuses to start on a node whose configuration conflicts, says why and how to fix it, and changes
 * nothing: no bridge, no conflist, no plugin installed.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { TestAgent } from '../../harness/agent.ts';
import { rootSkipReason, sh } from '../../harness/netns.ts';

const cases: [string, (a: TestAgent) => void, RegExp][] = [
  ['another CNI config sorts first', (a) => {
    mkdirSync(a.confDir, { recursive: true });
    writeFileSync(join(a.confDir, '05-flannel.conflist'), '{}');
  }, /PREFLIGHT_CNI_CONF_ORDER|05-flannel/],
  ['the pod range overlaps a host address', (a) => {
    sh('ip', ['-n', a.netns, 'link', 'add', 'atltv0', 'type', 'veth', 'peer', 'name', 'atltv1']);
    sh('ip', ['-n', a.netns, 'addr', 'add', '10.90.0.5/16', 'dev', 'atltv0']);
  }, /overlaps address 10\.90\.0\.5\/16/],
  ['the bridge name is taken by a veth', (a) => {
    sh('ip', ['-n', a.netns, 'link', 'add', a.bridge, 'type', 'veth', 'peer', 'name', 'atltv2']);
  }, /not a bridge/],
];

describe('preflight', { skip: rootSkipReason() }, () => {
  for (const [name, setUp, message] of cases) {
    test(`refuses to start when ${name}, changing nothing`, async () => {
      const agent = new TestAgent({ name: 'pf', podCidrs: ['10.90.1.0/24'] });
      try {
        setUp(agent);
        const linksBefore = sh('ip', ['-n', agent.netns, '-br', 'link']);
        const confBefore = existsSync(agent.confDir) ? readdirSync(agent.confDir) : [];
        await assert.rejects(agent.start(10_000), (err: Error) => {
          assert.match(err.message, message);
          assert.match(err.message, /fix/);
          return true;
        });
        assert.equal(sh('ip', ['-n', agent.netns, '-br', 'link']), linksBefore);
        assert.deepEqual(existsSync(agent.confDir) ? readdirSync(agent.confDir) : [], confBefore);
        assert.equal(existsSync(join(agent.binDir, 'atoll-cni')), false);
      } finally {
        await agent.cleanup();
      }
    });
  }
});
