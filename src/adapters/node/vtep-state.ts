/**
 * The node's VTEP MAC, chosen once and kept in local state, so the VXLAN device comes back with the same MAC after an
 * agent restart or a reboot, with or without the controller: peers cut off from the cloud keep delivering to it.
 * A node without the file gets the MAC derived from its name ({@link vtepMacOf}), so one whose disk refuses the
 * file (full, read-only) makes the same MAC at every start until it is written; nodes made before keep their random one.
 */
import { createHash } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { atollError } from '../../core/errors.ts';
import { writeFileDurably } from '../durable-file.ts';

const MAC = /^([0-9a-f]{2}:){5}[0-9a-f]{2}$/;

/** The saved VTEP MAC, or undefined when there is no file. @throws AtollError CONFIG_FILE_INVALID when it is damaged. */
export function loadVtepMac(path: string): string | undefined {
  return existsSync(path) ? decodeVtepState(readFileSync(path, 'utf8'), path) : undefined;
}

/** The VTEP MAC of a node without a saved one: locally administered, unicast, from its name (the same at every start). */
export function vtepMacOf(nodeName: string): string {
  const b = createHash('sha256').update(`atoll vtep mac\0${nodeName}`).digest().subarray(0, 6);
  b[0] = ((b[0] as number) & 0xfc) | 0x02; // locally administered, unicast
  return [...b].map((x) => x.toString(16).padStart(2, '0')).join(':');
}

/** Writes `mac` durably to `path`. @throws what the write throws (a full or read-only disk). */
export function saveVtepMac(path: string, mac: string): void {
  writeFileDurably(path, encodeVtepState(mac), { mode: 0o644 });
}

/** The text of the VTEP state file holding `mac`. */
export function encodeVtepState(mac: string): string {
  return JSON.stringify({ vtepMac: mac }) + '\n';
}

/** The MAC in the text of the VTEP state file at `path`. @throws AtollError CONFIG_FILE_INVALID when it holds none. */
export function decodeVtepState(text: string, path: string): string {
  let mac: unknown;
  let cause: unknown;
  try {
    mac = (JSON.parse(text) as { vtepMac?: unknown } | null)?.vtepMac;
  } catch (err) {
    cause = err; // a file cut short or not JSON: the same refusal, with the parser's words as its cause
  }
  if (typeof mac !== 'string' || !MAC.test(mac)) {
    throw atollError('CONFIG_FILE_INVALID', `the saved VTEP MAC in ${path} is unreadable`, 'restore the file; a new MAC would strand peers that cannot hear about it', cause);
  }
  return mac;
}
