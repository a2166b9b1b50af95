import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:net';
import { connect } from 'node:tls';
import { circuitServerName, lineToken, sniToken } from './circuit.ts';

/** The first record a real TLS client (Node's OpenSSL) sends, asking for `servername`. */
async function clientHello(servername: string): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const server = createServer((s) => {
      s.once('data', (chunk: Buffer) => {
        resolve(chunk.subarray(0, 5 + chunk.readUInt16BE(3)));
        s.destroy();
        server.close();
      });
    }).listen(0, '127.0.0.1', () => {
      const port = (server.address() as { port: number }).port;
      const tls = connect({ host: '127.0.0.1', port, servername, rejectUnauthorized: false, minVersion: 'TLSv1.3' });
      tls.on('error', () => undefined);
    });
    server.on('error', reject);
  });
}

test('circuit token: read back from a real ClientHello\'s server name; anything else is no token', async () => {
  const token = '0123456789abcdef0123456789abcdef';
  const hello = await clientHello(circuitServerName(token));
  assert.equal(sniToken(hello), token);
  assert.equal(sniToken(await clientHello('relay.example.org')), undefined, 'another name');
  assert.equal(sniToken(await clientHello(`${token}.circuit.atoll.evil`)), undefined, 'another suffix');
  assert.equal(sniToken(hello.subarray(0, 60)), undefined, 'a truncated record');
  assert.equal(sniToken(Buffer.from('GET / HTTP/1.1\r\n\r\n')), undefined, 'not TLS');
});

test('circuit token: a token line is 32 lowercase hex digits and a newline', () => {
  assert.equal(lineToken('0123456789abcdef0123456789abcdef\n'), '0123456789abcdef0123456789abcdef');
  assert.equal(lineToken('0123456789ABCDEF0123456789abcdef\n'), undefined);
  assert.equal(lineToken('0123456789abcdef0123456789abcdef'), undefined);
  assert.equal(lineToken('0123456789abcdef0123456789abcde\n\n'), undefined);
});
