// The PLDMA's responder at the edges the larger suites leave open, watched on the fabric's
// own packets and on the destination's memory: a write whose payload lost a source page on
// the way (as another process's transport reports it), admission, copy outcomes.
import { describe, expect, test } from 'vitest';
import {
  type AckPacket,
  AckResp,
  DEFAULT_COSTS,
  type DmaDescriptor,
  DmaStatus,
  type Packet,
  RcOp,
  MrState,
  mrRecord,
  type RcMr,
  type SimSystem,
  type TraceEvent,
  type WritePacket,
} from '../../../kernel-sim/index.js';
import { INLINE_COPY_MAX } from '../../../kernel-sim/pldma/copy-engine.js';
import { MAX_RUN_BLOCKS } from '../../../kernel-sim/pldma/types.js';
import type { Region } from '../../../lib/index.js';
import { RecvRing } from '../../../kernel-sim/device/recv-ring.js';
import { CompletionRing, CQE } from '../../../kernel-sim/device/cq-ring.js';
import { QpState, WcOpcode, WcStatus } from '../../../kernel-sim/device/ib.js';
import { RcQueuePair } from '../../../kernel-sim/rc/qp.js';
import { binding } from '../../../native/index.js';
import { bytesOf, FaultLibrary, fill, holdCopyThread, P, post, proc, useEnv, within } from '../helpers.js';

const env = useEnv();
const RUN = MAX_RUN_BLOCKS;
/** Pages of a write larger than is copied inline: its copy is a copy thread's job. */
const LARGE = INLINE_COPY_MAX / P + 1;

/** Every write and ACK the fabric carries, in order; `edit` may change a write before it is delivered. */
function tap(sys: SimSystem, edit?: (p: WritePacket) => void): Packet[] {
  const seen: Packet[] = [];
  const fabric = sys.fabric;
  const deliver = fabric.deliver.bind(fabric);
  fabric.deliver = (p: Packet) => {
    if (p.type === 'write') edit?.(p);
    seen.push(p);
    deliver(p);
  };
  return seen;
}

const acks = (ps: Packet[]) => ps.filter((p): p is AckPacket => p.type === 'ack' && p.verdicts !== undefined);
const verdicts = (a: AckPacket) => a.verdicts!.map((v) => [v.seq, v.count, v.resp]);

