/**
 * A small promise-based client for the CRI RuntimeService (runtime.v1) of the node's container runtime.
 *
 * Why: the agent classifies a pod the NetworkPolicy view does not know from the sandbox the kubelet had the runtime
 * create (PodSandboxStatus: its metadata and labels; src/core/policy/local-pods.ts). The lab and the end-to-end tests
 * drive the CNI plugin the way Kubernetes does, through the same client (RunPodSandbox, StopPodSandbox,
 * RemovePodSandbox, and ListContainers to find a kubelet's container on a node whose API server is out of reach).
 * The wire messages live in `cri-api.proto` beside this file (a field-number-exact subset of k8s.io/cri-api), which
 * is read at run time (the image ships it). Load this module lazily where memory counts: @grpc/grpc-js is heavy.
 */
import { join } from 'node:path';
import { installRoot } from '../install-root.ts';
import { atollError } from '../../core/errors.ts';
import { type SandboxPod, sandboxPodOf, type SandboxRuntime } from '../../core/policy/local-pods.ts';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';

/** The proto file with the CRI subset, next to this module (scripts/image.ts copies it into the image). */
export const CRI_PROTO_PATH = join(installRoot(), 'src', 'adapters', 'node', 'cri-api.proto');

/** Default deadline for one CRI call; RunPodSandbox includes the CNI ADD, so it is generous. */
export const DEFAULT_CRI_DEADLINE_MS = 60_000;

/** CRI sandbox states, as the proto enum names them. */
export type PodSandboxState = 'SANDBOX_READY' | 'SANDBOX_NOTREADY';

/** Port protocols of the CRI `Protocol` enum. */
export type PortProtocol = 'TCP' | 'UDP' | 'SCTP';

/** One host port mapping, as the kubelet passes it for a pod with `hostPort` set. */
export interface PortMappingSpec {
  protocol?: PortProtocol;
  containerPort: number;
  hostPort: number;
  hostIp?: string;
}

/** What a test says about the pod whose sandbox it wants; the client fills in the rest of PodSandboxConfig. */
export interface PodSandboxSpec {
  name: string;
  namespace: string;
  uid: string;
  attempt?: number;
  annotations?: Record<string, string>;
  labels?: Record<string, string>;
  portMappings?: PortMappingSpec[];
  /** Defaults to `name`. */
  hostname?: string;
}

/** The parts of PodSandboxStatus that network tests look at. */
export interface PodSandboxStatusView {
  id: string;
  state: PodSandboxState;
  /** Primary pod IP as the runtime took it from the CNI result; '' when the pod has none. */
  ip: string;
  additionalIps: string[];
  /** Path of the pod's network namespace (what the plugin got as CNI_NETNS), from the verbose info. */
  netnsPath?: string;
  /** PID of the sandbox (pause) process, from the verbose info; `/proc/<pid>/ns/net` is the pod netns too. */
  pid?: number;
  /** The runtime's verbose `info` JSON, parsed; shape is runtime-specific (containerd: runtimeSpec, cniResult, ...). */
  info?: Record<string, unknown>;
}

/** One row of ListPodSandbox. */
export interface PodSandboxSummary {
  id: string;
  name: string;
  namespace: string;
  uid: string;
  attempt: number;
  state: PodSandboxState;
}

/** CRI container states, as the proto enum names them. */
export type ContainerState = 'CONTAINER_CREATED' | 'CONTAINER_RUNNING' | 'CONTAINER_EXITED' | 'CONTAINER_UNKNOWN';

/** One row of ListContainers. */
export interface ContainerSummary {
  id: string;
  podSandboxId: string;
  /** The container's name in its pod (the kubelet's `io.kubernetes.container.name`). */
  name: string;
  /** How often the kubelet started this container of the pod before: 0 for the first. */
  attempt: number;
  state: ContainerState;
  labels: Record<string, string>;
}

/** Runtime identity, from the Version RPC. */
export interface RuntimeVersion {
  runtimeName: string;
  runtimeVersion: string;
  runtimeApiVersion: string;
}

/** Promise-based CRI RuntimeService client limited to pod sandboxes. Every call has a deadline. */
export interface CriClient extends SandboxRuntime {
  /** Runtime name and version; useful as a readiness probe. */
  version(): Promise<RuntimeVersion>;
  /** Creates and starts a sandbox (the runtime calls CNI ADD); resolves to the sandbox id. */
  runPodSandbox(spec: PodSandboxSpec): Promise<string>;
  /** Status of one sandbox, verbose, so that the netns path and PID are known. Rejects if the id is unknown. */
  podSandboxStatus(id: string): Promise<PodSandboxStatusView>;
  /** Stops the sandbox (the runtime calls CNI DEL); idempotent. */
  stopPodSandbox(id: string): Promise<void>;
  /** Removes the sandbox (containerd calls CNI DEL again); idempotent. */
  removePodSandbox(id: string): Promise<void>;
  /** All sandboxes the runtime knows, in any state. */
  listPodSandbox(): Promise<PodSandboxSummary[]>;
  /** The containers whose labels include all of `labels` (every container when empty), in any state. */
  listContainers(labels?: Readonly<Record<string, string>>): Promise<ContainerSummary[]>;
  /** Closes the gRPC channel; later calls reject. */
  close(): void;
}

