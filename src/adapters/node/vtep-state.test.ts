import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadVtepMac, saveVtepMac, vtepMacOf } from './vtep-state.ts';

test('a node without a saved VTEP MAC gets one derived from its name: the same at every start, unicast, locally administered, its own', () => {
  const mac = vtepMacOf('edge-a1');
  assert.match(mac, /^([0-9a-f]{2}:){5}[0-9a-f]{2}$/);
  assert.equal(vtepMacOf('edge-a1'), mac, 'a start that could not write the file derives the same MAC again');
  const first = parseInt(mac.slice(0, 2), 16);
  assert.equal(first & 0x01, 0, 'unicast');
  assert.equal(first & 0x02, 0x02, 'locally administered');
  const many = new Set(Array.from({ length: 1000 }, (_, i) => vtepMacOf(`node-${i}`)));
  assert.equal(many.size, 1000);
});

test('the file: none is undefined; a saved MAC loads back; a damaged one is refused with a code', () => {
  const dir = mkdtempSync(join(tmpdir(), 'atoll-vtep-'));
  try {
    const path = join(dir, 'vtep.json');
    assert.equal(loadVtepMac(path), undefined);
    saveVtepMac(path, '02:11:22:33:44:55');
    assert.equal(loadVtepMac(path), '02:11:22:33:44:55');
    writeFileSync(path, '{"vtepMac":"02:11');
    assert.throws(() => loadVtepMac(path), { code: 'CONFIG_FILE_INVALID' });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
