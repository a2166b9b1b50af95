/**
 * The lines of the controller's watch stream (`GET /v1/watch`, NDJSON, docs/api.md): their type and their schema.
 * A line enters the agent and the relay from the network, so each is decoded against the schema before it is used.
 *
 * Node records are checked field by field but not strictly: keys a newer controller adds are dropped, so an older
 * agent keeps following it. A line of an unknown `type` is refused: the agent cannot apply what it does not know.
 */
import * as z from 'zod/mini';
import { decodeStreamLine } from './json-file.ts';
import type { NodeRecord } from '../core/cluster/model.ts';

export type WatchLine =
  | { type: 'snapshot'; revision: number; nodes: NodeRecord[] }
  | { type: 'put'; node: NodeRecord; revision: number }
  | { type: 'delete'; name: string; revision: number }
  | { type: 'ping' };

const revision = z.number().check(z.int(), z.gte(0));
const strings = z.array(z.string());

/** A {@link NodeRecord} as the controller sends it. */
const nodeRecordSchema = z.object({
  name: z.string().check(z.minLength(1)),
  identity: z.string(),
  site: z.string(),
  community: z.string(),
  addresses: strings,
  observedAddress: z.string(),
  vtepMac: z.string(),
  tunnelKey: z.string(),
  agentVersion: z.string(),
  annotations: z.record(z.string(), z.string()),
  blocks: strings,
  registeredAt: z.number(),
  updatedAt: z.number(),
});

export const watchLineSchema = z.discriminatedUnion('type', [
  z.object({ type: z.literal('snapshot'), revision, nodes: z.array(nodeRecordSchema) }),
  z.object({ type: z.literal('put'), node: nodeRecordSchema, revision }),
  z.object({ type: z.literal('delete'), name: z.string().check(z.minLength(1)), revision }),
  z.object({ type: z.literal('ping') }),
]);

/**
 * The watch line in `text` (one line of the stream, without its newline), from the controller at `source`.
 * @throws AtollError CONTROLLER_WATCH_INVALID when the text is not JSON, or is JSON that is not a watch line (an
 *   unknown type, a missing or malformed field); the message names the controller, the fields and the line's start.
 */
export function decodeWatchLine(text: string, source: string): WatchLine {
  const fix = 'the agent or relay ends this watch and watches again from its last good revision; if this repeats, run the same ' +
    'Atoll version on the controller and here, and check that nothing between them (a proxy) rewrites the stream';
  return decodeStreamLine(watchLineSchema, text, 'watch line', `the watch stream of controller ${source}`, fix);
}
