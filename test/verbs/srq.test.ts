// Shared receive queues (ibv_create_srq, ibv_post_srq_recv, ibv_modify_srq): rdma-core's ODP
// SRQ traffic (tests/test_odp.py test_odp_rc_srq_traffic: 100 iterations of 1 KiB with both
// sides' buffers evicted before each) with two QPs sharing the server's SRQ, the limit event,
// and the error paths (overrun, a QP's own postRecv, RNR on an empty SRQ).
import { afterEach, describe, expect, test } from 'vitest';
import {
  AsyncEventType,
  Cluster,
  connectQps,
  QpState,
  SendFlags,
  SharedReceiveQueue,
  WcOpcode,
  WcStatus,
  WrOpcode,
  type AsyncEvent,
  type QueuePair,
} from '../../lib/index.js';
import { allBytes, closeAll, MSG, next, ODP_ACCESS, P, pollOk, region, thrown, track } from './helpers.js';

afterEach(closeAll);

/** Node 0: `clients` RC QPs (one PD, one ODP MR); node 1: as many QPs sharing one SRQ. */
function srqPlayers(clients: number, o: { maxWr?: number; srqLimit?: number; rnrRetry?: number; minRnrTimer?: number } = {}) {
  const cr = region(16 * P);
  const sr = region(16 * P);
  const cluster = track(Cluster.create({ nodes: 2 }));
  const cctx = cluster.openDevice(0);
  const sctx = cluster.openDevice(1);
  const cpd = cctx.allocPd();
  const spd = sctx.allocPd();
  const ccq = cctx.createCq(1000);
  const scq = sctx.createCq(1000);
  const cmr = cctx.regMr(cpd, cr, 0, cr.size, ODP_ACCESS);
  const smr = sctx.regMr(spd, sr, 0, sr.size, ODP_ACCESS);
  const srq = sctx.createSrq(spd, { maxWr: o.maxWr ?? 64, maxSge: 1, ...(o.srqLimit !== undefined ? { srqLimit: o.srqLimit } : {}) });
  const pairs: Array<{ c: QueuePair; s: QueuePair }> = [];
  for (let i = 0; i < clients; i++) {
    const c = cctx.createQp(cpd, { sendCq: ccq, recvCq: ccq });
    const s = sctx.createQp(spd, { sendCq: scq, recvCq: scq, srq });
    connectQps(c, s, { rnrRetry: o.rnrRetry ?? 7, minRnrTimer: o.minRnrTimer ?? 1 });
    pairs.push({ c, s });
  }
  return { cluster, cctx, sctx, cr, sr, ccq, scq, cmr, smr, srq, pairs };
}

describe('SRQ traffic with ODP (test_odp_rc_srq_traffic)', () => {
  test('two QPs share one SRQ: 100 iterations of 1 KiB, both sides evicted each time, data at the receiver, all success, faults in wc.odp', async () => {
    const t = srqPlayers(2);
    const { cr, sr, cmr, smr, srq, pairs, ccq, scq } = t;
    expect(t.sctx.queryDevice().odpCaps.rcOdpCaps & 32).toBe(32); // IBV_ODP_SUPPORT_SRQ_RECV
    // WQE k receives into page k of the server's region (wrId = k).
    const post = (k: number) => srq.postRecv({ wrId: k, sgList: [{ addr: sr.address + BigInt(k * P), length: MSG, lkey: smr.lkey }] });
    for (let k = 0; k < 4; k++) post(k);
    let destFaults = 0;
    for (let i = 0; i < 100; i++) {
      cr.evict();
      sr.evict();
      for (let q = 0; q < 2; q++) {
        const byte = 0x41 + ((i * 2 + q) % 26);
        new Uint8Array(cr.buffer, q * P, MSG).fill(byte);
        pairs[q]!.c.postSend({
          wrId: i,
          opcode: WrOpcode.SEND,
          sgList: [{ addr: cr.address + BigInt(q * P), length: MSG, lkey: cmr.lkey }],
          sendFlags: SendFlags.SIGNALED,
        });
        const cs = await pollOk(ccq);
        expect(cs.opcode).toBe(WcOpcode.SEND);
        const r = await pollOk(scq);
        expect(r.opcode).toBe(WcOpcode.RECV);
        expect(r.byteLen).toBe(MSG);
        // The completion is the receiving QP's, on its own CQ, from its own peer.
        expect(r.qpNum).toBe(pairs[q]!.s.qpNum);
        expect(r.srcQp).toBe(pairs[q]!.c.qpNum);
        const k = Number(r.wrId);
        allBytes(Buffer.from(sr.buffer, k * P, MSG), byte);
        // The receive page was evicted: the SEND faulted there once and was sent again.
        expect(cs.odp!.faults).toEqual({ source: 0, destination: 1 });
        destFaults += r.odp!.faults.destination;
        post(k);
      }
    }
    expect(destFaults).toBe(200);
    expect(srq.length).toBe(4);
  });

  test('a WRITE with immediate takes its receive from the SRQ too', async () => {
    const { cr, sr, cmr, smr, srq, pairs, ccq, scq } = srqPlayers(1);
    srq.postRecv({ wrId: 7, sgList: [] });
    new Uint8Array(cr.buffer, 0, MSG).fill(0x5a);
    pairs[0]!.c.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_WRITE_WITH_IMM,
      sgList: [{ addr: cr.address, length: MSG, lkey: cmr.lkey }],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: sr.address, rkey: smr.rkey },
      immData: 0xabc,
    });
    await pollOk(ccq);
    const r = await pollOk(scq);
    expect(r.opcode).toBe(WcOpcode.RECV_RDMA_WITH_IMM);
    expect(r.wrId).toBe(7n);
    expect(r.immData).toBe(0xabc);
    allBytes(Buffer.from(sr.buffer, 0, MSG), 0x5a);
    expect(srq.length).toBe(0);
  });
});

