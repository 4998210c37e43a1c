// The PLDMA and its copy engine at their edges, through the public kernel-sim API: the copy
// engine's own contract, partial last blocks, the modelled clock across transfers, closing,
// validation messages, counters, and the modelled time of each step as the trace shows it.
import { describe, expect, test } from 'vitest';
import { CopyEngine, CopyFlag, type CopyResult, CopyStatus, DEFAULT_COSTS, DmaStatus, IommuPageResponseCode } from '../../../kernel-sim/index.js';
import { INLINE_COPY_MAX, INLINE_SAME_TURN } from '../../../kernel-sim/pldma/copy-engine.js';
import { binding } from '../../../native/index.js';
import { bytesOf, deferred, FaultLibrary, fill, P, post, sleep, stallRig, until, useEnv, within, zeroNoWake } from '../helpers.js';
import { twoNode } from '../../fixtures/two-node.js';

const env = useEnv();
const c = DEFAULT_COSTS;

describe('the copy engine', () => {
  test('a completion names the copy thread that did it and the real time it took', async () => {
    const eng = env.track(new CopyEngine(2));
    const src = env.region(4 * P);
    const dst = env.region(4 * P);
    const data = fill(src, 3);
    dst.populate();
    const t0 = performance.now();
    const r = await within('copy', eng.copy(src, 0, dst, 0, 4 * P, CopyFlag.CheckSource | CopyFlag.CheckDest));
    const wallNs = (performance.now() - t0) * 1e6;
    expect(r.status).toBe(CopyStatus.Ok);
    expect(r.faultOffset).toBe(-1);
    expect(eng.tids).toContain(r.tid);
    expect(r.ns).toBeGreaterThan(0);
    expect(r.ns).toBeLessThan(wallNs);
    expect(bytesOf(dst).equals(data)).toBe(true);
    expect(eng.inflight).toBe(0);
  });

  test('Inline: a small copy of present pages runs on the JS thread; past INLINE_SAME_TURN a turn, its result settles on a later turn', async () => {
    const eng = env.track(new CopyEngine(2));
    const src = env.region(4 * P);
    const dst = env.region(4 * P);
    const data = fill(src, 5);
    dst.populate();
    const inline = CopyFlag.CheckSource | CopyFlag.CheckDest | CopyFlag.Inline;
    // A fresh turn: no inline copy of this engine has settled at once in it yet.
    await new Promise((resolve) => setImmediate(resolve));
    const settled: boolean[] = [];
    const pending: Array<Promise<CopyResult>> = [];
    for (let k = 0; k <= INLINE_SAME_TURN; k++) pending.push(eng.copy(src, 0, dst, 0, 4 * P, inline).then((r) => ((settled[k] = true), r)));
    // The bytes are there as copy() returns: it ran on this thread, no job was queued.
    expect(bytesOf(dst).equals(data)).toBe(true);
    expect(eng.inflight).toBe(0);
    for (let i = 0; i < 10; i++) await Promise.resolve();
    // The first INLINE_SAME_TURN settle within this turn's microtasks (no event-loop turn for
    // a small write); the one after them not (as a thread's result), so the loop still turns.
    expect(settled.filter(Boolean).length).toBe(INLINE_SAME_TURN);
    expect(settled[INLINE_SAME_TURN]).toBeUndefined();
    const rs = await within('inline copies', Promise.all(pending));
    for (const r of rs) expect(r).toMatchObject({ status: CopyStatus.Ok, faultOffset: -1, tid: binding.gettid() });
    expect(eng.tids).not.toContain(rs[0]!.tid);

    // A page not present on either side: nothing is touched inline; a copy thread walks it
    // and reports the fault, having copied the bytes before it.
    new Uint8Array(dst.buffer).fill(0);
    dst.evict(2 * P, P);
    const f = await within('copy with a missing page', eng.copy(src, 0, dst, 0, 4 * P, inline));
    expect(f).toMatchObject({ status: CopyStatus.DestFault, faultOffset: 2 * P });
    expect(eng.tids).toContain(f.tid);
    expect(bytesOf(dst, 0, 2 * P).equals(data.subarray(0, 2 * P))).toBe(true);
    // Larger than INLINE_COPY_MAX: a thread's job.
    const pages = INLINE_COPY_MAX / P + 1;
    const big = env.region(pages * P);
    const bigDst = env.region(pages * P);
    fill(big, 9);
    bigDst.populate();
    const b = await within('large copy', eng.copy(big, 0, bigDst, 0, pages * P, inline));
    expect(b.status).toBe(CopyStatus.Ok);
    expect(eng.tids).toContain(b.tid);
  });

  test('closing: closed is true, a copy is refused, a queued copy settles with a status that is no copy outcome', async () => {
    const eng = new CopyEngine(1);
    const src = env.region(1024 * P);
    const dst = env.region(1024 * P);
    src.populate();
    dst.populate();
    const copies = [0, 1, 2, 3].map(() => eng.copy(src, 0, dst, 0, 1024 * P, 0));
    expect(eng.inflight).toBe(4);
    eng.close();
    eng.close(); // idempotent
    expect(eng.closed).toBe(true);
    expect(eng.inflight).toBe(0);
    const rs = await within('copies at close', Promise.all(copies));
    expect(rs.map((r) => r.status)).toEqual([-1, -1, -1, -1]);
    await expect(eng.copy(src, 0, dst, 0, P, 0)).rejects.toThrow(/closed/);
  });
});