describe('a write whose payload lost a source page on the way', () => {
  test('the blocks before it are written, it is answered SOURCE_FAULT, the rest returned; the source faults once and sends it again', async () => {
    const sys = env.system({ nodes: 2, faultTimeoutMs: 60_000 });
    const src = env.region(2 * RUN * P);
    const dst = env.region(2 * RUN * P);
    const data = fill(src, 0x63);
    dst.populate();
    const a = proc(sys.node(0), 100, 7, [src]);
    proc(sys.node(1), 200, 7, [dst]);
    // The second run's third block: its page missing when its bytes were read (as the
    // socket transport marks it), once.
    const lost = RUN + 2;
    let marked = false;
    const packets = tap(sys, (p) => {
      if (marked || p.seq !== RUN) return;
      marked = true;
      p.sourceFault = { seq: lost, faultOffset: p.payload.offset + 2 * P };
    });
    // When the source's library hears the fault, what has landed of the second run.
    let landed: boolean[] = [];
    const lib = env.track(
      new FaultLibrary(a.socket, {
        regions: [src],
        hold: () => {
          landed = [lost - 1, lost, lost + 1].map((b) => bytesOf(dst, b * P, P).equals(data.subarray(b * P, (b + 1) * P)));
          return undefined;
        },
      }),
    );
    const cpl = await within('transfer', post(sys.node(0), src, dst), 20_000);
    expect(cpl.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dst).equals(data)).toBe(true);
    expect(cpl.faults).toEqual({ source: 1, destination: 0 });
    expect(cpl.retransmittedBlocks).toBe(1);
    expect(lib.faults.map((f) => [f.side, f.offset / P])).toEqual([['source', lost]]);
    expect(landed).toEqual([true, false, false]);
    const second = acks(packets).find((p) => p.seq === RUN)!;
    expect(verdicts(second)).toEqual([
      [RUN, 2, AckResp.OK],
      [lost, 1, AckResp.SOURCE_FAULT],
    ]);
    expect(second.verdicts![1]!.faultOffset).toBe(lost * P);
    expect(second.returned).toEqual({ seq: lost + 1, count: RUN - 3 });
    expect(sys.node(0).pldma.counters()).toMatchObject({ blocksAcked: 2 * RUN, retransmittedBlocks: 1 });
  });

  test('lost in the first run while the second is on the wire: the second is returned whole, written only after the block is sent again', async () => {
    const sys = env.system({ nodes: 2, faultTimeoutMs: 60_000 });
    const src = env.region(2 * RUN * P);
    const dst = env.region(2 * RUN * P);
    const data = fill(src, 0x65);
    dst.populate();
    const a = proc(sys.node(0), 100, 7, [src]);
    proc(sys.node(1), 200, 7, [dst]);
    const lost = 2;
    let marked = false;
    const packets = tap(sys, (p) => {
      if (marked || p.seq !== 0) return;
      marked = true;
      p.sourceFault = { seq: lost, faultOffset: p.payload.offset + lost * P };
    });
    // When the source's library hears the fault, whether anything of the second run has landed.
    let secondLanded = true;
    env.track(
      new FaultLibrary(a.socket, {
        regions: [src],
        hold: () => {
          secondLanded = !bytesOf(dst, RUN * P, RUN * P).every((x) => x === 0);
          return undefined;
        },
      }),
    );
    const cpl = await within('transfer', post(sys.node(0), src, dst), 20_000);
    expect([cpl.status, cpl.retransmittedBlocks]).toEqual([DmaStatus.SUCCESS, 1]);
    expect(bytesOf(dst).equals(data)).toBe(true);
    expect(secondLanded).toBe(false);
    const [first, second] = acks(packets);
    expect(verdicts(first!)).toEqual([
      [0, lost, AckResp.OK],
      [lost, 1, AckResp.SOURCE_FAULT],
    ]);
    expect(first!.returned).toEqual({ seq: lost + 1, count: RUN - lost - 1 });
    expect([second!.seq, second!.verdicts, second!.returned]).toEqual([RUN, [], { seq: RUN, count: RUN }]);
  });

  test('a stall-mode destination writes one block a write: a page lost later in the run is not its answer', async () => {
    const pages = 8;
    const sys = env.system({ nodes: 2, faultTimeoutMs: 60_000 });
    const uffd = env.uffd();
    const src = env.region(pages * P);
    const dst = env.region(pages * P);
    const data = fill(src, 0x64);
    // Resident before it is registered: no block stalls.
    dst.populate();
    uffd.register(dst);
    sys.attachStallSource(uffd);
    const a = proc(sys.node(0), 100, 7, [src]);
    proc(sys.node(1), 200, 7, [dst], 'stall');
    let marked = false;
    const packets = tap(sys, (p) => {
      if (marked) return;
      marked = true;
      p.sourceFault = { seq: p.seq + 2, faultOffset: p.payload.offset + 2 * P };
    });
    const lib = env.track(new FaultLibrary(a.socket, { regions: [src] }));
    const cpl = await within('transfer', post(sys.node(0), src, dst), 20_000);
    expect(cpl.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dst).equals(data)).toBe(true);
    // The mark came with a block the destination did not get to: not a source fault.
    expect(cpl.faults).toEqual({ source: 0, destination: 0 });
    expect(lib.faults).toHaveLength(0);
    const first = acks(packets)[0]!;
    expect(verdicts(first)).toEqual([[0, 1, AckResp.OK]]);
    expect(first.returned).toEqual({ seq: 1, count: pages - 1 });
  });
});

describe('which thread copies a write', () => {
  test('a small write into resident memory is copied inline, on this JS thread; a large one by a copy thread', async () => {
    const sys = env.system({ nodes: 2 });
    const packets = tap(sys);
    const src = env.region(LARGE * P);
    const dst = env.region(LARGE * P);
    const data = fill(src, 0x6b);
    dst.populate();
    proc(sys.node(0), 100, 7, [src]);
    proc(sys.node(1), 200, 7, [dst]);
    const small = await within('64 B write', post(sys.node(0), src, dst, { length: 64 }));
    const large = await within('large write', post(sys.node(0), src, dst, { length: LARGE * P }));
    expect([small.status, large.status]).toEqual([DmaStatus.SUCCESS, DmaStatus.SUCCESS]);
    expect(bytesOf(dst).equals(data)).toBe(true);
    const [a1, a2] = acks(packets);
    expect(a1!.verdicts![0]!.copyThread).toBe(binding.gettid());
    expect(sys.node(1).engine.tids).toContain(a2!.verdicts![0]!.copyThread);
  });
});

