// The copy thread's own residency walk, at the edges of a job. The SMMU translated the
// source from a stale IOTLB entry (its MMU notifier was taken away), so only the native
// copy thread's mincore walk right before the copy can see that a source page is gone.
// Reading an evicted anonymous page gives zeros, so a walk that skips the job's last page,
// or skips one-page jobs, copies zeros silently instead of faulting.
import { describe, expect, test } from 'vitest';
import { DmaStatus } from '../../../kernel-sim/index.js';
import { bytesOf, FaultLibrary, fill, P, post, proc, useEnv, within } from '../helpers.js';

const env = useEnv();

/**
 * `pages` resident pages copied node 0 → node 1 once (the source SMMU caches them), then the
 * source SMMU stops hearing about evictions and `evictPage` of the source is evicted.
 */
async function staleSource(pages: number, evictPage: number, blockSize?: number) {
  const sys = env.system(blockSize ? { nodes: 2, blockSize } : { nodes: 2 });
  const src = env.region(pages * P);
  const dst = env.region(pages * P);
  const data = fill(src, 3);
  dst.populate();
  const a = proc(sys.node(0), 100, 7, [src]);
  proc(sys.node(1), 200, 7, [dst]);
  // The source's fault library brings the evicted page back with its bytes.
  const lib = env.track(
    new FaultLibrary(a.socket, { regions: [src], resolve: (r, off, len) => new Uint8Array(r.buffer, off, len).set(data.subarray(off, off + len)) }),
  );
  const smmu = sys.node(0).smmu;
  const c1 = await within('first transfer', post(sys.node(0), src, dst));
  expect(c1.faults).toEqual({ source: 0, destination: 0 });
  src.unobserve(smmu);
  src.evict(evictPage * P, P);
  expect(src.residency()[evictPage]).toBe(0);
  expect(smmu.counters().iotlbInvalidations).toBe(0);
  new Uint8Array(dst.buffer).fill(0);
  const hits = smmu.counters().iotlbHits;
  const c2 = await within('second transfer', post(sys.node(0), src, dst));
  // The SMMU really answered from its stale entries: only the copy thread could notice.
  expect(smmu.counters().iotlbHits - hits).toBeGreaterThanOrEqual(1);
  src.observe(smmu);
  return { c2, lib, src, dst, data, smmu };
}

describe("the copy thread's residency re-check at the edges of a job", () => {
  test('the last page of a multi-block job: a source fault on that page, not zeros', async () => {
    const pages = 4;
    const { c2, lib, dst, data, smmu } = await staleSource(pages, pages - 1);
    expect(c2.status).toBe(DmaStatus.SUCCESS);
    expect(c2.faults).toEqual({ source: 1, destination: 0 });
    // Only the block holding the last page went again.
    expect(c2.retransmittedBlocks).toBe(1);
    expect(lib.faults.map((f) => [f.side, f.offset / P])).toEqual([['source', pages - 1]]);
    expect(lib.faults[0]!.write).toBe(false);
    // The engine dropped the stale entry of that page (and only it).
    expect(smmu.counters().iotlbInvalidations).toBe(1);
    expect(bytesOf(dst).equals(data)).toBe(true);
  });

  test('the last page of a one-block job (a block of 4 pages)', async () => {
    const { c2, lib, dst, data } = await staleSource(4, 3, 4 * P);
    expect(c2.status).toBe(DmaStatus.SUCCESS);
    expect(c2.blocks).toBe(1);
    expect(c2.faults).toEqual({ source: 1, destination: 0 });
    expect(c2.retransmittedBlocks).toBe(1);
    expect(lib.faults.map((f) => f.offset / P)).toEqual([3]);
    expect(bytesOf(dst).equals(data)).toBe(true);
  });

  test('a one-page job: a source fault, not a page of zeros', async () => {
    const { c2, lib, dst, data } = await staleSource(1, 0);
    expect(c2.status).toBe(DmaStatus.SUCCESS);
    expect(c2.blocks).toBe(1);
    expect(c2.faults).toEqual({ source: 1, destination: 0 });
    expect(c2.retransmittedBlocks).toBe(1);
    expect(lib.faults.map((f) => f.offset)).toEqual([0]);
    expect(bytesOf(dst).equals(data)).toBe(true);
  });

  test('a one-page job of a few bytes in the middle of the page', async () => {
    const sys = env.system({ nodes: 2 });
    const src = env.region(P);
    const dst = env.region(P);
    const data = fill(src, 9);
    dst.populate();
    const a = proc(sys.node(0), 100, 7, [src]);
    proc(sys.node(1), 200, 7, [dst]);
    const lib = env.track(
      new FaultLibrary(a.socket, { regions: [src], resolve: (r, off, len) => new Uint8Array(r.buffer, off, len).set(data.subarray(off, off + len)) }),
    );
    const d = { srcVa: src.address + 100n, dstVa: dst.address + 100n, length: 200 };
    expect((await within('first', post(sys.node(0), src, dst, d))).faults.source).toBe(0);
    src.unobserve(sys.node(0).smmu);
    src.evict(0, P);
    const c = await within('second', post(sys.node(0), src, dst, d));
    src.observe(sys.node(0).smmu);
    expect(c.faults).toEqual({ source: 1, destination: 0 });
    expect(lib.faults.map((f) => f.offset)).toEqual([0]);
    expect(bytesOf(dst, 100, 200).equals(data.subarray(100, 300))).toBe(true);
  });
});

test("a stale destination translation on a job's last page: a NACK the source counts, then the right bytes", async () => {
  const pages = 4;
  const sys = env.system({ nodes: 2 });
  const src = env.region(pages * P);
  const dst = env.region(pages * P);
  const data = fill(src, 5);
  dst.populate();
  proc(sys.node(0), 100, 7, [src]);
  const b = proc(sys.node(1), 200, 7, [dst]);
  const lib = env.track(new FaultLibrary(b.socket, { regions: [dst] }));
  expect((await within('first', post(sys.node(0), src, dst))).faults.destination).toBe(0);
  const smmu = sys.node(1).smmu;
  dst.unobserve(smmu);
  dst.evict((pages - 1) * P, P);
  const before = sys.node(0).pldma.counters();
  const c = await within('second', post(sys.node(0), src, dst));
  dst.observe(smmu);
  expect(c.status).toBe(DmaStatus.SUCCESS);
  expect(c.faults).toEqual({ source: 0, destination: 1 });
  expect(c.nacks).toBe(1);
  expect(lib.faults.map((f) => f.offset / P)).toEqual([pages - 1]);
  expect(sys.node(0).pldma.counters().nacksReceived - before.nacksReceived).toBe(1);
  expect(sys.node(1).pldma.counters().faults.destination).toBe(1);
  expect(bytesOf(dst).equals(data)).toBe(true);
});
