// QP attributes and capabilities at their bounds: the last value libibverbs accepts is taken
// and kept, the first one past it is refused with a RangeError naming the attribute, and a
// failed modify changes nothing. Queue capacities hold exactly their cap.
import { afterEach, describe, expect, test } from 'vitest';
import { Access, QpState, WcStatus, WrOpcode } from '../../lib/index.js';
import { closeAll, createPlayers, thrown } from './helpers.js';

afterEach(closeAll);

describe('modify: attribute bounds', () => {
  test('INIT: qpAccessFlags 0..0x3ff (up to FLUSH_PERSISTENT)', () => {
    const { client } = createPlayers({ connect: false });
    expect(thrown(() => client.qp.modify({ qpState: QpState.INIT, qpAccessFlags: 0x400 })).message).toMatch(/qpAccessFlags/);
    expect(client.qp.state).toBe(QpState.RESET);
    client.qp.modify({ qpState: QpState.INIT, qpAccessFlags: 0x3ff });
    expect(client.qp.query().qpAccessFlags).toBe(0x3ff);
  });

  test('RTR: minRnrTimer 0..31, destNode on the cluster, destQpNum not negative', () => {
    const { client, server } = createPlayers({ connect: false });
    client.qp.modify({ qpState: QpState.INIT, qpAccessFlags: Access.LOCAL_WRITE });
    const rtr = { qpState: QpState.RTR, destQpNum: server.qp.qpNum, destNode: 1 };
    expect(thrown(() => client.qp.modify({ ...rtr, minRnrTimer: 32 })).message).toMatch(/minRnrTimer/);
    expect(thrown(() => client.qp.modify({ ...rtr, destNode: 2 })).message).toMatch(/destNode/);
    expect(thrown(() => client.qp.modify({ ...rtr, destQpNum: -1 })).code).toBe('EINVAL');
    expect(client.qp.state).toBe(QpState.INIT);
    client.qp.modify({ ...rtr, minRnrTimer: 31 });
    expect(client.qp.query()).toMatchObject({ qpState: QpState.RTR, minRnrTimer: 31, destQpNum: server.qp.qpNum, destNode: 1 });
  });

  test('RTS: timeout 0..31, retryCnt 0..7, rnrRetry 0..7', () => {
    const { client, server } = createPlayers({ connect: false });
    client.qp.modify({ qpState: QpState.INIT, qpAccessFlags: Access.LOCAL_WRITE });
    client.qp.modify({ qpState: QpState.RTR, destQpNum: server.qp.qpNum, destNode: 1 });
    for (const [k, v] of [
      ['timeout', 32],
      ['retryCnt', 8],
      ['rnrRetry', 8],
    ] as const) {
      expect(thrown(() => client.qp.modify({ qpState: QpState.RTS, [k]: v })).message).toMatch(new RegExp(k));
    }
    expect(client.qp.state).toBe(QpState.RTR);
    client.qp.modify({ qpState: QpState.RTS, timeout: 31, retryCnt: 7, rnrRetry: 7 });
    expect(client.qp.query()).toMatchObject({ qpState: QpState.RTS, timeout: 31, retryCnt: 7, rnrRetry: 7 });
    client.qp.modify({ qpState: QpState.RTS, timeout: 0, retryCnt: 0, rnrRetry: 0 });
    expect(client.qp.query()).toMatchObject({ timeout: 0, retryCnt: 0, rnrRetry: 0 });
  });
});

describe('capabilities', () => {
  test('cap bounds: 1..65536 WRs, 1..16 SGEs; defaults 128 and 4', () => {
    const { client } = createPlayers();
    const mk = (cap: object) => client.ctx.createQp(client.pd, { sendCq: client.cq, recvCq: client.cq, cap });
    expect(mk({}).cap).toEqual({ maxSendWr: 128, maxRecvWr: 128, maxSendSge: 4, maxRecvSge: 4 });
    expect(mk({ maxSendWr: 65536, maxRecvWr: 65536, maxSendSge: 16, maxRecvSge: 16 }).cap).toEqual({
      maxSendWr: 65536,
      maxRecvWr: 65536,
      maxSendSge: 16,
      maxRecvSge: 16,
    });
    for (const bad of [{ maxSendWr: 0 }, { maxRecvWr: 65537 }, { maxSendSge: 17 }, { maxRecvSge: 0 }])
      expect(thrown(() => mk(bad)).code).toBe('EINVAL');
    expect(client.ctx.createQp(client.pd, { sendCq: client.cq, recvCq: client.cq, sqSigAll: true }).sqSigAll).toBe(true);
  });

  test('the receive queue holds exactly maxRecvWr; receive SGEs at most maxRecvSge', () => {
    const { server } = createPlayers({ cap: { maxRecvWr: 2, maxRecvSge: 1 } });
    const r = { wrId: 1, sgList: [server.sge(0, 64)] };
    expect(thrown(() => server.qp.postRecv({ wrId: 2, sgList: [server.sge(0, 8), server.sge(8, 8)] })).code).toBe('EINVAL');
    server.qp.postRecv([r, r]);
    const e = thrown(() => server.qp.postRecv(r));
    expect(e.code).toBe('ENOMEM');
    expect(e.syscall).toBe('ibv_post_recv');
  });

  test('the send queue holds exactly maxSendWr: that many post at once', async () => {
    const { client, server } = createPlayers({ cap: { maxSendWr: 3 } });
    const wr = (id: number) => ({
      wrId: id,
      opcode: WrOpcode.RDMA_WRITE,
      sendFlags: 2,
      sgList: [client.sge(0, 8)],
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    client.qp.postSend([wr(1), wr(2), wr(3)]);
    const wcs = await client.cq.take(3, { timeoutMs: 3000 });
    expect(wcs.map((w) => [w.wrId, w.status])).toEqual([
      [1n, WcStatus.SUCCESS],
      [2n, WcStatus.SUCCESS],
      [3n, WcStatus.SUCCESS],
    ]);
  });
});