describe('the copy a write becomes is written for its key and QP', () => {
  // The only copy thread is held in a genuine userfaultfd fault, so the write's copy waits in
  // the queue; a fence by the write's key (or QP) then cancels it: nothing of it lands.
  async function queuedBehindHeldCopy(fence: { key?: number; qp?: number }) {
    const sys = env.system({ nodes: 2, engineThreads: 1 });
    const release = await holdCopyThread(env, sys.node(1).engine);
    const pages = LARGE; // more than is copied inline
    const src = env.region(pages * P);
    const dst = env.region(pages * P);
    fill(src, 0x6a);
    dst.populate();
    proc(sys.node(0), 100, 7, [src]);
    proc(sys.node(1), 200, 7, [dst]);
    const pc = post(sys.node(0), src, dst, { key: 0x4d, dstQp: 9 });
    await within(
      'the write queued',
      (async () => {
        while (sys.node(1).engine.inflight < 2) await new Promise((r) => setImmediate(r));
      })(),
    );
    expect(sys.node(1).fence(fence, 1000)).toBe(true);
    expect((await release()).status).toBe(0);
    const cpl = await within('the write', pc);
    return { cpl, dst };
  }

  for (const fence of [{ key: 0x4d }, { qp: 9 }]) {
    test(`a fence by its ${Object.keys(fence)[0]} cancels it while queued: refused at the destination, not one byte lands`, async () => {
      const { cpl, dst } = await queuedBehindHeldCopy(fence);
      expect(cpl).toMatchObject({ status: DmaStatus.DST_PERM_ERR, side: 'destination', bytes: 0 });
      expect(cpl.reason).toBe('node 1 revoked key 0x4d / QP 9 before the write');
      expect(bytesOf(dst).every((x) => x === 0)).toBe(true);
    });
  }
});

describe('a transfer its source QP cancels (SimNode.cancel): nothing of it lands once the call returns', () => {
  test('its run handed to the fabric, not yet at the destination: the revoked payload is never copied, answered FLUSHED', async () => {
    const sys = env.system({ nodes: 2 });
    const src = env.region(64 * P);
    const dst = env.region(64 * P);
    fill(src, 0x6c);
    dst.populate();
    proc(sys.node(0), 100, 7, [src]);
    proc(sys.node(1), 200, 7, [dst]);
    let cancelled = false;
    const packets = tap(sys, () => {
      if (cancelled) return;
      cancelled = true;
      expect(sys.node(0).cancel(5)).toBe(true);
    });
    const cpl = await within('the write', post(sys.node(0), src, dst, { key: 0x4d, dstQp: 9, srcQp: 5 }));
    expect(cancelled).toBe(true);
    expect(cpl).toMatchObject({ status: DmaStatus.FLUSHED, side: 'source', bytes: 0, reason: 'QP 5 of node 0 was destroyed' });
    await within(
      'the answer',
      (async () => {
        while (acks(packets).length === 0) await new Promise((r) => setImmediate(r));
      })(),
    );
    expect(verdicts(acks(packets)[0]!)).toEqual([[0, 1, AckResp.FLUSHED]]);
    expect(acks(packets)[0]!.verdicts![0]!.reason).toBe('node 0 cancelled transfer 1 (its QP was destroyed)');
    expect(bytesOf(dst).every((x) => x === 0)).toBe(true);
  });

  test("its copy queued behind a held one: cancelled with it; another QP's transfer is not touched", async () => {
    const sys = env.system({ nodes: 2, engineThreads: 1 });
    const release = await holdCopyThread(env, sys.node(1).engine);
    const pages = LARGE; // more than is copied inline
    const src = env.region(2 * pages * P);
    const dst = env.region(2 * pages * P);
    const data = fill(src, 0x6d);
    dst.populate();
    proc(sys.node(0), 100, 7, [src]);
    proc(sys.node(1), 200, 7, [dst]);
    const mine = post(sys.node(0), src, dst, { length: pages * P, key: 0x4d, dstQp: 9, srcQp: 5 });
    const other = post(sys.node(0), src, dst, {
      channel: 1,
      srcVa: src.address + BigInt(pages * P),
      dstVa: dst.address + BigInt(pages * P),
      length: pages * P,
      key: 0x4e,
      dstQp: 10,
      srcQp: 6,
    });
    await within(
      'both writes queued',
      (async () => {
        while (sys.node(1).engine.inflight < 3) await new Promise((r) => setImmediate(r));
      })(),
    );
    expect(sys.node(0).cancel(5, 1000)).toBe(true);
    expect((await release()).status).toBe(0);
    const [a, b] = await within('the writes', Promise.all([mine, other]));
    expect(a).toMatchObject({ status: DmaStatus.FLUSHED, side: 'source', bytes: 0 });
    expect(b.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dst, 0, pages * P).every((x) => x === 0)).toBe(true);
    expect(bytesOf(dst, pages * P).equals(data.subarray(pages * P))).toBe(true);
  });
});

