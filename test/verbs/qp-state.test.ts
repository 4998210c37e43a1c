// The RC QP state machine of ibv_modify_qp: RESET → INIT → RTR → RTS (and SQD), ERR from
// anywhere (posted work flushed), RESET from anywhere (and back up again). Invalid
// transitions and posting in the wrong state fail at once with EINVAL, like libibverbs.
import { afterEach, describe, expect, test } from 'vitest';
import { Access, connectQps, deregMr, pollCq, QP_DEFAULTS, QpState, QpType, SendFlags, WcOpcode, WcStatus, WrOpcode } from '../../lib/index.js';
import { allBytes, closeAll, createPlayers, next, pollOk, sleep, thrown } from './helpers.js';

afterEach(closeAll);

const init = { qpState: QpState.INIT, portNum: 1, qpAccessFlags: Access.LOCAL_WRITE | Access.REMOTE_WRITE };

describe('bring-up', () => {
  test('a new QP is in RESET; connectQps moves both through INIT → RTR → RTS with rdma-core defaults', () => {
    const { client, server } = createPlayers({ connect: false });
    expect(client.qp.state).toBe(QpState.RESET);
    expect(client.qp.qpType).toBe(QpType.RC);
    expect(client.qp.qpNum).not.toBe(server.qp.qpNum);
    connectQps(client.qp, server.qp);
    for (const [a, b] of [
      [client, server],
      [server, client],
    ] as const) {
      const q = a.qp.query();
      expect(q.qpState).toBe(QpState.RTS);
      expect(q).toMatchObject({
        destQpNum: b.qp.qpNum,
        destNode: b.ctx.node,
        timeout: QP_DEFAULTS.timeout,
        retryCnt: QP_DEFAULTS.retryCnt,
        rnrRetry: 7,
        minRnrTimer: 12,
      });
    }
  });

  test("createQp takes { type: 'RC' } (or qpType) and refuses transports not modelled (UC) with EOPNOTSUPP", () => {
    const { client } = createPlayers({ connect: false });
    const qp = client.ctx.createQp(client.pd, { type: 'RC', sendCq: client.cq, recvCq: client.cq });
    expect(qp.qpType).toBe(QpType.RC);
    expect(thrown(() => client.ctx.createQp(client.pd, { type: 3 as QpType, sendCq: client.cq, recvCq: client.cq })).code).toBe('EOPNOTSUPP');
    qp.destroy();
  });

  test('step by step, with the attributes each state needs', async () => {
    const { client, server } = createPlayers({ connect: false });
    for (const [a, b] of [
      [client, server],
      [server, client],
    ] as const) {
      a.qp.modify(init);
      expect(a.qp.state).toBe(QpState.INIT);
      a.qp.modify({ qpState: QpState.INIT, qpAccessFlags: init.qpAccessFlags }); // INIT → INIT is allowed
      a.qp.modify({ qpState: QpState.RTR, destQpNum: b.qp.qpNum, destNode: b.ctx.node, minRnrTimer: 3 });
      expect(a.qp.state).toBe(QpState.RTR);
      a.qp.modify({ qpState: QpState.RTS, rnrRetry: 5, retryCnt: 6, timeout: 10 });
      expect(a.qp.query()).toMatchObject({ qpState: QpState.RTS, rnrRetry: 5, retryCnt: 6, timeout: 10, minRnrTimer: 3 });
    }
    client.fill(0x41);
    client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [client.sge()],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    await pollOk(client.cq);
    allBytes(server.bytes(), 0x41);
  });

  test('receives may be posted in INIT and RTR; a responder in RTR accepts a SEND', async () => {
    const { client, server } = createPlayers({ connect: false });
    server.qp.modify(init);
    server.qp.postRecv({ wrId: 1, sgList: [server.sge()] });
    server.qp.modify({ qpState: QpState.RTR, destQpNum: client.qp.qpNum, destNode: 0 });
    client.qp.modify(init);
    client.qp.modify({ qpState: QpState.RTR, destQpNum: server.qp.qpNum, destNode: 1 });
    client.qp.modify({ qpState: QpState.RTS });
    client.fill(0x42);
    client.qp.postSend({ wrId: 2, opcode: WrOpcode.SEND, sgList: [client.sge()], sendFlags: SendFlags.SIGNALED });
    await pollOk(client.cq);
    expect((await pollOk(server.cq)).wrId).toBe(1n);
    allBytes(server.bytes(), 0x42);
  });

  test('RTS ↔ SQD', () => {
    const { client } = createPlayers();
    client.qp.modify({ qpState: QpState.SQD });
    expect(client.qp.state).toBe(QpState.SQD);
    client.qp.modify({ qpState: QpState.RTS });
    expect(client.qp.state).toBe(QpState.RTS);
  });

  test('a responder in SQD still answers: a WRITE, a READ and a SEND to it succeed', async () => {
    // SQD drains the send queue only: receive processing goes on (IBA 10.3.1).
    const { client, server } = createPlayers();
    server.qp.modify({ qpState: QpState.SQD });
    server.qp.postRecv({ wrId: 5, sgList: [server.sge(256, 64)] });
    server.fill(0x22, 128, 64);
    client.fill(0x61, 0, 64);
    const rdma = (at: number) => ({ remoteAddr: server.at(at), rkey: server.mr.rkey });
    client.qp.postSend([
      { wrId: 1, opcode: WrOpcode.RDMA_WRITE, sgList: [client.sge(0, 64)], sendFlags: SendFlags.SIGNALED, rdma: rdma(0) },
      { wrId: 2, opcode: WrOpcode.RDMA_READ, sgList: [client.sge(128, 64)], sendFlags: SendFlags.SIGNALED, rdma: rdma(128) },
      { wrId: 3, opcode: WrOpcode.SEND, sgList: [client.sge(0, 64)], sendFlags: SendFlags.SIGNALED },
    ]);
    for (const wrId of [1n, 2n, 3n]) expect((await pollOk(client.cq)).wrId).toBe(wrId);
    expect((await pollOk(server.cq)).wrId).toBe(5n);
    allBytes(server.bytes(0, 64), 0x61);
    allBytes(client.bytes(128, 64), 0x22);
    allBytes(server.bytes(256, 64), 0x61);
    expect(server.qp.state).toBe(QpState.SQD);
  });

  test('SQD finishes the WR in progress; WRs posted before it started or during SQD wait for RTS', async () => {
    const { client, server } = createPlayers();
    server.qp.postRecv([
      { wrId: 1, sgList: [server.sge(0, 64)] },
      { wrId: 2, sgList: [server.sge(64, 64)] },
      { wrId: 3, sgList: [server.sge(128, 64)] },
    ]);
    client.fill(0x51);
    const send = (wrId: number, at: number) =>
      client.qp.postSend({ wrId, opcode: WrOpcode.SEND, sgList: [client.sge(at, 64)], sendFlags: SendFlags.SIGNALED });
    send(10, 0);
    await new Promise((r) => setImmediate(r)); // the requester has taken it: in progress
    client.qp.modify({ qpState: QpState.SQD });
    const first = await pollOk(client.cq);
    expect(first.wrId).toBe(10n);
    expect(client.qp.state).toBe(QpState.SQD); // completed while drained, not after RTS
    expect((await pollOk(server.cq)).wrId).toBe(1n);

    // Posted in SQD (allowed, as with rdma_rxe): queued, not started.
    send(11, 64);
    send(12, 128);
    await sleep(50);
    expect(client.cq.length).toBe(0);
    expect(server.cq.length).toBe(0);
    expect(server.bytes(64, 128).every((b) => b === 0)).toBe(true);
    client.qp.modify({ qpState: QpState.RTS });
    expect([(await pollOk(client.cq)).wrId, (await pollOk(client.cq)).wrId]).toEqual([11n, 12n]);
    expect([(await pollOk(server.cq)).wrId, (await pollOk(server.cq)).wrId]).toEqual([2n, 3n]);
    allBytes(server.bytes(0, 192), 0x51);
  });

  test('WRs queued in SQD are flushed in order when the QP goes to ERR', async () => {
    const { client } = createPlayers();
    client.qp.modify({ qpState: QpState.SQD });
    for (const wrId of [1, 2]) client.qp.postSend({ wrId, opcode: WrOpcode.SEND, sgList: [client.sge(0, 8)], sendFlags: SendFlags.SIGNALED });
    client.qp.modify({ qpState: QpState.ERR });
    const wcs = [await next(client.cq), await next(client.cq)];
    expect(wcs.map((w) => [w.wrId, w.status])).toEqual([
      [1n, WcStatus.WR_FLUSH_ERR],
      [2n, WcStatus.WR_FLUSH_ERR],
    ]);
  });
});