/** Options of {@link connectCri}. */
export interface CriClientInit {
  /** Absolute path of the runtime's gRPC unix socket. */
  socket: string;
  /** Directory under which each sandbox this client runs gets its `log_directory` (`<ns>_<name>_<uid>`); none without. */
  logRoot?: string;
  /** Deadline per call; defaults to {@link DEFAULT_CRI_DEADLINE_MS}. */
  deadlineMs?: number;
  /**
   * `linux.cgroup_parent` of every sandbox (cgroupfs syntax, e.g. `/atoll-e2e-1a2b`), as the kubelet always sends
   * one. Without it containerd 1.6 uses `/k8s.io/<id>` and leaves the shared `/k8s.io` cgroup behind.
   */
  cgroupParent?: string;
}

type Message = Record<string, unknown>;
type UnaryDefinition = grpc.MethodDefinition<Message, Message>;
type RpcName = 'Version' | 'RunPodSandbox' | 'PodSandboxStatus' | 'StopPodSandbox' | 'RemovePodSandbox' | 'ListPodSandbox' | 'ListContainers';

let cachedDefinitions: Record<RpcName, UnaryDefinition> | undefined;

/** Loads `cri-api.proto` once and returns the RuntimeService method definitions (paths and codecs). */
function runtimeServiceMethods(): Record<RpcName, UnaryDefinition> {
  if (cachedDefinitions === undefined) {
    const pkg = protoLoader.loadSync(CRI_PROTO_PATH, { keepCase: false, enums: String, longs: String, defaults: true });
    const service = pkg['runtime.v1.RuntimeService'];
    if (service === undefined || !('Version' in service)) {
      throw atollError('CRI_CALL_FAILED', `CRI proto ${CRI_PROTO_PATH} has no service runtime.v1.RuntimeService`, 'reinstall Atoll: the file is part of it');
    }
    cachedDefinitions = service as unknown as Record<RpcName, UnaryDefinition>;
  }
  return cachedDefinitions;
}

/** Builds the PodSandboxConfig message the kubelet would send for `spec`. */
function sandboxConfig(spec: PodSandboxSpec, init: CriClientInit): Message {
  return {
    metadata: { name: spec.name, uid: spec.uid, namespace: spec.namespace, attempt: spec.attempt ?? 0 },
    hostname: spec.hostname ?? spec.name,
    logDirectory: init.logRoot === undefined ? '' : `${init.logRoot}/${spec.namespace}_${spec.name}_${spec.uid}`,
    portMappings: (spec.portMappings ?? []).map((m) => ({
      protocol: m.protocol ?? 'TCP',
      containerPort: m.containerPort,
      hostPort: m.hostPort,
      hostIp: m.hostIp ?? '',
    })),
    labels: spec.labels ?? {},
    annotations: spec.annotations ?? {},
    linux: {
      cgroupParent: init.cgroupParent ?? '',
      securityContext: { namespaceOptions: { network: 'POD', pid: 'CONTAINER', ipc: 'POD' } },
    },
  };
}

/** Parses containerd's verbose `info` entry; returns undefined if the runtime sent none or it is not JSON. */
function parseInfo(info: unknown): Record<string, unknown> | undefined {
  const raw = (info as Record<string, string> | undefined)?.['info'];
  if (raw === undefined) return undefined;
  try {
    return JSON.parse(raw) as Record<string, unknown>;
  } catch {
    return undefined;
  }
}

/** Finds the network namespace path in `runtimeSpec.linux.namespaces` of containerd's verbose info. */
function netnsPathFromInfo(info: Record<string, unknown> | undefined): string | undefined {
  const spec = info?.['runtimeSpec'] as { linux?: { namespaces?: { type?: string; path?: string }[] } } | undefined;
  const network = spec?.linux?.namespaces?.find((ns) => ns.type === 'network');
  return network?.path === '' ? undefined : network?.path;
}

/** Converts a PodSandboxStatusResponse into the view tests use. */
function statusView(response: Message): PodSandboxStatusView {
  const status = response['status'] as Message;
  const network = (status['network'] ?? {}) as { ip?: string; additionalIps?: { ip: string }[] };
  const info = parseInfo(response['info']);
  const pid = info?.['pid'];
  return {
    id: status['id'] as string,
    state: status['state'] as PodSandboxState,
    ip: network.ip ?? '',
    additionalIps: (network.additionalIps ?? []).map((p) => p.ip),
    netnsPath: netnsPathFromInfo(info),
    pid: typeof pid === 'number' && pid > 0 ? pid : undefined,
    info,
  };
}

