/**
 * The lines of the controller's policy stream (`GET /v1/policy`, NDJSON, docs/api.md): what a node's pods need of the
 * cluster's NetworkPolicy state (src/core/policy/scope.ts). Each line is decoded against this schema before it is
 * used: a line that does not decode ends the stream (the agent keeps enforcing what it last applied, and watches
 * again for a fresh snapshot). Objects are checked strictly: a field the agent does not know could be one that
 * narrows what a rule allows.
 */
import * as z from 'zod/mini';
import { decodeStreamLine } from './json-file.ts';
import type { PolicyLine } from '../core/policy/scope.ts';

const labels = z.record(z.string(), z.string());
const name = z.string().check(z.minLength(1));
const selector = z.strictObject({
  matchLabels: z.optional(labels),
  matchExpressions: z.optional(z.array(z.strictObject({ key: z.string(), operator: z.enum(['In', 'NotIn', 'Exists', 'DoesNotExist']), values: z.array(z.string()) }))),
});
const protocol = z.enum(['TCP', 'UDP', 'SCTP']);
const portNumber = z.number().check(z.int(), z.gte(1), z.lte(65535));
const port = z.strictObject({ protocol, port: z.optional(z.union([portNumber, z.string().check(z.minLength(1), z.maxLength(15))])), endPort: z.optional(portNumber) });
const peer = z.union([
  z.strictObject({ ipBlock: z.strictObject({ cidr: z.string(), except: z.array(z.string()) }) }),
  z.strictObject({ podSelector: z.optional(selector), namespaceSelector: z.optional(selector) }),
]);
const rule = z.strictObject({ peers: z.array(peer), ports: z.array(port) });
const policy = z.strictObject({
  namespace: name,
  name,
  podSelector: selector,
  policyTypes: z.array(z.enum(['Ingress', 'Egress'])),
  ingress: z.array(rule),
  egress: z.array(rule),
});
const namespace = z.strictObject({ name, labels });
const pod = z.strictObject({
  namespace: name,
  name,
  node: name,
  ip: z.string(),
  labels,
  ports: z.array(z.strictObject({ name: z.string(), protocol, port: portNumber })),
});

export const policyLineSchema = z.discriminatedUnion('type', [
  z.strictObject({ type: z.literal('snapshot'), policies: z.array(policy), namespaces: z.array(namespace), pods: z.array(pod) }),
  z.strictObject({ type: z.literal('put'), policy: z.optional(policy), namespace: z.optional(namespace), pod: z.optional(pod) }),
  z.strictObject({ type: z.literal('delete'), policy: z.optional(name), namespace: z.optional(name), pod: z.optional(name) }),
  z.strictObject({ type: z.literal('mark'), stream: z.string().check(z.minLength(1), z.maxLength(64)), seq: z.number().check(z.int(), z.gte(0)) }),
  z.strictObject({ type: z.literal('ping') }),
]);

/**
 * The policy line in `text` (one line, without its newline), from the controller at `source`.
 * @throws AtollError CONTROLLER_WATCH_INVALID when the text is not JSON or not a policy line.
 */
export function decodePolicyLine(text: string, source: string): PolicyLine {
  const fix = 'the agent keeps enforcing the policies it last applied, ends this stream and asks again for a snapshot; if this repeats, run the same Atoll version on the controller and here';
  return decodeStreamLine(policyLineSchema, text, 'policy line', `the policy stream of controller ${source}`, fix) as PolicyLine;
}
