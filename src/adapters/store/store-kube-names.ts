/**
 * Where a store key lives in the Kubernetes store (src/adapters/store/store-kube.ts): which custom resource kind, and
 * which object name. Names are cluster-wide, so each carries its store's tag: `<store>.<key name>`.
 *
 * - Kind: keys under `blocks/` are IPBlocks and under `nodes/` NodeRegistrations (that prefix dropped from the
 *   name); every other key is a StoreEntry named after the whole key.
 * - Key name: the rest of the key as it is when it is already a valid DNS-1123 subdomain without `--` (so
 *   `blocks/10.244.1.0-26` is IPBlock `atoll-controller.10.244.1.0-26`, and the name gives the key back); otherwise
 *   a readable form (lowercase, other characters as `-`) cut to fit, then `--` and 20 hex digits of the key's
 *   SHA-256. A plain name never holds `--` and a hashed one always does, so no two keys share a name; the key itself
 *   is always in `spec.key`.
 * - Store tag: the store's name when it is a DNS label (no dots), else its readable form and a hash, so the first
 *   dot always ends the tag.
 */
import { createHash } from 'node:crypto';

export type EntryKind = 'IPBlock' | 'NodeRegistration' | 'StoreEntry';

/** The plural resource name of each kind, as in deploy/helm/atoll/crds/. */
export const KIND_PLURAL: Readonly<Record<EntryKind, string>> = { IPBlock: 'ipblocks', NodeRegistration: 'noderegistrations', StoreEntry: 'storeentries' };

/** The key prefix each kind holds ('' for StoreEntry: every key the others do not). */
export const KIND_PREFIX: Readonly<Record<EntryKind, string>> = { IPBlock: 'blocks/', NodeRegistration: 'nodes/', StoreEntry: '' };

export const ENTRY_KINDS: readonly EntryKind[] = ['IPBlock', 'NodeRegistration', 'StoreEntry'];

const MAX_NAME = 253;
const HASH_HEX = 20;
const DNS_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const DNS_LABEL = /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/;
/** Room a store tag may take, so a key always has most of the name. */
const MAX_TAG = 63;

export function kindOfKey(key: string): EntryKind {
  if (key.startsWith(KIND_PREFIX.IPBlock)) return 'IPBlock';
  if (key.startsWith(KIND_PREFIX.NodeRegistration)) return 'NodeRegistration';
  return 'StoreEntry';
}

/** The tag of a store named `name` (a Kubernetes object name): itself when it is a DNS label. */
export function storeTag(name: string): string {
  return DNS_LABEL.test(name) ? name : hashed(name, MAX_TAG);
}

/** The object name of `key` in the store tagged `tag`. */
export function objectName(tag: string, key: string): string {
  const rest = key.slice(KIND_PREFIX[kindOfKey(key)].length);
  const room = MAX_NAME - tag.length - 1;
  const plain = rest.length <= room && DNS_SUBDOMAIN.test(rest) && !rest.includes('--');
  return `${tag}.${plain ? rest : hashed(rest, room)}`;
}

/**
 * The key an object name stands for, when the name is a plain one (no hash): the inverse of {@link objectName}.
 * Undefined for a hashed name (read `spec.key`) or a name of another store.
 */
export function keyOfName(tag: string, kind: EntryKind, name: string): string | undefined {
  if (!name.startsWith(`${tag}.`)) return undefined;
  const rest = name.slice(tag.length + 1);
  return rest.includes('--') ? undefined : KIND_PREFIX[kind] + rest;
}

/** A readable lowercase form of `s` and a hash of it, at most `room` characters, a valid DNS label start and end. */
function hashed(s: string, room: number): string {
  const hash = createHash('sha256').update(s).digest('hex').slice(0, HASH_HEX);
  const readable = s.toLowerCase().replace(/[^a-z0-9]+/g, '-').replace(/^-+/, '').slice(0, Math.max(0, room - HASH_HEX - 2));
  return `${readable || 'k'}--${hash}`;
}
