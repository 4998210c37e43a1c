// Every work-completion error status this API produces, with libibverbs' values and strings,
// and the verbs that fail at once (errno-style codes). After a completion error the QP is in
// ERR and everything after it completes with WR_FLUSH_ERR, as in libibverbs.
import { afterEach, describe, expect, test } from 'vitest';
import {
  Access,
  AdviseMrAdvice,
  AdviseMrFlags,
  connectQps,
  QpState,
  SendFlags,
  SIZE_MAX,
  WcOpcode,
  WcStatus,
  wcStatusStr,
  WrOpcode,
  type SendWr,
  type WorkCompletion,
} from '../../lib/index.js';
import { DEFAULT_COSTS, Fabric, type Packet } from '../../kernel-sim/index.js';
import { report, requireDist, runFixture } from '../child.js';
import { closeAll, createPlayers, MSG, next, ODP_ACCESS, P, PINNED_ACCESS, region, sleep, thrown, type Player } from './helpers.js';

afterEach(closeAll);

/** ibv_wc_status_str() of libibverbs/enum_strs.c, in enum order. */
const LIBIBVERBS_STRINGS = [
  'success',
  'local length error',
  'local QP operation error',
  'local EE context operation error',
  'local protection error',
  'Work Request Flushed Error',
  'memory management operation error',
  'bad response error',
  'local access error',
  'remote invalid request error',
  'remote access error',
  'remote operation error',
  'transport retry counter exceeded',
  'RNR retry counter exceeded',
  'local RDD violation error',
  'remote invalid RD request',
  'aborted error',
  'invalid EE context number',
  'invalid EE context state',
  'fatal error',
  'response timeout error',
  'general error',
  'TM error',
];

test('WcStatus values and statusStr follow libibverbs (enum ibv_wc_status, ibv_wc_status_str)', () => {
  const names = [
    'SUCCESS',
    'LOC_LEN_ERR',
    'LOC_QP_OP_ERR',
    'LOC_EEC_OP_ERR',
    'LOC_PROT_ERR',
    'WR_FLUSH_ERR',
    'MW_BIND_ERR',
    'BAD_RESP_ERR',
    'LOC_ACCESS_ERR',
    'REM_INV_REQ_ERR',
    'REM_ACCESS_ERR',
    'REM_OP_ERR',
    'RETRY_EXC_ERR',
    'RNR_RETRY_EXC_ERR',
    'LOC_RDD_VIOL_ERR',
    'REM_INV_RD_REQ_ERR',
    'REM_ABORT_ERR',
    'INV_EECN_ERR',
    'INV_EEC_STATE_ERR',
    'FATAL_ERR',
    'RESP_TIMEOUT_ERR',
    'GENERAL_ERR',
    'TM_ERR',
  ];
  names.forEach((n, i) => {
    expect(WcStatus[n as keyof typeof WcStatus]).toBe(i);
    expect(wcStatusStr(i)).toBe(LIBIBVERBS_STRINGS[i]);
  });
  expect(wcStatusStr(999 as WcStatus)).toBe('unknown');
});

/** Post `wr` (signaled) on the client and return its completion. */
async function fails(p: Player, wr: Omit<SendWr, 'wrId' | 'sendFlags'>, wrId = 1): Promise<WorkCompletion> {
  p.qp.postSend({ wrId, sendFlags: SendFlags.SIGNALED, ...wr });
  return next(p.cq, 3000);
}

/** After an error: the QP is in ERR and later WRs (signaled or not) complete with WR_FLUSH_ERR. */
async function expectFlushedAfter(p: Player, peer: Player): Promise<void> {
  expect(p.qp.state).toBe(QpState.ERR);
  p.fill(0x11);
  p.qp.postSend([
    {
      wrId: 100,
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [p.sge()],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: peer.at(0), rkey: peer.mr.rkey },
    },
    { wrId: 101, opcode: WrOpcode.SEND, sgList: [p.sge()] },
  ]);
  const a = await next(p.cq, 3000);
  const b = await next(p.cq, 3000);
  expect([a.wrId, b.wrId]).toEqual([100n, 101n]);
  for (const wc of [a, b]) {
    expect(wc.status).toBe(WcStatus.WR_FLUSH_ERR);
    expect(wc.statusStr).toBe('Work Request Flushed Error');
    expect(wc.byteLen).toBe(0);
  }
  expect(a.opcode).toBe(WcOpcode.RDMA_WRITE);
  expect(b.opcode).toBe(WcOpcode.SEND);
  // A receive posted in ERR is flushed at once.
  p.qp.postRecv({ wrId: 102, sgList: [p.sge()] });
  expect(await next(p.cq, 3000)).toMatchObject({ wrId: 102n, status: WcStatus.WR_FLUSH_ERR, opcode: WcOpcode.RECV });
  // Nothing reached the peer.
  expect(peer.bytes().includes(0x11)).toBe(false);
}

