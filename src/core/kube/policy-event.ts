/**
 * The Kubernetes Event that tells a namespace's users Atoll enforces one of their NetworkPolicies more strictly than
 * written (POLICY_UNSUPPORTED), as events.k8s.io/v1 (shown by `kubectl describe networkpolicy` and `kubectl events`).
 * Pure: the controller posts what this builds.
 *
 * One Event per policy generation: its name is derived from the policy's uid and `metadata.generation`, so a second
 * post of it (another controller replica, a restarted controller, a resync) is refused as AlreadyExists and changes
 * nothing; an edit of the policy's spec (a new generation) that still has problems gets a new Event.
 */
import { fnv1a, hex } from '../fnv.ts';

export const POLICY_EVENT_REASON = 'PolicyUnsupported';
export const EVENT_REPORTER = 'atoll.dev/controller';
/** events.k8s.io/v1 refuses a note over 1 kB (the messages are ASCII: names, labels and prefixes). */
const NOTE_MAX = 1024;

/** What the Event needs of the NetworkPolicy it is about. */
export interface PolicyRef {
  readonly namespace: string;
  readonly name: string;
  readonly uid: string;
  readonly generation: number;
  readonly resourceVersion?: string;
}

/** `ns/name@uid/generation`: what "once per policy generation" counts. */
export function policyGenerationKey(p: PolicyRef): string {
  return `${p.namespace}/${p.name}@${p.uid}/${p.generation}`;
}

/**
 * The Event for `problems` (each a POLICY_UNSUPPORTED message) of policy `p`, reported by controller `instance` at
 * `now` (ms since epoch).
 */
export function policyUnsupportedEvent(p: PolicyRef, problems: readonly string[], instance: string, now: number) {
  const name = `${p.name.slice(0, 240)}.${hex(fnv1a(`${p.uid}/${p.generation}`), 8)}`;
  let note = `Atoll enforces this policy more strictly than written (POLICY_UNSUPPORTED): ${problems.join('; ')}`;
  if (note.length > NOTE_MAX) note = `${note.slice(0, NOTE_MAX - 3)}...`;
  // MicroTime: RFC 3339 with six fractional digits
  const eventTime = new Date(now).toISOString().replace(/\.(\d{3})Z$/, '.$1000Z');
  return {
    apiVersion: 'events.k8s.io/v1',
    kind: 'Event',
    metadata: { name, namespace: p.namespace },
    eventTime,
    type: 'Warning',
    reason: POLICY_EVENT_REASON,
    action: 'Enforce',
    note,
    reportingController: EVENT_REPORTER,
    reportingInstance: instance.slice(0, 128),
    regarding: { apiVersion: 'networking.k8s.io/v1', kind: 'NetworkPolicy', namespace: p.namespace, name: p.name, uid: p.uid, ...(p.resourceVersion ? { resourceVersion: p.resourceVersion } : {}) },
  };
}