describe('a copy that stops while the next run of its transfer is already translated', () => {
  test("the next run's answer is dropped (its blocks returned whole), though it stopped at a fault of its own", async () => {
    // Run 1 (RUN blocks) and run 2 (TAIL) of one transfer are both translated before either is
    // copied: the only copy thread is held in a genuine userfaultfd fault. Run 2 stops at its
    // own destination fault (block RUN + HOLE, evicted before the post; the blocks before it
    // are more than is copied inline, so their copy queues too); then page 5 of run 1
    // goes away under its queued copy. Run 1's copy stops there, so run 2, behind it, must
    // come back whole, not with verdicts for blocks after a hole.
    const sys = env.system({ nodes: 2, engineThreads: 1, faultTimeoutMs: 60_000 });
    const packets = tap(sys);
    const release = await holdCopyThread(env, sys.node(1).engine);
    const TAIL = LARGE + 16;
    const HOLE = TAIL - 10;
    const pages = RUN + TAIL;
    const src = env.region(pages * P);
    const dst = env.region(pages * P);
    const data = fill(src, 0x71);
    dst.populate();
    dst.evict((RUN + HOLE) * P, P);
    proc(sys.node(0), 100, 7, [src]);
    const b = proc(sys.node(1), 200, 7, [dst]);
    const lib = env.track(new FaultLibrary(b.socket, { regions: [dst] }));
    const pc = post(sys.node(0), src, dst);
    await within(
      "both runs' copies queued",
      (async () => {
        while (sys.node(1).engine.inflight < 3) await new Promise((r) => setImmediate(r));
      })(),
    );
    dst.evict(5 * P, P);
    expect((await release()).status).toBe(0);
    const cpl = await within('the transfer', pc, 20_000);
    expect(cpl.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dst).equals(data)).toBe(true);
    const [a1, a2] = acks(packets);
    expect(verdicts(a1!)).toEqual([
      [0, 5, AckResp.OK],
      [5, 1, AckResp.FAULT],
    ]);
    expect(a1!.returned).toEqual({ seq: 6, count: RUN - 6 });
    // The envelope says what stopped the write, as its last verdict does.
    expect(a1!.resp).toBe(AckResp.FAULT);
    expect([a2!.seq, verdicts(a2!), a2!.returned]).toEqual([RUN, [], { seq: RUN, count: TAIL }]);
    // Run 2's own fault was never NACKed: block RUN + HOLE faults again when it is sent again.
    expect(lib.faults.map((f) => f.offset / P)).toEqual([5, RUN + HOLE]);
  });
});

