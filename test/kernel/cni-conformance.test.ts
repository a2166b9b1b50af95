/**
 * CNI conformance of the real `atoll-cni` binary against a real agent: every verb in every config version, every
 * error case with its spec code (and nothing allocated by a failed request), an unreachable agent, idempotent DEL,
 * and CHECK with prevResult. The spec facts (which verb exists since which version, which code means what) are
 * written out here, not imported from src/, so a mistake in the product cannot hide in the expectations.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { basename, join } from 'node:path';
import { type CniCall, TestAgent } from '../../harness/agent.ts';
import { delNetns, leftoverNetns, rootSkipReason, sh } from '../../harness/netns.ts';

const VERSIONS = ['0.3.1', '0.4.0', '1.0.0', '1.1.0'] as const;
type Version = (typeof VERSIONS)[number];
const VERBS = ['ADD', 'DEL', 'CHECK', 'STATUS', 'GC', 'VERSION'] as const;
type Verb = (typeof VERBS)[number];

/** The CNI specification (containernetworking/cni SPEC.md): the first config version that has each verb. */
const VERB_SINCE: Record<Verb, Version> = { ADD: '0.3.1', DEL: '0.3.1', VERSION: '0.3.1', CHECK: '0.4.0', STATUS: '1.1.0', GC: '1.1.0' };
const allowed = (verb: Verb, v: Version) => VERSIONS.indexOf(v) >= VERSIONS.indexOf(VERB_SINCE[verb]);

/** SPEC.md "Error" codes used below. */
const CODE = { incompatibleVersion: 1, invalidEnvironment: 4, decodeFailure: 6, invalidConfig: 7, tryAgainLater: 11, notAvailable: 50 } as const;

const MIB = 1 << 20;
const POD_CIDR = '10.79.0.0/24';
const GATEWAY = '10.79.0.1';
const MTU = 1500;
const CNI_PATH = '/opt/cni/bin';
const MAC = /^[0-9a-f]{2}(:[0-9a-f]{2}){5}$/i;

type Json = Record<string, unknown>;
/** Environment overrides: a string sets the variable, undefined removes it. */
type EnvPatch = Readonly<Record<string, string | undefined>>;

let agent: TestAgent;
let serial = 0;
/** Attachments ADDed and not yet DELeted, so GC is told to keep them. */
const live = new Map<string, { containerID: string; ifname: string }>();

function uniq(prefix: string): string {
  return `${prefix}${serial++}`;
}

/** A network configuration; `omit` drops keys (e.g. cniVersion), `extra` adds or replaces them. */
function conf(version: string, extra: Json = {}, omit: readonly string[] = []): string {
  const c: Json = { ...(JSON.parse(agent.netconf(version)) as Json), ...extra };
  for (const k of omit) delete c[k];
  return JSON.stringify(c);
}

/** The configuration padded through `args` (a key the schema allows) to exactly `bytes` bytes. */
function paddedConf(version: string, bytes: number): string {
  const base = conf(version, { args: { pad: '' } });
  const text = conf(version, { args: { pad: 'x'.repeat(bytes - Buffer.byteLength(base)) } });
  assert.equal(Buffer.byteLength(text), bytes);
  return text;
}

function baseEnv(verb: string, containerId: string, netns: string): Record<string, string> {
  return { CNI_COMMAND: verb, CNI_CONTAINERID: containerId, CNI_NETNS: netns, CNI_IFNAME: 'eth0', CNI_PATH, CNI_ARGS: '' };
}

function patch(env: Record<string, string>, p: EnvPatch = {}): Record<string, string> {
  const out = { ...env };
  for (const [k, v] of Object.entries(p)) {
    if (v === undefined) delete out[k];
    else out[k] = v;
  }
  return out;
}

function show(res: CniCall): string {
  return `exit ${res.code}, stdout ${JSON.stringify(res.stdout)}, stderr ${JSON.stringify(res.stderr.slice(0, 500))}`;
}

/** stdout holds exactly one JSON object (and at most trailing whitespace); returns it. */
function onlyObject(res: CniCall): Json {
  let v: unknown;
  assert.doesNotThrow(() => (v = JSON.parse(res.stdout)), `stdout is not exactly one JSON document: ${show(res)}`);
  assert.ok(typeof v === 'object' && v !== null && !Array.isArray(v), `stdout is not a JSON object: ${show(res)}`);
  return v as Json;
}

