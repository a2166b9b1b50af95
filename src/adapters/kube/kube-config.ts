/**
 * Where the Kubernetes API is and how to authenticate to it: a kubeconfig file (its current context: server, CA,
 * bearer token or client certificate, inline or as files), or the pod's service account (in-cluster: the token file,
 * re-read as the kubelet rotates it, its ca.crt and KUBERNETES_SERVICE_HOST/PORT). `server` overrides the endpoint,
 * for an edge API cache (OpenYurt's yurthub, KubeEdge's metaServer) that serves the same API nearer the node.
 */
import { readFileSync } from 'node:fs';
import { parse as parseYaml } from 'yaml';
import { atollError } from '../../core/errors.ts';

export interface KubeConnection {
  readonly server: URL;
  readonly ca?: string;
  readonly cert?: string;
  readonly key?: string;
  /** The bearer token, read when a request is made (service-account tokens rotate). */
  readonly token?: () => string | undefined;
  readonly userAgent: string;
}

export interface KubeConnectionInit {
  /** A kubeconfig path; without it the pod's service account is used. */
  readonly kubeconfig?: string;
  /** The API endpoint to use instead of the kubeconfig's or the in-cluster one (an edge cache). */
  readonly server?: string;
  /** The User-Agent: yurthub caches only for the agents listed in its cache_agents. */
  readonly userAgent: string;
}

export const SERVICE_ACCOUNT_DIR = '/var/run/secrets/kubernetes.io/serviceaccount';

/** @throws AtollError KUBE_CONFIG_INVALID naming the file and the field. */
export function loadKubeConnection(init: KubeConnectionInit, env: NodeJS.ProcessEnv = process.env): KubeConnection {
  const base = init.kubeconfig ? fromKubeconfig(init.kubeconfig) : inCluster(env);
  const server = init.server ? parseServer(init.server, 'kubernetes.server') : base.server;
  return { ...base, server, userAgent: init.userAgent };
}

function inCluster(env: NodeJS.ProcessEnv): Omit<KubeConnection, 'userAgent'> {
  const host = env.KUBERNETES_SERVICE_HOST;
  const port = env.KUBERNETES_SERVICE_PORT ?? '443';
  if (!host) {
    throw atollError('KUBE_CONFIG_INVALID', 'no kubeconfig given and KUBERNETES_SERVICE_HOST is not set (not running in a pod)',
      'set kubernetes.kubeconfig in the configuration, or run the component as a pod with a service account');
  }
  const tokenFile = `${SERVICE_ACCOUNT_DIR}/token`;
  const ca = readText(`${SERVICE_ACCOUNT_DIR}/ca.crt`, 'the service account CA');
  readText(tokenFile, 'the service account token');
  return { server: parseServer(`https://${host.includes(':') ? `[${host}]` : host}:${port}`, 'KUBERNETES_SERVICE_HOST'), ca, token: () => readText(tokenFile, 'the service account token').trim() };
}

interface KubeconfigFile {
  'current-context'?: string;
  contexts?: { name: string; context: { cluster: string; user: string } }[];
  clusters?: { name: string; cluster: { server?: string; 'certificate-authority'?: string; 'certificate-authority-data'?: string } }[];
  users?: { name: string; user: { token?: string; tokenFile?: string; 'client-certificate'?: string; 'client-certificate-data'?: string; 'client-key'?: string; 'client-key-data'?: string } }[];
}

function fromKubeconfig(path: string): Omit<KubeConnection, 'userAgent'> {
  const bad = (what: string) => atollError('KUBE_CONFIG_INVALID', `kubeconfig ${path}: ${what}`, 'point kubernetes.kubeconfig at a kubeconfig with a current context (kubectl config view --minify --raw)');
  let doc: KubeconfigFile;
  try {
    doc = parseYaml(readText(path, 'the kubeconfig')) as KubeconfigFile;
  } catch (err) {
    if ((err as { code?: string }).code === 'KUBE_CONFIG_INVALID') throw err;
    throw atollError('KUBE_CONFIG_INVALID', `kubeconfig ${path} is not YAML: ${(err as Error).message}`, 'fix the file', err);
  }
  if (!doc || typeof doc !== 'object') throw bad('not a YAML mapping');
  const ctxName = doc['current-context'] ?? doc.contexts?.[0]?.name;
  const ctx = doc.contexts?.find((c) => c.name === ctxName)?.context;
  if (!ctx) throw bad(`no context ${ctxName ?? '(none set)'}`);
  const cluster = doc.clusters?.find((c) => c.name === ctx.cluster)?.cluster;
  if (!cluster?.server) throw bad(`cluster ${ctx.cluster} has no server`);
  const user = doc.users?.find((u) => u.name === ctx.user)?.user ?? {};
  const rel = (f: string) => (f.startsWith('/') ? f : `${path.replace(/[^/]*$/, '')}${f}`);
  const pem = (data: string | undefined, file: string | undefined, what: string) =>
    data ? Buffer.from(data, 'base64').toString('utf8') : file ? readText(rel(file), what) : undefined;
  const token = user.token ?? (user.tokenFile ? readText(rel(user.tokenFile), 'the kubeconfig token file').trim() : undefined);
  return {
    server: parseServer(cluster.server, `kubeconfig ${path} cluster ${ctx.cluster}`),
    ca: pem(cluster['certificate-authority-data'], cluster['certificate-authority'], 'the kubeconfig CA'),
    cert: pem(user['client-certificate-data'], user['client-certificate'], 'the kubeconfig client certificate'),
    key: pem(user['client-key-data'], user['client-key'], 'the kubeconfig client key'),
    token: token === undefined ? undefined : () => token,
  };
}

function parseServer(s: string, where: string): URL {
  let u: URL;
  try {
    u = new URL(s);
  } catch (err) {
    throw atollError('KUBE_CONFIG_INVALID', `${where}: ${JSON.stringify(s)} is not a URL`, 'use https://HOST:PORT (or http:// for a local cache)', err);
  }
  if (u.protocol !== 'https:' && u.protocol !== 'http:') {
    throw atollError('KUBE_CONFIG_INVALID', `${where}: ${s} is not an http(s) URL`, 'use https://HOST:PORT (or http:// for a local cache)');
  }
  return u;
}

function readText(path: string, what: string): string {
  try {
    return readFileSync(path, 'utf8');
  } catch (err) {
    throw atollError('KUBE_CONFIG_INVALID', `cannot read ${what} at ${path}: ${(err as Error).message}`, 'check the path and its permissions', err);
  }
}
