// The PLDMA's requester and its front (pldma.ts) at the edges the larger suites leave open:
// a peer lost under parked transfers, the modelled plan each write carries (issue times and
// arrivals, across runs and transfers), source faults at the first block of a run, a
// protection domain gone mid-transfer, and the work a node counts in flight. Watched on the
// fabric's own packets, the trace and memory.
import { describe, expect, test } from 'vitest';
import type { Region } from '../../../lib/index.js';
import {
  type AckPacket,
  DEFAULT_COSTS,
  DmaStatus,
  type Packet,
  type SimSystem,
  type TraceEvent,
  type WritePacket,
} from '../../../kernel-sim/index.js';
import { MAX_RUN_BLOCKS } from '../../../kernel-sim/pldma/types.js';
import { bytesOf, deferred, FaultLibrary, fill, P, post, proc, stallRig, until, useEnv, within, zeroNoWake } from '../helpers.js';

const env = useEnv();
const RUN = MAX_RUN_BLOCKS;

/** Every write and write answer the fabric carries, in order. */
function wire(sys: SimSystem): Packet[] {
  const seen: Packet[] = [];
  const fabric = sys.fabric;
  const deliver = fabric.deliver.bind(fabric);
  fabric.deliver = (p: Packet) => {
    if (p.type === 'write' || (p.type === 'ack' && p.verdicts !== undefined)) seen.push(p);
    deliver(p);
  };
  return seen;
}

/** W(seq,count) for a write, A(seq) for its answer. */
const show = (ps: Packet[]) => ps.map((p) => (p.type === 'write' ? `W${p.seq},${p.count}` : `A${(p as AckPacket).seq}`));

/** The writes the fabric carries, in order. */
function writesOn(sys: SimSystem): WritePacket[] {
  const seen: WritePacket[] = [];
  const fabric = sys.fabric;
  const deliver = fabric.deliver.bind(fabric);
  fabric.deliver = (p: Packet) => {
    if (p.type === 'write') seen.push(p);
    deliver(p);
  };
  return seen;
}

/** Consecutive differences. */
const steps = (xs: number[]) => xs.slice(1).map((x, i) => x - xs[i]!);

describe('a peer lost', () => {
  test('ends only the transfers to that node, RETRY_EXCEEDED, naming it; the others go on', async () => {
    const sys = env.system({ nodes: 3, faultTimeoutMs: 60_000 });
    const src = env.region(2 * P);
    const d1 = env.region(2 * P);
    const d2 = env.region(2 * P);
    const data = fill(src, 0x52);
    proc(sys.node(0), 100, 7, [src]);
    const b = proc(sys.node(1), 200, 7, [d1]);
    const c = proc(sys.node(2), 300, 7, [d2]);
    // Both destinations fault and their libraries hold the answer: both transfers are parked.
    const hold = deferred();
    const lib1 = env.track(new FaultLibrary(b.socket, { regions: [d1], hold: () => hold.promise }));
    const lib2 = env.track(new FaultLibrary(c.socket, { regions: [d2], hold: () => hold.promise }));
    const to1 = post(sys.node(0), src, d1, { channel: 0 });
    const to2 = post(sys.node(0), src, d2, { channel: 1, dstNode: 2 });
    await until('both faults', () => lib1.faults.length === 1 && lib2.faults.length === 1);
    sys.node(0).pldma.peerLost(1);
    const c1 = await within('the transfer to node 1', to1, 3000);
    expect(c1).toMatchObject({ status: DmaStatus.RETRY_EXCEEDED, reason: 'node 1 went away (its connection shut down)', bytes: 0 });
    expect(sys.node(0).pldma.active).toBe(1);
    hold.resolve();
    const c2 = await within('the transfer to node 2', to2);
    expect(c2.status).toBe(DmaStatus.SUCCESS);
    expect(Buffer.from(d2.buffer).equals(data)).toBe(true);
  });
});

