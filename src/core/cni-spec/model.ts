/**
 * The CNI request and result model (CNI SPEC 1.1), independent of how a request arrives. Pure.
 */

export const CNI_VERBS = ['ADD', 'DEL', 'CHECK', 'STATUS', 'GC', 'VERSION'] as const;
export type CniVerb = (typeof CNI_VERBS)[number];

/** The versions Atoll accepts in a network configuration and answers in. Oldest first. */
export const SUPPORTED_CNI_VERSIONS = ['0.3.1', '0.4.0', '1.0.0', '1.1.0'] as const;
export type CniVersion = (typeof SUPPORTED_CNI_VERSIONS)[number];
export const LATEST_CNI_VERSION: CniVersion = '1.1.0';

/** The first version that knows each verb. */
const VERB_SINCE: Record<CniVerb, CniVersion> = {
  ADD: '0.3.1',
  DEL: '0.3.1',
  VERSION: '0.3.1',
  CHECK: '0.4.0',
  STATUS: '1.1.0',
  GC: '1.1.0',
};

export function isSupportedVersion(v: string): v is CniVersion {
  return (SUPPORTED_CNI_VERSIONS as readonly string[]).includes(v);
}

export function verbAllowedIn(verb: CniVerb, version: CniVersion): boolean {
  const order = SUPPORTED_CNI_VERSIONS as readonly string[];
  return order.indexOf(version) >= order.indexOf(VERB_SINCE[verb]);
}

/** Who a pod is, from CNI_ARGS. `namespace`/`name` are absent for runtimes that are not Kubernetes. */
export interface PodIdentity {
  readonly namespace?: string;
  readonly name?: string;
  readonly uid?: string;
  readonly infraContainerId?: string;
}

/** One attachment the runtime says is still valid (GC's `cni.dev/valid-attachments`). */
export interface Attachment {
  readonly containerId: string;
  readonly ifName: string;
}

/** What CHECK compares against: the addresses and pod-side interfaces of the previous result. */
export interface PrevResult {
  readonly addresses: readonly string[];
  readonly interfaces: readonly { readonly name: string; readonly mac?: string; readonly sandbox?: string }[];
}

/** A decoded, validated CNI request. */
export interface CniRequest {
  readonly verb: CniVerb;
  readonly cniVersion: CniVersion;
  readonly network: string;
  readonly containerId: string;
  /** Path of the pod network namespace; empty when the runtime gave none (DEL after the sandbox is gone). */
  readonly netns: string;
  readonly ifName: string;
  readonly pod: PodIdentity;
  /** GC only: attachments to keep. */
  readonly validAttachments: readonly Attachment[];
  /** The runtime's cached result (CHECK, DEL), when given. */
  readonly prevResult?: PrevResult;
}

/** What ADD built, in version-independent form. */
export interface PodAttachment {
  readonly hostIfName: string;
  readonly hostMac: string;
  readonly ifName: string;
  readonly mac: string;
  readonly sandbox: string;
  readonly mtu: number;
  /** Pod address with prefix, e.g. 10.244.1.5/24. */
  readonly address: string;
  readonly gateway: string;
}

/** Renders an ADD result in the shape of the version asked for. */
export function renderResult(a: PodAttachment, version: CniVersion): Record<string, unknown> {
  const legacy = version === '0.3.1' || version === '0.4.0';
  const withMtu = version === '1.1.0';
  const hostIf: Record<string, unknown> = { name: a.hostIfName, mac: a.hostMac };
  const podIf: Record<string, unknown> = { name: a.ifName, mac: a.mac, sandbox: a.sandbox };
  if (withMtu) {
    hostIf.mtu = a.mtu;
    podIf.mtu = a.mtu;
  }
  const ip: Record<string, unknown> = legacy
    ? { version: '4', address: a.address, gateway: a.gateway, interface: 1 }
    : { address: a.address, gateway: a.gateway, interface: 1 };
  return {
    cniVersion: version,
    interfaces: [hostIf, podIf],
    ips: [ip],
    routes: [{ dst: '0.0.0.0/0', gw: a.gateway }],
    dns: {},
  };
}

/** The VERSION answer. */
export function renderVersionInfo(): Record<string, unknown> {
  return { cniVersion: LATEST_CNI_VERSION, supportedVersions: [...SUPPORTED_CNI_VERSIONS] };
}

/** The spec's error object. */
export function renderCniError(version: string, code: number, msg: string, details: string): Record<string, unknown> {
  return details ? { cniVersion: version, code, msg, details } : { cniVersion: version, code, msg };
}
