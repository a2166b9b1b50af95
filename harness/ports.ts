/** Free TCP ports on loopback for tests and benchmarks. */
import { createServer } from 'node:net';

/** A port the kernel hands out on 127.0.0.1 now (it may be taken again before use: callers bind soon after). */
export async function freePort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((resolve, reject) => {
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => resolve());
  });
  const port = (s.address() as { port: number }).port;
  await new Promise((r) => s.close(r));
  return port;
}
