/**
 * Decoding a CNI invocation (environment + network configuration on stdin) into a {@link CniRequest}.
 * The only place raw CNI input enters. Checks run in the reference plugins' order: the command, then the
 * environment, then the configuration, so each kind of bad input gets its spec code.
 */
import * as z from 'zod/mini';
import { AtollError, atollError } from '../core/errors.ts';
import { describeIssues } from './json-file.ts';
import {
  type Attachment,
  CNI_VERBS,
  type CniRequest,
  type CniVerb,
  type PodIdentity,
  isSupportedVersion,
  LATEST_CNI_VERSION,
  SUPPORTED_CNI_VERSIONS,
  verbAllowedIn,
} from '../core/cni-spec/model.ts';

/** The largest network configuration accepted on stdin. */
export const MAX_STDIN_BYTES = 1 << 20;

const CONTAINER_ID = /^[A-Za-z0-9][A-Za-z0-9_.-]*$/;
/**
 * An interface name: 1 to 15 printable ASCII characters (so 1 to 15 bytes: Linux's IFNAMSIZ is 16 with the NUL) other
 * than space, `/` and `:`. The kernel takes other bytes too, but a name counted in UTF-16 units could pass at 15
 * characters and be longer than 15 bytes.
 */
const IFNAME = /^[!-.0-9;-~]{1,15}$/;
const IFNAME_RULE = 'an interface name of 1 to 15 printable ASCII characters other than space, / and :';
const NETNS_PATH = /^\/[A-Za-z0-9_./@:+-]+$/;
const ARG_KEYS = ['K8S_POD_NAMESPACE', 'K8S_POD_NAME', 'K8S_POD_UID', 'K8S_POD_INFRA_CONTAINER_ID', 'IgnoreUnknown'] as const;

const attachmentSchema = z.pipe(
  z.record(z.string(), z.unknown()),
  z.transform((o: Record<string, unknown>, ctx): Attachment => {
    const pick = (k: string) => Object.entries(o).find(([key]) => key.toLowerCase() === k)?.[1];
    const containerId = pick('containerid');
    const ifName = pick('ifname');
    if (typeof containerId !== 'string' || typeof ifName !== 'string') {
      ctx.issues.push({ code: 'custom', message: 'each valid attachment needs string containerID and ifname', input: o });
      return z.NEVER;
    }
    return { containerId, ifName };
  }),
);

