// A worker_thread is a JS thread of its own: it can open a userfaultfd, poll it on its own
// event loop and handle faults; terminating it with a fault in flight neither hangs nor crashes.
import { beforeAll, expect, it } from 'vitest';
import { report, requireDist, runFixture } from './child.js';

beforeAll(requireDist);

it('workers handle faults on their own userfaultfd; terminate() with a fault in flight returns', async () => {
  const r = await runFixture('worker-uffd.mjs', [], { timeoutMs: 20_000 });
  expect(r.signal).toBeNull();
  expect(r.code).toBe(0);
  const out = report<{ workers: Array<{ code: number; faults: number; bytesOk: boolean }>; terminated: boolean }>(r);
  expect(out.workers).toEqual([
    { code: 0, faults: 16, bytesOk: true },
    { code: 0, faults: 16, bytesOk: true },
  ]);
  expect(out.terminated).toBe(true);
});