describe('the SRQ limit event', () => {
  test('armed by modify({ srqLimit }): IBV_EVENT_SRQ_LIMIT_REACHED once the WQEs fall below it, then disarmed', async () => {
    const t = srqPlayers(1, { maxWr: 8 });
    const { cr, sr, cmr, smr, srq, pairs, ccq, scq, sctx } = t;
    const events: AsyncEvent[] = [];
    sctx.onAsyncEvent((e) => events.push(e));
    for (let k = 0; k < 8; k++) srq.postRecv({ wrId: k, sgList: [{ addr: sr.address + BigInt(k * 512), length: 512, lkey: smr.lkey }] });
    srq.modify({ srqLimit: 4 });
    expect(srq.query()).toEqual({ maxWr: 8, maxSge: 1, srqLimit: 4 });
    const send = async (i: number) => {
      pairs[0]!.c.postSend({
        wrId: i,
        opcode: WrOpcode.SEND,
        sgList: [{ addr: cr.address, length: 64, lkey: cmr.lkey }],
        sendFlags: SendFlags.SIGNALED,
      });
      await pollOk(ccq);
      await pollOk(scq);
    };
    for (let i = 0; i < 4; i++) await send(i); // 8 → 4 left: not below the limit
    expect(events).toHaveLength(0);
    await send(4); // 3 left
    expect(events.map((e) => [e.eventType, e.name, e.srq])).toEqual([[AsyncEventType.SRQ_LIMIT_REACHED, 'IBV_EVENT_SRQ_LIMIT_REACHED', srq]]);
    expect(srq.query().srqLimit).toBe(0);
    await send(5); // disarmed: no second event
    expect(sctx.pollAsyncEvents()).toHaveLength(1);
  });
});

