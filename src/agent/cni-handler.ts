/**
 * The TypeScript side of `atoll-cni`: turns one invocation (environment and stdin, as forwarded by the shim) into
 * the bytes the shim prints and its exit code. stdout carries only the result or the spec error object; errors
 * become CNI codes here and nowhere else ({@link toCniError}).
 */
import { asAtollError, type AtollError, describeCauses } from '../core/errors.ts';
import { renderCniError, renderResult, renderVersionInfo } from '../core/cni-spec/model.ts';
import type { PodNetworkPort } from '../core/cni-spec/ports.ts';
import { decodeCniRequest, decodeVerb, versionForErrors } from '../config/cni-request.ts';
import type { CniResponse } from '../core/cni-spec/shim-protocol.ts';

/** The one mapping from errors to the spec's error object. */
export function toCniError(err: AtollError, version: string): Record<string, unknown> {
  const details = [err.fix ? `fix: ${err.fix}` : '', describeCauses(err), `atoll code ${err.code}`].filter(Boolean).join('; ');
  return renderCniError(version, err.cniCode, err.message, details);
}

function json(v: unknown): string {
  return JSON.stringify(v) + '\n';
}

export interface HandleOptions {
  /** Called with every failure, for the agent's log. */
  readonly onError?: (err: AtollError, verb: string) => void;
}

/** Handles one CNI invocation. Never throws. */
export async function handleCni(
  env: Readonly<Record<string, string | undefined>>,
  stdin: Uint8Array,
  port: PodNetworkPort,
  opts: HandleOptions = {},
): Promise<CniResponse> {
  let verb: string | undefined;
  try {
    verb = decodeVerb(env);
    if (verb === 'VERSION') return { exitCode: 0, stdout: json(renderVersionInfo()), stderr: '' };
    const req = decodeCniRequest(env, stdin);
    switch (req.verb) {
      case 'ADD':
        return { exitCode: 0, stdout: json(renderResult(await port.add(req), req.cniVersion)), stderr: '' };
      case 'DEL':
        await port.del(req);
        break;
      case 'CHECK':
        await port.check(req);
        break;
      case 'STATUS':
        await port.status(req);
        break;
      case 'GC':
        await port.gc(req);
        break;
    }
    return { exitCode: 0, stdout: '', stderr: '' };
  } catch (e) {
    const err = asAtollError(e);
    opts.onError?.(err, verb ?? '?');
    return { exitCode: 1, stdout: json(toCniError(err, versionForErrors(stdin))), stderr: '' };
  }
}
