// The fault library's small parts on their own, through the public exports: the trace
// recorder (a bounded ring) and its Chrome trace-event JSON, the histogram, the statistics
// snapshot and the prefetcher. (The trace in a real run: fault-library.test.ts.)
import { describe, expect, test } from 'vitest';
import { MODEL_LABEL, type TraceEvent } from '../../kernel-sim/index.js';
import { DEFAULT_TRACE_EVENTS, FaultStats, Histogram, Prefetcher, TraceRecorder, type ChromeTraceEvent } from '../../lib/index.js';
import { traceFormatErrors } from '../trace-format.js';

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
    // A ring of one keeps the newest event; the events handed out are a copy, not the ring.
    const one = new TraceRecorder(1);
    one.record(ev({ modelUs: 1 }));
    one.record(ev({ modelUs: 2 }));
    one.events.push(ev({ modelUs: 3 }));
    expect([one.events.map((e) => e.modelUs), one.dropped]).toEqual([[2], 1]);
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
    expect(otherData).toEqual({ producer: 'pagefault-rdma', model: MODEL_LABEL, keptEvents: '2', droppedEvents: '0' });
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

describe("TraceRecorder: one fault's phases, slice by slice", () => {
  // A destination fault on node 1 of block 4 of transfer 9, posted by node 0 on channel 3, as
  // the engine, the driver and the fault library emit it: times exact in binary, so the real
  // timeline (µs of performance.now() ms) compares exactly.
  const FAULT = { tid: 9, channel: 3, side: 'destination' as const };
  const args = { side: 'destination', transfer: 9, block: 4, srcNode: 0, va: '0x2000' };
  function destinationFault(o: { pid?: number; thread?: number; issued?: boolean } = {}): TraceEvent[] {
    const issued = (o.issued ?? true) ? { issuedUs: 8, issuedMs: 99.5 } : {};
    return [
      { kind: 'fault', node: 1, ...FAULT, modelUs: 10, realMs: 100, detail: { seq: 4, va: 0x2000n, srcNode: 0, ...issued } },
      { kind: 'notify', node: 1, ...FAULT, modelUs: 12, realMs: 100.25, detail: { seq: 4, srcNode: 0, pid: o.pid ?? 7 } },
      { kind: 'resolved', node: 1, ...FAULT, modelUs: 15, realMs: 100.5, detail: { seq: 4, srcNode: 0 } },
      { kind: 'retransmit', node: 0, tid: 9, channel: 3, modelUs: 20, realMs: 101, detail: { seq: 4, attempt: 2, srcNode: 0 } },
      { kind: 'ack', node: 0, tid: 9, channel: 3, modelUs: 26, realMs: 101.5, detail: { seq: 4, attempt: 2, srcNode: 0, thread: o.thread ?? 4321 } },
    ];
  }
  function recorder(events: TraceEvent[], scope?: { node: number; pid?: number }): ChromeTraceEvent[] {
    const t = new TraceRecorder(100, scope);
    for (const e of events) t.record(e);
    return t.toChromeTrace().traceEvents;
  }
  const slices = (events: ChromeTraceEvent[]) => events.filter((e) => e.ph === 'X').map((e) => [e.name, e.pid, e.tid, e.ts, e.dur]);

  test('detect, notify, resolve on node 1; retransmit and copy on node 0; each on both timelines, with its time and lane', () => {
    const out = recorder(destinationFault());
    expect(slices(out)).toEqual([
      ['detect', 2, 1, 8, 2],
      ['detect', 3, 1, 99_500, 500],
      ['notify', 2, 2, 10, 2],
      ['notify', 3, 2, 100_000, 250],
      ['resolve', 2, 3, 12, 3],
      ['resolve', 3, 3, 100_250, 250],
      ['retransmit', 0, 1_000_003, 15, 5],
      ['retransmit', 1, 1_000_003, 100_500, 500],
      ['copy', 0, 4321, 20, 6],
      ['copy', 1, 4321, 101_000, 500],
    ]);
    for (const e of out.filter((x) => x.ph === 'X')) expect(e).toMatchObject({ cat: 'fault', args });
    // The flow from the fault's issue on node 1 to the retransmission (at the resolve) on node 0.
    expect(out.filter((e) => e.ph === 's' || e.ph === 'f')).toEqual([
      { name: 'fault -> retransmission', cat: 'fault', ph: 's', id: 'model:0:9:4:destination:2', ts: 8, pid: 2, tid: 1 },
      { name: 'fault -> retransmission', cat: 'fault', ph: 's', id: 'real:0:9:4:destination:2', ts: 99_500, pid: 3, tid: 1 },
      { name: 'fault -> retransmission', cat: 'fault', ph: 'f', bp: 'e', id: 'model:0:9:4:destination:2', ts: 15, pid: 0, tid: 1_000_003 },
      { name: 'fault -> retransmission', cat: 'fault', ph: 'f', bp: 'e', id: 'real:0:9:4:destination:2', ts: 100_500, pid: 1, tid: 1_000_003 },
    ]);
    const threads = out.filter((e) => e.name === 'thread_name' && e.pid === 0).map((e) => [e.tid, e.args!['name']]);
    expect(threads).toEqual([
      [1_000_003, 'PLDMA channel 3'],
      [4321, 'copy engine thread 4321'],
    ]);
    expect(traceFormatErrors({ traceEvents: out })).toEqual([]);
  });

  test('a copy with no thread of its own is on the channel; a fault with no issue time is detected in no time', () => {
    const out = recorder(destinationFault({ thread: 0, issued: false }));
    expect(slices(out).filter(([name, pid]) => name === 'copy' && pid === 0)).toEqual([['copy', 0, 1_000_003, 20, 6]]);
    expect(slices(out).filter(([name, pid]) => name === 'detect' && pid === 2)).toEqual([['detect', 2, 1, 10, 0]]);
    expect(out.find((e) => e.ph === 's' && e.pid === 2)!.ts).toBe(10);
  });

  test('a block that faults again on its retransmission: each fault is closed by its own later steps, the copy by its attempt', () => {
    const first = destinationFault().slice(0, 4);
    // The retransmission (attempt 2) faults again; attempt 3 is copied by thread 77.
    const again: TraceEvent[] = [
      { kind: 'fault', node: 1, ...FAULT, modelUs: 30, realMs: 102, detail: { seq: 4, va: 0x2000n, srcNode: 0, issuedUs: 28, issuedMs: 102 } },
      { kind: 'notify', node: 1, ...FAULT, modelUs: 33, realMs: 102.5, detail: { seq: 4, srcNode: 0, pid: 7 } },
      { kind: 'resolved', node: 1, ...FAULT, modelUs: 37, realMs: 103, detail: { seq: 4, srcNode: 0 } },
      { kind: 'retransmit', node: 0, tid: 9, channel: 3, modelUs: 40, realMs: 104, detail: { seq: 4, attempt: 3, srcNode: 0 } },
      { kind: 'ack', node: 0, tid: 9, channel: 3, modelUs: 45, realMs: 105, detail: { seq: 4, attempt: 3, srcNode: 0, thread: 77 } },
    ];
    const model = slices(recorder([...first, ...again])).filter(([, pid]) => pid === 0 || pid === 2);
    expect(model).toEqual([
      ['detect', 2, 1, 8, 2],
      ['notify', 2, 2, 10, 2],
      ['resolve', 2, 3, 12, 3],
      ['retransmit', 0, 1_000_003, 15, 5],
      // no copy for attempt 2: its ack never came (it faulted)
      ['detect', 2, 1, 28, 2],
      ['notify', 2, 2, 30, 3],
      ['resolve', 2, 3, 33, 4],
      ['retransmit', 0, 1_000_003, 37, 3],
      ['copy', 0, 77, 40, 5],
    ]);
  });

  test('an unfinished fault has only the phases that ended; one of another transfer or block takes no step of this one', () => {
    const [fault, notify, resolved] = destinationFault();
    const other: TraceEvent = { ...resolved!, detail: { seq: 5, srcNode: 0 } };
    expect(slices(recorder([fault!, notify!, other])).filter(([, pid]) => pid === 2)).toEqual([
      ['detect', 2, 1, 8, 2],
      ['notify', 2, 2, 10, 2],
    ]);
    const otherTransfer: TraceEvent = { ...notify!, tid: 10 };
    expect(slices(recorder([fault!, otherTransfer])).filter(([, pid]) => pid === 2)).toEqual([['detect', 2, 1, 8, 2]]);
    expect(recorder([fault!, notify!]).filter((e) => e.ph === 's' || e.ph === 'f')).toEqual([]);
  });

  test("a fault whose notification was dropped: its resolve is the next one after it, not an earlier attempt's", () => {
    const events = destinationFault().slice(0, 4);
    // Attempt 2 faults again; the driver dropped that notification (no notify event).
    events.push(
      { kind: 'fault', node: 1, ...FAULT, modelUs: 30, realMs: 102, detail: { seq: 4, va: 0x2000n, srcNode: 0, issuedUs: 28, issuedMs: 102 } },
      { kind: 'resolved', node: 1, ...FAULT, modelUs: 37, realMs: 103, detail: { seq: 4, srcNode: 0 } },
    );
    expect(slices(recorder(events)).filter(([name, pid]) => name === 'resolve' && pid === 2)).toEqual([
      ['resolve', 2, 3, 12, 3],
      ['resolve', 2, 3, 30, 7],
    ]);
  });

  test('events without a transfer id get instants only; every lane is named by its own kind; metadata is __metadata', () => {
    const out = recorder([
      { kind: 'fault', node: 0, side: 'source', modelUs: 1, realMs: 1 },
      { kind: 'notify', node: 0, side: 'source', modelUs: 2, realMs: 2 },
      { kind: 'resolved', node: 0, side: 'source', modelUs: 3, realMs: 3 },
    ]);
    expect(out.filter((e) => e.ph === 'X' || e.ph === 's' || e.ph === 'f')).toEqual([]);
    expect(out.filter((e) => e.name === 'thread_name' && e.pid === 0).map((e) => [e.tid, e.args!['name']])).toEqual([
      [1, 'SMMU'],
      [2, 'SMMU driver (IRQ handler)'],
      [3, 'fault library'],
    ]);
    const meta = recorder(destinationFault()).filter((e) => e.ph === 'M');
    expect(meta.length).toBeGreaterThan(8);
    for (const e of meta) expect(e.cat).toBe('__metadata');
  });

  test("scoped to node 1's process: its phases and the flow's start; to node 0: the retransmission, the copy and the flow's end", () => {
    const dst = recorder(destinationFault(), { node: 1, pid: 7 });
    expect(slices(dst).map(([name, pid]) => `${String(name)}@${String(pid)}`)).toEqual([
      'detect@2',
      'detect@3',
      'notify@2',
      'notify@3',
      'resolve@2',
      'resolve@3',
    ]);
    // The flow goes from one process to the other: neither export alone holds half of it.
    expect(dst.filter((e) => e.ph === 's' || e.ph === 'f')).toEqual([]);
    expect(traceFormatErrors({ traceEvents: dst })).toEqual([]);
    const src = recorder(destinationFault(), { node: 0 });
    expect(slices(src).map(([name, pid]) => `${String(name)}@${String(pid)}`)).toEqual(['retransmit@0', 'retransmit@1', 'copy@0', 'copy@1']);
    expect(src.filter((e) => e.ph === 's' || e.ph === 'f')).toEqual([]);
    expect(traceFormatErrors({ traceEvents: src })).toEqual([]);
    // Both processes exported together: the flow, paired, from node 1's fault to node 0's retransmission.
    const t = new TraceRecorder(100, { node: 1, pid: 7 });
    for (const e of destinationFault()) t.record(e);
    const both = t.toChromeTrace({ with: [{ node: 0, pid: 6 }] }).traceEvents;
    expect(both.filter((e) => e.ph === 's').map((e) => e.pid)).toEqual([2, 3]);
    expect(both.filter((e) => e.ph === 'f').map((e) => e.pid)).toEqual([0, 1]);
    expect(traceFormatErrors({ traceEvents: both })).toEqual([]);
    expect(both.filter((e) => e.name === 'process_labels').map((e) => e.args!['labels'])).toEqual(
      expect.arrayContaining(['node 1 (pid 7)', 'node 0 (pid 6)']),
    );
    expect(src.filter((e) => e.name === 'process_name').map((e) => e.pid)).toEqual([0, 1]);
    // Another process's fault on node 1: none of its phases in this process's trace.
    expect(slices(recorder(destinationFault({ pid: 8 }), { node: 1, pid: 7 }))).toEqual([]);
    expect(recorder(destinationFault({ pid: 8 }), { node: 1, pid: 7 }).filter((e) => e.ph === 's')).toEqual([]);
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