describe('the plan of runs on the wire', () => {
  test('runs sent while the one before is on the wire continue its plan: issue times and arrivals step evenly across runs', async () => {
    const sys = env.system({ nodes: 2 });
    const writes = writesOn(sys);
    const src = env.region(3 * RUN * P);
    const dst = env.region(3 * RUN * P);
    const data = fill(src, 0x71);
    dst.populate();
    proc(sys.node(0), 100, 7, [src]);
    proc(sys.node(1), 200, 7, [dst]);
    const cpl = await within('transfer', post(sys.node(0), src, dst), 20_000);
    expect(cpl.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dst).equals(data)).toBe(true);
    expect(writes.map((w) => [w.seq, w.count])).toEqual([0, 1, 2].map((k) => [k * RUN, RUN]));
    for (const w of writes) expect(w.arrivesAt).toBe(w.arrivals[0]);
    const issued = writes.flatMap((w) => [...w.issuedUs]);
    const arrivals = writes.flatMap((w) => [...w.arrivals]);
    // Resident and page-sized blocks: every block costs the engine the same, and the link
    // (the slower of the two) one block's bytes, whichever run it is in.
    const engineStep = issued[1]! - issued[0]!;
    // Each block walks its own page (none is in the IOTLB yet).
    expect(engineStep).toBeCloseTo(DEFAULT_COSTS.scheduleUs + DEFAULT_COSTS.walkUs + DEFAULT_COSTS.blockUs, 9);
    for (const d of steps(issued)) expect(d).toBeCloseTo(engineStep, 6);
    for (const d of steps(arrivals)) expect(d).toBeCloseTo(P / DEFAULT_COSTS.linkBytesPerUs, 6);
    // The first block is issued one doorbell after the post, and the transfer ends when the
    // last block's answer is back.
    expect(issued[0]).toBeCloseTo(cpl.model.startUs + DEFAULT_COSTS.doorbellUs, 6);
    expect(arrivals[0]).toBeCloseTo(issued[0]! + engineStep + P / DEFAULT_COSTS.linkBytesPerUs + DEFAULT_COSTS.linkLatencyUs, 6);
    expect(cpl.model.endUs).toBeGreaterThan(arrivals.at(-1)!);
  });

  test("a channel's next transfer is planned from where the engine ended the one before, not from its own post", async () => {
    const sys = env.system({ nodes: 2 });
    const writes = writesOn(sys);
    const src = env.region(8 * P);
    const dst = env.region(8 * P);
    const data = fill(src, 0x72);
    dst.populate();
    proc(sys.node(0), 100, 7, [src]);
    proc(sys.node(1), 200, 7, [dst]);
    // Posted together on one channel: the second waits for the first.
    const half = 4 * P;
    const [c1, c2] = await within(
      'transfers',
      Promise.all([
        post(sys.node(0), src, dst, { length: half }),
        // Its last block is short: it takes the link only for its own bytes.
        post(sys.node(0), src, dst, { length: half - 1000, srcVa: src.address + BigInt(half), dstVa: dst.address + BigInt(half) }),
      ]),
    );
    expect([c1.status, c2.status]).toEqual([DmaStatus.SUCCESS, DmaStatus.SUCCESS]);
    expect(bytesOf(dst, 0, 2 * half - 1000).equals(data.subarray(0, 2 * half - 1000))).toBe(true);
    expect(bytesOf(dst, 2 * half - 1000).every((x) => x === 0)).toBe(true);
    expect(writes.map((w) => [w.tid, w.count])).toEqual([
      [c1.tid, 4],
      [c2.tid, 4],
    ]);
    const [w1, w2] = writes as [WritePacket, WritePacket];
    const step = w1.issuedUs[1]! - w1.issuedUs[0]!;
    expect(w1.issuedUs[0]).toBeCloseTo(DEFAULT_COSTS.doorbellUs, 6);
    expect(w2.issuedUs[0]).toBeCloseTo(w1.issuedUs[3]! + step, 6);
    expect(w2.length).toBe(half - 1000);
    expect(steps([...w2.arrivals])).toEqual([P, P, P - 1000].map((n) => expect.closeTo(n / DEFAULT_COSTS.linkBytesPerUs, 6)));
    expect(c2.model.endUs).toBeGreaterThan(c1.model.endUs);
  });
});

