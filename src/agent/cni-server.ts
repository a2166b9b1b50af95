/**
 * The agent end of the `atoll-cni` socket: one connection per CNI invocation.
 */
import { chmodSync, mkdirSync, unlinkSync } from 'node:fs';
import { createServer, type Server, type Socket } from 'node:net';
import { dirname } from 'node:path';
import type { PodNetworkPort } from '../core/cni-spec/ports.ts';
import type { Logger } from '../core/ports.ts';
import { MAX_STDIN_BYTES } from '../config/cni-request.ts';
import { handleCni } from './cni-handler.ts';
import { decodeRequest, encodeResponse } from '../core/cni-spec/shim-protocol.ts';

export interface CniServer {
  close(): Promise<void>;
}

/** Told of every served request: its verb ('?' when unreadable), 'ok' or the Atoll error code, and how long it took. */
export type CniObserver = (verb: string, result: string, seconds: number) => void;

/** Listens on `socketPath` (replacing a stale socket file) and serves CNI invocations with `port`. */
export async function startCniServer(socketPath: string, port: PodNetworkPort, log: Logger, observe?: CniObserver): Promise<CniServer> {
  mkdirSync(dirname(socketPath), { recursive: true, mode: 0o700 });
  try {
    unlinkSync(socketPath);
  } catch {
    // no stale socket
  }
  const server: Server = createServer({ allowHalfOpen: true }, (sock) => serve(sock, port, log, observe));
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(socketPath, () => resolve());
  });
  chmodSync(socketPath, 0o600);
  return {
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

function serve(sock: Socket, port: PodNetworkPort, log: Logger, observe: CniObserver | undefined): void {
  let buf: Buffer = Buffer.alloc(0);
  let done = false;
  sock.on('error', () => {});
  sock.on('data', (chunk: Buffer) => {
    if (done) return;
    buf = buf.length === 0 ? chunk : Buffer.concat([buf, chunk]);
    let inv;
    try {
      inv = decodeRequest(buf, MAX_STDIN_BYTES);
    } catch (err) {
      done = true;
      log.warn('refused a malformed atoll-cni request', { err });
      sock.destroy();
      return;
    }
    if (!inv) return;
    done = true;
    const started = performance.now();
    let failed: { verb: string; code: string } | undefined;
    void handleCni(inv.env, inv.stdin, port, {
      onError: (err, verb) => {
        failed = { verb, code: err.code };
        log.warn('CNI request failed', { verb, container: inv.env.CNI_CONTAINERID, err, fix: err.fix });
      },
    }).then((res) => {
      const ms = performance.now() - started;
      // on success the verb was decoded, so it is one of the spec's (a bounded label)
      observe?.(failed?.verb ?? inv.env.CNI_COMMAND ?? '?', failed?.code ?? 'ok', ms / 1000);
      log.debug('CNI request served', { verb: inv.env.CNI_COMMAND, container: inv.env.CNI_CONTAINERID, ms: +ms.toFixed(2) });
      sock.end(encodeResponse(res));
    });
  });
}
