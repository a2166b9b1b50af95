import { test } from 'node:test';
import assert from 'node:assert/strict';
import { connect } from 'node:net';
import { Metrics } from './metrics.ts';
import { type Readiness, splitHostPort, startOpsServer } from './ops-server.ts';

async function withServer(fn: (url: string, port: number, state: { readiness: Readiness; served: number }) => Promise<void>): Promise<void> {
  const state = { readiness: { ready: false, reasons: ['starting: the CNI socket does not serve yet'] } as Readiness, served: 3 };
  const m = new Metrics();
  m.counter('atoll_test_served_total', 'requests served', () => state.served);
  m.gauge('atoll_test_paths', 'paths', () => [[{ path: 'direct' }, 2], [{ path: 'down' }, 1]], ['path']);
  const server = await startOpsServer({ listen: '127.0.0.1:0', registry: m.registry, readiness: () => state.readiness });
  try {
    await fn(`http://127.0.0.1:${server.port}`, server.port, state);
  } finally {
    await server.close();
  }
}

/** Sends `text` as is and returns the status line of the answer. */
function raw(port: number, text: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const s = connect(port, '127.0.0.1', () => s.write(text));
    let got = '';
    s.on('data', (d) => (got += d.toString('latin1')));
    s.on('close', () => resolve(got.split('\r\n')[0] ?? ''));
    s.on('error', reject);
    s.setTimeout(5000, () => s.destroy(new Error('no answer')));
  });
}

test('/healthz is 200; /readyz is 503 with the reasons until ready, then 200', async () => {
  await withServer(async (url, _port, state) => {
    assert.equal((await fetch(`${url}/healthz`)).status, 200);
    const notReady = await fetch(`${url}/readyz`);
    assert.equal(notReady.status, 503);
    assert.match(await notReady.text(), /starting: the CNI socket does not serve yet/);
    state.readiness = { ready: true, reasons: [] };
    assert.equal((await fetch(`${url}/readyz`)).status, 200);
  });
});

test('/metrics renders the Prometheus text format from the collect callbacks, read at scrape time', async () => {
  await withServer(async (url, _port, state) => {
    const res = await fetch(`${url}/metrics`);
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type') ?? '', /^text\/plain; version=0\.0\.4/);
    const text = await res.text();
    assert.match(text, /^# TYPE atoll_test_served_total counter$/m);
    assert.match(text, /^atoll_test_served_total 3$/m);
    assert.match(text, /^atoll_test_paths\{path="direct"\} 2$/m);
    state.served = 7;
    assert.match(await (await fetch(`${url}/metrics`)).text(), /^atoll_test_served_total 7$/m);
  });
});

test('bad requests get a clear HTTP error and change nothing', async () => {
  await withServer(async (url, port) => {
    const before = await (await fetch(`${url}/metrics`)).text();
    const cases: [string, RequestInit, number, RegExp][] = [
      ['/nope', {}, 404, /no such path "\/nope"; try \/healthz, \/readyz, \/metrics/],
      ['/metrics', { method: 'POST', body: 'x' }, 405, /POST is not allowed here/],
      ['/readyz', { method: 'DELETE' }, 405, /read only/],
      ['/metrics', { method: 'PUT', body: 'atoll_test_served_total 0' }, 405, /not allowed/],
    ];
    for (const [path, init, status, body] of cases) {
      const res = await fetch(`${url}${path}`, init);
      assert.equal(res.status, status, `${init.method ?? 'GET'} ${path}`);
      assert.match(await res.text(), body);
    }
    assert.equal((await fetch(`${url}/metrics`, { method: 'POST' })).headers.get('allow'), 'GET, HEAD');
    assert.match(await raw(port, 'GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello'), /^HTTP\/1\.1 413/);
    assert.match(await raw(port, `GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`), /^HTTP\/1\.1 431/);
    assert.match(await raw(port, 'NOT-HTTP\r\n\r\n'), /^HTTP\/1\.1 400/);
    assert.equal(await (await fetch(`${url}/metrics`)).text(), before);
  });
});

test('a listen address in use is refused with OPS_LISTEN_FAILED', async () => {
  await withServer(async (_url, port) => {
    await assert.rejects(startOpsServer({ listen: `127.0.0.1:${port}`, registry: new Metrics().registry, readiness: () => ({ ready: true, reasons: [] }) }),
      (err: Error & { code?: string }) => err.code === 'OPS_LISTEN_FAILED' && /127\.0\.0\.1:\d+/.test(err.message));
  });
});

test('splitHostPort reads IPv4 and bracketed IPv6 addresses', () => {
  assert.deepEqual(splitHostPort('127.0.0.1:9470'), { host: '127.0.0.1', port: 9470 });
  assert.deepEqual(splitHostPort('[::1]:9471'), { host: '::1', port: 9471 });
});
