// Pinning does not prevent faults, on real memory: Region.frames() reads the physical frames
// (/proc/self/pagemap), MADV_COLLAPSE moves every frame of a pinned buffer while the mlock
// stays, the SMMU's MMU-notifier role drops exactly the cached translations whose frame
// changed, and RDMA writes into the collapsed buffer land. As user nobody the frames are
// hidden (CAP_SYS_ADMIN) and the program shows residency only.
import { readFileSync } from 'node:fs';
import { beforeAll, describe, expect, it } from 'vitest';
import { FRAMES_HIDDEN, HUGE_PAGE_SIZE as H, mapRegion } from '../lib/index.js';
import { Smmu } from '../kernel-sim/index.js';
import { pinningMoves, type PinningMovesResult } from '../cli/programs/pinning-moves.js';
import { report, requireDist, runFixture } from './child.js';
import { closer, P, pattern } from './helpers.js';

const own = closer();
const root = process.getuid?.() === 0;

describe('Region.frames()', () => {
  it('reads -1 for pages not present and a frame for each resident page; distinct frames for distinct pages', () => {
    const r = own(mapRegion(8 * P));
    const untouched = r.frames();
    expect([...untouched.pfns]).toEqual(Array(8).fill(-1));
    Buffer.from(r.buffer).set(pattern(4), 0);
    const f = r.frames();
    expect([...f.pfns.subarray(4)]).toEqual([-1, -1, -1, -1]);
    expect(f.visible).toBe(root);
    if (f.visible) {
      expect(f.hidden).toBeUndefined();
      expect(new Set(f.pfns.subarray(0, 4)).size).toBe(4);
      for (const pfn of f.pfns.subarray(0, 4)) expect(pfn).toBeGreaterThan(0);
    } else {
      expect(f.hidden).toBe(FRAMES_HIDDEN);
      expect([...f.pfns.subarray(0, 4)]).toEqual([0, 0, 0, 0]);
    }
    expect([...r.frames(2 * P, 3 * P).pfns]).toEqual([...f.pfns.subarray(2, 5)]);
  });

  it('refuses a range outside the region, and a closed region', () => {
    const r = mapRegion(4 * P);
    expect(() => r.frames(2 * P, 4 * P)).toThrow(/outside|beyond|range/);
    r.close();
    expect(() => r.frames()).toThrow(/closed/);
  });
});

describe('the MMU-notifier role on a move (Smmu.regionMoved)', () => {
  it('drops the IOTLB entries whose frame changed and keeps those that did not', () => {
    const smmu = new Smmu({ node: 0 });
    const ctx = smmu.attach({ pid: 1, pd: 1 });
    const r = own(mapRegion(2 * H));
    const keep = own(mapRegion(4 * P));
    Buffer.from(r.buffer).set(pattern(1024));
    Buffer.from(keep.buffer).set(pattern(4));
    smmu.map(ctx.sid, r);
    smmu.map(ctx.sid, keep);
    expect(smmu.translate(ctx.sid, r.address, 2 * H, 'write').ok).toBe(true);
    expect(smmu.translate(ctx.sid, keep.address, 4 * P, 'write').ok).toBe(true);
    const held = smmu.iotlb.entriesIn(r.address, 2 * H);
    expect(held).toHaveLength(1024);
    r.collapse();
    const c = smmu.counters();
    expect(c.movedChecked).toBe(1024);
    expect(c.movedStale).toBe(root ? held.filter((e) => e.frame !== r.frames().pfns[Number(e.page - r.address) / P]).length : 1024);
    expect(c.movedStale).toBeGreaterThan(0);
    expect(smmu.iotlb.entriesIn(r.address, 2 * H)).toHaveLength(1024 - c.movedStale);
    expect(smmu.iotlb.entriesIn(keep.address, 4 * P)).toHaveLength(4); // another region's entries stay
    // The next access re-walks the moved pages and caches their new frames.
    const t = smmu.translate(ctx.sid, r.address, 2 * H, 'read');
    expect(t.ok && t.walked).toBe(c.movedStale);
    if (root) expect(smmu.iotlb.entriesIn(r.address, 2 * H).map((e) => e.frame)).toEqual(expect.arrayContaining([...r.frames().pfns]));
  });
});