describe('invalid transitions and posting in the wrong state: EINVAL', () => {
  const code = (fn: () => unknown) => thrown(fn).code;

  test('skipping states, going back, unknown states', () => {
    const { client, server } = createPlayers({ connect: false });
    const q = client.qp;
    expect(code(() => q.modify({ qpState: QpState.RTR, destQpNum: server.qp.qpNum, destNode: 1 }))).toBe('EINVAL'); // RESET → RTR
    expect(code(() => q.modify({ qpState: QpState.RTS }))).toBe('EINVAL'); // RESET → RTS
    expect(code(() => q.modify({ qpState: QpState.SQD }))).toBe('EINVAL');
    expect(code(() => q.modify({ qpState: 42 as QpState }))).toBe('EINVAL');
    q.modify(init);
    expect(code(() => q.modify({ qpState: QpState.RTS }))).toBe('EINVAL'); // INIT → RTS
    expect(code(() => q.modify({ qpState: QpState.RTR }))).toBe('EINVAL'); // RTR without the remote QP
    q.modify({ qpState: QpState.RTR, destQpNum: server.qp.qpNum, destNode: 1 });
    expect(code(() => q.modify({ qpState: QpState.INIT }))).toBe('EINVAL'); // RTR → INIT
    q.modify({ qpState: QpState.RTS });
    expect(code(() => q.modify({ qpState: QpState.RTR }))).toBe('EINVAL'); // RTS → RTR
    expect(code(() => q.modify({ qpState: QpState.INIT }))).toBe('EINVAL');
    expect(q.state).toBe(QpState.RTS); // failed modifies changed nothing
    const e = thrown(() => q.modify({ qpState: QpState.INIT }));
    expect(e.syscall).toBe('ibv_modify_qp');
    expect(e.message).toMatch(/RTS to INIT/);
  });

  test('ERR accepts nothing but RESET', () => {
    const { client } = createPlayers();
    client.qp.modify({ qpState: QpState.ERR });
    for (const s of [QpState.INIT, QpState.RTR, QpState.RTS, QpState.SQD]) expect(code(() => client.qp.modify({ qpState: s }))).toBe('EINVAL');
    client.qp.modify({ qpState: QpState.RESET });
    expect(client.qp.state).toBe(QpState.RESET);
  });

  test('postSend in RESET, INIT and RTR; postRecv in RESET', () => {
    const { client, server } = createPlayers({ connect: false });
    const wr = { wrId: 1, opcode: WrOpcode.SEND, sgList: [client.sge()] };
    expect(code(() => client.qp.postSend(wr))).toBe('EINVAL');
    expect(thrown(() => client.qp.postSend(wr)).syscall).toBe('ibv_post_send');
    expect(code(() => client.qp.postRecv({ wrId: 1, sgList: [client.sge()] }))).toBe('EINVAL');
    client.qp.modify(init);
    expect(code(() => client.qp.postSend(wr))).toBe('EINVAL');
    client.qp.modify({ qpState: QpState.RTR, destQpNum: server.qp.qpNum, destNode: 1 });
    expect(code(() => client.qp.postSend(wr))).toBe('EINVAL');
    expect(client.cq.length).toBe(0); // nothing was queued
  });

  test('malformed work requests', () => {
    const { client, server } = createPlayers({ cap: { maxSendWr: 2, maxSendSge: 1 } });
    const sge = client.sge();
    expect(code(() => client.qp.postSend({ wrId: 1, opcode: 99 as WrOpcode, sgList: [sge] }))).toBe('EINVAL');
    expect(code(() => client.qp.postSend({ wrId: 1, opcode: WrOpcode.SEND, sgList: [sge, sge] }))).toBe('EINVAL'); // > maxSendSge
    expect(code(() => client.qp.postSend({ wrId: 1, opcode: WrOpcode.RDMA_WRITE, sgList: [sge] }))).toBe('EINVAL'); // no wr.rdma
    expect(code(() => client.qp.postSend({ wrId: 1, opcode: WrOpcode.ATOMIC_FETCH_AND_ADD, sgList: [client.sge(0, 8)] }))).toBe('EINVAL'); // no wr.atomic
    expect(code(() => client.qp.postSend({ wrId: 1, opcode: WrOpcode.SEND, sgList: [{ addr: 5 as unknown as bigint, length: 1, lkey: 1 }] }))).toBe(
      'EINVAL',
    );
    const wr = { wrId: 1, opcode: WrOpcode.RDMA_WRITE, sgList: [sge], rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey } };
    expect(code(() => client.qp.postSend([wr, wr, wr]))).toBe('ENOMEM'); // > maxSendWr
  });
});

