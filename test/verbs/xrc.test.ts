// XRC (ibv_open_xrcd, XRC SRQs, IBV_QPT_XRC_SEND / XRC_RECV): rdma-core's XRC pattern, two QP
// pairs sharing one XRC SRQ, run as its ODP suite runs traffic (100 iterations of 1 KiB, both
// sides evicted before each, data checked at the receiver, every status success, the faults in
// wc.odp); then an XRC WR naming no SRQ, or one that does not exist, and the other misuses.
import { afterEach, describe, expect, test } from 'vitest';
import { Cluster, connectQps, OdpTransportCaps, QpType, SendFlags, SrqType, WcOpcode, WcStatus, WrOpcode, type SendWr } from '../../lib/index.js';
import { allBytes, closeAll, MSG, next, ODP_ACCESS, P, pollOk, region, thrown, track } from './helpers.js';

afterEach(closeAll);

/** Node 0: `pairs` XRC_SEND QPs; node 1: as many XRC_RECV QPs in one XRC domain, one XRC SRQ with its own CQ. */
function xrcPlayers(pairs = 2) {
  const cr = region(16 * P);
  const sr = region(16 * P);
  const cluster = track(Cluster.create({ nodes: 2 }));
  const cctx = cluster.openDevice(0);
  const sctx = cluster.openDevice(1);
  const cpd = cctx.allocPd();
  const spd = sctx.allocPd();
  const ccq = cctx.createCq(1000);
  const srqCq = sctx.createCq(1000);
  const cmr = cctx.regMr(cpd, cr, 0, cr.size, ODP_ACCESS);
  const smr = sctx.regMr(spd, sr, 0, sr.size, ODP_ACCESS);
  const xrcd = sctx.openXrcd();
  const srq = sctx.createSrq(spd, { srqType: SrqType.XRC, xrcd, cq: srqCq, maxWr: 64, maxSge: 1 });
  const qps = Array.from({ length: pairs }, () => {
    const ini = cctx.createQp(cpd, { qpType: QpType.XRC_SEND, sendCq: ccq });
    const tgt = sctx.createQp(spd, { qpType: QpType.XRC_RECV, xrcd });
    connectQps(ini, tgt);
    return { ini, tgt };
  });
  return { cluster, cctx, sctx, cr, sr, cmr, smr, ccq, srqCq, xrcd, srq, qps };
}

describe('XRC traffic with ODP: two QP pairs share one XRC SRQ', () => {
  test('100 iterations of 1 KiB per pair, both sides evicted each time: completions on the SRQ CQ naming each target QP, data at the receiver, faults in wc.odp', async () => {
    const { cr, sr, cmr, smr, ccq, srqCq, srq, qps } = xrcPlayers(2);
    expect(srq.srqNum).toBeGreaterThan(0);
    const post = (k: number) => srq.postRecv({ wrId: k, sgList: [{ addr: sr.address + BigInt(k * P), length: MSG, lkey: smr.lkey }] });
    for (let k = 0; k < 4; k++) post(k);
    for (let i = 0; i < 100; i++) {
      cr.evict();
      sr.evict();
      for (let q = 0; q < 2; q++) {
        const byte = 0x41 + ((2 * i + q) % 26);
        new Uint8Array(cr.buffer, q * P, MSG).fill(byte);
        qps[q]!.ini.postSend({
          wrId: i,
          opcode: WrOpcode.SEND,
          sgList: [{ addr: cr.address + BigInt(q * P), length: MSG, lkey: cmr.lkey }],
          sendFlags: SendFlags.SIGNALED,
          xrc: { remoteSrqn: srq.srqNum! },
        });
        const s = await pollOk(ccq);
        expect(s.opcode).toBe(WcOpcode.SEND);
        expect(s.odp!.faults).toEqual({ source: 0, destination: 1 });
        const r = await pollOk(srqCq);
        expect([r.opcode, r.byteLen, r.qpNum, r.srcQp]).toEqual([WcOpcode.RECV, MSG, qps[q]!.tgt.qpNum, qps[q]!.ini.qpNum]);
        allBytes(Buffer.from(sr.buffer, Number(r.wrId) * P, MSG), byte);
        post(Number(r.wrId));
      }
    }
  });

  test('an RDMA WRITE through an XRC pair lands under the target QP and the rkey', async () => {
    const { cr, sr, cmr, smr, ccq, srq, qps } = xrcPlayers(1);
    new Uint8Array(cr.buffer, 0, MSG).fill(0x6b);
    qps[0]!.ini.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [{ addr: cr.address, length: MSG, lkey: cmr.lkey }],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: sr.address + BigInt(3 * P), rkey: smr.rkey },
      xrc: { remoteSrqn: srq.srqNum! },
    });
    await pollOk(ccq);
    allBytes(Buffer.from(sr.buffer, 3 * P, MSG), 0x6b);
  });
});

