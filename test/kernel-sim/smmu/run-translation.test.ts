// The SMMU translates a run of blocks with one call (translateBlocks): the region is found and
// the page table read once, but the outcome (which block faults, at which page) and every
// counter (translations, walks, pages walked, IOTLB hits and misses) are those of translate()
// block by block, on the same real memory.
import { describe, expect, test } from 'vitest';
import { DmaStatus, Smmu } from '../../../kernel-sim/index.js';
import { HUGE_PAGE_SIZE as HUGE } from '../../../lib/index.js';
import { binding } from '../../../native/index.js';
import { bytesOf, FaultLibrary, fill, P, post, proc, useEnv, within } from '../helpers.js';

const env = useEnv();
const B = 2 * P; // a block of two pages

function twoSmmus(region: ReturnType<typeof env.region>) {
  return [0, 1].map((node) => {
    const smmu = new Smmu({ node });
    const { sid } = smmu.attach({ pid: process.pid, pd: 7 });
    smmu.map(sid, region);
    return { smmu, sid };
  });
}

describe('translating a run of blocks at once', () => {
  test('resident, then cached, then with a page evicted mid-run: the same outcome and counters as block by block', () => {
    const blocks = 16;
    const r = env.region(blocks * B);
    r.populate();
    const [one, run] = twoSmmus(r) as [{ smmu: Smmu; sid: number }, { smmu: Smmu; sid: number }];
    const walked: number[] = [];
    const compare = (length: number) => {
      const per: number[] = [];
      let fault: unknown;
      for (let off = 0; off < length; off += B) {
        const tr = one.smmu.translate(one.sid, r.address + BigInt(off), Math.min(B, length - off), 'write');
        if (!tr.ok) {
          fault = tr;
          break;
        }
        expect(tr.offset).toBe(off);
        per.push(tr.hit ? 0 : tr.walked);
      }
      const got = run.smmu.translateBlocks(run.sid, r.address, length, B, 'write', walked);
      expect(walked).toEqual(per);
      expect(got.fault).toEqual(fault);
      expect(got.region).toBe(r);
      expect(run.smmu.counters()).toEqual(one.smmu.counters());
      return { per, fault };
    };
    // Cold: every block walks its two pages.
    expect(compare(blocks * B).per).toEqual(Array(blocks).fill(2));
    // Cached: every block hits.
    expect(compare(blocks * B).per).toEqual(Array(blocks).fill(0));
    // A page of block 5 evicted: blocks 0-4 hit, block 5 faults at that page; nothing after it is translated.
    r.evict(5 * B + P, P);
    const { per, fault } = compare(blocks * B - 100);
    expect(per).toEqual([0, 0, 0, 0, 0]);
    expect(fault).toMatchObject({ ok: false, recoverable: true, addr: r.address + BigInt(5 * B + P) });
  });

  test('a run that leaves the region: only its first block is translated; asked again, the block that leaves it is an address-size fault', () => {
    const r = env.region(4 * B);
    r.populate();
    const [, run] = twoSmmus(r) as [unknown, { smmu: Smmu; sid: number }];
    const walked: number[] = [];
    const got = run.smmu.translateBlocks(run.sid, r.address + BigInt(2 * B), 3 * B, B, 'read', walked);
    expect(walked).toEqual([2]);
    expect(got).toMatchObject({ region: r, offset: 2 * B, fault: undefined });
    expect(run.smmu.translateBlocks(run.sid, r.address + BigInt(3 * B), 2 * B, B, 'read', walked).fault).toBeUndefined();
    expect(walked).toEqual([2]);
    const out = run.smmu.translateBlocks(run.sid, r.address + BigInt(4 * B), B, B, 'read', walked);
    expect(walked).toEqual([]);
    expect(out.fault).toMatchObject({ ok: false, recoverable: false, addr: r.address + BigInt(4 * B) });
    expect(run.smmu.counters().translations).toBe(3);
  });

  test('a transfer whose source faults mid-run translates each block once per attempt, as block by block', async () => {
    const pages = 8;
    const sys = env.system({ nodes: 2 });
    const src = env.region(pages * P);
    const dst = env.region(pages * P);
    const data = fill(src, 0x31);
    dst.populate();
    src.evict(5 * P, P);
    const a = proc(sys.node(0), 100, 7, [src]);
    proc(sys.node(1), 200, 7, [dst]);
    env.track(
      new FaultLibrary(a.socket, {
        regions: [src],
        policy: 'touch',
        resolve: (r, off, len) => new Uint8Array(r.buffer, off, len).set(data.subarray(off, off + len)),
      }),
    );
    const c = await within('transfer', post(sys.node(0), src, dst));
    expect(c.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dst).equals(data)).toBe(true);
    expect(c.faults.source).toBe(1);
    // Blocks 0-5 (5 faults), then 5-7 again after the fault: 9 translations, 1 fault recorded.
    const k = sys.node(0).smmu.counters();
    expect(k.translations).toBe(9);
    expect(k.faults).toEqual({ F_TRANSLATION: 1 });
  });
});

