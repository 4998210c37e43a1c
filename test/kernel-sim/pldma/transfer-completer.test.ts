// The completer as the posting node sees it: how large a run may be after a destination
// fault (and how it grows again), which blocks count as retransmitted, the modelled time of
// a short last block, the stalls a stall-mode write took, the 'ack' trace of a
// retransmitted block, and the reason a stalled source read that was aborted gives.
// Observed on the fabric's packets (a tap on the transport), the trace and the completions.
import { describe, expect, test } from 'vitest';
import {
  DEFAULT_COSTS,
  DmaStatus,
  IommuPageResponseCode,
  type Packet,
  type SimSystem,
  type TraceEvent,
  type WritePacket,
} from '../../../kernel-sim/index.js';
import { MAX_RUN_BLOCKS } from '../../../kernel-sim/pldma/types.js';
import { twoNode } from '../../fixtures/two-node.js';
import { bytesOf, deferred, FaultLibrary, fill, P, post, proc, stallRig, useEnv, within, zeroNoWake } from '../helpers.js';

const env = useEnv();
const c = DEFAULT_COSTS;

/** The writes the fabric carries, as [seq, count], in the order they were handed over. */
function tapWrites(sys: SimSystem): Array<[number, number]> {
  const seen: Array<[number, number]> = [];
  const fabric = sys.fabric;
  const deliver = fabric.deliver.bind(fabric);
  fabric.deliver = (p: Packet) => {
    if (p.type === 'write') seen.push([(p as WritePacket).seq, (p as WritePacket).count]);
    deliver(p);
  };
  return seen;
}

/** Two nodes, `pages` filled on node 0, as many resident on node 1; every trace event kept. */
function rig(pages: number, o: { blockSize?: number; faultTimeoutMs?: number } = {}) {
  const r = twoNode(env, {
    pages,
    faultTimeoutMs: o.faultTimeoutMs ?? 60_000,
    ...(o.blockSize ? { blockSize: o.blockSize } : {}),
    fill: 0x5a,
    dstResident: true,
    trace: true,
  });
  return { ...r, writes: tapWrites(r.sys) };
}

describe('runs after a destination fault', () => {
  test("start again at 2 blocks, also after a NACK of a run's last block, and double while they land whole", async () => {
    const { sys, writes, src, dst, data, b } = rig(64);
    // Pages 8 and 9 missing at the destination; the library makes one page resident per fault.
    dst.evict(8 * P, 2 * P);
    const lib = env.track(new FaultLibrary(b.socket, { regions: [dst] }));
    const cpl = await within('transfer', post(sys.node(0), src, dst));
    expect(cpl.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dst).equals(data)).toBe(true);
    expect(lib.faults.map((f) => f.offset / P)).toEqual([8, 9]);
    // The first run NACKed at 8 (the rest returned); the retransmission [8, 9] NACKed at its
    // last block, 9 (nothing returned): 2 blocks again, then 4, 8, 16, then the rest.
    expect(writes).toEqual([
      [0, 64],
      [8, 2],
      [9, 2],
      [11, 4],
      [15, 8],
      [23, 16],
      [39, 25],
    ]);
    // Blocks 8 and 9 were each sent again once; returned blocks are no retransmissions.
    expect(cpl.nacks).toBe(2);
    expect(cpl.retransmittedBlocks).toBe(2);
    expect(sys.node(0).pldma.counters()).toMatchObject({ retransmittedBlocks: 2, blocksIssued: 66, blocksAcked: 64 });
  });
});