describe("the responder's RC checks, on its own node's tables", () => {
  // Node 1 holds one QP connected to QP 5 of node 0, and one MR over the destination's first
  // `mrPages` pages: what the verbs layer keeps there, built by hand.
  function rig(pages: number, mrPages = pages) {
    const sys = env.system({ nodes: 2 });
    const src = env.region(pages * P);
    const dst = env.region(pages * P);
    const data = fill(src, 0x65);
    dst.populate();
    proc(sys.node(0), 100, 7, [src]);
    proc(sys.node(1), 200, 7, [dst]);
    const pd = { handle: 7, closed: false };
    const mr: RcMr = mrRecord({ key: 0x1234, pd, access: 1 | 2, region: dst, offset: 0, length: mrPages * P });
    // The QP as a device builds it: from its PD's record and its rings alone.
    const rq = new RecvRing(4, 1);
    const cq = new CompletionRing(4);
    const qp = new RcQueuePair({ qpNum: 9, pd, rq, recvCq: cq });
    qp.modify({ state: QpState.RTS, destroyed: false, destNode: 0, destQpNum: 5, accessFlags: 1 | 2, minRnrTimer: 1, qkey: undefined });
    // The receive CQEs the device wrote, as the provider reads them.
    const received = () => {
      const out: Array<{ status: number; opcode: number; byteLen: number; srcQp: number; immData: number }> = [];
      for (let i = cq.consumer; i !== cq.producer; i = (i + 1) >>> 0) {
        const at = cq.slot(i);
        const v = cq.view;
        out.push({
          status: v.getUint32(at + CQE['wc.status'], true),
          opcode: v.getUint32(at + CQE['wc.opcode'], true),
          byteLen: v.getUint32(at + CQE['wc.byte_len'], true),
          srcQp: v.getUint32(at + CQE['wc.src_qp'], true),
          immData: v.getUint32(at + CQE['wc.ex.imm_data'], false),
        });
      }
      return out;
    };
    const t = sys.node(1).tables;
    t.strict = true;
    t.mrs.set(0x1234, mr);
    t.qps.set(9, qp);
    const rc = (d: Partial<DmaDescriptor>) => post(sys.node(0), src, dst, { dstQp: 9, srcQp: 5, key: 0x1234, opcode: RcOp.WRITE, psn: 0, ...d });
    return { sys, src, dst, data, mr, qp, rq, received, rc };
  }
  const zero = (r: Region) => bytesOf(r).every((x) => x === 0);

  test('a WRITE past its MR is refused whole, once per packet: DST_PERM_ERR, nothing written', async () => {
    const { dst, rc } = rig(8, 3);
    const cpl = await within('write', rc({}));
    expect(cpl).toMatchObject({ status: DmaStatus.DST_PERM_ERR, side: 'destination', bytes: 0 });
    expect(cpl.reason).toMatch(/is not inside rkey 0x1234's MR/);
    expect(zero(dst)).toBe(true);
  });

  test('another PD, a closed MR, a missing access flag: each refused, nothing written', async () => {
    const { dst, mr, rc } = rig(2);
    for (const [change, reason] of [
      [{ pd: { handle: 8, closed: false } }, /another protection domain/],
      [{ state: MrState.FREE }, /names no live MR/],
      [{ access: 1 }, /without REMOTE_WRITE/],
    ] as const) {
      const saved = { pd: mr.pd, state: mr.state, access: mr.access };
      Object.assign(mr, change);
      const cpl = await within('write', rc({}));
      expect(cpl).toMatchObject({ status: DmaStatus.DST_PERM_ERR, bytes: 0 });
      expect(cpl.reason).toMatch(reason);
      Object.assign(mr, saved);
    }
    expect(zero(dst)).toBe(true);
  });

  test('the wrong sender, a QP not receiving, a PSN out of sequence: dropped (DROPPED), nothing written', async () => {
    const { dst, qp, data, rc } = rig(2);
    expect(await within('other QP', rc({ srcQp: 6 }))).toMatchObject({ status: DmaStatus.DROPPED, bytes: 0 });
    expect(await within('skipped PSN', rc({ psn: 1 }))).toMatchObject({ status: DmaStatus.DROPPED, bytes: 0 });
    Object.assign(qp, { destroyed: true });
    const off = await within('not receiving', rc({}));
    expect(off).toMatchObject({ status: DmaStatus.DROPPED, bytes: 0 });
    expect(off.reason).toBe('no QP 9 accepting packets on this node');
    expect(zero(dst)).toBe(true);
    Object.assign(qp, { destroyed: false });
    // The expected PSN did not move: the first message lands, the next must follow it.
    expect(await within('in sequence', rc({}))).toMatchObject({ status: DmaStatus.SUCCESS });
    expect(bytesOf(dst).equals(data)).toBe(true);
    expect(qp.resp.epsn).toBe(1);
    expect(await within('a PSN again', rc({ psn: 0 }))).toMatchObject({ status: DmaStatus.DROPPED });
  });

  test('a packet naming no QP: refused from a peer once a device drives the node, written from its own engine', async () => {
    const { sys, src, dst, data } = rig(2);
    const plain = await within('raw', post(sys.node(0), src, dst));
    expect(plain).toMatchObject({ status: DmaStatus.DST_PERM_ERR, bytes: 0, reason: 'node 1 does not accept a write from node 0 that names no QP' });
    expect(zero(dst)).toBe(true);
    sys.node(1).tables.strict = false;
    expect((await within('not strict', post(sys.node(0), src, dst))).status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dst).equals(data)).toBe(true);
  });

  test("a SEND with no receive posted: RNR NAKs until one is; it lands in the receive's buffer and completes there", async () => {
    const { dst, qp, rq, data, received, rc } = rig(2);
    const sent = rc({ opcode: RcOp.SEND, key: undefined, dstVa: 0n, length: 100, immData: 0xabc, retryLimit: Infinity });
    await new Promise((r) => setTimeout(r, 20));
    expect(received()).toEqual([]);
    rq.push({ wrId: 1, sgList: [{ addr: dst.address + BigInt(P), length: 200, lkey: 0x1234 }] });
    const cpl = await within('send', sent);
    expect(cpl.status).toBe(DmaStatus.SUCCESS);
    expect(cpl.nacks).toBeGreaterThan(0);
    expect(bytesOf(dst, P, 100).equals(data.subarray(0, 100))).toBe(true);
    expect(received()).toMatchObject([{ status: WcStatus.SUCCESS, opcode: WcOpcode.RECV, byteLen: 100, immData: 0xabc, srcQp: 5 }]);
    expect(qp.rq.length).toBe(0);
  });

  test('a SEND longer than the receive: the receive completes with "len", the requester gets REM_INV_REQ, nothing written', async () => {
    const { dst, qp, rq, received, rc } = rig(2);
    rq.push({ wrId: 1, sgList: [{ addr: dst.address, length: 50, lkey: 0x1234 }] });
    const cpl = await within('send', rc({ opcode: RcOp.SEND, key: undefined, length: 100 }));
    expect(cpl).toMatchObject({ status: DmaStatus.REM_INV_REQ, bytes: 0 });
    expect(received()).toMatchObject([{ status: WcStatus.LOC_LEN_ERR, opcode: WcOpcode.RECV, byteLen: 0 }]);
    // The device moved its QP to ERR on its own.
    expect(qp.state).toBe(QpState.ERR);
    expect(zero(dst)).toBe(true);
  });
});

