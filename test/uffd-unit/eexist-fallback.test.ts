// The range ioctls' EEXIST fallback (native/uffd.cc RangeOp): zeropage, continue and poison
// over a range whose first page is there already fail at once with EEXIST, so the rest is
// placed page by page. A thread blocked in a real fault on one of those pages must then be
// woken, and with { wake: false } its fault must stay in the watchdog's care: otherwise it
// sleeps until close().
import { describe, expect, it } from 'vitest';
import { touch, type Region, type Userfaultfd } from '../../lib/index.js';
import { closer, P, pattern, recording, until } from '../helpers.js';
import { DELIVERIES, open, pagesOf, region } from './matrix.js';

const own = closer();
const data = pattern(3, 0x31);

interface Op {
  name: 'zeropage' | 'continue' | 'poison';
  shared: boolean;
  /** Register the region and make page 0 present; a thread's access to page 1 then faults. */
  setup(uffd: Userfaultfd, r: Region): void;
  resolve(uffd: Userfaultfd, r: Region, wake: boolean): number;
  /** What the thread's walk over pages 1 and 2 saw once they were placed: its result, or for poison its error. */
  check(seen: unknown): void;
}

const bytes = (seen: unknown): Buffer => (seen as { data: Buffer }).data;

const OPS: Op[] = [
  {
    name: 'zeropage',
    shared: false,
    setup: (uffd, r) => (uffd.register(r), uffd.copy(r, 0, data.subarray(0, P))),
    resolve: (uffd, r, wake) => uffd.zeropage(r, 0, 3 * P, { wake }),
    check: (seen) => expect(bytes(seen).every((b) => b === 0)).toBe(true),
  },
  {
    name: 'continue',
    shared: true,
    setup: (uffd, r) => {
      const view = own(r.alias());
      Buffer.from(view.buffer).set(data); // in the page cache, not mapped in r
      uffd.register(r, { missing: false, minor: true });
      uffd.continue(r, 0, P);
    },
    resolve: (uffd, r, wake) => uffd.continue(r, 0, 3 * P, { wake }),
    check: (seen) => expect(bytes(seen).equals(data.subarray(P))).toBe(true),
  },
  {
    name: 'poison',
    shared: false,
    setup: (uffd, r) => (uffd.register(r), uffd.copy(r, 0, data.subarray(0, P))),
    resolve: (uffd, r, wake) => uffd.poison(r, 0, 3 * P, { wake }),
    check: (seen) => expect(seen).toMatchObject({ code: 'ERR_PFR_ACCESS_FAILED', offsets: [P, 2 * P] }),
  },
];

/** A native thread's walk over pages 1 and 2: what it saw (touch's result, or its error), or 'asleep' after `ms` (the uffd's close() then releases it). */
const walk = (r: Region, ms: number): Promise<unknown> =>
  Promise.race([touch(r, { offset: P }).catch((err: unknown) => err), new Promise<'asleep'>((res) => setTimeout(() => res('asleep'), ms).unref())]);

describe.each(DELIVERIES)('EEXIST fallback of the range ioctls (%s delivery)', (delivery) => {
  it.each(OPS)('$name over a range whose first page is there places the rest and wakes the waiting thread', async (op) => {
    const placed: number[] = [];
    // The watchdog is far away: only the ioctl's own wake can release the thread in time.
    const h = recording((f, u) => void placed.push(op.resolve(u, f.region, true)));
    const uffd = own(open(delivery, h.handler, { timeoutMs: 60_000 }));
    const r = own(region(3, op.shared));
    op.setup(uffd, r);
    const seen = await walk(r, 3000);
    expect(seen).not.toBe('asleep');
    expect(placed).toEqual([2 * P]);
    expect(pagesOf(h.faults)).toEqual([1]);
    op.check(seen);
    expect(uffd.pending).toBe(0);
    expect(uffd.stats().timeouts).toBe(0);
  });

  it.each(OPS)('$name with { wake: false } over such a range leaves the fault to the watchdog, which releases it', async (op) => {
    const placed: number[] = [];
    const h = recording((f, u) => void placed.push(op.resolve(u, f.region, false)));
    const uffd = own(open(delivery, h.handler, { timeoutMs: 200 }));
    const timeouts: string[] = [];
    uffd.on('error', (e) => timeouts.push(e.code));
    const r = own(region(3, op.shared));
    op.setup(uffd, r);
    const seen = await walk(r, 5000);
    expect(seen).not.toBe('asleep');
    expect(placed).toEqual([2 * P]);
    op.check(seen);
    expect(uffd.stats().timeouts).toBe(1);
    await until('the timeout event', () => timeouts.length > 0); // it follows the wake
    expect(timeouts).toEqual(['ERR_PFR_HANDLER_TIMEOUT']);
    expect(uffd.pending).toBe(0);
  });
});
