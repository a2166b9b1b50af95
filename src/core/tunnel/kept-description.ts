/**
 * The kept region's description: which peers the datagram path had, their addresses and which of the region's slots
 * hold their keys, written by the agent at every change and read by its next process (src/adapters/tunnel/datagram-kept-peers.ts;
 * the region itself is native, held by the keeper). Pure. The text comes from a previous process that may have died
 * mid-write or been another version: {@link parseKeptDescription} takes what is well formed and nothing else, so a bad
 * description costs the keeping (the paths are rebuilt), never the agent's start.
 */

/** One peer as the kept region describes it (wall-clock times, ms since the epoch). */
export interface KeptPeer {
  readonly id: string;
  readonly pin: string;
  readonly endpoint?: string;
  readonly announced?: { readonly host: string; readonly port: number };
  /** The path was usable at the last description: the restarted agent takes it as still usable. */
  readonly usable: boolean;
  /**
   * When the last authentic datagram from the peer came, as of the last description: a path that was not usable then
   * is taken back with it, so the restarted agent still sends to a peer nothing else reaches (the last resort).
   */
  readonly heard?: number;
  readonly send?: { readonly slot: number; readonly id: number; readonly createdAt: number };
  readonly pending?: { readonly slot: number; readonly id: number; readonly at: number };
  readonly recv: readonly { readonly slot: number; readonly id: number; readonly expiresAt: number | null }[];
}

export interface KeptDescription {
  readonly v: 1;
  readonly peers: readonly KeptPeer[];
}

type Obj = Record<string, unknown>;

const isObj = (x: unknown): x is Obj => typeof x === 'object' && x !== null && !Array.isArray(x);
const isUint = (x: unknown): x is number => typeof x === 'number' && Number.isInteger(x) && x >= 0;
const isTime = (x: unknown): x is number => typeof x === 'number' && Number.isFinite(x);

/** A key's slot and id, with its time field `at` (finite), or undefined when it is not one. */
function keyRef<K extends string>(x: unknown, at: K): ({ slot: number; id: number } & Record<K, number>) | undefined {
  if (!isObj(x) || !isUint(x.slot) || !isUint(x.id) || !isTime(x[at])) return undefined;
  return { slot: x.slot, id: x.id, [at]: x[at] } as { slot: number; id: number } & Record<K, number>;
}

/** One peer of a description, or undefined when it is not well formed (it is then left out). */
function keptPeer(x: unknown): KeptPeer | undefined {
  if (!isObj(x) || typeof x.id !== 'string' || x.id === '' || typeof x.pin !== 'string' || typeof x.usable !== 'boolean' || !Array.isArray(x.recv)) return undefined;
  const recv: KeptPeer['recv'][number][] = [];
  for (const r of x.recv as unknown[]) {
    if (!isObj(r) || !isUint(r.slot) || !isUint(r.id) || !(r.expiresAt === null || isTime(r.expiresAt))) return undefined;
    recv.push({ slot: r.slot, id: r.id, expiresAt: r.expiresAt });
  }
  const send = x.send === undefined ? undefined : keyRef(x.send, 'createdAt');
  const pending = x.pending === undefined ? undefined : keyRef(x.pending, 'at');
  if ((x.send !== undefined && !send) || (x.pending !== undefined && !pending)) return undefined;
  const a = x.announced;
  const announced = isObj(a) && typeof a.host === 'string' && isUint(a.port) && a.port < 65_536 ? { host: a.host, port: a.port } : undefined;
  return {
    id: x.id, pin: x.pin, usable: x.usable, recv,
    ...(typeof x.endpoint === 'string' ? { endpoint: x.endpoint } : {}),
    ...(announced ? { announced } : {}),
    ...(isTime(x.heard) ? { heard: x.heard } : {}),
    ...(send ? { send } : {}),
    ...(pending ? { pending } : {}),
  };
}

/**
 * The description in `text`, its well-formed peers only (each once: a repeated id keeps the first); undefined when
 * the text is not a version-1 description at all (empty, cut short, another version).
 */
export function parseKeptDescription(text: string): KeptDescription | undefined {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch {
    return undefined;
  }
  if (!isObj(raw) || raw.v !== 1 || !Array.isArray(raw.peers)) return undefined;
  const seen = new Set<string>();
  const peers: KeptPeer[] = [];
  for (const x of raw.peers as unknown[]) {
    const p = keptPeer(x);
    if (!p || seen.has(p.id)) continue;
    seen.add(p.id);
    peers.push(p);
  }
  return { v: 1, peers };
}
