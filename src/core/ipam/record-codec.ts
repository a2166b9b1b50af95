/**
 * The on-disk form of IPAM records, readable by operators who know OpenYurt's patched host-local:
 * one file per address named `{ip}_{namespace}_{podname}` (namespace empty for pods without a Kubernetes identity,
 * whose name is then the container ID), holding the container ID and the interface name on two lines; a third line
 * `released <ms since epoch>` marks a reservation kept for a deleted pod, and a fourth `reusable` one that peers no
 * longer hold the deleted pod (src/core/ipam/sticky-pool.ts, guarded reuse). Pure.
 */
import { formatIpv4, parseIpv4 } from '../net/ipv4.ts';
import type { IpamRecord } from './sticky-pool.ts';

export function recordFileName(r: IpamRecord): string {
  return `${formatIpv4(r.ip)}_${r.namespace}_${r.name}`;
}

export function encodeRecord(r: IpamRecord): string {
  const lines = [r.containerId, r.ifName];
  if (r.releasedAt !== undefined) lines.push(`released ${r.releasedAt}`);
  if (r.releasedAt !== undefined && r.reusable) lines.push('reusable');
  return lines.join('\n') + '\n';
}

/** The address and pod a record file name holds, or the reason it is not a record's name. */
export function decodeRecordFileName(fileName: string): Pick<IpamRecord, 'ip' | 'namespace' | 'name'> | string {
  const first = fileName.indexOf('_');
  const second = first < 0 ? -1 : fileName.indexOf('_', first + 1);
  if (second < 0) return `file name "${fileName}" is not {ip}_{namespace}_{podname}`;
  const ip = parseIpv4(fileName.slice(0, first));
  if (ip === undefined) return `file name "${fileName}" does not start with an IPv4 address`;
  const name = fileName.slice(second + 1);
  if (name === '') return `record "${fileName}" lacks a pod name`;
  return { ip, namespace: fileName.slice(first + 1, second), name };
}

/**
 * Decodes a record file; returns a reason string when the file is not one of ours or is damaged.
 *
 * A torn write (a power cut on a file system that does not keep the rename after the data) leaves a prefix of the
 * content. Every line the encoder writes ends with a line break, so content without a final one is refused as
 * damaged; what remains is a prefix cut at a line end, which is an older, more holding state of the same record: an
 * active allocation for a reservation, a reservation not yet reusable for a reusable one (the unit test tries every
 * offset).
 */
export function decodeRecord(fileName: string, content: string): IpamRecord | string {
  const key = decodeRecordFileName(fileName);
  if (typeof key === 'string') return key;
  if (!content.endsWith('\n')) return `record "${fileName}" does not end with a line break (a torn or foreign write)`;
  const lines = content.split('\n').map((l) => l.trim());
  const containerId = lines[0] ?? '';
  const ifName = lines[1] ?? '';
  if (containerId === '' || ifName === '') return `record "${fileName}" lacks a pod name, container ID or interface name`;
  const released = /^released (\d+)$/.exec(lines[2] ?? '');
  if (lines[2] && !released) return `record "${fileName}" has an unreadable third line "${lines[2]}"`;
  if (lines[3] && (!released || lines[3] !== 'reusable')) return `record "${fileName}" has an unreadable fourth line "${lines[3]}"`;
  const base = { ...key, containerId, ifName };
  if (!released) return base;
  return lines[3] ? { ...base, releasedAt: Number(released[1]), reusable: true } : { ...base, releasedAt: Number(released[1]) };
}

/** Container ID of the stand-in record that holds the address of a damaged record file (see {@link damagedHold}). */
export const DAMAGED_CONTAINER_ID = 'unknown-damaged-record';

/**
 * The stand-in for a damaged record whose file name still says the address and pod: a reservation of that address
 * for that pod, released `now`. The address is never handed to a new pod while the old one may hold it (reconcile
 * deletes the unknown container's veth first, as it has no active record), the same pod re-created gets it back,
 * and it is reclaimed like any reservation.
 */
export function damagedHold(key: Pick<IpamRecord, 'ip' | 'namespace' | 'name'>, now: number): IpamRecord {
  return { ...key, containerId: DAMAGED_CONTAINER_ID, ifName: 'unknown', releasedAt: now };
}
