// The device's send side alone (kernel-sim/rc/qp.ts): an RcQueuePair built from a send ring,
// a CQ ring and a node's MR table, with no object of the verbs library. The node's engine is
// a stand-in that holds each posted descriptor until the test answers it, so the order in
// which WQEs complete, when their slots free, and what each CQE says can be checked exactly.
import { describe, expect, test } from 'vitest';
import { CompletionRing, CQE, CqEvent } from '../../../kernel-sim/device/cq-ring.js';
import { HEADER, SGE } from '../../../kernel-sim/device/rings.js';
import { sendWqe } from '../../../kernel-sim/device/abi.js';
import { Access, QpState, QpType, SendFlags, WcOpcode, WcStatus, WrOpcode } from '../../../kernel-sim/device/ib.js';
import { SEND_WQE, SendRing, type SendWqe } from '../../../kernel-sim/device/send-ring.js';
import { DmaStatus, type DmaCompletion, type DmaDescriptor } from '../../../kernel-sim/pldma/types.js';
import { RcQueuePair } from '../../../kernel-sim/rc/qp.js';
import { mrRecord, RcTables, type RcMr } from '../../../kernel-sim/rc/tables.js';
import type { MemoryLike } from '../../../kernel-sim/memory.js';

const PD = { handle: 7, closed: false };
const LKEY = 0x1234;

// An MR record of the node's table: [0x1000, 0x9000) in PD 7.
const REGION: MemoryLike = { id: 1, address: 0x1000n, size: 0x8000, pageSize: 4096, closed: false, granule: 4096, observe() {}, unobserve() {} };
function mr(access: number): RcMr {
  return mrRecord({ key: LKEY, pd: PD, access, region: REGION, offset: 0, length: 0x8000 });
}

function tablesWithMr(): RcTables {
  const t = new RcTables();
  t.mrs.set(LKEY, mr(Access.LOCAL_WRITE));
  return t;
}

function completion(d: DmaDescriptor, status: DmaStatus): DmaCompletion {
  return {
    tid: 1,
    status,
    statusName: DmaStatus[status],
    descriptor: d,
    bytes: status === DmaStatus.SUCCESS ? d.length : 0,
    blocks: 1,
    faults: { source: 0, destination: 0 },
    retransmittedBlocks: 0,
    nacks: 0,
    pagesFetched: 0,
    model: { startUs: 0, endUs: 1, us: 1, label: 'modelled' },
    real: { us: 1 },
    ...(status === DmaStatus.SUCCESS ? {} : { side: 'destination' as const }),
  } as DmaCompletion;
}