describe('a source fault behind runs on the wire', () => {
  test('counts only once those runs are answered: a NACK in them comes first, and the fault is reported after it', async () => {
    const RUN = MAX_RUN_BLOCKS;
    const { sys, events, src, dst, data, a, b } = rig(2 * RUN);
    const nacked = RUN + 200;
    const gone = RUN + 500;
    // Run 2 goes out while run 1 is on the wire, stopping before its missing source page,
    // which is held; run 2 then NACKs at a missing destination page.
    dst.evict(nacked * P, P);
    src.evict(gone * P, P);
    const srcLib = env.track(
      new FaultLibrary(a.socket, { regions: [src], resolve: (r, off, len) => new Uint8Array(r.buffer, off, len).set(data.subarray(off, off + len)) }),
    );
    const dstLib = env.track(new FaultLibrary(b.socket, { regions: [dst] }));
    const cpl = await within('transfer', post(sys.node(0), src, dst), 20_000);
    expect(cpl.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dst).equals(data)).toBe(true);
    expect(cpl.faults).toEqual({ source: 1, destination: 1 });
    expect(dstLib.faults.map((f) => f.offset / P)).toEqual([nacked]);
    expect(srcLib.faults.map((f) => f.offset / P)).toEqual([gone]);
    const nack = events.findIndex((e) => e.kind === 'nack');
    const fault = events.findIndex((e) => e.kind === 'fault' && e.side === 'source');
    expect(events[nack]!.detail).toMatchObject({ seq: nacked });
    expect(events[fault]!.detail).toMatchObject({ seq: gone });
    expect(nack).toBeLessThan(fault);
    // The source answer is traced for its block and the node that posted.
    expect(events.find((e) => e.kind === 'resolved' && e.side === 'source')!.detail).toEqual({ seq: gone, srcNode: 0 });
  });
});

describe('late answers', () => {
  test("an answer that comes after its block was retried on the timer does not unpark the transfer from a later block's fault", async () => {
    // Block 2's answer is held past the fault timer (its NACK goes without one, and the source
    // retries at once); the page comes back through the CPU, so the retry of block 2 lands. Block 5 then faults; the held answer for block 2 is
    // let go, and block 5's own answer only on the turn after block 2's has arrived.
    const faultTimeoutMs = 500;
    const { sys, events, src, dst, data, b } = rig(8, { faultTimeoutMs });
    dst.evict(2 * P, P);
    dst.evict(5 * P, P);
    const late = deferred();
    const afterLate = deferred();
    let answered5 = false;
    const lib = env.track(
      new FaultLibrary(b.socket, {
        regions: [dst],
        hold: (note) => {
          if (note.offset === 2 * P) return late.promise;
          late.resolve();
          return afterLate.promise;
        },
        resolve: (r, off, len) => {
          if (off === 5 * P) answered5 = true;
          r.populate(off, len);
        },
      }),
    );
    let answeredAtRetransmit: boolean | undefined;
    sys.tracer.on((e) => {
      // Block 2's answer came after its NACK went without one (the fault timeout): it must take no block with it.
      if (e.kind === 'resolved' && e.side === 'destination' && e.detail?.['seq'] === 2) setImmediate(() => afterLate.resolve());
      if (e.kind === 'nack' && e.detail?.['seq'] === 2) new Uint8Array(dst.buffer, 2 * P, P).fill(0);
      if (e.kind === 'retransmit' && e.detail?.['seq'] === 5) answeredAtRetransmit = answered5;
    });
    const cpl = await within('transfer', post(sys.node(0), src, dst));
    expect(cpl.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dst).equals(data)).toBe(true);
    expect(lib.faults.map((f) => f.offset / P)).toEqual([2, 5]);
    expect(lib.answered).toBe(2);
    // Block 5 went out again only once its own fault was answered, not on block 2's answer.
    expect(answeredAtRetransmit).toBe(true);
    expect(cpl.nacks).toBe(2);
    expect(events.filter((e) => e.kind === 'retransmit').map((e) => e.detail?.['seq'])).toEqual([2, 5]);
  });
  test("the same at the source: a late source answer does not unpark a later block's source fault", async () => {
    const faultTimeoutMs = 500;
    const { sys, events, src, dst, data, a } = rig(8, { faultTimeoutMs });
    src.evict(2 * P, P);
    src.evict(5 * P, P);
    const late = deferred();
    let answered5 = false;
    const lib = env.track(
      new FaultLibrary(a.socket, {
        regions: [src],
        // Block 5's answer waits for block 2's to have been sent and taken in (a turn later).
        hold: (note) => {
          if (note.offset === 2 * P) return late.promise;
          late.resolve();
          return late.promise.then(() => new Promise<void>((resolve) => setImmediate(resolve)));
        },
        resolve: (r, off, len) => {
          if (off === 5 * P) answered5 = true;
          new Uint8Array(r.buffer, off, len).set(data.subarray(off, off + len));
        },
      }),
    );
    let answeredAtRetransmit: boolean | undefined;
    sys.tracer.on((e) => {
      if (e.kind === 'fault' && e.side === 'source' && e.detail?.['seq'] === 2) new Uint8Array(src.buffer, 2 * P, P).set(data.subarray(2 * P, 3 * P));
      if (e.kind === 'retransmit' && e.detail?.['seq'] === 5) answeredAtRetransmit = answered5;
    });
    const cpl = await within('transfer', post(sys.node(0), src, dst));
    expect(cpl.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dst).equals(data)).toBe(true);
    expect(lib.faults.map((f) => f.offset / P)).toEqual([2, 5]);
    expect(lib.answered).toBe(2);
    expect(answeredAtRetransmit).toBe(true);
    expect(cpl.faults).toEqual({ source: 2, destination: 0 });
    expect(events.filter((e) => e.kind === 'retransmit').map((e) => e.detail?.['seq'])).toEqual([2, 5]);
  });
});

