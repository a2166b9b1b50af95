import { test } from 'node:test';
import assert from 'node:assert/strict';
import { renderKubeletConfig } from './kubelet.ts';

const base = { socket: '/w/containerd.sock', nodeIp: '192.0.2.10', podLogsDir: '/w/pod-logs' };

test('renderKubeletConfig: no featureGates key unless gates are given', () => {
  const cfg = JSON.parse(renderKubeletConfig(base)) as Record<string, unknown>;
  assert.equal('featureGates' in cfg, false);
  assert.equal(cfg.containerRuntimeEndpoint, 'unix:///w/containerd.sock');
});

test('renderKubeletConfig: featureGates are written as given (EventedPLEG for containerd 2.x)', () => {
  const cfg = JSON.parse(renderKubeletConfig({ ...base, featureGates: { EventedPLEG: true } })) as Record<string, unknown>;
  assert.deepEqual(cfg.featureGates, { EventedPLEG: true });
});

test('renderKubeletConfig: failCgroupV1 only when given (kubelets v1.35+ on a cgroup v1 host need it false)', () => {
  assert.equal('failCgroupV1' in (JSON.parse(renderKubeletConfig(base)) as Record<string, unknown>), false);
  const cfg = JSON.parse(renderKubeletConfig({ ...base, failCgroupV1: false })) as Record<string, unknown>;
  assert.equal(cfg.failCgroupV1, false);
});
