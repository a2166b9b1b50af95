/**
 * The agent's NetworkPolicy engine (src/core/policy/engine.ts) in a child process of the agent, so that compiling
 * and rendering a large view never holds the agent's thread, which serves CNI calls, and runs with V8's compilers.
 * It also writes the kept view (its JSON is as large as the view). Requests come in order over its IPC channel from
 * src/adapters/node/policy-compute.ts; each gets one answer. It leaves when the channel closes (the agent stopped or died).
 */
import { asAtollError } from '../../core/errors.ts';
import { PolicyEngine } from '../../core/policy/engine.ts';
import { writeFileDurablyAsync } from '../durable-file.ts';
import { startIdleGc } from '../ops/idle-gc.ts';
import type { PolicyRequest, PolicyResponse } from './policy-compute.ts';

const engine = new PolicyEngine();

async function answer(req: PolicyRequest): Promise<unknown> {
  switch (req.op) {
    case 'line':
      engine.apply(req.line);
      return undefined;
    case 'unknown':
      return engine.unknown(req.active, req.nodeName);
    case 'compile':
      return engine.compile(req.req);
    case 'whole':
      return engine.whole();
    case 'committed':
      engine.committed(req.kept);
      return undefined;
    case 'save':
      // a disk that refuses the file is an answer, not a failure of the worker (the view stays in force from memory)
      try {
        await writeFileDurablyAsync(req.path, `${JSON.stringify({ type: 'snapshot', ...engine.view() })}\n`);
      } catch (e) {
        return { message: (e as Error).message, errno: (e as NodeJS.ErrnoException).code };
      }
      return undefined;
    case 'explain':
      return engine.explain(req.flow);
    case 'drops':
      return engine.drops(req.counters);
  }
}

const send = process.send?.bind(process);
if (send) {
  // one at a time, in order: a save or compile must see every line sent before it
  let chain = Promise.resolve();
  process.on('message', (message) => {
    const req = message as PolicyRequest;
    chain = chain.then(async () => {
      let res: PolicyResponse;
      try {
        res = { id: req.id, ok: true, value: await answer(req) };
      } catch (e) {
        const err = asAtollError(e);
        res = { id: req.id, ok: false, message: err.message, code: err.code };
      }
      send(res);
    });
  });
  process.on('disconnect', () => process.exit(0));
  // between changes the worker is idle: what a compile left behind is collected and given back
  startIdleGc();
}
