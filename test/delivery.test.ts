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