describe('translating a run: per run against block by block, at random', () => {
  // Random runs (starts, lengths, block sizes, streams) on real memory, with pages evicted
  // (told to the SMMUs, or behind their backs, as reclaim would), made resident again,
  // invalidated, and translated one block at a time in between: one SMMU translates each run
  // with translateBlocks, the other block by block with translate(). Outcomes, counters and
  // the IOTLB's entries, frames and LRU order must stay identical.
  test.each([0, 1, 3, 17, 100])('IOTLB capacity %i', async (cap) => {
    let seed = 7 + cap;
    const rnd = (n: number): number => (seed = (seed * 1103515245 + 12345) % 2147483648) % n;
    const small = env.region(64 * P);
    const huge = env.region(4 * HUGE, { hugePages: true });
    const regions = [small, huge];
    const smmus = [0, 1].map((node) => {
      const smmu = new Smmu({ node, iotlbEntries: cap });
      for (let pd = 1; pd <= 3; pd++) {
        const { sid } = smmu.attach({ pid: process.pid, pd, sid: pd });
        for (const r of regions) smmu.map(sid, r, { write: pd !== 3 });
      }
      return smmu;
    }) as [Smmu, Smmu];
    const [run, one] = smmus;
    small.populate(0, 48 * P);
    huge.populate(0, 3 * HUGE);
    const walked: number[] = [];
    let faults = 0;
    let hits = 0;
    for (let i = 0; i < 1500; i++) {
      // translate() reads the page table once per synchronous turn: a new turn per step, so it
      // sees the pages populate() made resident.
      await Promise.resolve();
      const op = rnd(100);
      const r = regions[rnd(2)]!;
      const sid = 1 + rnd(3);
      const pages = r.size / P;
      if (op < 55) {
        // A run: page-aligned or not, of blocks smaller or larger than pages and granules.
        const start = rnd(4) === 0 ? rnd(r.size - 1) : rnd(pages) * P;
        const length = 1 + rnd(Math.min(r.size - start, rnd(3) === 0 ? r.size : 24 * P));
        const blockSize = [P, 2 * P, 3 * P, P / 2, 5000, 16 * P, HUGE][rnd(7)]!;
        const access = sid === 3 ? 'read' : rnd(2) ? 'read' : 'write';
        const va = r.address + BigInt(start);
        const per: number[] = [];
        let fault: unknown;
        for (let off = 0; off < length; off += blockSize) {
          const tr = one.translate(sid, va + BigInt(off), Math.min(blockSize, length - off), access);
          if (!tr.ok) {
            fault = tr;
            break;
          }
          per.push(tr.hit ? 0 : tr.walked);
        }
        const got = run.translateBlocks(sid, va, length, blockSize, access, walked);
        expect(walked).toEqual(per);
        expect(got.fault).toEqual(fault);
        if (per.length) expect([got.region, got.offset]).toEqual([r, start]);
        if (fault) faults++;
        hits += per.filter((w) => w === 0).length;
      } else if (op < 70) {
        const start = rnd(pages) * P;
        const length = (1 + rnd(Math.min(pages - start / P, 8))) * P;
        expect(run.translate(sid, r.address + BigInt(start), length, 'read')).toEqual(one.translate(sid, r.address + BigInt(start), length, 'read'));
      } else if (op < 78) {
        r.evict(rnd(pages) * P, (1 + rnd(4)) * P);
      } else if (op < 83) {
        // Reclaim behind the SMMUs' backs: their IOTLBs keep the entries (a hit is not walked).
        binding.evict(r.id, rnd(pages) * P, (1 + rnd(3)) * P);
      } else if (op < 93) {
        const start = rnd(pages) * P;
        r.populate(start, Math.min(r.size - start, (1 + rnd(32)) * P));
      } else {
        const page = r.address + BigInt(rnd(pages) * P);
        expect(run.iotlb.invalidate(sid, page)).toBe(one.iotlb.invalidate(sid, page));
      }
      expect(run.counters()).toEqual(one.counters());
      expect(run.iotlb.entriesIn(0n, 2 ** 47)).toEqual(one.iotlb.entriesIn(0n, 2 ** 47));
      expect(run.iotlb.size).toBe(one.iotlb.size);
    }
    // The runs met faults and (with a cache) hits.
    expect(faults).toBeGreaterThan(20);
    if (cap > 1) expect(hits).toBeGreaterThan(20);
  });
});