describe('the source side of a run', () => {
  test("the posting process's protection domain gone mid-transfer: the next block is not sent, FLUSHED at the source", async () => {
    const sys = env.system({ nodes: 2, faultTimeoutMs: 60_000 });
    const writes = writesOn(sys);
    const src = env.region(4 * P);
    const dst = env.region(4 * P);
    const data = fill(src, 0x73);
    dst.populate();
    dst.evict(2 * P, P);
    const a = proc(sys.node(0), 100, 7, [src]);
    const b = proc(sys.node(1), 200, 7, [dst]);
    const hold = deferred();
    const lib = env.track(new FaultLibrary(b.socket, { regions: [dst], hold: () => hold.promise }));
    const pc = post(sys.node(0), src, dst);
    // The destination holds its NACK until the fault library answers: the stream goes first.
    await until('the fault', () => lib.faults.length === 1);
    sys.node(0).smmu.detach(a.stream.sid);
    hold.resolve();
    const cpl = await within('flushed', pc);
    expect(cpl).toMatchObject({
      status: DmaStatus.FLUSHED,
      side: 'source',
      reason: 'node 0 no longer has a stream for protection domain 7',
      bytes: 2 * P,
    });
    expect(writes.map((w) => [w.seq, w.count])).toEqual([[0, 4]]);
    expect(bytesOf(dst, 0, 2 * P).equals(data.subarray(0, 2 * P))).toBe(true);
    expect(bytesOf(dst, 3 * P).every((x) => x === 0)).toBe(true);
    expect(sys.node(0).pldma.counters()).toMatchObject({ errors: 1, completed: 0, blocksAcked: 2 });
    expect(sys.node(0).pldma.active).toBe(0);
    expect(sys.node(0).pldma.inflight).toBe(0);
  });

  test('a source page missing at the first block of a pipelined run: its fault waits until the run before has landed whole', async () => {
    const sys = env.system({ nodes: 2, faultTimeoutMs: 60_000 });
    const writes = writesOn(sys);
    const src = env.region(2 * RUN * P);
    const dst = env.region(2 * RUN * P);
    const data = fill(src, 0x74);
    dst.populate();
    src.evict(RUN * P, P);
    const a = proc(sys.node(0), 100, 7, [src]);
    proc(sys.node(1), 200, 7, [dst]);
    let landedAtFault = false;
    let acksAtFault = -1;
    const lib = env.track(
      new FaultLibrary(a.socket, {
        regions: [src],
        resolve: (r, off, len) => new Uint8Array(r.buffer, off, len).set(data.subarray(off, off + len)),
        hold: () => {
          landedAtFault = bytesOf(dst, 0, RUN * P).equals(data.subarray(0, RUN * P));
          acksAtFault = sys.node(0).pldma.counters().blocksAcked;
          return undefined;
        },
      }),
    );
    const cpl = await within('transfer', post(sys.node(0), src, dst), 20_000);
    expect(cpl.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dst).equals(data)).toBe(true);
    expect(cpl.faults).toEqual({ source: 1, destination: 0 });
    expect(cpl.retransmittedBlocks).toBe(1);
    expect(lib.faults.map((f) => [f.side, f.offset / P])).toEqual([['source', RUN]]);
    expect(landedAtFault).toBe(true);
    expect(acksAtFault).toBe(RUN);
    // Run 1 whole; the faulting block never went out before its fault was resolved.
    expect(writes[0]).toMatchObject({ seq: 0, count: RUN });
    expect(writes[1]!.seq).toBe(RUN);
    expect(writes.reduce((n, w) => n + w.count, 0)).toBe(2 * RUN);
    expect(sys.node(0).pldma.counters()).toMatchObject({ blocksAcked: 2 * RUN, blocksIssued: 2 * RUN + 1, retransmittedBlocks: 1 });
  });
});

describe('a source fault at the first block of a run', () => {
  test('detected one schedule and one walk after the block was issued; the resend is traced as attempt 2, its real fault time measured', async () => {
    const sys = env.system({ nodes: 2, faultTimeoutMs: 60_000 });
    const events: TraceEvent[] = [];
    sys.tracer.on((e) => events.push(e));
    const src = env.region(4 * P);
    const dst = env.region(4 * P);
    const data = fill(src, 0x75);
    dst.populate();
    src.evict(0, P);
    const a = proc(sys.node(0), 100, 7, [src]);
    proc(sys.node(1), 200, 7, [dst]);
    const lib = env.track(
      new FaultLibrary(a.socket, { regions: [src], resolve: (r, off, len) => new Uint8Array(r.buffer, off, len).set(data.subarray(off, off + len)) }),
    );
    const cpl = await within('transfer', post(sys.node(0), src, dst));
    expect(cpl.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dst).equals(data)).toBe(true);
    expect(cpl.faults).toEqual({ source: 1, destination: 0 });
    expect(lib.faults.map((f) => [f.side, f.offset / P, f.hint])).toEqual([['source', 0, 4 * P]]);
    const c = DEFAULT_COSTS;
    const blocks = events.filter((e) => e.kind === 'block');
    expect(blocks.map((e) => [e.detail?.['seq'], e.detail?.['attempt']])).toEqual([
      [0, 1],
      [0, 2],
      [1, 1],
      [2, 1],
      [3, 1],
    ]);
    const fault = events.find((e) => e.kind === 'fault')!;
    expect(fault).toMatchObject({ side: 'source', detail: { seq: 0 } });
    expect(fault.modelUs - blocks[0]!.modelUs).toBeCloseTo(c.scheduleUs + c.walkUs, 9);
    expect(blocks[0]!.modelUs).toBeCloseTo(c.doorbellUs, 9);
    const retransmit = events.find((e) => e.kind === 'retransmit')!;
    expect(retransmit.detail).toMatchObject({ seq: 0, attempt: 2, srcNode: 0 });
    expect(retransmit.modelUs).toBe(blocks[1]!.modelUs);
    expect(cpl.retransmittedBlocks).toBe(1);
    // The real time from the fault to its block going out again: within the transfer's.
    expect(cpl.real.faultUs).toHaveLength(1);
    expect(cpl.real.faultUs[0]).toBeGreaterThanOrEqual(0);
    expect(cpl.real.faultUs[0]).toBeLessThanOrEqual(cpl.real.us);
  });

  test("the faulting block holds the node's engine for its schedule, walk and issue: another channel's block waits behind it", async () => {
    // Channel 1's one resident block alone, then posted together with channel 0's transfer
    // whose first block faults at the source (and is issued first).
    const run = async (withFault: boolean) => {
      const sys = env.system({ nodes: 2, faultTimeoutMs: 60_000 });
      const src = env.region(2 * P);
      const dst = env.region(2 * P);
      const data = fill(src, 0x76);
      dst.populate();
      if (withFault) src.evict(0, P);
      const a = proc(sys.node(0), 100, 7, [src]);
      proc(sys.node(1), 200, 7, [dst]);
      const resolve = (r: Region, off: number, len: number) => new Uint8Array(r.buffer, off, len).set(data.subarray(off, off + len));
      env.track(new FaultLibrary(a.socket, { regions: [src], resolve }));
      const faulting = withFault ? post(sys.node(0), src, dst, { channel: 0, length: P }) : undefined;
      const other = post(sys.node(0), src, dst, { channel: 1, length: P, srcVa: src.address + BigInt(P), dstVa: dst.address + BigInt(P) });
      const [c0, c1] = await within('transfers', Promise.all([faulting, other]));
      if (c0) expect(c0.status).toBe(DmaStatus.SUCCESS);
      expect(c1!.status).toBe(DmaStatus.SUCCESS);
      return c1!.model.endUs;
    };
    const alone = await run(false);
    const behind = await run(true);
    const c = DEFAULT_COSTS;
    expect(behind - alone).toBeCloseTo(c.scheduleUs + c.walkUs + c.blockUs, 9);
  });
});