describe('blocks and the modelled clock', () => {
  test('a partial last block copies only its own bytes', async () => {
    const { sys, src, dst, data } = twoNode(env, { pages: 2, fill: 0x21, trace: true, dstResident: true });
    new Uint8Array(dst.buffer).fill(0xee);
    const cpl = await within('transfer', post(sys.node(0), src, dst, { length: P + 100 }));
    expect(cpl.status).toBe(DmaStatus.SUCCESS);
    expect(cpl.blocks).toBe(2);
    expect(cpl.bytes).toBe(P + 100);
    expect(bytesOf(dst, 0, P + 100).equals(data.subarray(0, P + 100))).toBe(true);
    expect(bytesOf(dst, P + 100).every((x) => x === 0xee)).toBe(true);
  });

  test('two identical transfers one after the other: the same modelled duration, the second starting after the first ends', async () => {
    const { sys, src, dst } = twoNode(env, { pages: 4, fill: 0x21, trace: true, dstResident: true });
    const first = await within('first', post(sys.node(0), src, dst));
    // The first one warmed the IOTLBs: compare the second and third, which both hit.
    const second = await within('second', post(sys.node(0), src, dst));
    const third = await within('third', post(sys.node(0), src, dst));
    expect(second.model.startUs).toBeGreaterThanOrEqual(first.model.endUs);
    expect(third.model.startUs).toBeGreaterThanOrEqual(second.model.endUs);
    expect(sys.clock.now).toBe(third.model.endUs);
    expect(third.model.us).toBeCloseTo(second.model.us, 9);
    expect(third.model.us).toBeLessThan(first.model.us);
  });

  test('one block of 4 pages, fault-free, models exactly: walks of 4 pages at both ends, the payload, two link latencies', async () => {
    const { sys, src, dst } = twoNode(env, { pages: 4, fill: 0x21, trace: true, dstResident: true, blockSize: 4 * P });
    const cpl = await within('transfer', post(sys.node(0), src, dst));
    expect(cpl.blocks).toBe(1);
    const expected =
      c.doorbellUs + c.scheduleUs + 4 * c.walkUs + c.blockUs + (4 * P) / c.linkBytesPerUs + c.linkLatencyUs + 4 * c.walkUs + c.linkLatencyUs;
    expect(cpl.model.us).toBeCloseTo(expected, 9);
  });

  test('the engine never counts less than 0 jobs in flight, and is idle after', async () => {
    // Larger than is copied inline: the copy is a thread's job, seen in flight.
    const { sys, src, dst } = twoNode(env, { pages: INLINE_COPY_MAX / P + 1, fill: 0x21, trace: true, dstResident: true });
    const seen: number[] = [];
    const pc = post(sys.node(0), src, dst);
    let done = false;
    void pc.then(() => (done = true));
    while (!done) {
      seen.push(sys.node(0).pldma.inflight);
      await new Promise((r) => setImmediate(r));
    }
    expect(Math.min(...seen)).toBeGreaterThanOrEqual(0);
    expect(Math.max(...seen)).toBeGreaterThanOrEqual(1);
    expect(Math.max(...seen)).toBeLessThanOrEqual(sys.node(0).pldma.capacity);
    expect(sys.node(0).pldma.inflight).toBe(0);
  });
});