describe('a write crossing the end of the destination region', () => {
  test('translated block by block there, the blocks inside written as one piece with one verdict, the first outside refused', async () => {
    const sys = env.system({ nodes: 2 });
    const packets = tap(sys);
    const src = env.region(8 * P);
    const dst = env.region(6 * P);
    const data = fill(src, 0x66);
    dst.populate();
    proc(sys.node(0), 100, 7, [src]);
    proc(sys.node(1), 200, 7, [dst]);
    const cpl = await within('transfer', post(sys.node(0), src, dst, { length: 8 * P }));
    expect(cpl).toMatchObject({ status: DmaStatus.DST_ADDR_ERR, side: 'destination', bytes: 6 * P });
    expect(bytesOf(dst).equals(data.subarray(0, 6 * P))).toBe(true);
    const [ack] = acks(packets);
    expect(verdicts(ack!)).toEqual([
      [0, 6, AckResp.OK],
      [6, 1, AckResp.ADDR_ERR],
    ]);
    expect(ack!.returned).toEqual({ seq: 7, count: 1 });
  });
});

describe('a page found gone by the copy, after the translation', () => {
  /**
   * 6 pages copied once from page 2 of an 8-page source (both SMMUs cache them), then
   * `side`'s SMMU stops hearing about evictions and the page of block `block` there is evicted.
   */
  async function stale(side: 'source' | 'destination', block: number) {
    const sys = env.system({ nodes: 2, faultTimeoutMs: 60_000 });
    const src = env.region(8 * P);
    const dst = env.region(6 * P);
    const data = fill(src, 0x67);
    const sent = data.subarray(2 * P);
    dst.populate();
    const a = proc(sys.node(0), 100, 7, [src]);
    const b = proc(sys.node(1), 200, 7, [dst]);
    const restore = (r: Region, off: number, len: number) => new Uint8Array(r.buffer, off, len).set(data.subarray(off, off + len));
    const lib =
      side === 'source'
        ? env.track(new FaultLibrary(a.socket, { regions: [src], resolve: restore }))
        : env.track(new FaultLibrary(b.socket, { regions: [dst] }));
    const go = () => post(sys.node(0), src, dst, { srcVa: src.address + BigInt(2 * P), length: 6 * P });
    expect((await within('first', go())).faults).toEqual({ source: 0, destination: 0 });
    const [r, node, page] = side === 'source' ? [src, 0, block + 2] : [dst, 1, block];
    r.unobserve(sys.node(node).smmu);
    r.evict(page * P, P);
    new Uint8Array(dst.buffer).fill(0, 0, block * P);
    const packets = tap(sys);
    const events: TraceEvent[] = [];
    sys.tracer.on((e) => events.push(e));
    const cpl = await within('second', go());
    r.observe(sys.node(node).smmu);
    return { sys, src, dst, sent, lib, cpl, packets, events };
  }

  test('at the destination: the blocks before it written, a late NACK for it, the rest returned; the fault names that page', async () => {
    const { dst, sent, lib, cpl, packets, events } = await stale('destination', 2);
    expect(cpl.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dst).equals(sent)).toBe(true);
    expect(cpl.faults).toEqual({ source: 0, destination: 1 });
    expect(lib.faults.map((f) => [f.side, f.offset / P, f.hint])).toEqual([['destination', 2, 4 * P]]);
    const [first] = acks(packets);
    expect(verdicts(first!)).toEqual([
      [0, 2, AckResp.OK],
      [2, 1, AckResp.FAULT],
    ]);
    expect(first!.verdicts![1]!.late).toBe(true);
    expect(first!.returned).toEqual({ seq: 3, count: 3 });
    // Found by the copy, not the walk: the NACK is back one link latency after the block arrived.
    const fault = events.find((e) => e.kind === 'fault' && e.side === 'destination')!;
    const nack = events.find((e) => e.kind === 'nack')!;
    expect(fault.detail).toMatchObject({ seq: 2, va: dst.address + BigInt(2 * P) });
    expect(nack.detail).toMatchObject({ seq: 2 });
    expect(nack.modelUs - fault.modelUs).toBeCloseTo(DEFAULT_COSTS.linkLatencyUs, 9);
  });

  test('at the source: the blocks before it written, SOURCE_FAULT for it at its offset, the rest returned', async () => {
    const { src, dst, sent, lib, cpl, packets } = await stale('source', 2);
    expect(cpl.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dst).equals(sent)).toBe(true);
    expect(cpl.faults).toEqual({ source: 1, destination: 0 });
    expect(lib.faults.map((f) => [f.side, f.offset / P])).toEqual([['source', 4]]);
    expect(src.residency()[4]).toBe(1);
    const [first] = acks(packets);
    expect(verdicts(first!)).toEqual([
      [0, 2, AckResp.OK],
      [2, 1, AckResp.SOURCE_FAULT],
    ]);
    expect(first!.verdicts![1]!.faultOffset).toBe(4 * P);
    expect(first!.returned).toEqual({ seq: 3, count: 3 });
  });

  test('at the first block of the job: no verdict for written blocks, the NACK first', async () => {
    const { dst, sent, cpl, packets } = await stale('destination', 0);
    expect(cpl.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dst).equals(sent)).toBe(true);
    const [first] = acks(packets);
    expect(verdicts(first!)).toEqual([[0, 1, AckResp.FAULT]]);
    expect(first!.resp).toBe(AckResp.FAULT);
    expect(first!.returned).toEqual({ seq: 1, count: 5 });
  });
});

