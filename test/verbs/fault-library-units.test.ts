// The fault library's small parts on their own, through the public exports: the histogram,
// the statistics snapshot and the prefetcher. (The trace recorder's own tests are in
// fault-library.test.ts, with its opt-in ring.)
import { describe, expect, test } from 'vitest';
import { FaultStats, Histogram, Prefetcher } from '../../lib/index.js';

describe('Histogram', () => {
  test('buckets are log2 ranges: [2^(i-1), 2^i) µs, bucket 0 below 1 µs', () => {
    const h = new Histogram();
    for (const v of [0, 0.99, 1, 1.99, 2, 3.99, 4, 1000]) h.add(v);
    expect(h.buckets.slice(0, 4)).toEqual([2, 2, 2, 1]);
    expect(h.buckets[10]).toBe(1); // 1000 µs: [512, 1024)
    expect(h.buckets).toHaveLength(11);
    expect([h.min, h.max, h.count]).toEqual([0, 1000, 8]);
  });

  test('ignores what is not a finite non-negative number; an empty one summarises to zeros', () => {
    const h = new Histogram();
    for (const v of [NaN, Infinity, -1]) h.add(v);
    expect(h.count).toBe(0);
    expect(h.mean).toBe(0);
    expect(h.quantile(0.5)).toBe(0);
    expect(h.summary()).toEqual({ count: 0, mean: 0, p50: 0, p99: 0, min: 0, max: 0 });
  });
});

describe('FaultStats', () => {
  test('a snapshot is a copy: counts, kinds and the phases of both timelines', () => {
    const s = new FaultStats();
    s.faults.source = 2;
    s.byKind['F_TRANSLATION/read'] = 2;
    s.notifications = 2;
    s.pagesMadeResident = 3;
    s.resolveCalls = 1;
    s.retransmittedBlocks = 2;
    s.unresolved = 1;
    s.real.detect.add(10);
    s.model.retransmit.add(4);
    const snap = s.snapshot();
    expect(snap).toMatchObject({
      faults: { source: 2, destination: 0, byKind: { 'F_TRANSLATION/read': 2 } },
      notifications: 2,
      pagesMadeResident: 3,
      resolveCalls: 1,
      retransmittedBlocks: 2,
      unresolved: 1,
    });
    expect(snap.phases.real.detect).toMatchObject({ count: 1, mean: 10 });
    expect(snap.phases.model.retransmit).toMatchObject({ count: 1, mean: 4 });
    expect(Object.keys(snap.phases.real)).toEqual(['detect', 'notify', 'resolve', 'retransmit']);
    s.faults.source = 9;
    s.byKind['F_TRANSLATION/read'] = 9;
    expect(snap.faults).toMatchObject({ source: 2, byKind: { 'F_TRANSLATION/read': 2 } });
  });
});

describe('Prefetcher', () => {
  test('defaults 4 and 256 pages; the minimum is at least 1 and the maximum at least the minimum', () => {
    const d = new Prefetcher();
    expect([d.min, d.max, d.window]).toEqual([4, 256, 4]);
    const z = new Prefetcher(0, 0);
    expect([z.min, z.max, z.window]).toEqual([1, 1, 1]);
    const inv = new Prefetcher(8, 2);
    expect([inv.min, inv.max]).toEqual([8, 8]);
  });

  test('a hit is a fault within one page past the last window; the same page again or further is a miss', () => {
    const p = new Prefetcher(4, 64);
    expect(p.next(10)).toEqual({ start: 10, pages: 4 }); // nothing learned yet: a miss, window stays at the minimum
    expect([p.hits, p.misses]).toEqual([0, 1]);
    expect(p.next(15).pages).toBe(8); // 10 + 4 + 1: still sequential
    expect(p.next(15).pages).toBe(4); // the same page: a miss halves the window
    const q = new Prefetcher(4, 64);
    q.next(10);
    expect(q.next(16).pages).toBe(4); // 10 + 4 + 2: too far, a miss (no stride learned yet)
    expect([q.hits, q.misses]).toEqual([0, 2]);
    // 10 → 16 taught a stride of 6: 22 is predicted.
    expect(q.next(22).pages).toBe(8);
    expect(q.hits).toBe(1);
  });

  test('the first fault teaches nothing: not a hit near page 0, no stride from it; the same page twice is a miss', () => {
    const p = new Prefetcher(4, 64);
    expect(p.next(2).pages).toBe(4);
    expect(p.next(2).pages).toBe(4);
    expect([p.hits, p.misses]).toEqual([0, 2]);
    const q = new Prefetcher(4, 64);
    q.next(10);
    expect(q.next(21).pages).toBe(4); // 10 + 11 would be a stride only if the first fault had taught one
    expect(q.hits).toBe(0);
  });

  test('misses shrink the window by half, never under the minimum', () => {
    const p = new Prefetcher(2, 64);
    p.next(0);
    p.next(2);
    p.next(6);
    p.next(14); // 2 → 4 → 8 → 16
    expect(p.window).toBe(16);
    p.next(1000);
    expect(p.window).toBe(8);
    p.next(5);
    p.next(3000);
    p.next(7);
    expect(p.window).toBe(2);
    p.next(9000);
    expect(p.window).toBe(2);
  });
});
