import { test } from 'node:test';
import assert from 'node:assert/strict';
import { decodePolicyLine } from './policy-line.ts';

const policy = { namespace: 'x', name: 'p', podSelector: { matchLabels: { a: 'b' } }, policyTypes: ['Ingress'], ingress: [{ peers: [{ ipBlock: { cidr: '10.0.0.0/8', except: [] } }], ports: [{ protocol: 'TCP', port: 80, endPort: 90 }] }], egress: [] };
const pod = { namespace: 'x', name: 'a', node: 'n1', ip: '10.1.0.2', labels: {}, ports: [{ name: 'http', protocol: 'TCP', port: 8080 }] };

test('policy lines: snapshot, put, delete, mark, ping decode to themselves', () => {
  for (const line of [{ type: 'snapshot', policies: [policy], namespaces: [{ name: 'x', labels: {} }], pods: [pod] }, { type: 'put', pod }, { type: 'delete', policy: 'x/p' }, { type: 'mark', stream: 'Zm9v', seq: 3 }, { type: 'ping' }]) {
    assert.deepEqual(decodePolicyLine(JSON.stringify(line), 'https://c'), line);
  }
});

test('a line that does not decode is CONTROLLER_WATCH_INVALID, naming the stream and the field; unknown keys are refused', () => {
  const refused = (text: string, field: RegExp) => assert.throws(() => decodePolicyLine(text, 'https://c'), (e: Error & { code?: string }) => e.code === 'CONTROLLER_WATCH_INVALID' && /the policy stream of controller https:\/\/c/.test(e.message) && field.test(e.message));
  refused('{"type":"put","pod":', /not JSON/);
  refused(JSON.stringify({ type: 'mark', stream: 's', seq: -1 }), /seq/);
  refused(JSON.stringify({ type: 'mark', stream: '', seq: 1 }), /stream/);
  refused(JSON.stringify({ type: 'put', policy: { ...policy, ingress: [{ peers: [], ports: [{ protocol: 'TCP', port: 70000 }] }] } }), /policy\.ingress\.0\.ports\.0\.port/);
  refused(JSON.stringify({ type: 'put', policy: { ...policy, someNewNarrowing: true } }), /someNewNarrowing|policy/);
  refused(JSON.stringify({ type: 'replace' }), /type/);
});