describe('SRQ error paths', () => {
  test('an overrun is refused with ENOMEM and queues nothing; the bad attributes and uses are refused with the fix', () => {
    const { srq, pairs, sr, smr, sctx } = srqPlayers(1, { maxWr: 4 });
    const wr = (k: number) => ({ wrId: k, sgList: [{ addr: sr.address, length: 64, lkey: smr.lkey }] });
    srq.postRecv([wr(0), wr(1), wr(2)]);
    const e = thrown(() => srq.postRecv([wr(3), wr(4)]));
    expect(e.code).toBe('ENOMEM');
    expect(e.syscall).toBe('ibv_post_srq_recv');
    expect(e.message).toMatch(/at most 4 WQEs/);
    expect(srq.length).toBe(3);
    expect(thrown(() => srq.postRecv({ wrId: -1, sgList: [] })).code).toBe('EINVAL');
    expect(thrown(() => srq.modify({ srqLimit: 5 })).message).toMatch(/srqLimit 5 exceeds maxWr 4/);
    expect(thrown(() => srq.modify({ maxWr: 2 })).message).toMatch(/below the 3 WQEs/);
    const own = thrown(() => pairs[0]!.s.postRecv(wr(9)));
    expect(own.code).toBe('EINVAL');
    expect(own.message).toMatch(/srq\.postRecv/);
    expect(thrown(() => srq.destroy()).code).toBe('EBUSY');
    const otherPd = sctx.allocPd();
    const cq = sctx.createCq(4);
    expect(thrown(() => sctx.createQp(otherPd, { sendCq: cq, recvCq: cq, srq })).message).toMatch(/another protection domain/);
    expect(thrown(() => sctx.createQp(otherPd, { sendCq: cq, recvCq: cq, srq: {} as SharedReceiveQueue })).code).toBe('EINVAL');
    pairs[0]!.s.destroy();
    srq.destroy();
    expect(srq.destroyed).toBe(true);
    expect(thrown(() => srq.postRecv(wr(0))).code).toBe('ERR_PFR_CLOSED');
  });

  test('an empty SRQ answers RNR: RNR_RETRY_EXC_ERR with a small rnrRetry, delivery once a WQE is posted with rnrRetry 7', async () => {
    const short = srqPlayers(1, { rnrRetry: 1, minRnrTimer: 1 });
    short.pairs[0]!.c.postSend({ wrId: 1, opcode: WrOpcode.SEND, sgList: [{ addr: short.cr.address, length: 64, lkey: short.cmr.lkey }] });
    expect((await next(short.ccq)).status).toBe(WcStatus.RNR_RETRY_EXC_ERR);

    const t = srqPlayers(1);
    new Uint8Array(t.cr.buffer, 0, 64).fill(0x33);
    t.pairs[0]!.c.postSend({
      wrId: 2,
      opcode: WrOpcode.SEND,
      sgList: [{ addr: t.cr.address, length: 64, lkey: t.cmr.lkey }],
      sendFlags: SendFlags.SIGNALED,
    });
    await new Promise((r) => setTimeout(r, 20));
    expect(t.scq.poll(1)).toHaveLength(0);
    t.srq.postRecv({ wrId: 5, sgList: [{ addr: t.sr.address, length: 64, lkey: t.smr.lkey }] });
    expect((await pollOk(t.ccq)).wrId).toBe(2n);
    expect((await pollOk(t.scq)).wrId).toBe(5n);
    allBytes(Buffer.from(t.sr.buffer, 0, 64), 0x33);
  });

  test('a QP going to ERR flushes the receive its message took off the SRQ, and leaves the others to the other QPs', async () => {
    const { srq, pairs, cr, cmr, sr, smr, scq, ccq } = srqPlayers(2);
    srq.postRecv([
      { wrId: 1, sgList: [{ addr: sr.address, length: 64, lkey: smr.lkey }] },
      { wrId: 2, sgList: [{ addr: sr.address + BigInt(P), length: 64, lkey: smr.lkey }] },
    ]);
    // Right after the SEND's first packet takes WQE 1 off the SRQ's ring on the device (before
    // its bytes land), the QP goes to ERR.
    const ring = srq.rc.ring;
    const shift = ring.shift.bind(ring);
    ring.shift = () => {
      const wqe = shift();
      queueMicrotask(() => pairs[0]!.s.modify({ qpState: QpState.ERR }));
      return wqe;
    };
    pairs[0]!.c.postSend({ wrId: 1, opcode: WrOpcode.SEND, sgList: [{ addr: cr.address, length: 64, lkey: cmr.lkey }] });
    const flushed = await next(scq);
    expect([flushed.wrId, flushed.status, flushed.qpNum]).toEqual([1n, WcStatus.WR_FLUSH_ERR, pairs[0]!.s.qpNum]);
    expect(srq.length).toBe(1);
    expect((await next(ccq)).status).not.toBe(WcStatus.SUCCESS);
    ring.shift = shift;
    // WQE 2 is still the SRQ's: the other QP receives into it.
    new Uint8Array(cr.buffer, P, 64).fill(0x44);
    pairs[1]!.c.postSend({ wrId: 3, opcode: WrOpcode.SEND, sgList: [{ addr: cr.address + BigInt(P), length: 64, lkey: cmr.lkey }] });
    const r = await pollOk(scq);
    expect([r.wrId, r.qpNum]).toEqual([2n, pairs[1]!.s.qpNum]);
    allBytes(Buffer.from(sr.buffer, P, 64), 0x44);
  });
});
