/** Waiting for conditions in tests and benchmarks: always bounded. */

/** Polls `fn` every `stepMs` until it holds; throws naming `what` after `timeoutMs`. */
export async function until(what: string, fn: () => boolean | Promise<boolean>, timeoutMs = 30_000, stepMs = 100): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await fn())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, stepMs));
  }
}