describe('faults, in modelled time and counters', () => {
  test('a source fault: detected one schedule and one walk after the post, resolved without waiting for the timeout, counted', async () => {
    const { sys, src, dst, data, a, events } = twoNode(env, { pages: 4, fill: 0x21, trace: true, dstResident: true, faultTimeoutMs: 60_000 });
    src.evict(2 * P, P);
    const lib = env.track(
      new FaultLibrary(a.socket, { regions: [src], resolve: (r, off, len) => new Uint8Array(r.buffer, off, len).set(data.subarray(off, off + len)) }),
    );
    const cpl = await within('transfer', post(sys.node(0), src, dst, { channel: 5 }), 5000);
    expect(cpl.status).toBe(DmaStatus.SUCCESS);
    expect(cpl.faults).toEqual({ source: 1, destination: 0 });
    expect(lib.faults.map((f) => [f.side, f.write, f.offset / P, f.channel])).toEqual([['source', false, 2, 5]]);
    const p = sys.node(0).pldma.counters();
    expect(p.faults).toEqual({ source: 1, destination: 0 });
    expect(p.retryTimeouts).toBe(0);
    expect(p.retransmittedBlocks).toBe(1);
    expect(bytesOf(dst).equals(data)).toBe(true);
    // The trace: the fault of block 2 comes a schedule and a walk after that block was issued;
    // its retransmission comes after the library's answer.
    const fault = events.find((e) => e.kind === 'fault' && e.side === 'source')!;
    expect(fault.detail).toMatchObject({ seq: 2 });
    const issued = events.filter((e) => e.kind === 'block' && e.detail?.['seq'] === 2);
    expect(issued.map((e) => e.detail?.['attempt'])).toEqual([1, 2]);
    expect(fault.modelUs - issued[0]!.modelUs).toBeCloseTo(c.scheduleUs + c.walkUs, 9);
    const resolved = events.find((e) => e.kind === 'resolved' && e.side === 'source')!;
    const retransmit = events.find((e) => e.kind === 'retransmit')!;
    expect(retransmit.detail).toMatchObject({ seq: 2, attempt: 2 });
    expect(retransmit.modelUs).toBeGreaterThanOrEqual(resolved.modelUs);
    expect(cpl.real.faultUs).toHaveLength(1);
  });

  test('a destination NACK is traced with its block, and a transfer that ends on one ends when that NACK arrives', async () => {
    const { sys, src, dst, b, events } = twoNode(env, { pages: 2, fill: 0x21, trace: true });
    env.track(new FaultLibrary(b.socket, { regions: [dst], silent: true }));
    const cpl = await within('transfer', post(sys.node(0), src, dst, { retryLimit: 0 }));
    expect(cpl.status).toBe(DmaStatus.RETRY_EXCEEDED);
    const nack = events.find((e) => e.kind === 'nack')!;
    expect(nack.detail).toMatchObject({ seq: 0 });
    expect(cpl.model.endUs).toBe(nack.modelUs);
    // The NACK leaves when the destination SMMU found the fault, one link latency earlier.
    const fault = events.find((e) => e.kind === 'fault' && e.side === 'destination')!;
    expect(nack.modelUs - fault.modelUs).toBeCloseTo(c.linkLatencyUs, 9);
    expect(cpl.model.us).toBeGreaterThan(0);
    expect(sys.node(0).pldma.counters()).toMatchObject({ nacksReceived: 1, errors: 1, completed: 0 });
  });

  test('a block that faults at both ends: each side has its own retry count (the NACK limit does not count the source fault)', async () => {
    const { sys, src, dst, data, a, b } = twoNode(env, { pages: 1, fill: 0x21, trace: true });
    src.evict();
    env.track(
      new FaultLibrary(a.socket, { regions: [src], resolve: (r, off, len) => new Uint8Array(r.buffer, off, len).set(data.subarray(off, off + len)) }),
    );
    env.track(new FaultLibrary(b.socket, { regions: [dst] }));
    const cpl = await within('transfer', post(sys.node(0), src, dst, { retryLimit: 1 }));
    expect(cpl.status).toBe(DmaStatus.SUCCESS);
    expect(cpl.faults).toEqual({ source: 1, destination: 1 });
    expect(bytesOf(dst).equals(data)).toBe(true);
  });

  test('a write refused by the destination (no region there) ends when the error ACK is back', async () => {
    const { sys, src, dst } = twoNode(env, { pages: 1, fill: 0x21, trace: true, dstResident: true });
    const cpl = await within('transfer', post(sys.node(0), src, dst, { dstVa: dst.address + BigInt(64 * P) }));
    expect(cpl.status).toBe(DmaStatus.DST_ADDR_ERR);
    const expected = c.doorbellUs + c.scheduleUs + c.walkUs + c.blockUs + P / c.linkBytesPerUs + c.linkLatencyUs + c.walkUs + c.linkLatencyUs;
    expect(cpl.model.us).toBeCloseTo(expected, 9);
  });

  test.each([
    ['source', /could not resolve the source fault at 0x/],
    ['destination', /node 1's fault library could not resolve the destination fault/],
  ] as const)('the %s fault library answers that it cannot resolve: FAULT_UNRESOLVED with a reason naming it', async (side, reason) => {
    const { sys, src, dst, a, b } = twoNode(env, { pages: 2, fill: 0x21, trace: true, dstResident: side === 'source' });
    if (side === 'source') src.evict();
    env.track(
      new FaultLibrary(side === 'source' ? a.socket : b.socket, {
        regions: [side === 'source' ? src : dst],
        noResolve: true,
        status: IommuPageResponseCode.INVALID,
      }),
    );
    const cpl = await within('transfer', post(sys.node(0), src, dst));
    expect(cpl.status).toBe(DmaStatus.FAULT_UNRESOLVED);
    expect(cpl.reason).toMatch(reason);
  });
});

describe('closing and validation', () => {
  test('closing the engine flushes a transfer parked on a fault, idempotently; a post after it is FLUSHED', async () => {
    const { sys, src, dst, b } = twoNode(env, { pages: 2, fill: 0x21, trace: true });
    const hold = deferred();
    const lib = env.track(new FaultLibrary(b.socket, { regions: [dst], hold: () => hold.promise }));
    const pc = post(sys.node(0), src, dst);
    await until('the fault', () => lib.faults.length === 1);
    sys.node(0).pldma.close();
    sys.node(0).pldma.close();
    const cpl = await within('flushed', pc);
    expect(cpl).toMatchObject({ status: DmaStatus.FLUSHED, reason: 'the engine was closed', bytes: 0 });
    expect(sys.node(0).pldma.active).toBe(0);
    const after = await within('post after close', post(sys.node(0), src, dst));
    expect(after).toMatchObject({ status: DmaStatus.FLUSHED, reason: 'the engine is closed' });
    hold.resolve();
    await sleep(10);
  });

  test('the copy engine closed under a transfer: FLUSHED, saying so, only acked bytes counted', async () => {
    const { sys, src, dst } = twoNode(env, { pages: 256, fill: 0x21, trace: true, dstResident: true });
    // Close it as the engine issues its first block, before that block's copy is submitted.
    let closed = false;
    sys.tracer.on((e) => {
      if (e.kind !== 'block' || closed) return;
      closed = true;
      sys.node(1).engine.close();
    });
    const cpl = await within('flushed', post(sys.node(0), src, dst));
    expect(cpl.status).toBe(DmaStatus.FLUSHED);
    expect(cpl.reason).toBe('the copy engine was closed');
    expect(cpl.bytes).toBeLessThan(256 * P);
    expect(sys.node(0).pldma.inflight).toBe(0);
  });

  test('validation reasons name what is wrong and the valid range', async () => {
    const { sys, src, dst } = twoNode(env, { pages: 1, fill: 0x21, trace: true, dstResident: true });
    const bad = await within('bad channel', post(sys.node(0), src, dst, { channel: 1024 }));
    expect(bad).toMatchObject({ status: DmaStatus.BAD_CHANNEL, reason: 'channel 1024 is not in 0..1023' });
    // Address 0 passes validation (it is a non-negative bigint) and is refused by the SMMU.
    const zero = await within('srcVa 0', post(sys.node(0), src, dst, { srcVa: 0n }));
    expect(zero.status).toBe(DmaStatus.SRC_ADDR_ERR);
    expect(zero.reason).toMatch(/is in no region/);
    const dzero = await within('dstVa 0', post(sys.node(0), src, dst, { dstVa: 0n }));
    expect(dzero.status).toBe(DmaStatus.DST_ADDR_ERR);
    expect(dzero.reason).toMatch(/is in no region/);
  });
});

describe('stall mode, in modelled time and counters', () => {
  const stallUs = c.eventRecordUs + c.irqUs + c.driverUs + c.netlinkUs + c.wakeupUs + c.touchPageUs + c.requestUs + c.resumeUs;

  test('every stalled block holds the engine for the whole fault path: later blocks wait behind it; the nodes count the stalls', async () => {
    const one = stallRig(env, 1);
    env.track(new FaultLibrary(one.b.socket, { regions: [one.dst], method: 'uffd', resolve: zeroNoWake(one.uffd) }));
    const c1 = await within('one page', post(one.sys.node(0), one.src, one.dst));
    const two = stallRig(env, 2);
    env.track(new FaultLibrary(two.b.socket, { regions: [two.dst], method: 'uffd', resolve: zeroNoWake(two.uffd) }));
    const c2 = await within('two pages', post(two.sys.node(0), two.src, two.dst));
    expect([c1.status, c2.status]).toEqual([DmaStatus.SUCCESS, DmaStatus.SUCCESS]);
    expect(c1.model.us).toBeGreaterThan(stallUs);
    expect(c2.model.us - c1.model.us).toBeGreaterThanOrEqual(stallUs);
    expect(two.sys.node(1).pldma.counters().faults).toEqual({ source: 0, destination: 2 });
    expect(two.sys.node(0).pldma.counters().faults).toEqual({ source: 0, destination: 0 });
    two.uffd.unregister(two.dst);
    one.uffd.unregister(one.dst);
  });

  test('a stalled source read: the library hears the rest of the transfer as the hint; the source node counts the stalls', async () => {
    const pages = 3;
    const { sys, uffd, src, dst, data, a } = stallRig(env, pages, { stallSide: 'source' });
    const lib = env.track(
      new FaultLibrary(a.socket, {
        regions: [src],
        method: 'uffd',
        resolve: (r, off, len) => uffd.copy(r, off, data.subarray(off, off + len), { wake: false }),
      }),
    );
    const cpl = await within('transfer', post(sys.node(0), src, dst));
    expect(cpl.status).toBe(DmaStatus.SUCCESS);
    expect(lib.faults.map((f) => [f.offset / P, f.hint])).toEqual([0, 1, 2].map((i) => [i, (pages - i) * P]));
    expect(sys.node(0).pldma.counters().faults).toEqual({ source: pages, destination: 0 });
    expect(bytesOf(dst).equals(data)).toBe(true);
    uffd.unregister(src);
  });

  test('an aborted stall: ABORTED with a reason naming the side, ending after the fault path', async () => {
    const { sys, uffd, src, dst, b } = stallRig(env, 1);
    env.track(new FaultLibrary(b.socket, { regions: [dst], method: 'uffd', noResolve: true, status: IommuPageResponseCode.INVALID }));
    const cpl = await within('transfer', post(sys.node(0), src, dst));
    expect(cpl.status).toBe(DmaStatus.ABORTED);
    expect(cpl.reason).toMatch(/^a stalled destination write was aborted/);
    expect(cpl.model.us).toBeGreaterThan(stallUs);
    uffd.unregister(dst);
  });
});