describe('runs one at a time', () => {
  test('after a fault: runs of 2, 4, 8 … blocks, each answered before the next goes out', async () => {
    const sys = env.system({ nodes: 2, faultTimeoutMs: 60_000 });
    const packets = wire(sys);
    const src = env.region(64 * P);
    const dst = env.region(64 * P);
    const data = fill(src, 0x77);
    dst.populate();
    dst.evict(0, P);
    proc(sys.node(0), 100, 7, [src]);
    const b = proc(sys.node(1), 200, 7, [dst]);
    env.track(new FaultLibrary(b.socket, { regions: [dst] }));
    const cpl = await within('transfer', post(sys.node(0), src, dst));
    expect(cpl.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dst).equals(data)).toBe(true);
    expect(show(packets)).toEqual(['W0,64', 'A0', 'W0,2', 'A0', 'W2,4', 'A2', 'W6,8', 'A6', 'W14,16', 'A14', 'W30,32', 'A30', 'W62,2', 'A62']);
  });

  test('a stall-mode source: one block a write, each answered before the next goes out (its stall window is its own)', async () => {
    const sys = env.system({ nodes: 2 });
    const packets = wire(sys);
    const uffd = env.uffd();
    const src = env.region(3 * P);
    const dst = env.region(3 * P);
    const data = fill(src, 0x78);
    dst.populate();
    // Resident before it is registered: nothing stalls.
    uffd.register(src);
    sys.attachStallSource(uffd);
    proc(sys.node(0), 100, 7, [src], 'stall');
    proc(sys.node(1), 200, 7, [dst]);
    const cpl = await within('transfer', post(sys.node(0), src, dst));
    expect(cpl.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dst).equals(data)).toBe(true);
    expect(show(packets)).toEqual(['W0,1', 'A0', 'W1,1', 'A1', 'W2,1', 'A2']);
    expect((packets[0] as WritePacket).sourceStall).toBe(true);
  });
});

describe('work in flight', () => {
  test("a node's inflight counts its writes on the wire and the copy jobs its responder runs for others", async () => {
    const { sys, uffd, src, dst, data, b } = stallRig(env, 1);
    const gate = deferred();
    const lib = env.track(new FaultLibrary(b.socket, { regions: [dst], method: 'uffd', resolve: zeroNoWake(uffd), hold: () => gate.promise }));
    const pc = post(sys.node(0), src, dst);
    // The destination's copy thread is blocked in the stalled write.
    await until('the stalled write', () => lib.faults.length === 1);
    expect(sys.node(0).pldma.inflight).toBe(1);
    expect(sys.node(1).pldma.inflight).toBe(1);
    gate.resolve();
    const cpl = await within('transfer', pc);
    expect(cpl.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dst).equals(data)).toBe(true);
    expect([sys.node(0).pldma.inflight, sys.node(1).pldma.inflight]).toEqual([0, 0]);
  });
});
