import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { AtollError } from '../errors.ts';
import { decodeTunnelMessage, type MessageChannel, type TunnelMessage } from './messages.ts';

const PIN = `sha256:${'ab'.repeat(32)}`;
const TOKEN = '0123456789abcdef0123456789abcdef';
const bytes = (v: unknown) => (v instanceof Uint8Array ? v : new TextEncoder().encode(typeof v === 'string' ? v : JSON.stringify(v)));

/** Every kind, well formed, on the channel it travels on. */
const VALID: readonly [MessageChannel, TunnelMessage][] = [
  ['control', { t: 'ping', at: 1234.5 }],
  ['control', { t: 'ping', at: 1234.5, quiet: true }],
  ['control', { t: 'pong', at: 0 }],
  ['control', { t: 'hello' }],
  ['control', { t: 'observed', host: '203.0.113.7', port: 40_001, circuitPort: 7443 }],
  ['control', { t: 'circuit', to: PIN, n: '1f2e3d' }],
  ['control', { t: 'circuit-ready', n: '1f2e3d', token: TOKEN }],
  ['control', { t: 'circuit-refused', n: '1f2e3d', reason: 'not on the relay' }],
  ['control', { t: 'circuit-join', from: PIN, token: TOKEN }],
  ['control', { t: 'udp-key', id: 0xffff_ffff, salt: TOKEN, host: '', port: 8476 }],
  ['control', { t: 'udp-key-ack', id: 0 }],
  ['relayed', { t: 'punch', n: 'a1', host: '198.51.100.2', port: 20_000 }],
  ['relayed', { t: 'punch-ack', n: 'a1', host: '198.51.100.3', port: 65_535 }],
];

function rejects(channel: MessageChannel, input: unknown, why: RegExp): void {
  const r = decodeTunnelMessage(bytes(input), channel);
  assert.equal(r.ok, false, `${JSON.stringify(input)} on ${channel} was accepted`);
  if (r.ok) return;
  assert.ok(r.error instanceof AtollError);
  assert.equal(r.error.code, 'TUNNEL_MESSAGE_INVALID');
  assert.match(r.error.message, why);
  assert.ok(r.error.fix);
}

describe('decodeTunnelMessage', () => {
  for (const [channel, msg] of VALID) {
    test(`${msg.t} (${channel}): decoded as sent`, () => {
      assert.deepEqual(decodeTunnelMessage(bytes(msg), channel), { ok: true, message: msg });
    });
  }

  test('keys a kind does not have are dropped, not kept', () => {
    assert.deepEqual(decodeTunnelMessage(bytes({ t: 'hello', extra: 1 }), 'control'), { ok: true, message: { t: 'hello' } });
    assert.deepEqual(decodeTunnelMessage(bytes({ t: 'punch', n: 'x', host: 'h', port: 1, via: 'relay' }), 'relayed'),
      { ok: true, message: { t: 'punch', n: 'x', host: 'h', port: 1 } });
  });

  test('not JSON, not an object, no type', () => {
    rejects('control', '{"t": "ping"', /not JSON/);
    rejects('control', new Uint8Array([0xff, 0xfe]), /not JSON/);
    rejects('control', '', /not JSON/);
    rejects('control', [], /not a JSON object/);
    rejects('control', null, /not a JSON object/);
    rejects('relayed', '"punch"', /not a JSON object/);
    rejects('control', {}, /no type/);
    rejects('control', { t: 7 }, /no type/);
  });

  test('a kind unknown, or not one of that channel', () => {
    rejects('control', { t: 'packet' }, /"packet" is not a message kind of control frames/);
    rejects('control', { t: 'punch', n: 'a', host: 'h', port: 1 }, /"punch" is not a message kind of control frames/);
    rejects('relayed', { t: 'hello' }, /"hello" is not a message kind of relayed frames/);
    rejects('relayed', { t: 'circuit', to: PIN, n: 'a' }, /not a message kind of relayed frames/);
  });

  test('missing or malformed fields, each named', () => {
    rejects('control', { t: 'ping' }, /"ping" message has no at/);
    rejects('control', { t: 'ping', at: 1, quiet: 1 }, /quiet 1, not true or false/);
    rejects('control', { t: 'pong', at: '5' }, /at "5", not a finite number/);
    rejects('control', { t: 'observed', host: '203.0.113.7', port: 70_000, circuitPort: 1 }, /port 70000, not a port/);
    rejects('control', { t: 'observed', host: 1, port: 1.5 }, /host 1, not a string, port 1.5, not a port .*, no circuitPort/);
    rejects('control', { t: 'circuit', to: 'node-b', n: 'x' }, /to "node-b", not a key pin/);
    rejects('control', { t: 'circuit', to: PIN }, /no n/);
    rejects('control', { t: 'circuit-ready', n: 'x', token: 'TOKEN' }, /token "TOKEN", not a circuit token/);
    rejects('control', { t: 'circuit-refused', n: 'x' }, /no reason/);
    rejects('control', { t: 'circuit-join', from: PIN.toUpperCase(), token: TOKEN }, /from .*, not a key pin/);
    rejects('relayed', { t: 'punch', n: 'x', host: 'h' }, /"punch" message has no port/);
    rejects('control', { t: 'udp-key', id: 2 ** 32, salt: 'x', host: '', port: 1 }, /id 4294967296, not an integer .*, salt "x", not a salt/);
    rejects('control', { t: 'udp-key-ack', id: -1 }, /id -1, not an integer/);
    rejects('relayed', { t: 'punch-ack', n: 1, host: 'h', port: -1 }, /n 1, not a string, port -1, not a port/);
  });
});