function rig(opts: { depth?: number; maxWr?: number; sigAll?: boolean } = {}) {
  const posted: Array<{ desc: DmaDescriptor; answer: (s: DmaStatus) => void }> = [];
  const cancelled: number[] = [];
  const tables = new RcTables();
  const mrs = tables.mrs;
  mrs.set(LKEY, mr(Access.LOCAL_WRITE));
  const events: string[] = [];
  tables.events = (e) => void events.push(`${e.type} ${e.handle}`);
  const node = {
    id: 0,
    channels: 4,
    faultTimeoutMs: 100,
    tables,
    post: (desc: DmaDescriptor) => new Promise<DmaCompletion>((resolve) => posted.push({ desc, answer: (s) => resolve(completion(desc, s)) })),
    cancel: (qp: number) => {
      cancelled.push(qp);
      return true;
    },
  };
  const sq = new SendRing<SendWqe<{ dlid: number }>>(opts.maxWr ?? 8, 2);
  const cq = new CompletionRing(opts.depth ?? 16);
  const rc = new RcQueuePair({
    qpNum: 0x42,
    pd: PD,
    rq: undefined,
    recvCq: undefined,
    send: { node, qpType: QpType.RC, sq, sendCq: cq, sqSigAll: opts.sigAll ?? false },
  });
  rc.modify({
    state: QpState.RTS,
    destroyed: false,
    destNode: 1,
    destQpNum: 0x99,
    accessFlags: 0,
    minRnrTimer: 1,
    qkey: undefined,
    rnrRetry: 7,
    retryCnt: 7,
    timeout: 14,
  });
  // The CQEs written, read back from the ring's bytes.
  const cqes = () => {
    const out: Array<{ wrId: bigint; status: number; opcode: number; byteLen: number; qpNum: number; srcQp: number }> = [];
    while (cq.count > 0) {
      const at = cq.slot(cq.consumer);
      const v = cq.view;
      out.push({
        wrId: v.getBigUint64(at + CQE['wc.wr_id'], true),
        status: v.getUint32(at + CQE['wc.status'], true),
        opcode: v.getUint32(at + CQE['wc.opcode'], true),
        byteLen: v.getUint32(at + CQE['wc.byte_len'], true),
        qpNum: v.getUint32(at + CQE['wc.qp_num'], true),
        srcQp: v.getUint32(at + CQE['wc.src_qp'], true),
      });
      cq.consumed();
    }
    return out;
  };
  const write = (wrId: number, flags: number = SendFlags.SIGNALED, addr = 0x1000n): SendWqe<{ dlid: number }> => ({
    wrId,
    opcode: WrOpcode.RDMA_WRITE,
    sendFlags: flags,
    sgList: [{ addr, length: 64, lkey: LKEY }],
    rdma: { remoteAddr: 0x5000n, rkey: 0xabc },
  });
  return { rc, sq, cq, posted, cancelled, cqes, write, mrs, events };
}

const settle = () => new Promise((r) => setTimeout(r, 0));

