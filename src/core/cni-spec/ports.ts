import type { CniRequest, PodAttachment } from './model.ts';

/**
 * What the CNI front end needs from the node agent. Implementations must make every method safe to repeat:
 * ADD of an existing attachment returns it; DEL and GC of what is gone succeed.
 */
export interface PodNetworkPort {
  /** Builds the attachment; on failure, leaves nothing behind (undoes every completed step) and throws. */
  add(req: CniRequest): Promise<PodAttachment>;
  /** Removes the attachment; succeeds when the namespace, the link or the allocation is already gone. */
  del(req: CniRequest): Promise<void>;
  /** Verifies that the interface, address and routes ADD made exist; throws CNI_CHECK_FAILED naming what is off. */
  check(req: CniRequest): Promise<void>;
  /** Throws AGENT_NOT_READY when an ADD could not be served now (not ready, no address left). */
  status(req: CniRequest): Promise<void>;
  /** Releases every attachment of the network that is not in `req.validAttachments`. */
  gc(req: CniRequest): Promise<void>;
}