describe('ERR and RESET', () => {
  test('modify to ERR flushes posted receives, and later sends', async () => {
    const { client } = createPlayers();
    client.qp.postRecv([
      { wrId: 1, sgList: [client.sge()] },
      { wrId: 2, sgList: [client.sge()] },
    ]);
    client.qp.modify({ qpState: QpState.ERR });
    const a = await next(client.cq, 2000);
    const b = await next(client.cq, 2000);
    expect([a, b].map((w) => [w.wrId, w.status, w.opcode])).toEqual([
      [1n, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV],
      [2n, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV],
    ]);
    client.qp.postSend({ wrId: 3, opcode: WrOpcode.SEND, sgList: [client.sge()] }); // unsignaled: flushed anyway
    expect(await next(client.cq, 2000)).toMatchObject({ wrId: 3n, status: WcStatus.WR_FLUSH_ERR, opcode: WcOpcode.SEND });
  });

  test('modify to ERR ends a SEND sleeping out an RNR timer at once, and the QP, reset, runs new work at once', async () => {
    // minRnrTimer 0 is the longest RNR timer: 655.36 ms between retries (rnrRetry 7: forever).
    const { client, server } = createPlayers({ rc: { minRnrTimer: 0 } });
    client.qp.postSend({ wrId: 1, opcode: WrOpcode.SEND, sgList: [client.sge(0, 64)], sendFlags: SendFlags.SIGNALED });
    await sleep(50); // the first RNR NAK is back: the requester sleeps
    client.qp.modify({ qpState: QpState.ERR });
    // Well before the timer would have woken it.
    expect(await next(client.cq, 300)).toMatchObject({ wrId: 1n, status: WcStatus.WR_FLUSH_ERR });
    for (const q of [client.qp, server.qp]) q.modify({ qpState: QpState.RESET });
    connectQps(client.qp, server.qp);
    server.qp.postRecv({ wrId: 7, sgList: [server.sge(0, 64)] });
    client.fill(0x62, 0, 64);
    client.qp.postSend({ wrId: 2, opcode: WrOpcode.SEND, sgList: [client.sge(0, 64)], sendFlags: SendFlags.SIGNALED });
    expect((await pollOk(client.cq, 300)).wrId).toBe(2n);
    expect((await pollOk(server.cq)).wrId).toBe(7n);
    allBytes(server.bytes(0, 64), 0x62);
  });

  test('a SEND to a peer in ERR is never answered: RETRY_EXC_ERR, and the requester goes to ERR too', async () => {
    const { client, server } = createPlayers();
    server.qp.modify({ qpState: QpState.ERR });
    client.qp.postSend({ wrId: 1, opcode: WrOpcode.SEND, sgList: [client.sge()], sendFlags: SendFlags.SIGNALED });
    const wc = await next(client.cq, 2000);
    expect(wc.status).toBe(WcStatus.RETRY_EXC_ERR);
    expect(client.qp.state).toBe(QpState.ERR);
  });

  test('ERR → RESET → INIT → RTR → RTS: the QP pair works again', async () => {
    const { client, server } = createPlayers();
    client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [client.sge()],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: server.at(0), rkey: 0x7ff },
    });
    expect((await next(client.cq, 2000)).status).toBe(WcStatus.REM_ACCESS_ERR);
    expect(client.qp.state).toBe(QpState.ERR);
    for (const q of [client.qp, server.qp]) q.modify({ qpState: QpState.RESET });
    connectQps(client.qp, server.qp);
    client.fill(0x43);
    client.qp.postSend({
      wrId: 2,
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [client.sge()],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    expect((await pollOk(client.cq)).wrId).toBe(2n);
    allBytes(server.bytes(), 0x43);
  });

  test('unsignaled WRs that succeed leave no completion; a signaled one after them does', async () => {
    const { client, server } = createPlayers();
    client.fill(0x44);
    const wr = (id: number, flags = 0) => ({
      wrId: id,
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [client.sge()],
      sendFlags: flags,
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    client.qp.postSend([wr(1), wr(2), wr(3, SendFlags.SIGNALED)]);
    expect((await pollOk(client.cq)).wrId).toBe(3n);
    await sleep(20);
    expect(client.cq.length).toBe(0);
  });

  test('an unsignaled WR that fails still completes, with its error', async () => {
    const { client, server } = createPlayers();
    client.qp.postSend({
      wrId: 4,
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [client.sge()],
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey ^ 0x5a5a00 },
    });
    expect(await next(client.cq, 2000)).toMatchObject({ wrId: 4n, status: WcStatus.REM_ACCESS_ERR });
    expect(client.qp.state).toBe(QpState.ERR);
  });

  test('sqSigAll: every send WR completes', async () => {
    const { client, server } = createPlayers({ connect: false });
    const qp = client.ctx.createQp(client.pd, { sendCq: client.cq, recvCq: client.cq, sqSigAll: true });
    connectQps(qp, server.qp);
    client.fill(0x45);
    qp.postSend(
      [1, 2].map((id) => ({
        wrId: id,
        opcode: WrOpcode.RDMA_WRITE,
        sgList: [client.sge()],
        rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
      })),
    );
    expect((await pollOk(client.cq)).wrId).toBe(1n);
    expect((await pollOk(client.cq)).wrId).toBe(2n);
  });
});