describe('XRC error paths', () => {
  test('an XRC WR naming no SRQ is refused at post time; naming one the target domain lacks completes REM_INV_REQ_ERR', async () => {
    const { cr, cmr, ccq, srq, qps } = xrcPlayers(1);
    const wr: SendWr = { wrId: 1, opcode: WrOpcode.SEND, sgList: [{ addr: cr.address, length: 64, lkey: cmr.lkey }], sendFlags: SendFlags.SIGNALED };
    const e = thrown(() => qps[0]!.ini.postSend(wr)) as Error & { field?: string };
    expect([(e as Error & { code?: string }).code, e.field]).toEqual(['EINVAL', 'xrc.remoteSrqn']);
    expect(e.message).toMatch(/must name the XRC SRQ/);
    srq.postRecv({ wrId: 9, sgList: [] });
    qps[0]!.ini.postSend({ ...wr, xrc: { remoteSrqn: srq.srqNum! + 100 } });
    expect((await next(ccq)).status).toBe(WcStatus.REM_INV_REQ_ERR);
  });

  test('misuses are refused with the fix', () => {
    const { cctx, sctx, xrcd, srq, qps, srqCq } = xrcPlayers(1);
    const spd = srq.pd;
    expect(thrown(() => sctx.createSrq(spd, { srqType: SrqType.XRC, cq: srqCq })).message).toMatch(/needs xrcd/);
    expect(thrown(() => sctx.createSrq(spd, { srqType: SrqType.XRC, xrcd })).message).toMatch(/needs cq/);
    expect(thrown(() => sctx.createSrq(spd, { xrcd })).message).toMatch(/for XRC SRQs/);
    expect(thrown(() => sctx.createQp(spd, { qpType: QpType.XRC_RECV })).message).toMatch(/needs xrcd/);
    expect(thrown(() => sctx.createQp(spd, { qpType: 'XRC_SEND', sendCq: srqCq, srq })).message).toMatch(/XRC QP takes no srq|named by XRC requests/);
    expect(thrown(() => qps[0]!.tgt.postSend({ wrId: 1, opcode: WrOpcode.SEND, sgList: [] })).message).toMatch(/only receives/);
    expect(thrown(() => qps[0]!.ini.postRecv({ wrId: 1, sgList: [] })).message).toMatch(/no receive queue/);
    const rcCq = cctx.createCq(4);
    const rcPd = cctx.allocPd();
    const rc = cctx.createQp(rcPd, { sendCq: rcCq, recvCq: rcCq });
    connectQps(rc, cctx.createQp(rcPd, { sendCq: rcCq, recvCq: rcCq }));
    expect(
      (thrown(() => rc.postSend({ wrId: 1, opcode: WrOpcode.SEND, sgList: [], xrc: { remoteSrqn: 1 } })) as Error & { field?: string }).field,
    ).toBe('xrc');
    expect(thrown(() => xrcd.close()).code).toBe('EBUSY');
    qps[0]!.tgt.destroy();
    srq.destroy();
    xrcd.close();
    expect(xrcd.closed).toBe(true);
  });
});

describe('XRC as libibverbs has it (issue 35)', () => {
  test('queryDevice().odpCaps.xrcOdpCaps reports what XRC over ODP supports: SEND, WRITE, READ, ATOMIC, SRQ_RECV, not RECV', () => {
    const { cctx } = xrcPlayers(1);
    const x = cctx.queryDevice().odpCaps.xrcOdpCaps;
    for (const bit of [OdpTransportCaps.SEND, OdpTransportCaps.WRITE, OdpTransportCaps.READ, OdpTransportCaps.ATOMIC, OdpTransportCaps.SRQ_RECV])
      expect(x & bit, String(bit)).toBe(bit);
    expect(x & OdpTransportCaps.RECV).toBe(0);
  });

  test('0 receive caps are taken by XRC_SEND, XRC_RECV and SRQ-attached QPs; a bad cap is EINVAL naming it', () => {
    const { cctx, sctx, xrcd } = xrcPlayers(1);
    const pd = cctx.allocPd();
    const cq = cctx.createCq(8);
    const ini = cctx.createQp(pd, { qpType: QpType.XRC_SEND, sendCq: cq, cap: { maxSendWr: 16, maxRecvWr: 0, maxRecvSge: 0 } });
    expect(ini.cap).toMatchObject({ maxSendWr: 16, maxRecvWr: 0, maxRecvSge: 0 });
    const tgt = sctx.createQp(sctx.allocPd(), { qpType: QpType.XRC_RECV, xrcd, cap: { maxRecvWr: 0, maxRecvSge: 0 } });
    expect(tgt.cap.maxRecvWr).toBe(0);
    const srq = cctx.createSrq(pd, { maxWr: 8, maxSge: 1 });
    const onSrq = cctx.createQp(pd, { sendCq: cq, recvCq: cq, srq, cap: { maxRecvWr: 0, maxRecvSge: 0 } });
    expect(onSrq.cap.maxRecvWr).toBe(0);
    // A QP with a receive queue of its own needs one entry; any cap out of range is EINVAL.
    for (const cap of [{ maxRecvWr: 0 }, { maxSendWr: 0 }, { maxSendSge: 17 }, { maxRecvSge: -1 }, { maxSendWr: 1.5 }]) {
      const e = thrown(() => cctx.createQp(pd, { sendCq: cq, recvCq: cq, cap }));
      expect(e.code, JSON.stringify(cap)).toBe('EINVAL');
      expect(e.syscall).toBe('ibv_create_qp');
      expect(e.message).toContain(`cap.${Object.keys(cap)[0]}`);
    }
  });
});
