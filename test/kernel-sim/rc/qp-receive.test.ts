// The device's receive side with no provider at all: a QP and an SRQ built from rings and
// records only (as a device process builds them from a C provider's memfds), the receives
// taken, completed into the CQ's ring and flushed by the device itself, and MR records
// checked without asking anyone.
import { describe, expect, test } from 'vitest';
import { CompletionRing, CQE } from '../../../kernel-sim/device/cq-ring.js';
import { QueueKind } from '../../../kernel-sim/device/abi.js';
import { QpState, WcOpcode, WcStatus } from '../../../kernel-sim/device/ib.js';
import { RecvRing } from '../../../kernel-sim/device/recv-ring.js';
import { RcOp } from '../../../kernel-sim/fabric/packets.js';
import type { MemoryLike, MemoryObserver } from '../../../kernel-sim/memory.js';
import { RcQueuePair } from '../../../kernel-sim/rc/qp.js';
import { MrState, mrCovers, mrFree, mrPlace, mrRecord, type RcEvent, type RcPd, type RcSrq, RcTables } from '../../../kernel-sim/rc/tables.js';

const odp = { faults: { source: 0, destination: 0 }, majorFaults: 0, retransmittedBlocks: 0, modelUs: 1, realUs: 1 };

// Every CQE in the ring, oldest first, as a provider reads them (without consuming them).
function cqes(cq: CompletionRing): Array<{ wrId: bigint; status: number; opcode: number; byteLen: number; qpNum: number; srcQp: number }> {
  const out = [];
  for (let i = cq.consumer; i !== cq.producer; i = (i + 1) >>> 0) {
    const at = cq.slot(i);
    const v = cq.view;
    out.push({
      wrId: v.getBigUint64(at + CQE['wc.wr_id'], true),
      status: v.getUint32(at + CQE['wc.status'], true),
      opcode: v.getUint32(at + CQE['wc.opcode'], true),
      byteLen: v.getUint32(at + CQE['wc.byte_len'], true),
      qpNum: v.getUint32(at + CQE['wc.qp_num'], true),
      srcQp: v.getUint32(at + CQE['wc.src_qp'], true),
    });
  }
  return out;
}

function rig(opts: { cqDepth?: number; srq?: boolean; ud?: boolean } = {}) {
  const t = new RcTables();
  const events: RcEvent[] = [];
  t.events = (e) => events.push(e);
  const pd: RcPd = { handle: 3, closed: false };
  const cq = new CompletionRing(opts.cqDepth ?? 8);
  const rq = new RecvRing(4, 1);
  const srq: RcSrq | undefined = opts.srq
    ? { handle: 5, pd, ring: new RecvRing(4, 1, QueueKind.SRQ, 5), limit: 0, xrcd: undefined, cq: undefined, destroyed: false }
    : undefined;
  if (srq) t.srqs.set(srq.handle, srq);
  const qp = new RcQueuePair({ qpNum: 9, pd, rq, recvCq: cq, srq, ud: opts.ud ?? false });
  t.qps.set(9, qp);
  qp.modify({ state: QpState.RTS, destroyed: false, destNode: 0, destQpNum: 7, accessFlags: 0, minRnrTimer: 1, qkey: opts.ud ? 1 : undefined });
  const wqe = (wrId: number) => ({ wrId, sgList: [{ addr: 0x1000n, length: 64, lkey: 1 }] });
  return { t, events, pd, cq, rq, srq, qp, wqe };
}