/**
 * A failure the spec's way: exit 1, one error object with `code` (any positive integer when undefined), a non-empty
 * `msg`, and the expected cniVersion (any supported one when undefined).
 */
function assertCniError(res: CniCall, code: number | undefined, replyVersion?: string): Json {
  assert.equal(res.code, 1, `exit status: ${show(res)}`);
  const err = onlyObject(res);
  if (code === undefined) assert.ok(Number.isInteger(err.code) && (err.code as number) > 0, `a CNI error code: ${show(res)}`);
  else assert.equal(err.code, code, `CNI code: ${show(res)}`);
  assert.ok(typeof err.msg === 'string' && err.msg.trim() !== '', `msg must be a non-empty string: ${show(res)}`);
  if (replyVersion) assert.equal(err.cniVersion, replyVersion, `error cniVersion: ${show(res)}`);
  else assert.ok((VERSIONS as readonly unknown[]).includes(err.cniVersion), `error cniVersion: ${show(res)}`);
  return err;
}

/** A verb that answers nothing: exit 0 and an empty stdout. */
function assertSilentSuccess(res: CniCall): void {
  assert.equal(res.code, 0, `exit status: ${show(res)}\n${agent.dump()}`);
  assert.equal(res.stdout, '', `stdout must be empty: ${show(res)}`);
}

interface State {
  /** IPAM record files and their contents (a release rewrites a record in place). */
  readonly records: Record<string, string>;
  readonly links: string;
}

function recordFiles(): string[] {
  return readdirSync(join(agent.dataDir, 'atoll')).sort();
}

/** What a failed request must not change: the IPAM records and the host links. */
function state(): State {
  const dir = join(agent.dataDir, 'atoll');
  const records = Object.fromEntries(recordFiles().map((f) => [f, readFileSync(join(dir, f), 'utf8')]));
  return { records, links: sh('ip', ['-n', agent.netns, '-br', 'link']) };
}

function assertUnchanged(before: State, what: string): void {
  const now = state();
  assert.deepEqual(Object.keys(now.records), Object.keys(before.records), `${what}: the IPAM record files changed`);
  assert.deepEqual(now.records, before.records, `${what}: an IPAM record was rewritten`);
  assert.equal(now.links, before.links, `${what}: host links changed`);
}

/** The supported cniVersion a request names, which its error must echo; undefined when there is none to read. */
function requestVersion(stdin: string | Buffer): Version | undefined {
  if (Buffer.byteLength(stdin) > MIB) return undefined; // the shim forwards only the first MiB + 1 byte
  try {
    const v = (JSON.parse(String(stdin)) as { cniVersion?: unknown } | null)?.cniVersion;
    return (VERSIONS as readonly unknown[]).includes(v) ? (v as Version) : undefined;
  } catch {
    return undefined;
  }
}

/** Links of a pod namespace other than loopback (none after a failed ADD). */
function podLinks(netnsPath: string): string[] {
  return (JSON.parse(sh('ip', ['-n', basename(netnsPath), '-j', 'link'])) as { ifname: string }[]).map((l) => l.ifname).filter((n) => n !== 'lo');
}

function hostLink(name: string): { master?: string } | undefined {
  const all = JSON.parse(sh('ip', ['-n', agent.netns, '-j', 'link'])) as { ifname: string; master?: string }[];
  return all.find((l) => l.ifname === name);
}

interface AddResult {
  readonly json: Json;
  readonly hostIf: string;
  readonly address: string;
}

