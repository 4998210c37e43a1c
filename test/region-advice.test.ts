// MADV_COLLAPSE and MADV_PAGEOUT on regions: collapse moves every frame of a pinned buffer
// into a transparent huge page (the contents stay, the mlock stays); pageout reclaims what
// this machine can reclaim and says how much.
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { HUGE_PAGE_SIZE as H, mapRegion, PageCategory } from '../lib/index.js';
import { closer, codeOf, P, pattern } from './helpers.js';

const own = closer();
const thp = readFileSync('/sys/kernel/mm/transparent_hugepage/enabled', 'utf8');

describe('collapse (MADV_COLLAPSE)', () => {
  it('a pinned buffer of 4 KiB pages becomes huge pages: the mlock stays, the contents too', () => {
    expect(thp).not.toMatch(/\[never\]/); // the machines this runs on allow THP (madvise or always)
    const r = own(mapRegion(2 * H));
    const data = pattern((2 * H) / P, 5);
    Buffer.from(r.buffer).set(data);
    r.pin();
    const huge = (): number => r.pagemapScan({ all: PageCategory.HUGE | PageCategory.PRESENT }).reduce((n, x) => n + x.length, 0);
    expect(huge()).toBe(0); // regions fault 4 KiB pages
    r.collapse();
    expect(huge()).toBe(2 * H);
    expect(r.residentPages()).toBe((2 * H) / P);
    expect(Buffer.from(r.buffer).equals(data)).toBe(true);
    expect(codeOf(() => r.evict(0, P))).toBe('EINVAL'); // still mlocked: the pin survived the move
    r.unpin();
    r.evict(0, P); // a part of a huge page can go (the kernel splits it)
    expect(r.residentPages()).toBe((2 * H) / P - 1);
  });

  it('is refused on ranges that are not whole 2 MiB pages, and on hugetlb', () => {
    const small = own(mapRegion(16 * P));
    expect(codeOf(() => small.collapse())).toBe('ERR_INVALID_ARG_VALUE');
    const r = own(mapRegion(2 * H, { hugePages: true }));
    expect(codeOf(() => r.collapse(P, H))).toBe('ERR_INVALID_ARG_VALUE');
  });
});

describe('pageout (MADV_PAGEOUT)', () => {
  it('returns how many pages left memory, and what stays reads back unchanged', () => {
    for (const shared of [false, true]) {
      const r = own(mapRegion(16 * P, { shared }));
      const data = pattern(16, 9);
      Buffer.from(r.buffer).set(data);
      const before = r.residentPages();
      const gone = r.pageout();
      expect(gone).toBe(before - r.residentPages());
      expect(gone).toBeGreaterThanOrEqual(0);
      // Reclaimed pages come back from swap: either way the bytes are the same.
      expect(Buffer.from(r.buffer).equals(data)).toBe(true);
    }
  });
});