describe("a QP's receive side on the device, from rings and records only", () => {
  test('an SRQ receive is taken for good; the armed limit raises srq-limit once on the event line and disarms', () => {
    const { t, events, srq, qp, wqe } = rig({ srq: true });
    for (let i = 1; i <= 3; i++) srq!.ring.push(wqe(i));
    srq!.limit = 3;
    expect(qp.takesReceives).toBe(true);
    expect(qp.take(t)?.wrId).toBe(1n);
    expect(events).toEqual([{ type: 'srq-limit', handle: 5 }]);
    expect(srq!.limit).toBe(0);
    expect(qp.take(t)?.wrId).toBe(2n);
    expect(events).toHaveLength(1);
    expect(srq!.ring.length).toBe(1);
    srq!.destroyed = true;
    expect(qp.take(t)).toBeUndefined();
  });

  test('received writes the CQE into the ring: RECV_RDMA_WITH_IMM, byte_len, src_qp; a failure is LOC_PROT_ERR with no bytes', () => {
    const { t, cq, qp, wqe } = rig();
    qp.received(t, wqe(1), { status: 'ok', op: RcOp.WRITE_IMM, byteLen: 40, immData: 5, srcQpn: 7, odp });
    qp.received(t, wqe(2), { status: 'prot', op: RcOp.SEND, byteLen: 40, srcQpn: 7, odp });
    expect(cqes(cq)).toEqual([
      { wrId: 1n, status: WcStatus.SUCCESS, opcode: WcOpcode.RECV_RDMA_WITH_IMM, byteLen: 40, qpNum: 9, srcQp: 7 },
      { wrId: 2n, status: WcStatus.LOC_PROT_ERR, opcode: WcOpcode.RECV, byteLen: 0, qpNum: 9, srcQp: 7 },
    ]);
  });

  test('the device moves its own QP to ERR: its receives flushed in order with WR_FLUSH_ERR, qp-error on the event line, once', () => {
    const { t, events, cq, rq, qp, wqe } = rig();
    rq.push(wqe(1));
    rq.push(wqe(2));
    qp.toError(t);
    qp.toError(t);
    expect(qp.state).toBe(QpState.ERR);
    expect(qp.receiving).toBe(false);
    expect(cqes(cq).map((c) => [c.wrId, c.status])).toEqual([
      [1n, WcStatus.WR_FLUSH_ERR],
      [2n, WcStatus.WR_FLUSH_ERR],
    ]);
    expect(rq.length).toBe(0);
    expect(events).toEqual([{ type: 'qp-error', handle: 9 }]);
  });

  test("the owner's modify to ERR flushes the receive a message holds off the SRQ, and leaves the SRQ's others", () => {
    const { t, events, cq, srq, qp, wqe } = rig({ srq: true });
    srq!.ring.push(wqe(1));
    srq!.ring.push(wqe(2));
    const held = qp.take(t)!;
    qp.resp.msg = { psn: 0, tid: 1, opcode: RcOp.SEND, wqe: held, faults: 0, firstUs: 0, firstMs: 0 };
    qp.modify({ state: QpState.ERR, destroyed: false, destNode: 0, destQpNum: 7, accessFlags: 0, minRnrTimer: 1, qkey: undefined });
    expect(cqes(cq).map((c) => [c.wrId, c.status])).toEqual([[1n, WcStatus.WR_FLUSH_ERR]]);
    expect(srq!.ring.length).toBe(1);
    expect(qp.resp.msg).toBeUndefined();
    // The owner asked for it: nothing to tell the owner.
    expect(events).toEqual([]);
  });

  test('a receive whose CQ overruns moves the QP to ERR; the CQ stays in error and says so once', () => {
    const { t, events, cq, qp, wqe } = rig({ cqDepth: 1 });
    const said: number[] = [];
    cq.onEvent = (e) => said.push(e);
    qp.received(t, wqe(1), { status: 'ok', op: RcOp.SEND, byteLen: 8, srcQpn: 7, odp });
    qp.received(t, wqe(2), { status: 'ok', op: RcOp.SEND, byteLen: 8, srcQpn: 7, odp });
    expect(cq.error).toBe(true);
    expect(cq.overruns).toBe(1);
    expect(said).toEqual([0, 1]);
    expect(qp.state).toBe(QpState.ERR);
    expect(events).toEqual([{ type: 'qp-error', handle: 9 }]);
  });

  test("a UD datagram's receive given back goes in front again, and is flushed once the QP is in ERR", () => {
    const { t, cq, rq, qp, wqe } = rig({ ud: true });
    rq.push(wqe(1));
    rq.push(wqe(2));
    const w = qp.take(t)!;
    qp.giveBack(w);
    expect(rq.head()?.wrId).toBe(1n);
    const again = qp.take(t)!;
    qp.toError(t);
    qp.giveBack(again);
    expect(cqes(cq).map((c) => [c.wrId, c.status])).toEqual([
      [2n, WcStatus.WR_FLUSH_ERR],
      [1n, WcStatus.WR_FLUSH_ERR],
    ]);
  });

  test("an answer lands only in a span the QP's landings hold, under its key", () => {
    const { qp } = rig();
    qp.landings.add({ key: 4, addr: 0x2000n, end: 0x3000n });
    expect(qp.expects(4, 0x2000n, 0x1000)).toBe(true);
    expect(qp.expects(4, 0x2800n, 0x1000)).toBe(false);
    expect(qp.expects(5, 0x2000n, 8)).toBe(false);
  });
});

describe('an MR record', () => {
  function region(): MemoryLike & { close(): void } {
    const observers = new Set<MemoryObserver>();
    const r = {
      id: 1,
      address: 0x10000n,
      size: 0x4000,
      pageSize: 4096,
      granule: 4096,
      closed: false,
      observe: (o: MemoryObserver) => void observers.add(o),
      unobserve: (o: MemoryObserver) => void observers.delete(o),
      close() {
        r.closed = true;
        for (const o of observers) o.regionClosing(r);
      },
      observers,
    };
    return r;
  }

  test('places a range inside it at its region offset, refuses one past it, and nothing once FREE or its region is gone', () => {
    const r = region();
    const pd: RcPd = { handle: 1, closed: false };
    const mr = mrRecord({ key: 0x77, pd, access: 1, region: r, offset: 0x1000, length: 0x2000 });
    expect([mr.lkey, mr.rkey, mr.iova, mr.state]).toEqual([0x77, 0x77, 0x11000n, MrState.VALID]);
    expect(mrPlace(mr, 0x11800n, 0x100)).toEqual({ region: r, offset: 0x1800 });
    expect(mrCovers(mr, 0x12f00n, 0x100)).toBe(true);
    expect(mrCovers(mr, 0x12f00n, 0x101)).toBe(false);
    expect(mrPlace(mr, 0x10fffn, 2)).toBeUndefined();
    r.close();
    expect(mr.regionGone).toBe(true);
    expect(mrPlace(mr, 0x11800n, 0x100)).toBeUndefined();
    const again = mrRecord({ key: 0x78, pd, access: 1, region: region(), offset: 0, length: 0x1000 });
    mrFree(again);
    expect(again.state).toBe(MrState.FREE);
    expect(mrPlace(again, 0x10000n, 8)).toBeUndefined();
    expect((again.region as unknown as { observers: Set<unknown> }).observers.size).toBe(0);
  });
});