/**
 * Two regions adjacent in VA, `lo` ending where `hi` begins (consecutive anonymous mmaps are
 * placed one below the other: a few tries are enough).
 */
function adjacent(loPages: number, hiPages: number): { lo: Region; hi: Region } {
  for (let i = 0; i < 16; i++) {
    const hi = env.region(hiPages * P);
    const lo = env.region(loPages * P);
    if (lo.address + BigInt(lo.size) === hi.address) return { lo, hi };
  }
  throw new Error('no two adjacent mappings in 16 tries');
}

describe('a write crossing from one region into the next one in VA', () => {
  /** A 12-page source filled with `pattern(base)` on node 0; on node 1, `lo` (8 pages) and `hi` (32) adjacent in VA, filled with 0xee. */
  function crossing(base: number) {
    const sys = env.system({ nodes: 2 });
    const src = env.region(12 * P);
    const data = fill(src, base);
    const { lo, hi } = adjacent(8, 32);
    for (const r of [lo, hi]) new Uint8Array(r.buffer).fill(0xee);
    proc(sys.node(0), 100, 7, [src]);
    proc(sys.node(1), 200, 7, [lo, hi]);
    return { sys, src, data, lo, hi };
  }

  test('a write ending mid-block in the second region: its last piece is cut at the write end, not at the block end', async () => {
    const { sys, src, data, lo, hi } = crossing(0x5d);
    const length = 12 * P - 100;
    const cpl = await within('crossing write', post(sys.node(0), src, lo, { length }));
    expect([cpl.status, cpl.bytes]).toEqual([DmaStatus.SUCCESS, length]);
    expect(bytesOf(lo).equals(data.subarray(0, 8 * P))).toBe(true);
    expect(bytesOf(hi, 0, 4 * P - 100).equals(data.subarray(8 * P, length))).toBe(true);
    expect(bytesOf(hi, 4 * P - 100).every((x) => x === 0xee)).toBe(true);
  });

  test('at the destination: each block lands once, nothing past the write, in the modelled time of one region', async () => {
    // 12 pages from the start of `lo` (8 pages) into `hi` (32): the last 4 in `hi`, whose
    // other 28 pages stay as they were. A first write of 2 pages to the start of `hi` leaves
    // them in the IOTLB, so the blocks in `hi` do not all walk alike.
    const { sys, src, data, lo, hi } = crossing(0x3c);
    const packets = tap(sys);
    const warm = await within('warm-up write', post(sys.node(0), src, hi, { srcVa: src.address + BigInt(8 * P), length: 2 * P }));
    expect(warm.status).toBe(DmaStatus.SUCCESS);
    packets.length = 0;
    const cpl = await within('crossing write', post(sys.node(0), src, lo, { length: 12 * P }));
    expect([cpl.status, cpl.bytes, cpl.blocks]).toEqual([DmaStatus.SUCCESS, 12 * P, 12]);
    expect(bytesOf(lo).equals(data.subarray(0, 8 * P))).toBe(true);
    expect(bytesOf(hi, 0, 4 * P).equals(data.subarray(8 * P))).toBe(true);
    expect(bytesOf(hi, 4 * P).every((x) => x === 0xee)).toBe(true);
    // `lo` translated block by block (the run is not in one region), `hi` as one run: two
    // pieces, two OK verdicts, 12 blocks in all; the second with a walk per block (2 hits, 2 walks).
    const [ack] = acks(packets);
    expect(verdicts(ack!)).toEqual([
      [0, 8, AckResp.OK],
      [8, 4, AckResp.OK],
    ]);
    // `lo`'s 8 blocks, joined from 8 one-block pieces, all walked alike: one figure, no list.
    expect(ack!.verdicts![0]!).toMatchObject({ walkUs: DEFAULT_COSTS.walkUs });
    expect(ack!.verdicts![0]!.walks).toBeUndefined();
    expect([...ack!.verdicts![1]!.walks!]).toEqual([DEFAULT_COSTS.iotlbHitUs, DEFAULT_COSTS.iotlbHitUs, DEFAULT_COSTS.walkUs, DEFAULT_COSTS.walkUs]);
    // The same walks and link time as the same two writes into one region of 12 resident pages.
    const one = env.system({ nodes: 2 });
    const src1 = env.region(12 * P);
    const dst1 = env.region(12 * P);
    fill(src1, 0x3c);
    new Uint8Array(dst1.buffer).fill(0xee);
    proc(one.node(0), 100, 7, [src1]);
    proc(one.node(1), 200, 7, [dst1]);
    const at8 = { srcVa: src1.address + BigInt(8 * P), dstVa: dst1.address + BigInt(8 * P), length: 2 * P };
    expect((await within('one-region warm-up', post(one.node(0), src1, dst1, at8))).status).toBe(DmaStatus.SUCCESS);
    const ref = await within('one-region write', post(one.node(0), src1, dst1, { length: 12 * P }));
    expect(cpl.model.us).toBeCloseTo(ref.model.us, 9);
  });
});
