import { test } from 'node:test';
import assert from 'node:assert/strict';
import { parseAgentConfig } from './agent-config.ts';

const pin = `sha256:${'0'.repeat(64)}`;
const withUrls = (urls: unknown) => parseAgentConfig({ nodeName: 'n1', controller: { urls, token: 't'.repeat(16), caCertHash: pin } });
const refusal = (urls: unknown): string => {
  try {
    withUrls(urls);
  } catch (e) {
    assert.equal((e as { code?: string }).code, 'CONFIG_FILE_INVALID', `${String(urls)}: ${(e as Error).message}`);
    return (e as Error).message;
  }
  return assert.fail(`${JSON.stringify(urls)} was accepted`);
};

test('controller.urls: https://host:port accepted; a path, another scheme or no URL at all refused as a coded error naming the key', () => {
  assert.deepEqual(withUrls(['https://192.0.2.2:7443', 'https://c.example:7443/']).controller?.urls, ['https://192.0.2.2:7443', 'https://c.example:7443/']);
  assert.match(refusal(['https://c:7443/api']), /controller\.urls\.0: must have no path/);
  assert.match(refusal(['http://c:7443']), /controller\.urls\.0: must be an https:\/\/ URL/);
  assert.match(refusal(['not a url']), /controller\.urls\.0: /);
  assert.match(refusal([]), /controller\.urls: /);
});