/** The ADD result has the shape of `version` and matches what the kernel holds. */
function assertAddResult(res: CniCall, version: Version, netns: string): AddResult {
  assert.equal(res.code, 0, `ADD failed: ${show(res)}\n${agent.dump()}`);
  const r = onlyObject(res);
  assert.equal(r.cniVersion, version, 'result cniVersion is the one asked for');
  const ifs = r.interfaces as Json[];
  assert.ok(Array.isArray(ifs) && ifs.length === 2, `two interfaces: ${res.stdout}`);
  const [host, pod] = ifs as [Json, Json];
  assert.ok(typeof host.name === 'string' && host.name !== '', 'host interface name');
  assert.match(String(host.mac), MAC, 'host interface mac');
  assert.ok(!('sandbox' in host), 'the host interface has no sandbox');
  assert.equal(pod.name, 'eth0');
  assert.match(String(pod.mac), MAC, 'pod interface mac');
  assert.equal(pod.sandbox, netns, 'pod interface sandbox is CNI_NETNS');
  for (const i of [host, pod]) {
    if (version === '1.1.0') assert.equal(i.mtu, MTU, `mtu in 1.1.0: ${res.stdout}`);
    else assert.ok(!('mtu' in i), `no mtu before 1.1.0: ${res.stdout}`);
  }
  const ips = r.ips as Json[];
  assert.ok(Array.isArray(ips) && ips.length === 1, `one IP: ${res.stdout}`);
  const ip = ips[0] as Json;
  assert.match(String(ip.address), /^10\.79\.0\.\d{1,3}\/24$/);
  assert.equal(ip.gateway, GATEWAY);
  assert.equal(ip.interface, 1, 'the IP is on the pod interface (index 1)');
  if (version === '0.3.1' || version === '0.4.0') assert.equal(ip.version, '4', `ips[].version in ${version}`);
  else assert.ok(!('version' in ip), `no ips[].version in ${version}: ${res.stdout}`);
  // and the kernel agrees
  assert.equal(hostLink(String(host.name))?.master, agent.bridge, 'host veth on the bridge');
  const addrs = JSON.parse(sh('ip', ['-n', basename(netns), '-j', 'addr', 'show', 'dev', 'eth0'])) as { addr_info: { local: string; prefixlen: number }[] }[];
  assert.ok(addrs[0]?.addr_info.some((a) => `${a.local}/${a.prefixlen}` === ip.address), `pod eth0 has ${String(ip.address)}`);
  return { json: r, hostIf: String(host.name), address: String(ip.address) };
}

/** Calls atoll-cni and keeps `live` in step. */
function cni(env: Record<string, string>, stdin: string | Buffer): CniCall {
  const res = agent.cni(env, stdin);
  const key = `${env.CNI_CONTAINERID}/${env.CNI_IFNAME}`;
  if (env.CNI_COMMAND === 'ADD' && res.code === 0) live.set(key, { containerID: env.CNI_CONTAINERID ?? '', ifname: env.CNI_IFNAME ?? '' });
  if (env.CNI_COMMAND === 'DEL' && res.code === 0) live.delete(key);
  return res;
}

/** ADDs a fresh pod in `version`; returns what the DEL or CHECK of it needs. */
function addPod(version: Version, prefix: string, p: EnvPatch = {}): { env: Record<string, string>; netns: string; result: AddResult } {
  const netns = agent.podNetns(uniq(prefix));
  const env = patch(baseEnv('ADD', uniq(`c-${prefix}-`), netns), p);
  const result = assertAddResult(cni(env, conf(version)), version, netns);
  return { env, netns, result };
}

function del(env: Record<string, string>, version: Version, p: EnvPatch = {}, extra: Json = {}): CniCall {
  return cni(patch({ ...env, CNI_COMMAND: 'DEL' }, p), conf(version, extra));
}

function gcConf(version: string): string {
  return conf(version, { 'cni.dev/valid-attachments': [...live.values()] });
}

/** A pod kept attached through the whole run: a failed DEL, CHECK or GC that wrongly went ahead would remove it. */
let sentinel: { env: Record<string, string>; netns: string; result: AddResult };

