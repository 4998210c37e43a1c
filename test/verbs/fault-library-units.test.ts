// The fault library's small parts on their own, through the public exports: the trace
// recorder and its Chrome trace-event JSON, the histogram and the statistics snapshot.
import { describe, expect, test } from 'vitest';
import { MODEL_LABEL, type TraceEvent } from '../../kernel-sim/index.js';
import { FaultStats, Histogram, Prefetcher, TraceRecorder } from '../../lib/index.js';

const ev = (o: Partial<TraceEvent> = {}): TraceEvent => ({ kind: 'fault', node: 1, modelUs: 5, realMs: performance.now(), ...o });

describe('TraceRecorder', () => {
  test('keeps at most `limit` events and counts the rest as dropped; clear() empties both', () => {
    const t = new TraceRecorder(2);
    expect(t.limit).toBe(2);
    for (let i = 0; i < 5; i++) t.record(ev({ modelUs: i }));
    expect(t.events.map((e) => e.modelUs)).toEqual([0, 1]);
    expect(t.dropped).toBe(3);
    t.clear();
    expect(t.events).toHaveLength(0);
    expect(t.dropped).toBe(0);
    t.record(ev());
    expect(t.events).toHaveLength(1);
    expect(new TraceRecorder().limit).toBe(200_000);
  });

  test('Chrome JSON: one instant per timeline, named by kind and side, laned by channel, bigints in hex', () => {
    const t = new TraceRecorder();
    const before = performance.now();
    t.record(ev({ kind: 'fault', side: 'destination', node: 1, tid: 9, channel: 3, modelUs: 12.5, realMs: before + 2, detail: { va: 0x1000n, seq: 4 } }));
    t.record(ev({ kind: 'complete', node: 0, modelUs: 20, realMs: before + 3 }));
    const { traceEvents, displayTimeUnit, otherData } = t.toChromeTrace();
    expect(displayTimeUnit).toBe('ns');
    expect(otherData).toEqual({ producer: 'pagefault-rdma', model: MODEL_LABEL });
    const inst = traceEvents.filter((e) => e.ph === 'i');
    expect(inst).toHaveLength(4);
    const [m, r, m2, r2] = inst;
    expect(m).toMatchObject({ name: 'fault (destination)', cat: 'fault', s: 't', ts: 12.5, pid: 2, tid: 3, args: { side: 'destination', tid: 9, va: '0x1000', seq: 4 } });
    expect(r).toMatchObject({ name: 'fault (destination)', pid: 3, tid: 3 });
    // The real timeline counts µs from when the recorder started.
    expect(r!.ts).toBeGreaterThanOrEqual(2000);
    expect(r!.ts).toBeLessThan(r2!.ts);
    expect(m2).toMatchObject({ name: 'complete', cat: 'complete', ts: 20, pid: 0, tid: 0 });
    expect(r2).toMatchObject({ pid: 1, tid: 0 });
    const meta = traceEvents.filter((e) => e.ph === 'M');
    expect(meta.map((e) => [e.pid, e.name, e.cat, e.args!['name']])).toEqual([
      [2, 'process_name', '__metadata', `node 1: ${MODEL_LABEL}`],
      [3, 'process_name', '__metadata', 'node 1: measured (real time)'],
      [0, 'process_name', '__metadata', `node 0: ${MODEL_LABEL}`],
      [1, 'process_name', '__metadata', 'node 0: measured (real time)'],
    ]);
  });
});

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

  test('quantiles of the values in order, the top one clamped', () => {
    const h = new Histogram();
    for (const v of [5, 1, 4, 2, 3]) h.add(v);
    expect([h.quantile(0), h.quantile(0.2), h.quantile(0.5), h.quantile(0.99), h.quantile(1)]).toEqual([1, 2, 3, 5, 5]);
    expect(h.summary()).toEqual({ count: 5, mean: 3, p50: 3, p99: 5, min: 1, max: 5 });
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
    expect(snap).toMatchObject({ faults: { source: 2, destination: 0, byKind: { 'F_TRANSLATION/read': 2 } }, notifications: 2, pagesMadeResident: 3, resolveCalls: 1, retransmittedBlocks: 2, unresolved: 1 });
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
