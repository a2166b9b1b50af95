import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { catchingRelist, containerdLineTime, containerdPodSteps } from './pod-timeline.ts';

const close = (actual: number | undefined, expected: number, what: string) =>
  assert.ok(actual !== undefined && Math.abs(actual - expected) < 1e-6, `${what}: ${actual} != ${expected}`);

const T0 = Date.UTC(2026, 10, 24, 7, 23, 13);

describe('containerdLineTime', () => {
  test('RFC 3339 with nanoseconds, UTC or an offset', () => {
    close(containerdLineTime('time="2026-11-24T07:23:13.123456789Z" level=info msg="x"'), T0 + 123.456789, 'UTC');
    close(containerdLineTime('time="2026-11-24T08:23:13.5+01:00" level=info msg="x"'), T0 + 500, '+01:00');
    close(containerdLineTime('time="2026-11-24T07:23:13Z" level=info'), T0, 'no fraction');
  });

  test('no time, no result', () => {
    assert.equal(containerdLineTime('level=info msg="x"'), undefined);
  });
});

// lines as containerd v2.2's CRI plugin writes them (logrus text: the message's quotes escaped; the sandbox metadata
// as protobuf text), and one pod as containerd 1.6 writes it (the metadata as a Go struct)
const SB = 'd891c7ad548739da111c47d054ebdf0f171929c4e1d6e4e1efea15d5723336e5';
const CT = 'be09349c121452cfbbf75d7673d042e9c044e2e68f32a81c3fb3420e8e3b33d3';
const SB16 = 'a1b2c3d4e5f6a1b2c3d4e5f6a1b2c3d4e5f6a1b2c3d4e5f6a1b2c3d4e5f6abcd';
const CT16 = 'f0e1d2c3b4a5f0e1d2c3b4a5f0e1d2c3b4a5f0e1d2c3b4a5f0e1d2c3b4a59999';
const line = (ms: number, msg: string) => `time="2026-11-24T07:23:13.${String(ms * 1000).padStart(6, '0')}000Z" level=info msg="${msg}"`;
const LOG = [
  line(1, 'RunPodSandbox for name:\\"s-o0-0\\" uid:\\"07bef56c-1194-4e0e-b0f9-0f516785a973\\" namespace:\\"default\\"'),
  line(2, 'RunPodSandbox for name:\\"w-0\\" uid:\\"15bcb822\\" namespace:\\"default\\"'),
  line(72, `RunPodSandbox for name:\\"s-o0-0\\" uid:\\"07bef56c-1194-4e0e-b0f9-0f516785a973\\" namespace:\\"default\\" returns sandbox id \\"${SB}\\"`),
  line(80, `CreateContainer within sandbox \\"${SB}\\" for container name:\\"c\\"`),
  line(92, `CreateContainer within sandbox \\"${SB}\\" for name:\\"c\\" returns container id \\"${CT}\\"`),
  line(93, `StartContainer for \\"${CT}\\"`),
  line(131, `StartContainer for \\"${CT}\\" returns successfully`),
  line(132, 'StartContainer for \\"0000\\" returns successfully'),
  line(200, 'RunPodSandbox for &PodSandboxMetadata{Name:s-r0-1,Uid:6f1d,Namespace:default,Attempt:0,}'),
  line(295, `RunPodSandbox for &PodSandboxMetadata{Name:s-r0-1,Uid:6f1d,Namespace:default,Attempt:0,} returns sandbox id \\"${SB16}\\"`),
  line(320, `CreateContainer within sandbox \\"${SB16}\\" for &ContainerMetadata{Name:c,Attempt:0,} returns container id \\"${CT16}\\"`),
  line(370, `StartContainer for \\"${CT16}\\" returns successfully`),
  'not a log line',
].join('\n');

describe('containerdPodSteps', () => {
  test('follows a pod from its sandbox request to its container started (containerd 2.x)', () => {
    const s = containerdPodSteps(LOG).get('s-o0-0');
    close(s?.sandboxRequested, T0 + 1, 'requested');
    close(s?.sandboxReady, T0 + 72, 'ready');
    close(s?.containerStarted, T0 + 131, 'started');
  });

  test('containerd 1.6\'s metadata', () => {
    assert.deepEqual(containerdPodSteps(LOG).get('s-r0-1'), { sandboxRequested: T0 + 200, sandboxReady: T0 + 295, containerStarted: T0 + 370 });
  });

  test('a pod whose sandbox never returned has only its request', () => {
    assert.deepEqual(containerdPodSteps(LOG).get('w-0'), { sandboxRequested: T0 + 2 });
  });

  test('a second pod of the same name starts over', () => {
    const again = `${LOG}\n${line(900, 'RunPodSandbox for name:\\"s-o0-0\\" uid:\\"07bf\\" namespace:\\"default\\"')}`;
    assert.deepEqual(containerdPodSteps(again).get('s-o0-0'), { sandboxRequested: T0 + 900 });
  });
});

describe('catchingRelist', () => {
  const global = [0, 1000, 2000, 3000];
  test('the pod\'s own relist a few ms after its start', () => {
    assert.deepEqual(catchingRelist(1500, 1540, global, [1200, 1503]), { kind: 'on-demand', afterStartMs: 3 });
  });

  test('a global relist that began first', () => {
    assert.deepEqual(catchingRelist(1995, 2040, global, [2001]), { kind: 'global', afterStartMs: 5 });
  });

  test('only global relists: the next one', () => {
    assert.deepEqual(catchingRelist(1500, 2010, global, []), { kind: 'global', afterStartMs: 500 });
  });

  test('nothing between the start and Running', () => {
    assert.deepEqual(catchingRelist(1500, 1600, global, [1400]), { kind: 'none', afterStartMs: undefined });
  });
});