describe('modelled time', () => {
  test('a short last block is on the link for its own bytes only', async () => {
    // Two fresh systems, the same two-block transfer, whole or with a 100-byte last block:
    // everything but the last block's time on the link is the same.
    const whole = rig(2);
    const full = await within('2 whole blocks', post(whole.sys.node(0), whole.src, whole.dst));
    const part = rig(2);
    const short = await within('1 block and 100 bytes', post(part.sys.node(0), part.src, part.dst, { length: P + 100 }));
    expect([full.status, short.status]).toEqual([DmaStatus.SUCCESS, DmaStatus.SUCCESS]);
    expect(short.bytes).toBe(P + 100);
    expect(full.model.us - short.model.us).toBeCloseTo((P - 100) / c.linkBytesPerUs, 9);
  });

  test("blocks returned unanswered behind a NACK cost no link time: the next NACK is dated from the retransmission's own plan", async () => {
    // Pages R/2 and R/2 + 1 evicted, resolved one page per fault: the first NACK returns the
    // rest of the run; the run sent after it (2 blocks) takes the second NACK. That NACK's
    // time comes from the blocks' planned arrival, which must not count the returned blocks.
    const R = MAX_RUN_BLOCKS;
    const clean = rig(R);
    const free = await within('fault-free', post(clean.sys.node(0), clean.src, clean.dst));
    const nacked = rig(R);
    nacked.dst.evict((R / 2) * P, 2 * P);
    env.track(new FaultLibrary(nacked.b.socket, { regions: [nacked.dst], policy: 'touch' }));
    const faulted = await within('two NACKs in the middle', post(nacked.sys.node(0), nacked.src, nacked.dst));
    expect([free.status, faulted.status, faulted.faults.destination]).toEqual([DmaStatus.SUCCESS, DmaStatus.SUCCESS, 2]);
    expect(bytesOf(nacked.dst).equals(nacked.data)).toBe(true);
    // Two fault paths (about 38 µs modelled each), not the link time of the R/2 − 1 blocks
    // the destination returned (each P / linkBytesPerUs on the link).
    const returnedLinkUs = (R / 2 - 1) * (P / c.linkBytesPerUs);
    expect(faulted.model.us - free.model.us).toBeLessThan(returnedLinkUs / 4);
  });

  test("a run ends at its slowest block's answer, not its last block's", async () => {
    // Walks dear, the link nearly free: block 0 walked at both ends, block 1 (warmed by a
    // first transfer of it alone) an IOTLB hit at both, so block 1 is answered first.
    const walkUs = 100;
    const { sys, src, dst, data } = twoNode(env, { pages: 2, fill: 0x66, dstResident: true, system: { costs: { walkUs, linkBytesPerUs: 1e9 } } });
    const warm = await within(
      'block 1 alone',
      post(sys.node(0), src, dst, { srcVa: src.address + BigInt(P), dstVa: dst.address + BigInt(P), length: P }),
    );
    expect(warm.status).toBe(DmaStatus.SUCCESS);
    const cpl = await within('both blocks', post(sys.node(0), src, dst));
    expect(cpl.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dst).equals(data)).toBe(true);
    // Block 0's source walk, then (after the link) its destination walk, one after the other.
    expect(cpl.model.us).toBeGreaterThan(2 * walkUs);
    expect(cpl.model.us).toBeLessThan(3 * walkUs);
  });

  test('a page found gone by the copy, not the walk: the fault is dated from when its block was issued', async () => {
    // Each SMMU keeps its translations and stops hearing about evictions: only the copy
    // finds the page gone (a late fault). Block 0's page goes at the destination, then
    // (another transfer) at the source.
    const { sys, events, src, dst, data, a, b } = rig(4);
    const srcLib = env.track(
      new FaultLibrary(a.socket, { regions: [src], resolve: (r, off, len) => new Uint8Array(r.buffer, off, len).set(data.subarray(off, off + len)) }),
    );
    const dstLib = env.track(new FaultLibrary(b.socket, { regions: [dst] }));
    expect((await within('warm-up', post(sys.node(0), src, dst))).status).toBe(DmaStatus.SUCCESS);
    const blockIssued = (from: number, seq: number) => events.slice(from).find((e) => e.kind === 'block' && e.detail?.['seq'] === seq)!.modelUs;

    dst.unobserve(sys.node(1).smmu);
    dst.evict(0, P);
    let from = events.length;
    const late = await within('late destination fault', post(sys.node(0), src, dst));
    dst.observe(sys.node(1).smmu);
    expect(late).toMatchObject({ status: DmaStatus.SUCCESS, faults: { source: 0, destination: 1 } });
    expect(dstLib.faults.map((f) => f.offset / P)).toEqual([0]);
    // The NACK is back one link latency after the block arrived (no walk: the copy found it;
    // the first block has the engine and the link to itself).
    const nack = events.slice(from).find((e) => e.kind === 'nack')!;
    const arrived = blockIssued(from, 0) + c.scheduleUs + c.iotlbHitUs + c.blockUs + P / c.linkBytesPerUs + c.linkLatencyUs;
    expect(nack.modelUs).toBeCloseTo(arrived + c.linkLatencyUs, 9);

    src.unobserve(sys.node(0).smmu);
    src.evict(0, P);
    from = events.length;
    const gone = await within('late source fault', post(sys.node(0), src, dst));
    src.observe(sys.node(0).smmu);
    expect(gone).toMatchObject({ status: DmaStatus.SUCCESS, faults: { source: 1, destination: 0 } });
    expect(srcLib.faults.map((f) => f.offset / P)).toEqual([0]);
    expect(bytesOf(dst).equals(data)).toBe(true);
    // The source fault is detected a schedule after its block was issued, as a walk's would be.
    const fault = events.slice(from).find((e) => e.kind === 'fault' && e.side === 'source')!;
    expect(fault.modelUs).toBeCloseTo(blockIssued(from, 0) + c.scheduleUs, 9);
  });

  test("a retransmitted run's 'ack' trace is its first block's answer, not its last's", async () => {
    const { sys, events, src, dst, b } = rig(16);
    dst.evict(4 * P, P);
    env.track(new FaultLibrary(b.socket, { regions: [dst] }));
    const cpl = await within('transfer', post(sys.node(0), src, dst));
    expect(cpl.status).toBe(DmaStatus.SUCCESS);
    const acks = events.filter((e) => e.kind === 'ack');
    expect(acks.map((e) => e.detail?.['seq'])).toEqual([4]);
    // The retransmission [4, 5]: block 5 was issued when block 4 left the engine; block 4's
    // answer came its payload's time on the link, the destination's walk of the page faulted
    // in (not in the IOTLB) and two latencies after that (block 5's answer came later still:
    // its payload waited for block 4's on the link).
    const issued5 = events.filter((e) => e.kind === 'block' && e.detail?.['seq'] === 5).at(-1)!;
    expect(acks[0]!.modelUs - issued5.modelUs).toBeCloseTo(P / c.linkBytesPerUs + c.walkUs + 2 * c.linkLatencyUs, 9);
  });
});