describe('ibv_poll_cq and ibv_dereg_mr', () => {
  test('pollCq returns nothing on an empty CQ, then the completions in order; a deregistered key is a local protection error', async () => {
    const { client, server } = createPlayers();
    expect(pollCq(client.cq, 4)).toEqual([]);
    for (const wrId of [1, 2]) {
      client.qp.postSend({
        wrId,
        opcode: WrOpcode.RDMA_WRITE,
        sendFlags: SendFlags.SIGNALED,
        sgList: [client.sge(0, 64)],
        rdma: { remoteAddr: server.mr.addr, rkey: server.mr.rkey },
      });
    }
    for (let i = 0; i < 500 && client.cq.length < 2; i++) await sleep(10); // bounded: 5 s
    const wcs = pollCq(client.cq, 4);
    expect(wcs.map((w) => [w.wrId, w.status])).toEqual([
      [1n, WcStatus.SUCCESS],
      [2n, WcStatus.SUCCESS],
    ]);
    deregMr(client.mr);
    expect(client.mr.closed).toBe(true);
    client.qp.postSend({
      wrId: 3,
      opcode: WrOpcode.RDMA_WRITE,
      sendFlags: SendFlags.SIGNALED,
      sgList: [client.sge(0, 64)],
      rdma: { remoteAddr: server.mr.addr, rkey: server.mr.rkey },
    });
    expect((await next(client.cq)).status).toBe(WcStatus.LOC_PROT_ERR);
  });
});
