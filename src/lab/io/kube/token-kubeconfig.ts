/**
 * A kubeconfig file's text (JSON is YAML) with one cluster and a bearer token: how the lab's components authenticate.
 * A plain-HTTP server (yurthub's proxy on the node's loopback) gets no CA.
 */
export function renderTokenKubeconfig(server: string, caPath: string, token: string): string {
  return `${JSON.stringify({
    apiVersion: 'v1', kind: 'Config', 'current-context': 'atoll',
    clusters: [{ name: 'atoll', cluster: { server, ...(server.startsWith('http://') ? {} : { 'certificate-authority': caPath }) } }],
    users: [{ name: 'user', user: { token } }],
    contexts: [{ name: 'atoll', context: { cluster: 'atoll', user: 'user' } }],
  }, null, 2)}\n`;
}