describe('translateRun: the compact answer', () => {
  test('pages walked per stretch of blocks: cold, cached, then past an evicted page', () => {
    const r = env.region(16 * P);
    r.populate();
    const smmu = new Smmu({ node: 0, iotlbEntries: 8 });
    const { sid } = smmu.attach({ pid: process.pid, pd: 1 });
    smmu.map(sid, r);
    expect(smmu.translateRun(sid, r.address, 16 * P, 2 * P, 'read')).toMatchObject({
      region: r,
      offset: 0,
      blocks: 8,
      spans: [8, 2],
      fault: undefined,
    });
    // The IOTLB keeps the last 8 pages: blocks 4-7 hit.
    expect(smmu.translateRun(sid, r.address + BigInt(8 * P), 8 * P, 2 * P, 'read').spans).toEqual([4, 0]);
    // Page 13 evicted (the IOTLB is told): blocks 4-5 hit, block 6 hits page 12 and walks 13.
    r.evict(13 * P, P);
    const run = smmu.translateRun(sid, r.address + BigInt(8 * P), 8 * P, 2 * P, 'read');
    expect(run).toMatchObject({ blocks: 2, spans: [2, 0], fault: { ok: false, recoverable: true, addr: r.address + BigInt(13 * P) } });
    expect(smmu.counters()).toMatchObject({ translations: 8 + 4 + 3, walks: 8 + 1, pagesWalked: 16 + 1, iotlbHits: 4 * 2 + 5 });
    expect(() => smmu.translateRun(sid, r.address, P, 0, 'read')).toThrow(RangeError);
  });

  test('binding.pageRun: the first absent page, the kept frames, and clear errors for bad input', () => {
    const r = env.region(8 * P);
    r.populate();
    r.evict(5 * P, P);
    const frames = new Float64Array(4);
    expect(binding.pageRun(r.id, 0, 8, P, 4, frames)).toBe(5);
    const want = r.frames(0, 5 * P).pfns;
    expect([...frames]).toEqual([...want.subarray(1, 5)]);
    expect(binding.pageRun(r.id, 6 * P, 2, P, 4, frames)).toBe(-1);
    expect(frames[0]).toBe(-1);
    expect(() => binding.pageRun(r.id, 0, 9, P, 0, frames)).toThrow(RangeError);
    expect(() => binding.pageRun(r.id, 1, 1, P, 0, frames)).toThrow(RangeError);
    expect(() => binding.pageRun(r.id, 0, 1, P, 5, frames)).toThrow(RangeError);
    expect(() => binding.pageRun(r.id, 0, 1, P, 0, new Float32Array(1) as unknown as Float64Array)).toThrow(TypeError);
  });
});
