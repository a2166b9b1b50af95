/**
 * Atoll's errors. Every error carries a stable code from {@link ERROR_CATALOGUE}, says what failed and with which
 * value, says what to do, and keeps its cause. `docs/errors.md` lists the same codes; a test keeps the two in step.
 */

/** CNI spec error codes (the CNI specification, containernetworking/cni SPEC.md, "Error"). */
export const CniCode = {
  incompatibleVersion: 1,
  unsupportedField: 2,
  unknownContainer: 3,
  invalidEnvironment: 4,
  ioFailure: 5,
  decodeFailure: 6,
  invalidConfig: 7,
  tryAgainLater: 11,
  notAvailable: 50,
  limitedConnectivity: 51,
  generic: 999,
} as const;
export type CniCode = (typeof CniCode)[keyof typeof CniCode];

interface CatalogueEntry {
  /** The CNI code this error maps to when it ends a CNI request. */
  readonly cni: CniCode;
  readonly summary: string;
}

/** The one table of error codes. Keep `docs/errors.md` in step (a test checks). */
export const ERROR_CATALOGUE = {
  CNI_VERSION_UNSUPPORTED: { cni: CniCode.incompatibleVersion, summary: 'the cniVersion asked for is not one Atoll speaks' },
  CNI_VERB_NOT_IN_VERSION: { cni: CniCode.incompatibleVersion, summary: 'the verb does not exist in the cniVersion asked for' },
  CNI_ENV_INVALID: { cni: CniCode.invalidEnvironment, summary: 'a CNI_* environment variable is missing or malformed' },
  CNI_NETNS_MISSING: { cni: CniCode.invalidEnvironment, summary: 'CNI_NETNS names a network namespace that does not exist' },
  CNI_DECODE: { cni: CniCode.decodeFailure, summary: 'the network configuration on stdin is not a JSON object' },
  CNI_INPUT_TOO_LARGE: { cni: CniCode.decodeFailure, summary: 'the network configuration on stdin is over the size limit' },
  CNI_FRAME_INVALID: { cni: CniCode.decodeFailure, summary: "a request on the agent's CNI socket is not an atoll-cni frame (bad magic, or a block over its limit)" },
  CNI_CONFIG_INVALID: { cni: CniCode.invalidConfig, summary: 'the network configuration has a missing, unknown or bad field' },
  CNI_CHECK_FAILED: { cni: CniCode.generic, summary: 'CHECK found the pod network not as ADD left it' },
  AGENT_UNREACHABLE: { cni: CniCode.tryAgainLater, summary: 'atoll-cni could not reach the node agent on its socket' },
  AGENT_NOT_READY: { cni: CniCode.notAvailable, summary: 'the agent is starting or stopping and serves no ADD' },
  IPAM_EXHAUSTED: { cni: CniCode.generic, summary: "no free address is left in the node's blocks" },
  IPAM_NO_BLOCKS: { cni: CniCode.notAvailable, summary: 'the node holds no address block yet' },
  IPAM_STORE_FAILED: { cni: CniCode.ioFailure, summary: 'an IPAM record could not be read or written' },
  IPAM_RECORD_DAMAGED: { cni: CniCode.ioFailure, summary: 'an IPAM record file is torn or unreadable; its address stays reserved for the pod its name gives' },
  NODE_STATE_WRITE_FAILED: { cni: CniCode.ioFailure, summary: "a file of the agent's own state (cluster state, VTEP MAC, tunnel datagram state, NetworkPolicy view, controller CA, node key) could not be written; the agent works from memory and writes it again at the next change or resync" },
  KERNEL_OP_FAILED: { cni: CniCode.generic, summary: 'a kernel change (link, address, route, sysctl) failed' },
  CONFIG_FILE_INVALID: { cni: CniCode.invalidConfig, summary: 'the agent configuration file is missing, not JSON, or fails the schema' },
  PREFLIGHT_CNI_CONF_ORDER: { cni: CniCode.generic, summary: "another CNI configuration sorts before Atoll's in the conf dir" },
  PREFLIGHT_RANGE_OVERLAP: { cni: CniCode.generic, summary: "the node's pod range overlaps a host address or route" },
  PREFLIGHT_FOREIGN_DEVICE: { cni: CniCode.generic, summary: 'a device Atoll would create exists with a foreign configuration' },
  STORE_UNAVAILABLE: { cni: CniCode.generic, summary: 'the controller store (files, etcd or Kubernetes) could not be reached or written' },
  STORE_COMPACTED: { cni: CniCode.generic, summary: 'the store no longer holds the history a watch asked for' },
  NODE_IDENTITY_MISMATCH: { cni: CniCode.generic, summary: 'the node name is registered with another identity key' },
  NODE_NOT_REGISTERED: { cni: CniCode.generic, summary: 'the node is not registered with the controller' },
  CLUSTER_CIDR_EXHAUSTED: { cni: CniCode.generic, summary: 'every block of the cluster CIDRs is leased' },
  NODE_BLOCK_LIMIT: { cni: CniCode.generic, summary: 'the node already holds its maximum number of blocks' },
  API_BAD_REQUEST: { cni: CniCode.generic, summary: 'a controller API request is malformed or fails the schema' },
  API_UNAUTHENTICATED: { cni: CniCode.generic, summary: 'a controller API request has a wrong token, or a forged, stale or replayed signature' },
  API_FORBIDDEN: { cni: CniCode.generic, summary: "a node asked to change another node's record" },
  API_TOO_LARGE: { cni: CniCode.generic, summary: 'a controller API request body is over the size limit' },
  API_REQUEST_TIMEOUT: { cni: CniCode.generic, summary: 'a request to the controller API did not send its body in time; the connection was closed' },
  API_WATCH_TOO_SLOW: { cni: CniCode.generic, summary: 'a watcher left more of its watch stream unread than the controller holds for it; the controller dropped it' },
  API_NOT_LEADER: { cni: CniCode.generic, summary: 'this controller replica is not the leader; writes go to the leader' },
  CONTROLLER_UNREACHABLE: { cni: CniCode.generic, summary: 'the agent could not reach any controller' },
  NODE_IDENTITY_INVALID: { cni: CniCode.generic, summary: "the node's identity key file is unreadable, corrupt or not an ed25519 key" },
  PKI_FAILED: { cni: CniCode.generic, summary: "the controller's CA or server certificate could not be read or created" },
  CONTROLLER_WATCH_INVALID: { cni: CniCode.generic, summary: "a line of the controller's watch stream is not JSON or not a watch line (the watch is ended and resumed)" },
  CONTROLLER_UNTRUSTED: { cni: CniCode.generic, summary: "the controller's TLS certificates do not match the pinned CA hash" },
  TUNNEL_UNREACHABLE: { cni: CniCode.generic, summary: 'a tunnel peer or the relay could not be reached, or its TLS handshake did not finish' },
  TUNNEL_PEER_UNTRUSTED: { cni: CniCode.generic, summary: "a tunnel peer or the relay presented a key that is not the pinned one" },
  TUNNEL_PUNCH_FAILED: { cni: CniCode.generic, summary: 'hole punching to an edge peer did not get through both NATs in time (the relay carries the pair)' },
  KUBE_API_UNAVAILABLE: { cni: CniCode.generic, summary: 'the Kubernetes API server (or the edge cache in front of it) could not be reached' },
  KUBE_API_REFUSED: { cni: CniCode.generic, summary: 'the Kubernetes API server refused a request (status and reason in the message)' },
  KUBE_CONFIG_INVALID: { cni: CniCode.generic, summary: 'the kubeconfig or in-cluster service account could not be read or names no usable server' },
  POLICY_NOT_SERVED: { cni: CniCode.generic, summary: 'the controller does not follow Kubernetes, so it serves no NetworkPolicies' },
  POLICY_STATE_INVALID: { cni: CniCode.generic, summary: "the agent's kept NetworkPolicy view cannot be read; the ruleset in the kernel stays until the controller sends a view" },
  POLICY_UNSUPPORTED: { cni: CniCode.generic, summary: 'a part of a NetworkPolicy could not be read; Atoll enforces the policy more strictly than written (the part says how)' },
  POLICY_POD_UNCLASSIFIED: { cni: CniCode.generic, summary: "a pod of the node that the NetworkPolicy view does not know could not be classified from its CRI sandbox; no policy selects it until the controller sends it" },
  CRI_UNREACHABLE: { cni: CniCode.generic, summary: "nothing answered on the container runtime's CRI socket in time" },
  CRI_CALL_FAILED: { cni: CniCode.generic, summary: 'the container runtime refused or failed a CRI call' },
  POLICY_ENGINE_FAILED: { cni: CniCode.generic, summary: "the agent's NetworkPolicy worker failed; the ruleset in the kernel stays in force" },
  POLICY_TRACE_INVALID: { cni: CniCode.generic, summary: 'a NetworkPolicy trace asked of the agent names something other than two IPv4 addresses and a PROTOCOL/PORT (tcp, udp or sctp, 1 to 65535)' },
  NODE_NOT_IN_CLUSTER: { cni: CniCode.generic, summary: 'an agent asked to join under a name that has no Kubernetes Node' },
  NODE_LABELS_INVALID: { cni: CniCode.generic, summary: "a Node's Atoll labels are malformed (the node keeps its last good placement)" },
  COMMUNITY_INVALID: { cni: CniCode.generic, summary: 'a Community names unknown nodes, or a node is in two communities' },
  TUNNEL_MESSAGE_INVALID: { cni: CniCode.generic, summary: 'a tunnel peer or the relay sent a control message that is not one of the protocol (the stream is closed)' },
  ROUTE_BLOCK_CONFLICT: { cni: CniCode.generic, summary: "two tunnel peers claim the same pod block in the cluster's node records (the tunnel keeps its previous peer table)" },
  TUNNEL_PIN_INVALID: { cni: CniCode.generic, summary: "a tunnel key pin (a node's tunnelKey in the registry) is not sha256:<64 hex digits>" },
  TUNNEL_FRAME_INVALID: { cni: CniCode.generic, summary: "a tunnel peer or the relay sent bytes that break the stream's framing: an unknown frame kind, or a length of 0 or over the limit (the stream is closed)" },
  OPS_LISTEN_FAILED: { cni: CniCode.generic, summary: 'the metrics and health listener could not bind its address (in use, or not on this host)' },
  INSTALL_ROOT_MISSING: { cni: CniCode.generic, summary: "Atoll's install root (the folder with its package.json, above the running code) was not found" },
  IMAGE_ARCH_UNSUPPORTED: { cni: CniCode.generic, summary: "this machine's CPU architecture has no OCI name Atoll knows, so no container image is packed here" },
  LAB_SPEC_INVALID: { cni: CniCode.generic, summary: 'the lab spec (flags or --spec file) names an impossible topology' },
  LAB_PREREQUISITE_MISSING: { cni: CniCode.generic, summary: 'the lab cannot run here: not root, or a tool or kernel feature it needs is missing' },
  LAB_STEP_FAILED: { cni: CniCode.generic, summary: 'a step of the lab (building, checking or removing it, a fault) failed or did not finish in time' },
  INTERNAL: { cni: CniCode.generic, summary: 'an unexpected failure inside Atoll (a bug: please report it)' },
} as const satisfies Record<string, CatalogueEntry>;

