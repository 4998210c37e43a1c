// The DM-Handler's thread: a worker_thread with its own userfaultfd and its own store
// connection. It never touches a missing page of the region, so it never waits on a fault
// it would have to resolve itself. Requests come from the pager over the worker's port.
import { parentPort, workerData } from 'node:worker_threads';
import { PfrError } from '../errors.js';
import { DmHandler, type DmHandlerConfig } from './dm-handler.js';

export type Request =
  | { id: number; op: 'flush' }
  | { id: number; op: 'evict'; offset: number; length: number }
  | { id: number; op: 'latency' }
  | { id: number; op: 'trace' }
  | { id: number; op: 'close' };

const port = parentPort!;
const errorOf = (err: unknown) => ({
  code: (err as PfrError).code ?? 'ERR_PFR_STORE_UNAVAILABLE',
  message: err instanceof Error ? err.message : String(err),
});

try {
  const handler = await DmHandler.start(workerData as DmHandlerConfig, (err) => port.postMessage({ event: 'error', error: errorOf(err) }));
  port.on('message', async (req: Request) => {
    try {
      let result: unknown;
      if (req.op === 'flush') result = await handler.flush();
      else if (req.op === 'evict') result = await handler.evict(req.offset, req.length);
      else if (req.op === 'latency') result = handler.latency();
      else if (req.op === 'trace') result = handler.trace();
      else {
        port.postMessage({ id: req.id, result: await handler.close() });
        port.close();
        return;
      }
      port.postMessage({ id: req.id, result });
    } catch (err) {
      port.postMessage({ id: req.id, error: errorOf(err) });
    }
  });
  port.postMessage({ event: 'ready', tracking: handler.tracking });
} catch (err) {
  port.postMessage({ event: 'failed', error: errorOf(err) });
}