describe('pagefault-rdma pinning-moves', () => {
  beforeAll(requireDist);

  const common = (r: PinningMovesResult): void => {
    const pages = 1024;
    expect(r.pages).toBe(pages);
    expect(r.residentBefore).toBe(pages);
    expect(r.residentAfter).toBe(pages);
    expect(r.mappedAfter).toBe(pages);
    expect(r.hugeBytesBefore).toBe(0);
    expect(r.hugeBytesAfter).toBe(4 * 2 ** 20);
    expect(r.contentsKept).toBe(true);
    expect(r.iotlb.cachedBefore).toBe(pages);
    expect(r.iotlb.checked).toBe(pages);
    expect(r.writes.map((w) => [w.when, w.via, w.status, w.bytesOk])).toEqual([
      ['before', 'pinned MR', 'success', true],
      ['after', 'ODP MR', 'success', true],
      ['after', 'pinned MR', 'success', true],
    ]);
    // The first write after the move re-translated what the notifier dropped.
    expect(r.writes[1]!.pagesWalked).toBe(r.iotlb.stale);
    expect(r.khugepaged.note).toMatch(/skipped/);
  };

  it('as this user: a pinned 4 MiB buffer changes frames in the collapse, stays resident and mlocked', async () => {
    const r = await pinningMoves({ khugepagedWaitS: 0 });
    common(r);
    expect(r.lockedBytesBefore).toBe(4 * 2 ** 20);
    expect(r.lockedBytesAfter).toBe(4 * 2 ** 20);
    if (!root) return;
    expect(r.framesVisible).toBe(true);
    // Read before pinning too (reported: mlock leaves resident pages where they are, the collapse does not).
    expect(r.framesMovedByPin).toEqual(expect.any(Number));
    expect(r.framesMoved).toBeGreaterThan(0);
    expect(r.iotlb.framesKnown).toBe(true);
    expect(r.iotlb.stale).toBe(r.framesMoved);
    expect(r.iotlb.oldFramesNotOwned).toBeGreaterThan(0);
    expect(r.pinningOnlyEngine).toMatch(/would DMA the next write into \d+ frames the buffer no longer owns/);
  });

  it("khugepaged left to do it: reported with the machine's THP mode, the pinned buffer still mlocked, its timing not asserted", async () => {
    const r = await pinningMoves({ khugepagedWaitS: 1 });
    const k = r.khugepaged;
    const mode = /\[(\w+)\]/.exec(readFileSync('/sys/kernel/mm/transparent_hugepage/enabled', 'utf8'))![1];
    expect(k.thp).toBe(mode);
    if (mode === 'never') return expect(k.note).toMatch(/"never"/);
    // 4 KiB pages in a THP-eligible range, for khugepaged to find, unless the kernel gave huge ones at once
    if (!k.setUp) return expect(k.note).toMatch(/gave huge pages at once/);
    expect(k.waitedS).toBeGreaterThanOrEqual(1);
    expect(k.lockedBytes).toBe(4 * 2 ** 20); // whatever khugepaged did, the mlock stays
    expect(k.note).toMatch(k.hugeBytes > 0 ? /of the pinned buffer is huge pages/ : /nothing collapsed within/);
    if (root) expect(k.framesMoved).toEqual(expect.any(Number));
  });

  it.runIf(root)('as user nobody: frames need CAP_SYS_ADMIN, residency is shown, the move is still handled', async () => {
    const c = await runFixture('pinning-moves.mjs', [], { asNobody: true, timeoutMs: 60_000 });
    expect(c.code, c.stderr).toBe(0);
    const r = report<PinningMovesResult>(c);
    expect(r.uid).toBe(65534);
    common(r);
    expect(r.framesVisible).toBe(false);
    expect(r.framesMovedByPin).toBeNull();
    expect(r.framesMoved).toBeNull();
    expect(r.framesHidden).toMatch(/CAP_SYS_ADMIN/);
    expect(c.stdout.replace(/\s+/g, ' ')).toMatch(/physical frames: not shown \(uid 65534\): physical frame numbers need CAP_SYS_ADMIN/);
    // Hidden frames: the notifier cannot tell which moved, so it drops them all.
    expect(r.iotlb.framesKnown).toBe(false);
    expect(r.iotlb.stale).toBe(1024);
  });
});
