// A worker_thread is a JS thread of its own: it can open a userfaultfd, poll it on its own
// event loop and handle faults; terminating it with a fault in flight neither hangs nor crashes.
import { beforeAll, expect, it } from 'vitest';
import { report, requireDist, runFixture } from './child.js';

beforeAll(requireDist);

it('workers handle faults on their own userfaultfd; terminate() with a fault in flight returns', async () => {
  const r = await runFixture('worker-uffd.mjs', [], { timeoutMs: 20_000 });
  expect(r.signal).toBeNull();
  expect(r.code, r.stderr).toBe(0);
  const out = report<{ workers: Array<{ code: number; faults: number; bytesOk: boolean }>; terminated: boolean }>(r);
  expect(out.workers).toEqual([
    { code: 0, faults: 16, bytesOk: true },
    { code: 0, faults: 16, bytesOk: true },
  ]);
  expect(out.terminated).toBe(true);
});

it("a worker's JS thread reading its own registered memory is resolved natively at once, not by its own handler", async () => {
  const r = await runFixture('worker-own-fault.mjs', [], { timeoutMs: 20_000 });
  expect(r.code, r.stderr).toBe(0);
  type Row = {
    delivery: string;
    workerTid: number;
    pid: number;
    handlerTid: number;
    sum: number;
    elapsedMs: number;
    handlerCalls: number;
    faults: string[];
    stats: { resolvedNatively: number; timeouts: number; forwarded: number };
  };
  const rows = report<Row[]>(r);
  expect(rows.map((x) => x.delivery)).toEqual(['event-loop', 'thread']);
  for (const x of rows) {
    expect(x.workerTid).not.toBe(x.pid); // off the main thread: thread id and process id differ
    expect(x.handlerTid).toBe(x.workerTid);
    expect(x.sum).toBe(0);
    expect(x.faults).toEqual(['native', 'native', 'native', 'native']);
    expect(x.handlerCalls).toBe(0);
    expect(x.stats).toMatchObject({ resolvedNatively: 4, timeouts: 0, forwarded: 0 });
    // Routed to its own handler, each fault would wait for the 5 s watchdog.
    expect(x.elapsedMs).toBeLessThan(1000);
  }
});

it('workers terminated while their copy threads are busy never crash the process', async () => {
  const r = await runFixture('worker-teardown.mjs', ['150'], { timeoutMs: 90_000 });
  expect(r.signal).toBeNull(); // SIGSEGV before the addon was pinned and Deliver checked env
  expect(r.code, r.stderr).toBe(0);
  expect(report<{ rounds: number; copiesSeen: number }>(r)).toEqual({ rounds: 150, copiesSeen: 150 });
  // The child is bounded by its own 90 s: on a loaded 2-core machine 150 workers took > 30 s.
}, 100_000);
