// Both ways of delivering faults to the handler give the same outcomes: 'event-loop' (the JS
// thread polls the uffd; the reader thread only guards) and 'thread' (the reader thread hands
// every batch over through a thread-safe function).
import { describe, expect, it } from 'vitest';
import { mapRegion, touch, Userfaultfd } from '../lib/index.js';
import { closer, P, pattern, recording, sleep } from './helpers.js';

const own = closer();

describe.each(['event-loop', 'thread'] as const)("delivery: '%s'", (delivery) => {
  it('N faults of a native thread reach the handler once each, with the right bytes', async () => {
    const N = 48;
    const data = pattern(N);
    const h = recording((f, u) => {
      u.copy(f.region, f.offset, data.subarray(f.offset, f.offset + P));
    });
    const region = own(mapRegion(N * P));
    const uffd = own(Userfaultfd.open({ handler: h.handler, delivery }));
    uffd.register(region);
    const r = await touch(region);
    expect(h.faults).toHaveLength(N);
    expect(h.faults.every((f) => f.threadId === r.threadId && f.resolvedBy === 'handler')).toBe(true);
    expect(r.data!.equals(data)).toBe(true);
    expect(uffd.stats()).toMatchObject({ forwarded: N, handled: N, timeouts: 0 });
  });

  it("the JS thread's own faults are resolved natively while a native thread waits on a slow handler", async () => {
    const region = own(mapRegion(8 * P));
    // The handler answers late, from a timer: the toucher stays blocked meanwhile.
    const h = recording((f, u) => sleep(30).then(() => u.zeropage(f.region, f.offset, P)));
    const uffd = own(Userfaultfd.open({ handler: h.handler, delivery }));
    uffd.register(region);
    const t = touch(region, { length: P });
    const view = new Uint8Array(region.buffer);
    for (let p = 1; p < 8; p++) {
      expect(view[p * P]).toBe(0); // never-touched registered page, read by this thread
      view[p * P] = p;
      expect(view[p * P]).toBe(p);
    }
    await t;
    expect(h.faults.map((f) => f.offset)).toEqual([0]);
    expect(uffd.stats().resolvedNatively).toBeGreaterThanOrEqual(7);
  });

  it('a JS thread busy in synchronous code does not stop faults from being resolved by the watchdog', async () => {
    const region = own(mapRegion(2 * P));
    const uffd = own(Userfaultfd.open({ delivery, timeoutMs: 50 }));
    const errors: string[] = [];
    uffd.on('error', (e: Error & { code?: string }) => errors.push(e.code ?? ''));
    uffd.onFault(() => new Promise(() => {})); // never answers
    uffd.register(region);
    const t = touch(region);
    const until = Date.now() + 300;
    while (Date.now() < until) {
      /* busy: no event-loop turn for 300 ms */
    }
    const r = await t;
    expect(r.pages).toBe(2);
    await sleep(10);
    expect(uffd.stats().timeouts).toBe(2);
    expect(errors).toEqual(['ERR_PFR_HANDLER_TIMEOUT', 'ERR_PFR_HANDLER_TIMEOUT']);
  });

  it('an async handler answering after later batches were read places every page from its own fault', async () => {
    // The native side hands every batch over in one array it reuses: a Fault must not depend on it.
    const threads = 4,
      pages = 64;
    const data = pattern(threads * pages);
    const region = own(mapRegion(threads * pages * P));
    const uffd = own(Userfaultfd.open({ delivery }));
    uffd.onFault(async (f, u) => {
      await sleep(1);
      u.copy(f.region, f.offset, data.subarray(f.offset, f.offset + P));
    });
    uffd.register(region);
    const walks = await Promise.all(Array.from({ length: threads }, (_, k) => touch(region, { offset: k * pages * P, length: pages * P })));
    walks.forEach((r, k) => expect(r.data!.equals(data.subarray(k * pages * P, (k + 1) * pages * P))).toBe(true));
    expect(uffd.stats()).toMatchObject({ forwarded: threads * pages, handled: threads * pages, timeouts: 0 });
  });

  it('close() with a fault in flight releases the faulting thread', async () => {
    const region = own(mapRegion(P));
    const uffd = Userfaultfd.open({ delivery });
    uffd.onFault(() => new Promise(() => {}));
    uffd.register(region);
    const t = touch(region);
    await sleep(20);
    uffd.close();
    const r = await t;
    expect(r.data!.every((b) => b === 0)).toBe(true);
    expect(() => uffd.stats()).toThrow(expect.objectContaining({ code: 'ERR_PFR_CLOSED' }));
  });
});

describe("delivery: 'event-loop' under a stream of faults", () => {
  it('reads again after the handler, yet leaves the event loop a turn every 16 reads', async () => {
    // Four threads fault without pause, so a fault is nearly always waiting when the handler
    // returns: the poll callback reads on (at most 4 faults a read, one per thread) for 16
    // reads, then the loop turns (setImmediate runs) before it reads again. When this thread is
    // descheduled for a tick (a loaded machine) the guard steps in, and its batches come through
    // the thread-safe function, which Node drains many to a turn: those turns may be larger, so
    // the bound is checked on where most faults were handled, not on every turn.
    const threads = 4,
      pages = 2048,
      bound = 16 * threads;
    const region = own(mapRegion(threads * pages * P));
    const uffd = own(Userfaultfd.open());
    const page = Buffer.alloc(P, 7);
    const perTurn: number[] = [];
    let sinceTurn = 0,
      walking = true;
    uffd.onFault((f, u) => {
      u.copy(f.region, f.offset, page);
      sinceTurn++;
    });
    const turn = (): void => {
      if (sinceTurn) perTurn.push(sinceTurn);
      sinceTurn = 0;
      if (walking) setImmediate(turn);
    };
    setImmediate(turn);
    uffd.register(region);
    const walks = await Promise.all(
      Array.from({ length: threads }, (_, k) => touch(region, { offset: k * pages * P, length: pages * P, probe: true })),
    );
    walking = false;
    perTurn.push(sinceTurn);
    expect(walks.reduce((sum, r) => sum + r.checksum, 0)).toBe(threads * pages * 7);
    expect(uffd.stats()).toMatchObject({ forwarded: threads * pages, handled: threads * pages, timeouts: 0 });
    expect(perTurn.reduce((a, b) => a + b, 0)).toBe(threads * pages);
    const inLargerTurns = perTurn.filter((n) => n > bound).reduce((a, b) => a + b, 0);
    expect(inLargerTurns).toBeLessThan((threads * pages) / 2);
  });
});
