/**
 * What the datagram path keeps on the node so it can rebuild its paths without the relay or the controller
 * (src/core/tunnel/hello.ts): its UDP port (reused after a restart, so the NAT's mapping for it still holds), the
 * generation counter of its hellos, and per peer its last address and the highest hello generation it sent. Written
 * crash-safely; small (a few hundred bytes per peer).
 */
import { existsSync, mkdirSync, readFileSync } from 'node:fs';
import { dirname } from 'node:path';
import { atollError } from '../../core/errors.ts';
import { MAX_GENERATION } from '../../core/tunnel/hello.ts';
import { writeFileDurably } from '../durable-file.ts';

export interface DatagramPeerMemory {
  /** The peer's pin when this was written: a peer with another key starts afresh. */
  readonly pin: string;
  /** `host:port` datagrams last reached it at. */
  readonly endpoint?: string;
  /** The highest hello generation seen from it (replays below it are refused). */
  readonly seenGeneration?: number;
}

export interface DatagramLocalState {
  /** The UDP port last bound (0: none yet). */
  readonly port: number;
  /** The highest hello generation this node used. */
  readonly generation: number;
  readonly peers: Readonly<Record<string, DatagramPeerMemory>>;
}

export const EMPTY_DATAGRAM_STATE: DatagramLocalState = Object.freeze({ port: 0, generation: 0, peers: {} });

export class DatagramStateFile {
  readonly path: string;

  constructor(path: string) {
    this.path = path;
  }

  /** The saved state, or the empty one. @throws AtollError CONFIG_FILE_INVALID when the file is damaged. */
  load(): DatagramLocalState {
    return existsSync(this.path) ? decodeDatagramState(readFileSync(this.path, 'utf8'), this.path) : EMPTY_DATAGRAM_STATE;
  }

  /** Writes `state` durably (before a hello of a new generation leaves). */
  save(state: DatagramLocalState): void {
    mkdirSync(dirname(this.path), { recursive: true, mode: 0o700 });
    writeFileDurably(this.path, encodeDatagramState(state), { mode: 0o600 });
  }
}

/** The text of the datagram state file holding `state`. */
export function encodeDatagramState(state: DatagramLocalState): string {
  return JSON.stringify(state);
}

/** The state in the text of the datagram state file at `path`. @throws AtollError CONFIG_FILE_INVALID when it is damaged. */
export function decodeDatagramState(text: string, path: string): DatagramLocalState {
  try {
    const s = JSON.parse(text) as DatagramLocalState;
    // only a cause: the catch below throws CONFIG_FILE_INVALID with it
    if (!Number.isInteger(s.port) || typeof s.peers !== 'object' || s.peers === null) throw new Error('missing port or peers');
    // only a cause too; far below MAX_GENERATION, so the generations counted up from it stay valid for any node's life
    if (!Number.isInteger(s.generation) || s.generation < 0 || s.generation >= MAX_GENERATION / 2) throw new Error(`generation ${s.generation} is not an integer from 0 to below 2^52`);
    return s;
  } catch (cause) {
    throw atollError('CONFIG_FILE_INVALID', `the tunnel's datagram state ${path} is unreadable`,
      'move the file away and restart the agent: it then waits for the relay or the controller to rebuild its edge paths', cause);
  }
}