/** The pod of a PodSandboxStatusResponse (non-verbose). */
function sandboxPodFrom(response: Message): SandboxPod {
  const status = response['status'] as Message;
  const meta = status['metadata'] as { name: string; namespace: string; uid: string };
  return sandboxPodOf(meta, (status['labels'] ?? {}) as Record<string, string>);
}

/** Converts one ListPodSandbox item into a summary row. */
function summary(item: Message): PodSandboxSummary {
  const meta = item['metadata'] as { name: string; namespace: string; uid: string; attempt: number };
  return {
    id: item['id'] as string,
    name: meta.name,
    namespace: meta.namespace,
    uid: meta.uid,
    attempt: meta.attempt,
    state: item['state'] as PodSandboxState,
  };
}

/** Converts one ListContainers item into a summary row. */
function containerSummary(item: Message): ContainerSummary {
  const meta = item['metadata'] as { name: string; attempt: number };
  return {
    id: item['id'] as string,
    podSandboxId: item['podSandboxId'] as string,
    name: meta.name,
    attempt: meta.attempt,
    state: item['state'] as ContainerState,
    labels: (item['labels'] ?? {}) as Record<string, string>,
  };
}

/**
 * Opens a CRI RuntimeService client on a unix socket. The channel connects lazily, so this never fails on a
 * socket that is not up yet; the first call does (use `version()` to probe readiness).
 *
 * Errors of every call name the RPC, the socket and the gRPC status, and keep the gRPC error as `cause`:
 * CRI_UNREACHABLE when nothing answered in time (UNAVAILABLE, DEADLINE_EXCEEDED), CRI_CALL_FAILED otherwise.
 */
export function connectCri(init: CriClientInit): CriClient {
  const methods = runtimeServiceMethods();
  const deadlineMs = init.deadlineMs ?? DEFAULT_CRI_DEADLINE_MS;
  const client = new grpc.Client(`unix://${init.socket}`, grpc.credentials.createInsecure());

  const call = (rpc: RpcName, request: Message): Promise<Message> =>
    new Promise((resolve, reject) => {
      const def = methods[rpc];
      const options: grpc.CallOptions = { deadline: Date.now() + deadlineMs };
      client.makeUnaryRequest(def.path, def.requestSerialize, def.responseDeserialize, request, new grpc.Metadata(), options,
        (err, response) => {
          if (err) {
            const code = grpc.status[err.code] ?? String(err.code);
            const unreachable = err.code === grpc.status.UNAVAILABLE || err.code === grpc.status.DEADLINE_EXCEEDED;
            reject(unreachable
              ? atollError('CRI_UNREACHABLE', `CRI ${rpc} on unix socket ${init.socket}: no answer (${code}): ${err.details}`, 'check that the container runtime runs and that its socket is this one (mounted into the agent\'s pod, when it runs in one)', err)
              : atollError('CRI_CALL_FAILED', `CRI ${rpc} on unix socket ${init.socket} failed (${code}): ${err.details}`, 'the container runtime\'s log says more', err));
          } else {
            resolve(response ?? {});
          }
        });
    });

  return {
    async version() {
      const r = await call('Version', { version: 'v1' });
      return {
        runtimeName: r['runtimeName'] as string,
        runtimeVersion: r['runtimeVersion'] as string,
        runtimeApiVersion: r['runtimeApiVersion'] as string,
      };
    },
    async runPodSandbox(spec) {
      const r = await call('RunPodSandbox', { config: sandboxConfig(spec, init), runtimeHandler: '' });
      return r['podSandboxId'] as string;
    },
    async podSandboxStatus(id) {
      return statusView(await call('PodSandboxStatus', { podSandboxId: id, verbose: true }));
    },
    async sandboxPod(id) {
      let response: Message;
      try {
        response = await call('PodSandboxStatus', { podSandboxId: id, verbose: false });
      } catch (err) {
        if ((err as { cause?: grpc.ServiceError }).cause?.code === grpc.status.NOT_FOUND) return undefined;
        throw err;
      }
      return sandboxPodFrom(response);
    },
    async stopPodSandbox(id) {
      await call('StopPodSandbox', { podSandboxId: id });
    },
    async removePodSandbox(id) {
      await call('RemovePodSandbox', { podSandboxId: id });
    },
    async listPodSandbox() {
      const r = await call('ListPodSandbox', {});
      return ((r['items'] ?? []) as Message[]).map(summary);
    },
    async listContainers(labels = {}) {
      const r = await call('ListContainers', { filter: { labelSelector: labels } });
      return ((r['containers'] ?? []) as Message[]).map(containerSummary);
    },
    close() {
      client.close();
    },
  };
}