describe('completions', () => {
  test('two transfers posted at once on one channel both complete, in order; a success names no side; each is traced', async () => {
    const { sys, events, src, dst, data } = rig(8);
    const order: number[] = [];
    const first = post(sys.node(0), src, dst, { length: 4 * P }).then((c) => (order.push(1), c));
    const second = post(sys.node(0), src, dst, { srcVa: src.address + BigInt(4 * P), dstVa: dst.address + BigInt(4 * P), length: 4 * P }).then(
      (c) => (order.push(2), c),
    );
    const [c1, c2] = await within('both transfers', Promise.all([first, second]));
    expect([c1.status, c2.status]).toEqual([DmaStatus.SUCCESS, DmaStatus.SUCCESS]);
    expect([c1.bytes, c2.bytes]).toEqual([4 * P, 4 * P]);
    expect(order).toEqual([1, 2]);
    expect(bytesOf(dst).equals(data)).toBe(true);
    expect('side' in c1).toBe(false);
    expect('reason' in c1).toBe(false);
    expect(c2.model.startUs).toBeGreaterThanOrEqual(c1.model.startUs);
    const done = events.filter((e) => e.kind === 'complete');
    expect(done.map((e) => [e.tid, e.detail?.['status']])).toEqual([
      [c1.tid, 'SUCCESS'],
      [c2.tid, 'SUCCESS'],
    ]);
    expect(done[1]!.modelUs).toBe(c2.model.endUs);
    expect(sys.node(0).pldma.counters()).toMatchObject({ completed: 2, errors: 0 });
  });

  test('a descriptor refused before any block is sent completes with its reason and no side', async () => {
    const { sys, src, dst } = rig(1);
    const cpl = await within('refused transfer', post(sys.node(0), src, dst, { channel: 1_000_000 }));
    expect(cpl.status).toBe(DmaStatus.BAD_CHANNEL);
    expect(cpl.reason).toMatch(/^channel 1000000 is not in 0\.\./);
    expect('side' in cpl).toBe(false);
    expect(cpl.bytes).toBe(0);
  });

  test("a descriptor refused on a channel that is busy leaves the channel's queued transfers alone", async () => {
    const { sys, src, dst, data, b } = rig(4);
    dst.evict(P, P);
    const hold = deferred();
    env.track(new FaultLibrary(b.socket, { regions: [dst], hold: () => hold.promise }));
    // Channel 0 holds a transfer waiting on its destination fault (the NACK held there) …
    const parked = post(sys.node(0), src, dst, { length: 4 * P });
    await within('the fault', new Promise<void>((r) => sys.tracer.on((e) => e.kind === 'fault' && e.side === 'destination' && r())));
    // … when a descriptor for the same channel is refused before it is queued.
    const refused = await within('refused transfer', post(sys.node(0), src, dst, { length: 0 }));
    expect(refused.status).toBe(DmaStatus.BAD_LENGTH);
    hold.resolve();
    const cpl = await within('the parked transfer', parked);
    expect([cpl.status, cpl.bytes]).toEqual([DmaStatus.SUCCESS, 4 * P]);
    expect(bytesOf(dst).equals(data)).toBe(true);
  });

  test('a block retried on the fault timer (nobody answered) is sent again after its NACK, not before', async () => {
    const sys = env.system({ nodes: 2, faultTimeoutMs: 20 });
    const events: TraceEvent[] = [];
    const src = env.region(4 * P);
    const dst = env.region(4 * P);
    const data = fill(src, 0x3d);
    dst.populate();
    dst.evict(P, P);
    // No fault library: the page comes back through the CPU once the NACK is in.
    sys.tracer.on((e) => {
      events.push(e);
      if (e.kind === 'nack') new Uint8Array(dst.buffer, P, P).fill(0);
    });
    proc(sys.node(0), 100, 7, [src]);
    proc(sys.node(1), 200, 7, [dst]);
    const cpl = await within('transfer', post(sys.node(0), src, dst));
    expect(cpl.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dst).equals(data)).toBe(true);
    expect(sys.node(0).pldma.counters().retryTimeouts).toBe(1);
    const nack = events.find((e) => e.kind === 'nack')!;
    const retransmit = events.find((e) => e.kind === 'retransmit')!;
    expect(retransmit.detail).toMatchObject({ seq: 1, attempt: 2 });
    expect(retransmit.modelUs).toBeGreaterThanOrEqual(nack.modelUs);
  });
});

