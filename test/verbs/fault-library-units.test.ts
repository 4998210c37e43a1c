// The fault library's small parts on their own, through the public exports: the trace
// recorder (a bounded ring) and its Chrome trace-event JSON, the histogram, the statistics
// snapshot and the prefetcher. (The trace in a real run: fault-library.test.ts.)
import { describe, expect, test } from 'vitest';
import { MODEL_LABEL, type TraceEvent } from '../../kernel-sim/index.js';
import { DEFAULT_TRACE_EVENTS, FaultStats, Histogram, Prefetcher, TraceRecorder } from '../../lib/index.js';

const ev = (o: Partial<TraceEvent> = {}): TraceEvent => ({ kind: 'fault', node: 1, modelUs: 5, realMs: performance.now(), ...o });

describe('TraceRecorder', () => {
  test('a ring of `limit` events: the newest kept, oldest first, the rest counted as dropped; clear() empties both', () => {
    const t = new TraceRecorder(3);
    expect(t.limit).toBe(3);
    for (let i = 0; i < 3; i++) t.record(ev({ modelUs: i }));
    expect([t.events.map((e) => e.modelUs), t.dropped]).toEqual([[0, 1, 2], 0]);
    for (let i = 3; i < 5; i++) t.record(ev({ modelUs: i }));
    expect([t.events.map((e) => e.modelUs), t.dropped]).toEqual([[2, 3, 4], 2]);
    // Once more round the ring, and past it.
    for (let i = 5; i < 10; i++) t.record(ev({ modelUs: i }));
    expect([t.events.map((e) => e.modelUs), t.dropped]).toEqual([[7, 8, 9], 7]);
    t.clear();
    expect([t.events, t.dropped]).toEqual([[], 0]);
    for (let i = 0; i < 4; i++) t.record(ev({ modelUs: 10 + i }));
    expect([t.events.map((e) => e.modelUs), t.dropped]).toEqual([[11, 12, 13], 1]);
    expect(new TraceRecorder().limit).toBe(DEFAULT_TRACE_EVENTS);
    expect(DEFAULT_TRACE_EVENTS).toBe(200_000);
    for (const bad of [0, -1, 1.5, Number.NaN]) expect(() => new TraceRecorder(bad)).toThrow(RangeError);
    expect(() => new TraceRecorder(0)).toThrow('trace limit must be a positive integer, got 0');
  });

  test('Chrome JSON: one instant per timeline, named by kind and side, laned by thread or channel, bigints in hex', () => {
    const t = new TraceRecorder();
    const before = performance.now();
    t.record(
      ev({ kind: 'fault', side: 'destination', node: 1, tid: 9, channel: 3, modelUs: 12.5, realMs: before + 2, detail: { va: 0x1000n, seq: 4 } }),
    );
    t.record(ev({ kind: 'complete', node: 0, channel: 2, modelUs: 20, realMs: before + 3 }));
    const { traceEvents, displayTimeUnit, otherData } = t.toChromeTrace();
    expect(displayTimeUnit).toBe('ns');
    expect(otherData).toEqual({ producer: 'pagefault-rdma', model: MODEL_LABEL });
    const inst = traceEvents.filter((e) => e.ph === 'i');
    expect(inst).toHaveLength(4);
    const [m, r, m2, r2] = inst;
    // A fault is on the SMMU's lane (1); the real timeline is in µs of performance.now().
    expect(m).toEqual({
      name: 'fault (destination)',
      cat: 'fault',
      ph: 'i',
      s: 't',
      ts: 12.5,
      pid: 2,
      tid: 1,
      args: { side: 'destination', tid: 9, va: '0x1000', seq: 4 },
    });
    expect(r).toMatchObject({ name: 'fault (destination)', pid: 3, tid: 1 });
    expect(r!.ts).toBeCloseTo((before + 2) * 1000, 3);
    expect(m2).toMatchObject({ name: 'complete', cat: 'complete', ts: 20, pid: 0, tid: 1_000_002 });
    expect(r2).toMatchObject({ pid: 1, tid: 1_000_002 });
    expect(r2!.ts).toBeCloseTo((before + 3) * 1000, 3);
    const meta = (name: string) =>
      traceEvents.filter((e) => e.ph === 'M' && e.name === name).map((e) => [e.pid, e.tid, e.args!['name'] ?? e.args!['labels']]);
    expect(meta('process_name')).toEqual([
      [2, 0, `node 1: ${MODEL_LABEL}`],
      [3, 0, 'node 1: measured (real time)'],
      [0, 0, `node 0: ${MODEL_LABEL}`],
      [1, 0, 'node 0: measured (real time)'],
    ]);
    expect(meta('process_labels')).toEqual([
      [2, 0, 'node 1'],
      [3, 0, 'node 1'],
      [0, 0, 'node 0'],
      [1, 0, 'node 0'],
    ]);
    expect(meta('thread_name')).toEqual([
      [2, 1, 'SMMU'],
      [3, 1, 'SMMU'],
      [0, 1_000_002, 'PLDMA channel 2'],
      [1, 1_000_002, 'PLDMA channel 2'],
    ]);
  });

  test("each event kind on its thread's lane: the driver's, the fault library's, a channel's", () => {
    const t = new TraceRecorder();
    for (const kind of ['irq', 'notify', 'notify-dropped', 'resume', 'resolved', 'retransmit'] as const) t.record(ev({ kind, node: 0 }));
    const lanes = t
      .toChromeTrace()
      .traceEvents.filter((e) => e.ph === 'i' && e.pid === 0)
      .map((e) => [e.name, e.tid]);
    expect(lanes).toEqual([
      ['irq', 2],
      ['notify', 2],
      ['notify-dropped', 2],
      ['resume', 2],
      ['resolved', 3],
      ['retransmit', 1_000_000],
    ]);
  });

  test("scoped to a node and a pid: only that node's events, and of its notifications only that pid's", () => {
    const t = new TraceRecorder(100, { node: 1, pid: 42 });
    t.record(ev({ kind: 'fault', node: 1, modelUs: 1 }));
    t.record(ev({ kind: 'notify', node: 1, modelUs: 2, detail: { pid: 42 } }));
    t.record(ev({ kind: 'notify', node: 1, modelUs: 3, detail: { pid: 43 } }));
    t.record(ev({ kind: 'complete', node: 0, modelUs: 4 }));
    expect(t.events).toHaveLength(4); // kept, to time the phases that end elsewhere
    const { traceEvents } = t.toChromeTrace();
    expect(traceEvents.filter((e) => e.ph === 'i' && e.pid === 2).map((e) => [e.name, e.ts])).toEqual([
      ['fault', 1],
      ['notify', 2],
    ]);
    expect(traceEvents.filter((e) => e.pid < 2)).toEqual([]);
    expect(traceEvents.filter((e) => e.name === 'process_labels').map((e) => e.args!['labels'])).toEqual(['node 1 (pid 42)', 'node 1 (pid 42)']);
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