describe('the device send queue (RcQueuePair from rings and tables)', () => {
  test('the doorbell posts each WQE; CQEs come in posting order, and a slot frees only at its completion', async () => {
    const r = rig();
    for (const id of [1, 2, 3]) r.sq.push(r.write(id));
    r.rc.doorbell();
    // Writes run behind writes: all three on the engine, the PSNs consecutive, this QP's channel.
    expect(r.posted.map((p) => p.desc.psn)).toEqual([0, 1, 2]);
    expect(r.posted.every((p) => p.desc.dstQp === 0x99 && p.desc.srcQp === 0x42 && p.desc.key === 0xabc)).toBe(true);
    expect(r.rc.sqOutstanding).toBe(3);
    // The third finishes first: nothing completes before the first has.
    r.posted[2]!.answer(DmaStatus.SUCCESS);
    await settle();
    expect(r.cq.count).toBe(0);
    expect(r.sq.consumer).toBe(0);
    r.posted[0]!.answer(DmaStatus.SUCCESS);
    await settle();
    expect(r.cqes().map((c) => c.wrId)).toEqual([1n]);
    expect(r.sq.consumer).toBe(1);
    r.posted[1]!.answer(DmaStatus.SUCCESS);
    await settle();
    const rest = r.cqes();
    expect(rest.map((c) => c.wrId)).toEqual([2n, 3n]);
    expect(
      rest.every(
        (c) => c.status === WcStatus.SUCCESS && c.opcode === WcOpcode.RDMA_WRITE && c.byteLen === 64 && c.qpNum === 0x42 && c.srcQp === 0x99,
      ),
    ).toBe(true);
    expect(r.rc.sqOutstanding).toBe(0);
  });

  test('an unsignalled WQE writes no CQE but frees its slot; sq_sig_all signals every one', async () => {
    const r = rig();
    r.sq.push(r.write(1, 0));
    r.sq.push(r.write(2));
    r.rc.doorbell();
    for (const p of r.posted) p.answer(DmaStatus.SUCCESS);
    await settle();
    expect(r.cqes().map((c) => c.wrId)).toEqual([2n]);
    expect(r.rc.sqOutstanding).toBe(0);
    const all = rig({ sigAll: true });
    all.sq.push(all.write(5, 0));
    all.rc.doorbell();
    all.posted[0]!.answer(DmaStatus.SUCCESS);
    await settle();
    expect(all.cqes().map((c) => c.wrId)).toEqual([5n]);
  });

  test('an error completes with its status, takes the QP to ERR and flushes the WQEs behind it', async () => {
    const r = rig();
    r.sq.push(r.write(1));
    r.sq.push(r.write(2, 0));
    r.sq.push({ wrId: 3, opcode: WrOpcode.SEND, sendFlags: SendFlags.SIGNALED, sgList: [{ addr: 0x1000n, length: 8, lkey: LKEY }] });
    r.rc.doorbell();
    // The SEND waits for the writes before it.
    expect(r.posted).toHaveLength(2);
    r.posted[0]!.answer(DmaStatus.DST_PERM_ERR);
    r.posted[1]!.answer(DmaStatus.SUCCESS);
    await settle();
    expect(r.rc.state).toBe(QpState.ERR);
    expect(r.cancelled).toEqual([0x42]);
    expect(r.events).toEqual(['qp-error 66']);
    const c = r.cqes();
    // The unsignalled write behind the error is flushed with a CQE, as is the SEND never started.
    expect(c.map((x) => [x.wrId, x.status])).toEqual([
      [1n, WcStatus.REM_ACCESS_ERR],
      [2n, WcStatus.WR_FLUSH_ERR],
      [3n, WcStatus.WR_FLUSH_ERR],
    ]);
    expect(c[2]!.opcode).toBe(WcOpcode.SEND);
    expect(r.posted).toHaveLength(2);
    expect(r.rc.sqOutstanding).toBe(0);
    // A WQE posted in ERR is flushed at the doorbell.
    r.sq.push(r.write(4));
    r.rc.doorbell();
    expect(r.cqes().map((x) => [x.wrId, x.status])).toEqual([[4n, WcStatus.WR_FLUSH_ERR]]);
  });

  test("an SGE outside the node's MR table, or of another PD, is LOC_PROT_ERR before anything is posted", async () => {
    const r = rig();
    r.mrs.set(0x777, { ...mr(Access.LOCAL_WRITE), pd: { handle: 8, closed: false } });
    r.sq.push(r.write(1, SendFlags.SIGNALED, 0x9000n));
    r.rc.doorbell();
    await settle();
    expect(r.posted).toHaveLength(0);
    expect(r.cqes().map((x) => [x.wrId, x.status])).toEqual([[1n, WcStatus.LOC_PROT_ERR]]);
    const other = rig();
    other.mrs.set(0x777, { ...mr(Access.LOCAL_WRITE), pd: { handle: 8, closed: false } });
    other.sq.push({ ...other.write(2), sgList: [{ addr: 0x1000n, length: 8, lkey: 0x777 }] });
    other.rc.doorbell();
    await settle();
    expect(other.posted).toHaveLength(0);
    expect(other.cqes()[0]!.status).toBe(WcStatus.LOC_PROT_ERR);
  });

  test('destroy flushes the WQEs in flight and queued, oldest first; their late outcomes are dropped', async () => {
    const r = rig();
    r.sq.push(r.write(1));
    r.sq.push({
      wrId: 2,
      opcode: WrOpcode.RDMA_READ,
      sendFlags: SendFlags.SIGNALED,
      sgList: [{ addr: 0x1000n, length: 8, lkey: LKEY }],
      rdma: { remoteAddr: 0x5000n, rkey: 1 },
    });
    r.rc.doorbell();
    r.rc.toError();
    r.rc.destroy();
    expect(r.cqes().map((x) => [x.wrId, x.status])).toEqual([
      [1n, WcStatus.WR_FLUSH_ERR],
      [2n, WcStatus.WR_FLUSH_ERR],
    ]);
    r.posted[0]!.answer(DmaStatus.SUCCESS);
    await settle();
    expect(r.cq.count).toBe(0);
    expect(r.sq.consumer).toBe(r.sq.producer);
  });

  test('a CQ that overruns is in error, tells its listener once, and takes the QP to ERR', async () => {
    const r = rig({ depth: 1 });
    const heard: string[] = [];
    r.cq.onEvent = (e) => heard.push(e === CqEvent.COMPLETION ? 'cqe' : 'overrun');
    r.sq.push(r.write(1));
    r.sq.push(r.write(2));
    r.rc.doorbell();
    for (const p of r.posted) p.answer(DmaStatus.SUCCESS);
    await settle();
    expect(heard).toEqual(['cqe', 'overrun']);
    expect(r.cq.error).toBe(true);
    expect(r.cq.overruns).toBe(1);
    expect(r.rc.state).toBe(QpState.ERR);
  });

  test('corrupt ring indices start nothing (the provider memory is not trusted)', () => {
    const r = rig();
    r.sq.push(r.write(1));
    // The producer index moved far past the ring's slots.
    new DataView(r.sq.buffer).setUint32(r.sq.offset + HEADER.producer_index, 1000, true);
    expect(r.sq.at(0)).toBeUndefined();
    r.rc.doorbell();
    expect(r.posted).toHaveLength(0);
  });

  test('a UD QP over a ring in memory it did not make, its WQE written as bytes, its AH named by handle', async () => {
    // The memory a provider in another process would map: a header written by the device, then slots.
    const own = new SendRing<SendWqe<{ dlid: number }>>(4, 1, { ud: true });
    const sq = new SendRing<SendWqe<{ dlid: number }>>(4, 1, { ud: true }, 0, { buffer: own.buffer, offset: own.offset });
    sq.setAh(7, { dlid: 1 });
    const cq = new CompletionRing(4);
    const posted: DmaDescriptor[] = [];
    const node = {
      id: 0,
      channels: 4,
      faultTimeoutMs: 100,
      tables: tablesWithMr(),
      post: (d: DmaDescriptor) => (posted.push(d), Promise.resolve(completion(d, DmaStatus.SUCCESS))),
      cancel: () => true,
    };
    const rc = new RcQueuePair({
      qpNum: 0x43,
      pd: PD,
      rq: undefined,
      recvCq: undefined,
      ud: true,
      send: { node, qpType: QpType.UD, sq, sendCq: cq, sqSigAll: true },
    });
    rc.modify({
      state: QpState.RTS,
      destroyed: false,
      destNode: -1,
      destQpNum: -1,
      accessFlags: 0,
      minRnrTimer: 1,
      qkey: 5,
      rnrRetry: 7,
      retryCnt: 7,
      timeout: 14,
    });
    // pfr_send_wqe by its offsets, as the C provider writes it, then the producer index.
    const v = new DataView(own.buffer);
    const at = own.slot(0);
    v.setBigUint64(at + SEND_WQE['wr.wr_id'], 77n, true);
    v.setUint32(at + SEND_WQE['wr.opcode'], WrOpcode.SEND, true);
    v.setUint32(at + SEND_WQE['wr.wr.ud.remote_qpn'], 0x55, true);
    v.setUint32(at + SEND_WQE['wr.wr.ud.remote_qkey'], 5, true);
    v.setUint32(at + SEND_WQE['wr.wr.ud.ah_handle'], 7, true);
    v.setUint32(at + SEND_WQE['dma.num_sge'], 1, true);
    v.setBigUint64(at + sendWqe.size + SGE.addr, 0x1000n, true);
    v.setUint32(at + sendWqe.size + SGE.length, 16, true);
    v.setUint32(at + sendWqe.size + SGE.lkey, LKEY, true);
    v.setUint32(own.offset + HEADER.producer_index, 1, true);
    rc.doorbell();
    expect(posted).toHaveLength(1);
    expect(posted[0]).toMatchObject({ dstNode: 1, dstQp: 0x55, qkey: 5, srcVa: 0x1000n, length: 16 });
    await settle();
    expect(cq.count).toBe(1);
    expect(new DataView(cq.buffer).getBigUint64(cq.slot(0) + CQE['wc.wr_id'], true)).toBe(77n);
    // The slot is the provider's again.
    expect(own.consumer).toBe(1);
  });
});