describe('stall mode', () => {
  test('a write to stall-mode memory counts each stall once, as a destination fault, with nothing retransmitted', async () => {
    const { sys, uffd, src, dst, data, b } = stallRig(env, 4);
    const lib = env.track(new FaultLibrary(b.socket, { regions: [dst], method: 'uffd', resolve: zeroNoWake(uffd) }));
    const cpl = await within('transfer', post(sys.node(0), src, dst));
    expect(cpl.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dst).equals(data)).toBe(true);
    const stalls = lib.faults.length;
    expect(stalls).toBeGreaterThan(0);
    expect(cpl.faults).toEqual({ source: 0, destination: stalls });
    expect(cpl.retransmittedBlocks).toBe(0);
  });

  test('the block after a stalled one is issued once the stall is over, not when the engine handed the stalled one on', async () => {
    const { sys, uffd, src, dst, data, b } = stallRig(env, 2);
    const events: TraceEvent[] = [];
    sys.tracer.on((e) => events.push(e));
    env.track(new FaultLibrary(b.socket, { regions: [dst], method: 'uffd', resolve: zeroNoWake(uffd) }));
    const cpl = await within('transfer', post(sys.node(0), src, dst));
    expect(cpl.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dst).equals(data)).toBe(true);
    const stallUs = c.eventRecordUs + c.irqUs + c.driverUs + c.netlinkUs + c.wakeupUs + c.touchPageUs + c.requestUs + c.resumeUs;
    const issued = (seq: number) => events.filter((e) => e.kind === 'block' && e.detail?.['seq'] === seq).map((e) => e.modelUs);
    // Block 1 went out with block 0 and came back unwritten (a stall-mode write is one
    // block); it went out again after block 0's answer, with block 0's stall behind it.
    expect(issued(1)).toHaveLength(2);
    expect(issued(1)[1]!).toBeGreaterThanOrEqual(issued(0)[0]! + stallUs);
  });

  test('a stalled source read the fault library cannot resolve is aborted: ABORTED, saying the source read, on the source side', async () => {
    const { sys, src, dst, a } = stallRig(env, 2, { stallSide: 'source' });
    env.track(new FaultLibrary(a.socket, { regions: [src], noResolve: true, status: IommuPageResponseCode.INVALID }));
    const cpl = await within('transfer', post(sys.node(0), src, dst));
    expect(cpl.status).toBe(DmaStatus.ABORTED);
    expect(cpl.side).toBe('source');
    expect(cpl.reason).toBe('a stalled source read was aborted (CMD_RESUME ABORT/TERM or CMD_STALL_TERM)');
    expect(cpl.bytes).toBe(0);
  });
});
