// Port of the kernel tests' hugetlb memory types: hugetlbfs regions fault in 2 MiB units
// (missing, minor, write-protect). The test reserves huge pages itself (as root, like the
// kernel's run_vmtests.sh) and gives the pool back afterwards.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { HUGE_PAGE_SIZE as H, mapRegion, touch } from '../../lib/index.js';
import { closer, freeHugePages, P, recording, reserveHugePages } from '../helpers.js';
import { DELIVERIES, open } from './matrix.js';

const own = closer();
const WANT = 16; // 32 MiB
let pool: { release(): void } | undefined;

beforeAll(() => {
  pool = reserveHugePages(WANT);
  expect(freeHugePages()).toBeGreaterThanOrEqual(WANT);
});
afterAll(() => pool?.release());

/** `n` huge pages, huge page i filled with the byte `base + i`. */
const hugePattern = (n: number, base: number): Buffer => {
  const b = Buffer.alloc(n * H);
  for (let i = 0; i < n; i++) b.fill(base + i, i * H, (i + 1) * H);
  return b;
};

describe('hugetlb regions', () => {
  it('are 2 MiB-paged; more than the pool holds is ENOMEM naming vm.nr_hugepages', () => {
    const r = own(mapRegion(2 * H, { hugetlb: true }));
    expect(r.pageSize).toBe(H);
    expect(r.granule).toBe(H);
    let err: (Error & { code?: string }) | undefined;
    try {
      mapRegion((freeHugePages() + 64) * H, { hugetlb: true });
    } catch (e) {
      err = e as Error & { code?: string };
    }
    expect(err?.code).toBe('ENOMEM');
    expect(err?.message).toMatch(/vm\.nr_hugepages/);
  });
});

describe.each(DELIVERIES)('hugetlb (%s delivery)', (delivery) => {
  it('missing faults come one per 2 MiB page; copy places 2 MiB', async () => {
    const N = 4;
    const data = hugePattern(N, 0x30);
    const placed: number[] = [];
    const h = recording((f, u) => void placed.push(u.copy(f.region, f.offset, data.subarray(f.offset, f.offset + H))));
    const uffd = own(open(delivery, h.handler));
    const r = own(mapRegion(N * H, { hugetlb: true }));
    uffd.register(r);
    const res = await touch(r, { probe: true });
    expect(h.faults.map((f) => f.offset)).toEqual([0, 1, 2, 3].map((i) => i * H));
    expect(placed).toEqual(Array(N).fill(H));
    expect(res.checksum).toBe((0x30 + 0x31 + 0x32 + 0x33) * (H / P)); // a probe per base page
    expect(Array.from(r.residency())).toEqual([1, 1, 1, 1]);
  });

  it('minor faults on shared hugetlbfs in 2 MiB units; CONTINUE maps the cached huge page', async () => {
    const N = 2;
    const h = recording((f, u) => void u.continue(f.region, f.offset, H));
    const uffd = own(open(delivery, h.handler));
    const r = own(mapRegion(N * H, { hugetlb: true, shared: true }));
    const view = own(r.alias());
    const data = hugePattern(N, 0x70);
    Buffer.from(view.buffer).set(data);
    uffd.register(r, { missing: false, minor: true });
    const res = await touch(r);
    expect(h.faults.map((f) => [f.kind, f.offset])).toEqual([
      ['minor', 0],
      ['minor', H],
    ]);
    expect(res.data!.equals(data)).toBe(true);
  });

  it('write-protect faults in 2 MiB units after a write-protected copy', async () => {
    const N = 2;
    const h = recording((f, u) => {
      if (f.kind === 'write-protect') u.writeProtect(f.region, f.offset, H, false);
      else u.copy(f.region, f.offset, Buffer.alloc(H, 1), { writeProtect: true });
    });
    const uffd = own(open(delivery, h.handler));
    const r = own(mapRegion(N * H, { hugetlb: true }));
    uffd.register(r, { writeProtect: true });
    await touch(r, { access: 'write', probe: true, fill: 0x99 });
    expect(h.faults.map((f) => [f.kind, f.offset])).toEqual([
      ['missing', 0],
      ['write-protect', 0],
      ['missing', H],
      ['write-protect', H],
    ]);
    const b = new Uint8Array(r.buffer);
    expect([b[0], b[1], b[H], b[H + 1]]).toEqual([0x99, 1, 0x99, 1]);
  });

  it('an unanswered hugetlb fault is resolved by the watchdog with a zeroed 2 MiB page', async () => {
    const uffd = own(open(delivery, () => new Promise<void>(() => undefined)));
    uffd.setTimeout(100);
    uffd.on('error', () => undefined);
    const r = own(mapRegion(H, { hugetlb: true }));
    uffd.register(r);
    const res = await touch(r, { probe: true });
    expect(res.checksum).toBe(0);
    expect(uffd.stats().timeouts).toBe(1);
  });
});