/** Atoll's own keys plus those the spec lets a runtime inject. */
const netConfSchema = z.strictObject({
  cniVersion: z.string(),
  name: z.string().check(z.minLength(1)),
  type: z.string().check(z.minLength(1)),
  agentSocket: z.optional(z.string().check(z.regex(/^\/[^"\\]*$/, 'must be an absolute path without quotes or backslashes'))),
  args: z.optional(z.record(z.string(), z.unknown())),
  capabilities: z.optional(z.record(z.string(), z.unknown())),
  runtimeConfig: z.optional(z.record(z.string(), z.unknown())),
  prevResult: z.optional(z.looseObject({
    ips: z._default(z.array(z.looseObject({ address: z.string() })), []),
    interfaces: z._default(z.array(z.looseObject({ name: z.string(), mac: z.optional(z.string()), sandbox: z.optional(z.string()) })), []),
  })),
  dns: z.optional(z.record(z.string(), z.unknown())),
  'cni.dev/valid-attachments': z.optional(z.array(attachmentSchema)),
});

function envInvalid(message: string, fix: string): AtollError {
  return atollError('CNI_ENV_INVALID', message, fix);
}

/** Best effort: the cniVersion of the input, to answer an error in it. */
export function versionForErrors(stdin: Uint8Array): string {
  const text = Buffer.from(stdin.subarray(0, MAX_STDIN_BYTES)).toString('utf8');
  let v: unknown;
  try {
    v = (JSON.parse(text) as { cniVersion?: unknown }).cniVersion;
  } catch {
    v = /"cniVersion"\s*:\s*"([0-9.]+)"/.exec(text)?.[1]; // cut-off or malformed input
  }
  return typeof v === 'string' && isSupportedVersion(v) ? v : LATEST_CNI_VERSION;
}

/** The CNI verb of an invocation. @throws AtollError CNI_ENV_INVALID when CNI_COMMAND is missing or unknown. */
export function decodeVerb(env: Readonly<Record<string, string | undefined>>): CniVerb {
  const cmd = env.CNI_COMMAND;
  if (!cmd || !(CNI_VERBS as readonly string[]).includes(cmd)) {
    throw envInvalid(`CNI_COMMAND is ${cmd ? `"${cmd}"` : 'missing'}`, `set it to one of ${CNI_VERBS.join(', ')}`);
  }
  return cmd as CniVerb;
}

/** Parses CNI_ARGS (`K=V;K=V`, any order). Unknown keys are refused unless IgnoreUnknown is set. */
export function decodeCniArgs(text: string): PodIdentity {
  const pairs = new Map<string, string>();
  for (const part of text.split(';')) {
    if (part === '') continue;
    const eq = part.indexOf('=');
    if (eq <= 0) throw envInvalid(`CNI_ARGS entry "${part}" is not KEY=VALUE`, 'separate entries with ; and write each as KEY=VALUE');
    pairs.set(part.slice(0, eq), part.slice(eq + 1));
  }
  const ignore = /^(1|true)$/i.test(pairs.get('IgnoreUnknown') ?? '');
  for (const key of pairs.keys()) {
    if (!ignore && !(ARG_KEYS as readonly string[]).includes(key)) {
      throw envInvalid(`CNI_ARGS has unknown key "${key}"`, 'remove it, or add IgnoreUnknown=1');
    }
  }
  const identity: { -readonly [K in keyof PodIdentity]: PodIdentity[K] } = {};
  const ns = pairs.get('K8S_POD_NAMESPACE');
  const name = pairs.get('K8S_POD_NAME');
  if ((ns === undefined) !== (name === undefined) || ns === '' || name === '') {
    throw envInvalid('CNI_ARGS must give K8S_POD_NAMESPACE and K8S_POD_NAME together, both non-empty', 'pass both or neither');
  }
  for (const [field, value] of [['namespace', ns], ['name', name]] as const) {
    if (value !== undefined && !/^[A-Za-z0-9][A-Za-z0-9.-]*$/.test(value)) {
      throw envInvalid(`CNI_ARGS pod ${field} "${value}" is not a Kubernetes name`, 'use lowercase letters, digits, - and .');
    }
    if (value !== undefined) identity[field] = value;
  }
  const uid = pairs.get('K8S_POD_UID');
  if (uid) identity.uid = uid;
  const infra = pairs.get('K8S_POD_INFRA_CONTAINER_ID');
  if (infra) identity.infraContainerId = infra;
  return identity;
}

function requireEnv(env: Readonly<Record<string, string | undefined>>, key: string, verb: CniVerb, pattern: RegExp, what: string): string {
  const v = env[key];
  if (v === undefined || v === '') throw envInvalid(`${key} is missing for ${verb}`, `the runtime must set ${key} (${what})`);
  if (!pattern.test(v)) throw envInvalid(`${key} "${v}" is not valid`, `it must be ${what}`);
  return v;
}

/**
 * Decodes and validates a whole invocation other than VERSION.
 * @throws AtollError with the code the spec gives for the first problem found.
 */
export function decodeCniRequest(env: Readonly<Record<string, string | undefined>>, stdin: Uint8Array): CniRequest {
  const verb = decodeVerb(env);
  const needsAttachment = verb === 'ADD' || verb === 'DEL' || verb === 'CHECK';
  const containerId = needsAttachment ? requireEnv(env, 'CNI_CONTAINERID', verb, CONTAINER_ID, 'letters, digits, _ . - starting with a letter or digit') : '';
  const ifName = needsAttachment ? requireEnv(env, 'CNI_IFNAME', verb, IFNAME, IFNAME_RULE) : '';
  if (ifName === '.' || ifName === '..') throw envInvalid(`CNI_IFNAME "${ifName}" is not valid`, 'pick another interface name');
  let netns = '';
  if (verb === 'ADD' || verb === 'CHECK') netns = requireEnv(env, 'CNI_NETNS', verb, NETNS_PATH, 'an absolute path to a network namespace');
  else if (verb === 'DEL' && env.CNI_NETNS) netns = requireEnv(env, 'CNI_NETNS', verb, NETNS_PATH, 'an absolute path to a network namespace');
  if (verb !== 'STATUS' && !env.CNI_PATH) throw envInvalid(`CNI_PATH is missing for ${verb}`, 'the runtime must set CNI_PATH to its plugin directories');
  const pod = decodeCniArgs(env.CNI_ARGS ?? '');

  if (stdin.length > MAX_STDIN_BYTES) {
    throw atollError('CNI_INPUT_TOO_LARGE', `the network configuration is ${stdin.length} bytes or more, over the ${MAX_STDIN_BYTES}-byte limit`, 'pass the conflist entry only');
  }
  let raw: unknown;
  try {
    raw = JSON.parse(Buffer.from(stdin).toString('utf8'));
  } catch (cause) {
    throw atollError('CNI_DECODE', `the network configuration on stdin is not JSON: ${(cause as Error).message}`, 'pass the network configuration as a JSON object', cause);
  }
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) {
    throw atollError('CNI_DECODE', 'the network configuration on stdin is not a JSON object', 'pass the network configuration as a JSON object');
  }
  const version = (raw as { cniVersion?: unknown }).cniVersion;
  if (typeof version !== 'string') {
    throw atollError('CNI_CONFIG_INVALID', 'the network configuration has no string cniVersion', `set cniVersion to one of ${SUPPORTED_CNI_VERSIONS.join(', ')}`);
  }
  if (!isSupportedVersion(version)) {
    throw atollError('CNI_VERSION_UNSUPPORTED', `cniVersion "${version}" is not supported`, `use one of ${SUPPORTED_CNI_VERSIONS.join(', ')}`);
  }
  if (!verbAllowedIn(verb, version)) {
    throw atollError('CNI_VERB_NOT_IN_VERSION', `config version ${version} does not allow ${verb}`, 'raise cniVersion in the conflist');
  }
  const parsed = netConfSchema.safeParse(raw);
  if (!parsed.success) {
    const problems = describeIssues(parsed.error);
    throw atollError('CNI_CONFIG_INVALID', `the network configuration is invalid: ${problems}`, 'fix the conflist entry for atoll; docs/configuration.md lists its keys');
  }
  if (verb === 'CHECK' && !parsed.data.prevResult) {
    throw atollError('CNI_CONFIG_INVALID', 'CHECK needs prevResult: the result of the ADD being checked', 'pass the cached ADD result as prevResult, as runtimes do');
  }
  return {
    verb,
    cniVersion: version,
    network: parsed.data.name,
    containerId,
    netns,
    ifName,
    pod,
    validAttachments: parsed.data['cni.dev/valid-attachments'] ?? [],
    prevResult: parsed.data.prevResult && {
      addresses: parsed.data.prevResult.ips.map((i) => i.address),
      interfaces: parsed.data.prevResult.interfaces.map((i) => ({ name: i.name, mac: i.mac, sandbox: i.sandbox })),
    },
  };
}