describe('LOC_PROT_ERR: the local SGE is not covered by a usable MR', () => {
  test('wrong lkey', async () => {
    const { client, server } = createPlayers();
    const wc = await fails(client, {
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [{ ...client.sge(), lkey: client.mr.lkey + 1 }],
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    expect(wc).toMatchObject({
      wrId: 1n,
      status: WcStatus.LOC_PROT_ERR,
      statusStr: 'local protection error',
      opcode: WcOpcode.RDMA_WRITE,
      qpNum: client.qp.qpNum,
    });
    await expectFlushedAfter(client, server);
  });

  test('PD mismatch: an MR of another protection domain of the same context', async () => {
    const { client, server } = createPlayers();
    const pd2 = client.ctx.allocPd();
    const other = client.ctx.regMr(pd2, region(4 * P), 0, 4 * P, ODP_ACCESS);
    const wc = await fails(client, { opcode: WrOpcode.SEND, sgList: [{ addr: other.addr, length: MSG, lkey: other.lkey }] });
    expect(wc.status).toBe(WcStatus.LOC_PROT_ERR);
    await expectFlushedAfter(client, server);
  });

  test.each([
    ['past the end', (p: Player) => p.sge(p.region.size - 512, 1024)],
    ['before the start', (p: Player) => ({ ...p.sge(), addr: p.at(0) - 8n })],
    ['in no mapping at all, under an implicit key', (p: Player) => ({ addr: 0x10n, length: 8, lkey: p.mr.lkey })],
  ])('local range outside the MR: %s', async (what, sge) => {
    const { client, server } = createPlayers({ implicit: what.includes('implicit') });
    const wc = await fails(client, { opcode: WrOpcode.RDMA_WRITE, sgList: [sge(client)], rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey } });
    expect(wc.status).toBe(WcStatus.LOC_PROT_ERR);
    await expectFlushedAfter(client, server);
  });

  test('a deregistered MR', async () => {
    const { client, server } = createPlayers();
    client.mr.dereg();
    const wc = await fails(client, { opcode: WrOpcode.SEND, sgList: [client.sge()] });
    expect(wc.status).toBe(WcStatus.LOC_PROT_ERR);
    expect(server.cq.length).toBe(0);
  });

  test('RDMA READ into an MR without LOCAL_WRITE', async () => {
    const { client, server } = createPlayers();
    const ro = client.ctx.regMr(client.pd, region(4 * P), 0, 4 * P, Access.ON_DEMAND);
    const wc = await fails(client, {
      opcode: WrOpcode.RDMA_READ,
      sgList: [{ addr: ro.addr, length: MSG, lkey: ro.lkey }],
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    expect(wc.status).toBe(WcStatus.LOC_PROT_ERR);
  });

  test("the responder's receive SGE is bad: responder LOC_PROT_ERR, requester REM_OP_ERR", async () => {
    const { client, server } = createPlayers();
    server.qp.postRecv({ wrId: 5, sgList: [{ ...server.sge(), lkey: 0x7fff }] });
    client.fill(0x11);
    const wc = await fails(client, { opcode: WrOpcode.SEND, sgList: [client.sge()] });
    expect(wc.status).toBe(WcStatus.REM_OP_ERR);
    expect(wc.statusStr).toBe('remote operation error');
    expect(await next(server.cq, 3000)).toMatchObject({ wrId: 5n, status: WcStatus.LOC_PROT_ERR, opcode: WcOpcode.RECV });
    expect(server.qp.state).toBe(QpState.ERR);
    await expectFlushedAfter(client, server);
  });
});

describe('REM_ACCESS_ERR: the remote key does not allow the access', () => {
  test('wrong rkey', async () => {
    const { client, server } = createPlayers();
    client.fill(0x11);
    const wc = await fails(client, {
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [client.sge()],
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey ^ 0x40 },
    });
    expect(wc).toMatchObject({ status: WcStatus.REM_ACCESS_ERR, statusStr: 'remote access error', byteLen: 0 });
    await expectFlushedAfter(client, server);
  });

  test("an rkey of the requester's own node (not the responder's PD)", async () => {
    const { client, server } = createPlayers();
    const wc = await fails(client, { opcode: WrOpcode.RDMA_WRITE, sgList: [client.sge()], rdma: { remoteAddr: client.at(0), rkey: client.mr.rkey } });
    expect(wc.status).toBe(WcStatus.REM_ACCESS_ERR);
    await expectFlushedAfter(client, server);
  });

  const missing: Array<[string, number, (c: Player, s: Player) => Omit<SendWr, 'wrId' | 'sendFlags'>]> = [
    [
      'REMOTE_WRITE',
      Access.REMOTE_WRITE,
      (c, s) => ({ opcode: WrOpcode.RDMA_WRITE, sgList: [c.sge()], rdma: { remoteAddr: s.at(0), rkey: s.mr.rkey } }),
    ],
    [
      'REMOTE_WRITE (WRITE_WITH_IMM)',
      Access.REMOTE_WRITE,
      (c, s) => ({ opcode: WrOpcode.RDMA_WRITE_WITH_IMM, immData: 1, sgList: [c.sge()], rdma: { remoteAddr: s.at(0), rkey: s.mr.rkey } }),
    ],
    [
      'REMOTE_READ',
      Access.REMOTE_READ,
      (c, s) => ({ opcode: WrOpcode.RDMA_READ, sgList: [c.sge()], rdma: { remoteAddr: s.at(0), rkey: s.mr.rkey } }),
    ],
    [
      'REMOTE_ATOMIC (FETCH_AND_ADD)',
      Access.REMOTE_ATOMIC,
      (c, s) => ({ opcode: WrOpcode.ATOMIC_FETCH_AND_ADD, sgList: [c.sge(0, 8)], atomic: { remoteAddr: s.at(0), rkey: s.mr.rkey, compareAdd: 1n } }),
    ],
    [
      'REMOTE_ATOMIC (CMP_AND_SWP)',
      Access.REMOTE_ATOMIC,
      (c, s) => ({
        opcode: WrOpcode.ATOMIC_CMP_AND_SWP,
        sgList: [c.sge(0, 8)],
        atomic: { remoteAddr: s.at(0), rkey: s.mr.rkey, compareAdd: 0n, swap: 1n },
      }),
    ],
  ];
  test.each(missing)('the remote MR lacks %s', async (_, flag, wr) => {
    const { client, server } = createPlayers();
    // Re-register the server's buffer without the flag (LOCAL_WRITE stays).
    server.mr.dereg();
    server.mr = server.ctx.regMr(server.pd, server.region, 0, server.region.size, ODP_ACCESS & ~flag);
    server.fill(0x22, 0, 64);
    server.qp.postRecv({ wrId: 9, sgList: [server.sge(MSG, MSG)] });
    const wc = await fails(client, wr(client, server));
    expect(wc).toMatchObject({ status: WcStatus.REM_ACCESS_ERR, byteLen: 0 });
    allUntouched(server);
    // With the flag the same WR works on a fresh pair.
    closeAll();
    const ok = createPlayers();
    ok.server.qp.postRecv({ wrId: 9, sgList: [ok.server.sge(MSG, MSG)] });
    expect((await fails(ok.client, wr(ok.client, ok.server))).status).toBe(WcStatus.SUCCESS);
  });

  test('the QP was not given the remote access (qp_access_flags)', async () => {
    const { client, server } = createPlayers({ rc: { qpAccessFlags: Access.LOCAL_WRITE | Access.REMOTE_READ } });
    const wc = await fails(client, { opcode: WrOpcode.RDMA_WRITE, sgList: [client.sge()], rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey } });
    expect(wc.status).toBe(WcStatus.REM_ACCESS_ERR);
  });

  test.each([
    ['past the end', (s: Player) => s.at(s.region.size - 512)],
    ['before the start', (s: Player) => s.at(0) - 4096n],
  ])('remote range outside the MR: %s', async (_, addr) => {
    const { client, server } = createPlayers();
    const wc = await fails(client, { opcode: WrOpcode.RDMA_WRITE, sgList: [client.sge()], rdma: { remoteAddr: addr(server), rkey: server.mr.rkey } });
    expect(wc.status).toBe(WcStatus.REM_ACCESS_ERR);
    const rd = createPlayers();
    const wc2 = await fails(rd.client, {
      opcode: WrOpcode.RDMA_READ,
      sgList: [rd.client.sge()],
      rdma: { remoteAddr: addr(rd.server), rkey: rd.server.mr.rkey },
    });
    expect(wc2.status).toBe(WcStatus.REM_ACCESS_ERR);
  });

  test('a write to a remote MR that was deregistered meanwhile', async () => {
    const { client, server } = createPlayers();
    const rkey = server.mr.rkey;
    server.mr.dereg();
    const wc = await fails(client, { opcode: WrOpcode.RDMA_WRITE, sgList: [client.sge()], rdma: { remoteAddr: server.at(0), rkey } });
    expect(wc.status).toBe(WcStatus.REM_ACCESS_ERR);
  });
});

function allUntouched(s: Player): void {
  // The server's first 64 bytes still hold 0x22 and its receive buffer saw nothing.
  expect(s.bytes(0, 64).every((b) => b === 0x22)).toBe(true);
}

describe('length and request errors', () => {
  test('SEND larger than the posted receive: requester REM_INV_REQ_ERR, responder LOC_LEN_ERR', async () => {
    const { client, server } = createPlayers();
    server.qp.postRecv({ wrId: 7, sgList: [server.sge(0, 512)] });
    client.fill(0x11, 0, MSG);
    const wc = await fails(client, { opcode: WrOpcode.SEND, sgList: [client.sge(0, MSG)] });
    expect(wc).toMatchObject({ status: WcStatus.REM_INV_REQ_ERR, statusStr: 'remote invalid request error' });
    const r = await next(server.cq, 3000);
    expect(r).toMatchObject({ wrId: 7n, status: WcStatus.LOC_LEN_ERR, statusStr: 'local length error', opcode: WcOpcode.RECV, byteLen: 0 });
    expect(server.qp.state).toBe(QpState.ERR);
    expect(server.bytes(0, 512).includes(0x11)).toBe(false);
    await expectFlushedAfter(client, server);
  });

  test('a SEND that fits two receive SGEs exactly succeeds (the boundary of the error above)', async () => {
    const { client, server } = createPlayers();
    server.qp.postRecv({ wrId: 7, sgList: [server.sge(0, 512), server.sge(4 * P, 512)] });
    client.fill(0x11, 0, 512);
    client.fill(0x12, 512, 512);
    const wc = await fails(client, { opcode: WrOpcode.SEND, sgList: [client.sge(0, MSG)] });
    expect(wc.status).toBe(WcStatus.SUCCESS);
    expect((await next(server.cq)).byteLen).toBe(MSG);
    expect(server.bytes(0, 512).every((b) => b === 0x11)).toBe(true);
    expect(server.bytes(4 * P, 512).every((b) => b === 0x12)).toBe(true);
  });

  test('an atomic on a misaligned remote address: REM_INV_REQ_ERR; a local SGE not 8 bytes: LOC_LEN_ERR', async () => {
    const { client, server } = createPlayers();
    const wc = await fails(client, {
      opcode: WrOpcode.ATOMIC_FETCH_AND_ADD,
      sgList: [client.sge(0, 8)],
      atomic: { remoteAddr: server.at(4), rkey: server.mr.rkey, compareAdd: 1n },
    });
    expect(wc.status).toBe(WcStatus.REM_INV_REQ_ERR);
    const b = createPlayers();
    const wc2 = await fails(b.client, {
      opcode: WrOpcode.ATOMIC_FETCH_AND_ADD,
      sgList: [b.client.sge(0, 16)],
      atomic: { remoteAddr: b.server.at(0), rkey: b.server.mr.rkey, compareAdd: 1n },
    });
    expect(wc2.status).toBe(WcStatus.LOC_LEN_ERR);
  });
});

describe('RNR_RETRY_EXC_ERR: no receive posted', () => {
  test('rnrRetry 1: the SEND gives up with RNR_RETRY_EXC_ERR, then later WRs are flushed', async () => {
    const { client, server } = createPlayers({ rc: { rnrRetry: 1, minRnrTimer: 1 } });
    expect(client.qp.query().rnrRetry).toBe(1);
    const t0 = Date.now();
    const wc = await fails(client, { opcode: WrOpcode.SEND, sgList: [client.sge()] });
    expect(wc).toMatchObject({ status: WcStatus.RNR_RETRY_EXC_ERR, statusStr: 'RNR retry counter exceeded' });
    expect(Date.now() - t0).toBeLessThan(1000);
    await expectFlushedAfter(client, server);
  });

  test('rnrRetry 1 and WRITE_WITH_IMM with no receive to consume the immediate: RNR_RETRY_EXC_ERR too', async () => {
    const { client, server } = createPlayers({ rc: { rnrRetry: 1, minRnrTimer: 1 } });
    const wc = await fails(client, {
      opcode: WrOpcode.RDMA_WRITE_WITH_IMM,
      immData: 3,
      sgList: [client.sge()],
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    expect(wc.status).toBe(WcStatus.RNR_RETRY_EXC_ERR);
  });

  test('WRITE_WITH_IMM with no receive yet is RNR-NAKed and retried (rnrRetry 7): it completes once a receive is posted', async () => {
    const { client, server } = createPlayers({ rc: { minRnrTimer: 1 } });
    client.fill(0x4d, 0, 64);
    client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_WRITE_WITH_IMM,
      immData: 0x1234,
      sgList: [client.sge(0, 64)],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    await new Promise((r) => setTimeout(r, 30));
    expect(client.cq.length).toBe(0); // still retrying
    server.qp.postRecv({ wrId: 9, sgList: [] });
    expect(await next(client.cq)).toMatchObject({ wrId: 1n, status: WcStatus.SUCCESS });
    expect(await next(server.cq)).toMatchObject({ wrId: 9n, status: WcStatus.SUCCESS, immData: 0x1234, byteLen: 64 });
    expect(server.bytes(0, 64).every((b) => b === 0x4d)).toBe(true);
  });

  test('a destination fault is an RNR NAK: with rnrRetry 0 the write into evicted memory ends in RNR_RETRY_EXC_ERR', async () => {
    const { client, server } = createPlayers({ rc: { rnrRetry: 0 } });
    client.fill(0x51, 0, 4 * P);
    server.region.evict();
    const wc = await fails(client, {
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [client.sge(0, 4 * P)],
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    expect(wc.status).toBe(WcStatus.RNR_RETRY_EXC_ERR);
    expect(wc.odp!.faults.destination).toBe(1);
    await expectFlushedAfter(client, server);
  });

  test('a WRITE_WITH_IMM whose bytes fail to land takes no receive: the requester gets the error, the receive stays posted', async () => {
    const { client, server } = createPlayers({ rc: { rnrRetry: 0 } });
    client.fill(0x51, 0, 4 * P);
    server.region.evict();
    server.qp.postRecv({ wrId: 9, sgList: [] });
    const wc = await fails(client, {
      opcode: WrOpcode.RDMA_WRITE_WITH_IMM,
      immData: 5,
      sgList: [client.sge(0, 4 * P)],
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    expect(wc.status).toBe(WcStatus.RNR_RETRY_EXC_ERR);
    await sleep(20);
    expect(server.cq.length).toBe(0);
    // The receive is still there: moving the server's QP to ERR flushes it.
    server.qp.modify({ qpState: QpState.ERR });
    expect(await next(server.cq)).toMatchObject({ wrId: 9n, status: WcStatus.WR_FLUSH_ERR });
  });

  test('a SEND whose bytes fail to land never completes its receive: it stays posted, and the next SEND fills it whole', async () => {
    // RC: the responder took the receive at the first packet; the message never ended, so the
    // receive does not complete (no SUCCESS for bytes that did not all land), and the next
    // message's first packet takes it again (rxe keeps qp->resp.wqe the same way).
    const { client, server } = createPlayers({ rc: { rnrRetry: 0 } });
    client.fill(0x52, 0, 4 * P);
    server.region.evict();
    server.qp.postRecv({ wrId: 9, sgList: [server.sge(0, 4 * P)] });
    const wc = await fails(client, { opcode: WrOpcode.SEND, sgList: [client.sge(0, 4 * P)] });
    expect(wc.status).toBe(WcStatus.RNR_RETRY_EXC_ERR);
    await sleep(20);
    expect(server.cq.poll(4)).toEqual([]);
    // The requester is in ERR: reset it, its next PSN the one the responder now expects (1),
    // and send again: the same receive completes, with the new message whole.
    client.qp.modify({ qpState: QpState.RESET });
    client.qp.modify({ qpState: QpState.INIT, qpAccessFlags: 0 });
    client.qp.modify({ qpState: QpState.RTR, destQpNum: server.qp.qpNum, destNode: server.ctx.node });
    client.qp.modify({ qpState: QpState.RTS, sqPsn: 1, rnrRetry: 7 });
    client.fill(0x53, 0, 4 * P);
    expect((await fails(client, { opcode: WrOpcode.SEND, sgList: [client.sge(0, 4 * P)] })).status).toBe(WcStatus.SUCCESS);
    expect(await next(server.cq)).toMatchObject({ wrId: 9n, status: WcStatus.SUCCESS, byteLen: 4 * P });
    expect(server.bytes(0, 4 * P).every((b) => b === 0x53)).toBe(true);
  });

  // RC executes an atomic where it arrives: a response that cannot land does not undo it.
  test('an atomic whose old value cannot land at the requester fails RNR_RETRY_EXC_ERR, applied once', async () => {
    // The requester's sink is evicted and its rnrRetry is 0: the response's one fault ends it.
    const { client, server } = createPlayers({ rc: { rnrRetry: 0 } });
    new DataView(server.region.buffer).setBigUint64(0, 41n, true);
    client.region.evict();
    const wc = await fails(client, {
      opcode: WrOpcode.ATOMIC_FETCH_AND_ADD,
      sgList: [client.sge(0, 8)],
      atomic: { remoteAddr: server.at(0), rkey: server.mr.rkey, compareAdd: 1n },
    });
    expect(wc.status).toBe(WcStatus.RNR_RETRY_EXC_ERR);
    await sleep(20);
    expect(new DataView(server.region.buffer).getBigUint64(0, true)).toBe(42n);
  });

  test('with rnrRetry 1 the same write succeeds after one retransmission', async () => {
    const { client, server } = createPlayers({ rc: { rnrRetry: 1 } });
    client.fill(0x51, 0, 4 * P);
    server.region.evict();
    const wc = await fails(client, {
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [client.sge(0, 4 * P)],
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    expect(wc.status).toBe(WcStatus.SUCCESS);
    expect(wc.odp).toMatchObject({ faults: { source: 0, destination: 1 }, retransmittedBlocks: 1 });
    expect(server.bytes(0, 4 * P).every((b) => b === 0x51)).toBe(true);
  });

  test('rnrRetry 7 (infinite): the SEND waits for a receive posted late, then succeeds', async () => {
    const { client, server } = createPlayers({ rc: { rnrRetry: 7, minRnrTimer: 1 } });
    client.fill(0x31);
    client.qp.postSend({ wrId: 1, opcode: WrOpcode.SEND, sgList: [client.sge()], sendFlags: SendFlags.SIGNALED });
    await sleep(50);
    expect(client.cq.length).toBe(0);
    server.qp.postRecv({ wrId: 2, sgList: [server.sge()] });
    expect((await next(client.cq, 3000)).status).toBe(WcStatus.SUCCESS);
    expect((await next(server.cq, 3000)).status).toBe(WcStatus.SUCCESS);
    expect(server.bytes().every((b) => b === 0x31)).toBe(true);
  });
});

describe('RETRY_EXC_ERR: the remote QP is gone or not ready', () => {
  test('the responder QP was destroyed', async () => {
    const { client, server } = createPlayers();
    server.qp.destroy();
    const wc = await fails(client, { opcode: WrOpcode.RDMA_WRITE, sgList: [client.sge()], rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey } });
    expect(wc).toMatchObject({ status: WcStatus.RETRY_EXC_ERR, statusStr: 'transport retry counter exceeded' });
  });

  test("the transport says the responder's node went away: a request waiting for its answer ends, the QP goes to ERR", async () => {
    // A transport between processes reports a lost peer; here one that first stops
    // delivering to node 1 (the request is lost on the way), then reports it gone.
    class Severable extends Fabric {
      #cut = new Set<number>();
      #listeners: Array<(node: number) => void> = [];
      override deliver(p: Packet): void {
        if (!this.#cut.has(p.dst)) super.deliver(p);
      }
      onPeerLost(listener: (node: number) => void): void {
        this.#listeners.push(listener);
      }
      cut(node: number): void {
        this.#cut.add(node);
      }
      lose(node: number): void {
        for (const l of this.#listeners) l(node);
      }
    }
    const transport = new Severable(DEFAULT_COSTS);
    const { cluster, client, server } = createPlayers({ cluster: { transport, nodes: 3 } });
    // A second QP of the client, to a responder on node 2, whose request is held on the way
    // too: node 2 is not lost, so that QP keeps waiting.
    const third = cluster.openDevice(2);
    const thirdPd = third.allocPd();
    const thirdCq = third.createCq(8);
    const thirdQp = third.createQp(thirdPd, { sendCq: thirdCq, recvCq: thirdCq });
    const thirdMr = third.regMr(thirdPd, region(4 * P), 0, P, ODP_ACCESS);
    const toThird = client.ctx.createQp(client.pd, { sendCq: client.cq, recvCq: client.cq });
    connectQps(toThird, thirdQp);
    transport.cut(1);
    transport.cut(2);
    toThird.postSend({
      wrId: 6,
      opcode: WrOpcode.RDMA_READ,
      sgList: [client.sge()],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: thirdMr.addr, rkey: thirdMr.rkey },
    });
    client.qp.postSend({
      wrId: 5,
      opcode: WrOpcode.RDMA_READ,
      sgList: [client.sge()],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    await sleep(20);
    expect(client.cq.length).toBe(0); // nothing answers: it waits
    transport.lose(1);
    expect(await next(client.cq, 3000)).toMatchObject({ wrId: 5n, status: WcStatus.RETRY_EXC_ERR });
    expect(client.qp.state).toBe(QpState.ERR);
    // The QP to node 2 is not touched: it still waits.
    await sleep(20);
    expect(client.cq.length).toBe(0);
    expect(toThird.state).toBe(QpState.RTS);
  });
});

describe('verbs that fail at once (errno codes)', () => {
  test('regMr: REMOTE_WRITE or REMOTE_ATOMIC without LOCAL_WRITE → EINVAL', () => {
    const { client } = createPlayers();
    const r = region(4 * P);
    for (const access of [Access.REMOTE_WRITE | Access.ON_DEMAND, Access.REMOTE_ATOMIC | Access.ON_DEMAND, Access.REMOTE_WRITE]) {
      const e = thrown(() => client.ctx.regMr(client.pd, r, 0, r.size, access));
      expect(e.code).toBe('EINVAL');
      expect(e.syscall).toBe('ibv_reg_mr');
    }
    // REMOTE_READ alone is fine (local read is always allowed).
    expect(client.ctx.regMr(client.pd, r, 0, r.size, Access.REMOTE_READ | Access.ON_DEMAND).lkey).toBeGreaterThan(0);
  });

  test('regMr: HUGETLB on a region without huge pages → EINVAL; on a hugePages region it works', () => {
    const { client } = createPlayers();
    const r = region(4 * P);
    expect(thrown(() => client.ctx.regMr(client.pd, r, 0, r.size, ODP_ACCESS | Access.HUGETLB)).code).toBe('EINVAL');
    const h = region(2 * 1024 * 1024, { hugePages: true });
    expect(client.ctx.regMr(client.pd, h, 0, h.size, ODP_ACCESS | Access.HUGETLB).access & Access.HUGETLB).toBe(Access.HUGETLB);
  });

  test('regMr: a plain ArrayBuffer (not from mapRegion) → TypeError', () => {
    const { client } = createPlayers();
    const e = thrown(() => client.ctx.regMr(client.pd, new ArrayBuffer(4 * P), 0, 4 * P, ODP_ACCESS));
    expect(e).toBeInstanceOf(TypeError);
    expect(e.message).toMatch(/mapRegion/);
    // The ArrayBuffer of a mapped region is accepted.
    const r = region(4 * P);
    expect(client.ctx.regMr(client.pd, r.buffer, 0, 4 * P, ODP_ACCESS).addr).toBe(r.address);
  });

  test('regMr: other bad arguments', () => {
    const { client, server } = createPlayers();
    const r = region(4 * P);
    expect(thrown(() => client.ctx.regMr(client.pd, r, 0, r.size, 0x1000)).code).toBe('EINVAL'); // unknown flag
    expect(thrown(() => client.ctx.regMr(server.pd, r, 0, r.size, ODP_ACCESS)).code).toBe('EINVAL'); // another context's PD
    expect(thrown(() => client.ctx.regMr(client.pd, null, 0, SIZE_MAX, Access.LOCAL_WRITE)).code).toBe('EINVAL'); // implicit without ON_DEMAND
    expect(thrown(() => client.ctx.regMr(client.pd, null, 0, 4096, ODP_ACCESS)).code).toBe('EINVAL'); // implicit needs SIZE_MAX
    expect(() => client.ctx.regMr(client.pd, r, 0, r.size + P, ODP_ACCESS)).toThrow(); // past the region
  });

  test('a PD that is not one, or of another context: EINVAL from the verb that was called, saying which', () => {
    const { client, server } = createPlayers();
    const notPd = thrown(() => client.ctx.regMr({} as never, client.region, 0, P, ODP_ACCESS));
    expect([notPd.code, notPd.syscall, notPd.message]).toEqual(['EINVAL', 'ibv_reg_mr', 'ibv_reg_mr: pd must be a ProtectionDomain from allocPd()']);
    const foreign = thrown(() => client.ctx.adviseMr(server.pd, AdviseMrAdvice.PREFETCH, AdviseMrFlags.FLUSH, [client.sge(0, P)]));
    expect([foreign.code, foreign.syscall, foreign.message]).toEqual([
      'EINVAL',
      'ibv_advise_mr',
      'ibv_advise_mr: the protection domain belongs to another context',
    ]);
    // An SGE of length 0 is a valid, empty advice: nothing made resident (it threw a RangeError from populate).
    client.region.evict();
    for (const advice of [AdviseMrAdvice.PREFETCH, AdviseMrAdvice.PREFETCH_WRITE]) {
      expect(() => client.ctx.adviseMr(client.pd, advice, AdviseMrFlags.FLUSH, [client.sge(0, 0)])).not.toThrow();
    }
    expect(client.region.residentPages(0, P)).toBe(0);
  });

  test("regMr that fails after pinning (a bad policy option) unpins what it pinned, and only that: the range can be evicted again, another MR's pin stays", () => {
    const { client } = createPlayers();
    const r = region(4 * P);
    // The 'pin' policy mlocks the range before the fault library checks the options.
    const e = thrown(() => client.ctx.regMr(client.pd, r, 0, r.size, ODP_ACCESS, { policy: 'pin', policyOptions: { cap: 0 } }));
    expect(e.code).toBe('ERR_OUT_OF_RANGE');
    expect(e.message).toMatch(/cap/);
    expect(() => r.evict()).not.toThrow(); // mlocked pages could not be evicted (EINVAL)
    // A pinned MR on the same pages, then an ODP registration that fails without pinning: the pin stays.
    const pinned = client.ctx.regMr(client.pd, r, 0, r.size, PINNED_ACCESS);
    expect(thrown(() => client.ctx.regMr(client.pd, r, 0, r.size, ODP_ACCESS, { policy: 'touch-ahead', policyOptions: { cap: 0 } })).code).toBe(
      'ERR_OUT_OF_RANGE',
    );
    expect(thrown(() => r.evict()).code).toBe('EINVAL');
    pinned.dereg();
    expect(() => r.evict()).not.toThrow();
  });

  test('two pinned MRs over shared pages: deregistering one leaves the pages the other pins locked', () => {
    const { client } = createPlayers();
    const r = region(8 * P);
    const evictable = (page: number, pages = 1): boolean => {
      try {
        r.evict(page * P, pages * P);
        return true;
      } catch (e) {
        expect((e as NodeJS.ErrnoException).code).toBe('EINVAL'); // mlocked
        return false;
      }
    };
    // A: pages 0-3; B: pages 2-5, its end one byte into page 5; C (ODP, 'pin' policy): pages 5-6.
    const a = client.ctx.regMr(client.pd, r, 0, 4 * P, PINNED_ACCESS);
    const b = client.ctx.regMr(client.pd, r, 2 * P, 3 * P + 1, PINNED_ACCESS);
    const c = client.ctx.regMr(client.pd, r, 5 * P, 2 * P, ODP_ACCESS, { policy: 'pin' });
    a.dereg();
    expect([0, 1, 2, 3, 4, 5, 6, 7].map((p) => evictable(p))).toEqual([true, true, false, false, false, false, false, true]);
    c.setPolicy('touch'); // leaving 'pin' unpins page 6 only: page 5 is still B's
    expect([5, 6].map((p) => evictable(p))).toEqual([false, true]);
    b.dereg();
    expect(evictable(0, 8)).toBe(true);
    c.dereg();
  });

  test('regMr: pinning past RLIMIT_MEMLOCK fails with the limit and the fix (child as nobody, ulimit -l 64)', async () => {
    requireDist();
    const r = await runFixture('memlock.mjs', [], { asNobody: true, memlockKiB: 64 });
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr).toBe('');
    const out = report<{
      uid: number;
      soft: number;
      small: string;
      big: { code: string; syscall: string; message: string } | null;
      odp: string;
      setPin: { code: string; before: string; after: string; pinned: boolean } | null;
    }>(r);
    if (process.getuid?.() === 0) expect(out.uid).toBe(65534);
    expect(out.soft).toBe(64 * 1024);
    expect(out.small).toBe('pinned'); // 8 pages fit under 64 KiB
    expect(out.big).not.toBeNull();
    expect(out.big!.code).toMatch(/^(ENOMEM|EPERM|EAGAIN)$/);
    expect(out.big!.message).toMatch(/RLIMIT_MEMLOCK/);
    expect(out.big!.message).toMatch(/ulimit -l/);
    expect(out.odp).toBe('registered'); // ODP needs no pinning: the same size registers fine
    // setPolicy('pin') on it fails the same way, and the MR keeps its policy, unpinned.
    expect(out.setPin).toEqual({ code: out.big!.code, before: 'touch-ahead', after: 'touch-ahead', pinned: false });
  });
});