describe('atoll-cni conformance (real binary, real agent)', { skip: rootSkipReason() }, () => {
  before(async () => {
    agent = new TestAgent({ name: 'cf', podCidrs: [POD_CIDR], config: { mtu: MTU } });
    await agent.start();
    sentinel = addPod('1.0.0', 'sentinel');
  });
  after(async () => {
    await agent?.cleanup();
    assert.deepEqual(leftoverNetns(), [], 'every namespace of this run is removed');
  });

  describe('every verb in every config version', () => {
    for (const version of VERSIONS) {
      for (const verb of VERBS) {
        const ok = allowed(verb, version);
        test(`${verb} in ${version} ${ok ? 'succeeds' : 'is refused with code 1'}`, () => {
          if (!ok) {
            const netns = agent.podNetns(uniq('nv'));
            const env = verb === 'STATUS' ? { CNI_COMMAND: verb } : verb === 'GC' ? { CNI_COMMAND: verb, CNI_PATH } : baseEnv(verb, uniq('c-nv-'), netns);
            const before = state();
            assertCniError(cni(env, conf(version)), CODE.incompatibleVersion, version);
            assertUnchanged(before, `${verb} in ${version}`);
            assert.deepEqual(podLinks(netns), []);
            return;
          }
          switch (verb) {
            case 'ADD': {
              const { env } = addPod(version, 'add');
              assertSilentSuccess(del(env, version));
              break;
            }
            case 'DEL': {
              const { env, result } = addPod(version, 'del');
              assertSilentSuccess(del(env, version));
              assert.equal(hostLink(result.hostIf), undefined, 'DEL removes the host veth');
              break;
            }
            case 'CHECK': {
              const { env, result } = addPod(version, 'chk');
              const prevResult = result.json;
              assertSilentSuccess(cni({ ...env, CNI_COMMAND: 'CHECK' }, conf(version, { prevResult })));
              assertSilentSuccess(del(env, version, {}, { prevResult }));
              break;
            }
            case 'STATUS':
              assertSilentSuccess(cni({ CNI_COMMAND: 'STATUS' }, conf(version)));
              break;
            case 'GC': {
              const before = state();
              assertSilentSuccess(cni({ CNI_COMMAND: 'GC', CNI_PATH }, gcConf(version)));
              assertUnchanged(before, 'GC keeping every live attachment');
              break;
            }
            case 'VERSION': {
              const res = cni({ CNI_COMMAND: 'VERSION' }, JSON.stringify({ cniVersion: version }));
              assert.equal(res.code, 0, show(res));
              const info = onlyObject(res);
              assert.ok((VERSIONS as readonly unknown[]).includes(info.cniVersion), `VERSION cniVersion: ${res.stdout}`);
              assert.deepEqual([...(info.supportedVersions as string[])].sort(), [...VERSIONS]);
              break;
            }
          }
        });
      }
    }
  });

  describe('errors: spec code, one JSON object on stdout, nothing allocated', () => {
    interface ErrorCase {
      readonly name: string;
      readonly verb: Exclude<Verb, 'VERSION'>;
      readonly env?: EnvPatch;
      /** stdin; the 1.0.0 configuration (1.1.0 for STATUS and GC, listing no valid attachment) when absent. */
      readonly stdin?: () => string | Buffer;
      readonly code: number;
    }
    const NO_SUCH_NETNS = '/var/run/netns/atoll-conformance-no-such-netns';
    const RELATIVE_NETNS = 'var/run/netns/pod';
    const ENV = CODE.invalidEnvironment;
    const CASES: readonly ErrorCase[] = [
      // the command
      { name: 'CNI_COMMAND missing', verb: 'ADD', env: { CNI_COMMAND: undefined }, code: ENV },
      { name: 'CNI_COMMAND empty', verb: 'ADD', env: { CNI_COMMAND: '' }, code: ENV },
      { name: 'CNI_COMMAND unknown (ATTACH)', verb: 'ADD', env: { CNI_COMMAND: 'ATTACH' }, code: ENV },
      { name: 'CNI_COMMAND in lower case (add)', verb: 'ADD', env: { CNI_COMMAND: 'add' }, code: ENV },
      // the attachment
      { name: 'CNI_CONTAINERID missing on ADD', verb: 'ADD', env: { CNI_CONTAINERID: undefined }, code: ENV },
      { name: 'CNI_CONTAINERID missing on DEL', verb: 'DEL', env: { CNI_CONTAINERID: undefined }, code: ENV },
      { name: 'CNI_CONTAINERID with a slash', verb: 'ADD', env: { CNI_CONTAINERID: 'abc/../def' }, code: ENV },
      { name: 'CNI_CONTAINERID starting with -', verb: 'ADD', env: { CNI_CONTAINERID: '-abc' }, code: ENV },
      { name: 'CNI_CONTAINERID with a space', verb: 'ADD', env: { CNI_CONTAINERID: 'abc def' }, code: ENV },
      { name: 'CNI_IFNAME missing on ADD', verb: 'ADD', env: { CNI_IFNAME: undefined }, code: ENV },
      { name: 'CNI_IFNAME missing on DEL', verb: 'DEL', env: { CNI_IFNAME: undefined }, code: ENV },
      { name: 'CNI_IFNAME of 16 characters', verb: 'ADD', env: { CNI_IFNAME: 'eth0123456789abc' }, code: ENV },
      { name: 'CNI_IFNAME with /', verb: 'ADD', env: { CNI_IFNAME: 'eth/0' }, code: ENV },
      { name: 'CNI_IFNAME ..', verb: 'ADD', env: { CNI_IFNAME: '..' }, code: ENV },
      { name: 'CNI_NETNS missing on ADD', verb: 'ADD', env: { CNI_NETNS: undefined }, code: ENV },
      { name: 'CNI_NETNS empty on ADD', verb: 'ADD', env: { CNI_NETNS: '' }, code: ENV },
      { name: 'CNI_NETNS missing on CHECK', verb: 'CHECK', env: { CNI_NETNS: undefined }, code: ENV },
      { name: 'CNI_NETNS relative on ADD', verb: 'ADD', env: { CNI_NETNS: RELATIVE_NETNS }, code: ENV },
      { name: 'CNI_NETNS relative on CHECK', verb: 'CHECK', env: { CNI_NETNS: RELATIVE_NETNS }, code: ENV },
      { name: 'CNI_NETNS relative on DEL', verb: 'DEL', env: { CNI_NETNS: RELATIVE_NETNS }, code: ENV },
      { name: 'CNI_NETNS that does not exist on ADD', verb: 'ADD', env: { CNI_NETNS: NO_SUCH_NETNS }, code: ENV },
      { name: 'CNI_PATH missing on ADD', verb: 'ADD', env: { CNI_PATH: undefined }, code: ENV },
      { name: 'CNI_PATH missing on DEL', verb: 'DEL', env: { CNI_PATH: undefined }, code: ENV },
      { name: 'CNI_PATH missing on CHECK', verb: 'CHECK', env: { CNI_PATH: undefined }, code: ENV },
      { name: 'CNI_PATH missing on GC', verb: 'GC', env: { CNI_PATH: undefined }, code: ENV },
      // CNI_ARGS
      { name: 'CNI_ARGS with an unknown key, no IgnoreUnknown', verb: 'ADD', env: { CNI_ARGS: 'K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;FOO=bar' }, code: ENV },
      { name: 'CNI_ARGS with an unknown key and IgnoreUnknown=0', verb: 'ADD', env: { CNI_ARGS: 'IgnoreUnknown=0;FOO=bar;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p' }, code: ENV },
      { name: 'CNI_ARGS entry without =', verb: 'ADD', env: { CNI_ARGS: 'IgnoreUnknown=1;K8S_POD_NAMESPACE' }, code: ENV },
      // stdin that is not a configuration
      { name: 'stdin not JSON', verb: 'ADD', stdin: () => 'cniVersion: 1.0.0\nname: atoll\n', code: CODE.decodeFailure },
      { name: 'stdin truncated JSON', verb: 'ADD', stdin: () => conf('1.0.0').slice(0, -7), code: CODE.decodeFailure },
      { name: 'stdin a JSON array', verb: 'ADD', stdin: () => `[${conf('1.0.0')}]`, code: CODE.decodeFailure },
      { name: 'stdin a JSON string', verb: 'ADD', stdin: () => JSON.stringify(conf('1.0.0')), code: CODE.decodeFailure },
      { name: 'stdin JSON null', verb: 'ADD', stdin: () => 'null', code: CODE.decodeFailure },
      { name: 'stdin empty on ADD', verb: 'ADD', stdin: () => '', code: CODE.decodeFailure },
      { name: 'stdin empty on DEL', verb: 'DEL', stdin: () => '', code: CODE.decodeFailure },
      { name: 'stdin 2 MiB of valid-looking JSON on ADD', verb: 'ADD', stdin: () => paddedConf('1.0.0', 2 * MIB), code: CODE.decodeFailure },
      { name: 'stdin of 1 MiB + 1 byte on STATUS', verb: 'STATUS', stdin: () => paddedConf('1.1.0', MIB + 1), code: CODE.decodeFailure },
      // the configuration
      { name: 'cniVersion missing', verb: 'ADD', stdin: () => conf('1.0.0', {}, ['cniVersion']), code: CODE.invalidConfig },
      { name: 'cniVersion a number', verb: 'ADD', stdin: () => conf('1.0.0', { cniVersion: 1.0 }), code: CODE.invalidConfig },
      { name: 'cniVersion 0.2.0 (unsupported)', verb: 'ADD', stdin: () => conf('0.2.0'), code: CODE.incompatibleVersion },
      { name: 'cniVersion 9.9.9 (unsupported)', verb: 'ADD', stdin: () => conf('9.9.9'), code: CODE.incompatibleVersion },
      { name: 'cniVersion 0.2.0 on DEL', verb: 'DEL', stdin: () => conf('0.2.0'), code: CODE.incompatibleVersion },
      { name: 'unknown top-level key on ADD', verb: 'ADD', stdin: () => conf('1.0.0', { bogusKey: true }), code: CODE.invalidConfig },
      { name: 'unknown top-level key on DEL', verb: 'DEL', stdin: () => conf('1.0.0', { bogusKey: true }), code: CODE.invalidConfig },
      { name: 'network name missing', verb: 'ADD', stdin: () => conf('1.0.0', {}, ['name']), code: CODE.invalidConfig },
      { name: 'network the agent does not serve, on ADD', verb: 'ADD', stdin: () => conf('1.0.0', { name: 'not-atoll' }), code: CODE.invalidConfig },
      { name: 'network the agent does not serve, on DEL', verb: 'DEL', stdin: () => conf('1.0.0', { name: 'not-atoll' }), code: CODE.invalidConfig },
      { name: 'network the agent does not serve, on CHECK', verb: 'CHECK', stdin: () => conf('1.0.0', { name: 'not-atoll' }), code: CODE.invalidConfig },
      { name: 'network the agent does not serve, on GC', verb: 'GC', stdin: () => conf('1.1.0', { name: 'not-atoll', 'cni.dev/valid-attachments': [] }), code: CODE.invalidConfig },
      { name: 'GC with cni.dev/valid-attachments not a list', verb: 'GC', stdin: () => conf('1.1.0', { 'cni.dev/valid-attachments': { containerID: 'x', ifname: 'eth0' } }), code: CODE.invalidConfig },
      { name: 'GC with an attachment lacking containerID', verb: 'GC', stdin: () => conf('1.1.0', { 'cni.dev/valid-attachments': [{ ifname: 'eth0' }] }), code: CODE.invalidConfig },
    ];

    for (const c of CASES) {
      test(`${c.name}: code ${c.code}`, () => {
        // ADD works on a fresh pod; DEL and CHECK aim at the sentinel, so one that wrongly went ahead shows.
        const fresh = c.verb === 'ADD' ? agent.podNetns(uniq('e')) : undefined;
        const env =
          c.verb === 'STATUS' ? { CNI_COMMAND: 'STATUS' }
          : c.verb === 'GC' ? { CNI_COMMAND: 'GC', CNI_PATH }
          : fresh ? baseEnv(c.verb, uniq('c-err-'), fresh)
          : { ...sentinel.env, CNI_COMMAND: c.verb };
        const stdin = c.stdin ? c.stdin() : c.verb === 'STATUS' || c.verb === 'GC' ? conf('1.1.0', { 'cni.dev/valid-attachments': [] }) : conf('1.0.0');
        const before = state();
        assertCniError(cni(patch(env, c.env), stdin), c.code, requestVersion(stdin));
        assertUnchanged(before, c.name);
        if (fresh) assert.deepEqual(podLinks(fresh), [], 'nothing was created in the pod namespace');
      });
    }

    // Failures found only while building: the code is the agent's choice, but every completed step must be undone.
    const LATE: readonly { name: string; env: () => EnvPatch }[] = [
      { name: 'CNI_NETNS a directory, not a namespace', env: () => ({ CNI_NETNS: agent.dir }) },
      { name: 'CNI_IFNAME names an interface the pod already has (lo)', env: () => ({ CNI_IFNAME: 'lo' }) },
    ];
    for (const c of LATE) {
      test(`${c.name}: ADD fails and its rollback leaves nothing`, () => {
        const netns = agent.podNetns(uniq('late'));
        const before = state();
        assertCniError(cni(patch(baseEnv('ADD', uniq('c-late-'), netns), c.env()), conf('1.0.0')), undefined, '1.0.0');
        assertUnchanged(before, c.name);
        assert.deepEqual(podLinks(netns), []);
      });
    }
  });

  describe('accepted variations', () => {
    const ARGS: readonly { name: string; args: (cid: string) => string }[] = [
      { name: 'IgnoreUnknown first', args: (cid) => `IgnoreUnknown=1;K8S_POD_NAMESPACE=ns-a;K8S_POD_NAME=pod-a;K8S_POD_INFRA_CONTAINER_ID=${cid};K8S_POD_UID=u-1` },
      { name: 'IgnoreUnknown last, extra keys first', args: (cid) => `FOO=bar;K8S_POD_NAME=pod-b;K8S_POD_INFRA_CONTAINER_ID=${cid};K8S_POD_NAMESPACE=ns-b;IgnoreUnknown=1` },
      { name: 'IgnoreUnknown in the middle, extra keys around', args: (cid) => `K8S_POD_UID=u-3;X_A=1;IgnoreUnknown=1;K8S_POD_NAME=pod-c;X_B=;K8S_POD_NAMESPACE=ns-c;K8S_POD_INFRA_CONTAINER_ID=${cid}` },
      { name: 'IgnoreUnknown=true, keys reversed', args: (cid) => `K8S_POD_INFRA_CONTAINER_ID=${cid};K8S_POD_NAME=pod-d;K8S_POD_NAMESPACE=ns-d;K8S_POD_NETWORK=x;IgnoreUnknown=true` },
      { name: 'empty entries around', args: () => `;IgnoreUnknown=1;;K8S_POD_NAMESPACE=ns-e;EXTRA=1;K8S_POD_NAME=pod-e;` },
    ];
    for (const a of ARGS) {
      test(`CNI_ARGS shuffled with IgnoreUnknown and extra keys: ${a.name}`, () => {
        const cid = uniq('c-args-');
        const args = a.args(cid);
        const { env } = addPod('1.0.0', 'args', { CNI_CONTAINERID: cid, CNI_ARGS: args });
        const ns = /K8S_POD_NAMESPACE=([^;]*)/.exec(args)?.[1];
        const name = /K8S_POD_NAME=([^;]*)/.exec(args)?.[1];
        assert.ok(recordFiles().some((f) => f.endsWith(`_${ns}_${name}`)), `an IPAM record for ${ns}/${name}: ${recordFiles().join(', ')}`);
        assertSilentSuccess(del(env, '1.0.0'));
      });
    }

    const RUNTIME_CONFIGS: readonly { name: string; runtimeConfig: Json }[] = [
      { name: 'PortMappings', runtimeConfig: { PortMappings: [{ hostPort: 8080, containerPort: 80, protocol: 'tcp' }] } },
      { name: 'portmappings', runtimeConfig: { portmappings: [] } },
      { name: 'portMappings, Bandwidth and IPRanges', runtimeConfig: { portMappings: [], Bandwidth: { ingressRate: 1000 }, IPRanges: [[{ subnet: POD_CIDR }]] } },
      { name: 'MAC and IPS', runtimeConfig: { MAC: '0a:58:0a:00:00:01', IPS: [] } },
    ];
    for (const v of RUNTIME_CONFIGS) {
      test(`runtimeConfig with odd capitalisation is accepted: ${v.name}`, () => {
        const netns = agent.podNetns(uniq('rc'));
        const env = baseEnv('ADD', uniq('c-rc-'), netns);
        assertAddResult(cni(env, conf('1.1.0', { runtimeConfig: v.runtimeConfig })), '1.1.0', netns);
        assertSilentSuccess(del(env, '1.1.0', {}, { runtimeConfig: v.runtimeConfig }));
      });
    }

    test('a configuration of exactly 1 MiB is accepted (STATUS)', () => {
      assertSilentSuccess(cni({ CNI_COMMAND: 'STATUS' }, paddedConf('1.1.0', MIB)));
    });
  });

  describe('DEL is idempotent', () => {
    test('DEL of a container never added', () => {
      const before = state();
      assertSilentSuccess(cni(baseEnv('DEL', uniq('c-never-'), agent.podNetns(uniq('dn'))), conf('1.0.0')));
      assertUnchanged(before, 'DEL of a container never added');
    });

    test('DEL with empty CNI_NETNS and no prevResult', () => {
      const { env, result } = addPod('1.0.0', 'de');
      assertSilentSuccess(del(env, '1.0.0', { CNI_NETNS: '' }));
      assert.equal(hostLink(result.hostIf), undefined, 'DEL removes the host veth');
    });

    test('DEL with CNI_NETNS unset and no prevResult, never added', () => {
      assertSilentSuccess(cni(patch(baseEnv('DEL', uniq('c-unset-'), ''), { CNI_NETNS: undefined }), conf('1.1.0')));
    });

    test('DEL repeated three times', () => {
      const { env, result } = addPod('1.1.0', 'dr');
      for (let i = 0; i < 3; i++) assertSilentSuccess(del(env, '1.1.0'));
      assert.equal(hostLink(result.hostIf), undefined);
    });

    test('DEL after the pod namespace was deleted', () => {
      const { env, netns, result } = addPod('1.0.0', 'dg');
      delNetns(basename(netns));
      assertSilentSuccess(del(env, '1.0.0'));
      assertSilentSuccess(del(env, '1.0.0', { CNI_NETNS: '' }));
      assert.equal(hostLink(result.hostIf), undefined);
    });

    test('DEL with the ADD result as prevResult, twice', () => {
      const { env, result } = addPod('1.0.0', 'dp');
      const prevResult = result.json;
      assertSilentSuccess(del(env, '1.0.0', {}, { prevResult }));
      assertSilentSuccess(del(env, '1.0.0', {}, { prevResult }));
    });
  });

  describe('CHECK', () => {
    for (const version of VERSIONS.filter((v) => allowed('CHECK', v))) {
      test(`CHECK with the ADD result as prevResult succeeds in ${version}`, () => {
        const { env, result } = addPod(version, 'ck');
        const prevResult = result.json;
        assertSilentSuccess(cni({ ...env, CNI_COMMAND: 'CHECK' }, conf(version, { prevResult })));
        assertSilentSuccess(del(env, version));
      });
    }

    test('CHECK of a container never added fails with a code and a message', () => {
      const before = state();
      assertCniError(cni(baseEnv('CHECK', uniq('c-nochk-'), agent.podNetns(uniq('cn'))), conf('1.0.0')), undefined, '1.0.0');
      assertUnchanged(before, 'CHECK of a container never added');
    });

    // SPEC.md, CHECK: "The plugin must consult the prevResult to determine the expected interfaces and addresses."
    const MISMATCHES: readonly { name: string; edit: (r: Json) => void }[] = [
      { name: 'an address the pod does not have', edit: (r) => Object.assign((r.ips as Json[])[0] as Json, { address: '10.79.0.250/24' }) },
      { name: 'a pod MAC the pod does not have', edit: (r) => Object.assign((r.interfaces as Json[])[1] as Json, { mac: '0a:58:00:00:00:01' }) },
    ];
    for (const m of MISMATCHES) {
      test(`CHECK with a prevResult naming ${m.name} fails`, () => {
        const { env, result } = addPod('1.0.0', 'cm');
        const prevResult = structuredClone(result.json);
        m.edit(prevResult);
        try {
          assertCniError(cni({ ...env, CNI_COMMAND: 'CHECK' }, conf('1.0.0', { prevResult })), undefined, '1.0.0');
        } finally {
          assertSilentSuccess(del(env, '1.0.0'));
        }
      });
    }

    test('CHECK after DEL fails', () => {
      const { env, result } = addPod('1.0.0', 'cd');
      const prevResult = result.json;
      assertSilentSuccess(del(env, '1.0.0'));
      assertCniError(cni({ ...env, CNI_COMMAND: 'CHECK' }, conf('1.0.0', { prevResult })), undefined, '1.0.0');
    });
  });

  // Last: it stops and restarts the agent.
  describe('agent unreachable', () => {
    before(async () => {
      await agent.stop();
    });
    const CASES: readonly { name: string; verb: Exclude<Verb, 'VERSION'>; version: Version; code: number }[] = [
      { name: 'ADD in 1.0.0', verb: 'ADD', version: '1.0.0', code: CODE.tryAgainLater },
      { name: 'ADD in 0.3.1', verb: 'ADD', version: '0.3.1', code: CODE.tryAgainLater },
      { name: 'DEL in 0.4.0', verb: 'DEL', version: '0.4.0', code: CODE.tryAgainLater },
      { name: 'STATUS in 1.1.0', verb: 'STATUS', version: '1.1.0', code: CODE.notAvailable },
    ];
    for (const c of CASES) {
      test(`agent stopped: ${c.name} gives code ${c.code} in the request's version`, () => {
        const env = c.verb === 'STATUS' ? { CNI_COMMAND: 'STATUS' } : baseEnv(c.verb, uniq('c-down-'), agent.podNetns(uniq('down')));
        const before = state();
        assertCniError(cni(env, conf(c.version)), c.code, c.version);
        assertUnchanged(before, `${c.name} while the agent is down`);
      });
    }

    test('agent stopped: VERSION still answers, from the shim', () => {
      const res = cni({ CNI_COMMAND: 'VERSION' }, '');
      assert.equal(res.code, 0, res.stdout);
      assert.deepEqual(res.json?.supportedVersions, ['0.3.1', '0.4.0', '1.0.0', '1.1.0']);
    });

    test('agent started again: ADD works, and the pod attached before the stop still passes CHECK', async () => {
      await agent.start();
      const { env } = addPod('1.0.0', 'up');
      assertSilentSuccess(del(env, '1.0.0'));
      assertSilentSuccess(cni({ ...sentinel.env, CNI_COMMAND: 'CHECK' }, conf('1.0.0', { prevResult: sentinel.result.json })));
    });
  });
});