export type ErrorCode = keyof typeof ERROR_CATALOGUE;

export interface AtollErrorInit {
  /** What failed, with the object and value involved. */
  readonly message: string;
  /** What the operator can do about it. */
  readonly fix?: string;
  readonly cause?: unknown;
  /** Machine-readable facts about the failure (an HTTP status, a reason), for callers that branch on them. */
  readonly detail?: Readonly<Record<string, unknown>>;
}

/** An error with a stable code, a fix hint and a cause. */
export class AtollError extends Error {
  readonly code: ErrorCode;
  readonly fix: string | undefined;
  readonly detail: Readonly<Record<string, unknown>> | undefined;

  constructor(code: ErrorCode, init: AtollErrorInit) {
    super(init.message, init.cause === undefined ? undefined : { cause: init.cause });
    this.name = 'AtollError';
    this.code = code;
    this.fix = init.fix;
    this.detail = init.detail;
  }

  get cniCode(): CniCode {
    return ERROR_CATALOGUE[this.code].cni;
  }
}

/** Shorthand for `new AtollError(code, { message, fix, cause, detail })`. */
export function atollError(code: ErrorCode, message: string, fix?: string, cause?: unknown, detail?: Readonly<Record<string, unknown>>): AtollError {
  return new AtollError(code, { message, fix, cause, detail });
}

/** Wraps anything thrown into an AtollError, keeping AtollErrors as they are. */
export function asAtollError(err: unknown): AtollError {
  if (err instanceof AtollError) return err;
  const message = err instanceof Error ? err.message : String(err);
  return new AtollError('INTERNAL', { message, cause: err });
}

/** The text of an error and its causes, one per line, for logs and CNI `details`. */
export function describeCauses(err: unknown): string {
  const parts: string[] = [];
  let cur: unknown = err instanceof Error ? err.cause : undefined;
  while (cur !== undefined && parts.length < 5) {
    parts.push(cur instanceof Error ? cur.message : String(cur));
    cur = cur instanceof Error ? cur.cause : undefined;
  }
  return parts.join('; ');
}
