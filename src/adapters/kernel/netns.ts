/**
 * Entering a pod's network namespace from the agent, without a helper process.
 *
 * Why: `setns(2)` switches only the calling thread. The agent switches its main thread synchronously, does the
 * namespace-bound work that cannot cross an `await` (open a file under /proc/sys/net, fork a child with
 * `child_process.spawn`, which forks from the calling thread so the child lives in the pod namespace), and switches
 * back before returning. Nothing else runs on the main thread meanwhile, and libuv's thread pool never moves.
 * This saves the 1 to 13 ms of `nsenter` or of moving links between namespaces (moving a link costs about 13 ms).
 */
import { closeSync, openSync } from 'node:fs';
import koffi from 'koffi';
import { atollError } from '../../core/errors.ts';
import { errnoText } from './errno.ts';
import { setnsCall } from './libc.ts';

const CLONE_NEWNET = 0x40000000;

let hostFd: number | undefined;

/** Opens a handle on the agent's own network namespace, once. Call at start-up, before any switch. */
function hostNamespace(): number {
  hostFd ??= openSync('/proc/self/ns/net', 'r');
  return hostFd;
}

/**
 * Runs `fn` synchronously with the main thread inside the network namespace at `nsPath`.
 * @throws Error with code ENOENT when the namespace file does not exist; AtollError KERNEL_OP_FAILED when setns
 * refuses it (not a network namespace); the error of `fn` otherwise.
 * If switching back fails the process aborts: continuing in the wrong namespace would corrupt the node.
 */
export function inNetns<T>(nsPath: string, fn: () => T): T {
  const back = hostNamespace();
  const fd = openSync(nsPath, 'r');
  try {
    if (setnsCall()(fd, CLONE_NEWNET) !== 0) {
      throw atollError('KERNEL_OP_FAILED', `cannot enter network namespace ${nsPath}: setns failed: ${errnoText(koffi.errno())}`,
        'check that it is a network namespace and the agent runs as root');
    }
    try {
      return fn();
    } finally {
      if (setnsCall()(back, CLONE_NEWNET) !== 0) {
        process.stderr.write(`atoll: could not return to the host network namespace after entering ${nsPath}\n`);
        process.abort();
      }
    }
  } finally {
    closeSync(fd);
  }
}

/** Prepares the namespace handles; call once at start-up so the first CNI request pays nothing for it. */
export function initNetns(): void {
  hostNamespace();
  setnsCall();
}
