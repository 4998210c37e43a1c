// Extended QPs and the ibv_wr_* post API (rdma-core's tests/test_qpex.py over ODP memory):
// every operation in rdma-core's traffic pattern (100 × 1 KiB, both buffers evicted before
// every iteration), batches, wrId/wrFlags, and what is refused.
import { afterEach, describe, expect, test } from 'vitest';
import { Access, FlushLevel, FlushType, QpExSendOps, SendFlags, WcOpcode, type QueuePairEx } from '../../lib/index.js';
import { allBytes, closeAll, createPlayers, int8b, MSG, next, ODP_ACCESS, P, pollOk, setU64, sleep, thrown, u64 } from './helpers.js';

afterEach(closeAll);

const ALL =
  QpExSendOps.WITH_RDMA_WRITE |
  QpExSendOps.WITH_RDMA_WRITE_WITH_IMM |
  QpExSendOps.WITH_SEND |
  QpExSendOps.WITH_SEND_WITH_IMM |
  QpExSendOps.WITH_RDMA_READ |
  QpExSendOps.WITH_ATOMIC_CMP_AND_SWP |
  QpExSendOps.WITH_ATOMIC_FETCH_AND_ADD;

const ex = (p: { qp: unknown }) => p.qp as QueuePairEx;

describe('ibv_wr_* traffic over ODP memory evicted every iteration', () => {
  test('wrRdmaWrite, 100 × 1 KiB both ways: data lands, every status success, one destination fault each', async () => {
    const { client, server } = createPlayers({ sendOpsFlags: QpExSendOps.WITH_RDMA_WRITE, policy: 'touch' });
    for (let i = 0; i < 100; i++) {
      for (const [req, resp, byte] of [
        [client, server, 0x63],
        [server, client, 0x73],
      ] as const) {
        req.region.evict();
        resp.region.evict();
        req.fill(byte, 0, MSG);
        const qp = ex(req);
        qp.wrStart();
        qp.wrId = i;
        qp.wrFlags = SendFlags.SIGNALED;
        qp.wrRdmaWrite(resp.mr.rkey, resp.at(0));
        qp.wrSetSge(req.mr.lkey, req.at(0), MSG);
        qp.wrComplete();
        const wc = await pollOk(req.cq);
        expect([wc.wrId, wc.opcode, wc.byteLen]).toEqual([BigInt(i), WcOpcode.RDMA_WRITE, MSG]);
        expect(wc.odp!.faults).toEqual({ source: 0, destination: 1 });
        allBytes(resp.bytes(0, MSG), byte);
      }
    }
  });

  test('wrSend / wrSendImm / wrRdmaWriteImm / wrRdmaRead, 100 iterations: receives, immediates and read data as posted', async () => {
    const { client, server } = createPlayers({ sendOpsFlags: ALL, policy: 'touch' });
    const qp = ex(client);
    for (let i = 0; i < 100; i++) {
      client.region.evict();
      server.region.evict();
      client.fill(0x41 + (i % 26), 0, MSG);
      server.qp.postRecv({ wrId: 1, sgList: [server.sge(0, MSG)] });
      server.qp.postRecv({ wrId: 2, sgList: [server.sge(2 * P, MSG)] });
      server.qp.postRecv({ wrId: 3, sgList: [] });
      qp.wrStart();
      qp.wrFlags = SendFlags.SIGNALED;
      qp.wrId = 10;
      qp.wrSend();
      qp.wrSetSge(client.mr.lkey, client.at(0), MSG);
      qp.wrId = 11;
      qp.wrSendImm(0x1000 + i);
      qp.wrSetSgeList([{ lkey: client.mr.lkey, addr: client.at(0), length: MSG }]);
      qp.wrId = 12;
      qp.wrRdmaWriteImm(server.mr.rkey, server.at(4 * P), 0x2000 + i);
      qp.wrSetSge(client.mr.lkey, client.at(0), MSG);
      qp.wrId = 13;
      qp.wrRdmaRead(server.mr.rkey, server.at(0)); // reads back what the SEND put there
      qp.wrSetSge(client.mr.lkey, client.at(8 * P), MSG);
      qp.wrComplete();
      const sent = [await pollOk(client.cq), await pollOk(client.cq), await pollOk(client.cq), await pollOk(client.cq)];
      expect(sent.map((w) => [w.wrId, w.opcode])).toEqual([
        [10n, WcOpcode.SEND],
        [11n, WcOpcode.SEND],
        [12n, WcOpcode.RDMA_WRITE],
        [13n, WcOpcode.RDMA_READ],
      ]);
      const recv = [await pollOk(server.cq), await pollOk(server.cq), await pollOk(server.cq)];
      expect(recv.map((w) => [w.wrId, w.opcode, w.immData])).toEqual([
        [1n, WcOpcode.RECV, undefined],
        [2n, WcOpcode.RECV, 0x1000 + i],
        [3n, WcOpcode.RECV_RDMA_WITH_IMM, 0x2000 + i],
      ]);
      const byte = 0x41 + (i % 26);
      for (const off of [0, 2 * P, 4 * P]) allBytes(server.bytes(off, MSG), byte);
      allBytes(client.bytes(8 * P, MSG), byte);
      // The evicted pages faulted where the bytes landed: the three receive/write targets and the read's sink.
      expect(sent[0]!.odp!.faults.destination + sent[1]!.odp!.faults.destination + sent[2]!.odp!.faults.destination).toBe(3);
      expect(sent[3]!.odp!.faults).toEqual({ source: 0, destination: 1 }); // the READ's sink, written here
    }
  });

  test('wrAtomicFetchAdd and wrAtomicCmpSwp, 100 iterations on evicted result buffers: old values come back, results land', async () => {
    const { client, server } = createPlayers({ sendOpsFlags: ALL });
    const qp = ex(client);
    for (let i = 0; i < 100; i++) {
      client.region.evict();
      server.region.evict();
      setU64(server, int8b(2));
      qp.wrStart();
      qp.wrFlags = SendFlags.SIGNALED;
      qp.wrId = i;
      qp.wrAtomicFetchAdd(server.mr.rkey, server.at(0), int8b(1));
      qp.wrSetSge(client.mr.lkey, client.at(0), 8);
      qp.wrComplete();
      const fa = await pollOk(client.cq);
      expect(fa.opcode).toBe(WcOpcode.FETCH_ADD);
      expect(fa.odp!.faults).toEqual({ source: 0, destination: 1 }); // the old value landed on the evicted local page
      expect(u64(client)).toBe(int8b(2));
      expect(u64(server)).toBe(int8b(3));
      qp.wrStart();
      qp.wrAtomicCmpSwp(server.mr.rkey, server.at(0), int8b(3), BigInt(i));
      qp.wrSetSge(client.mr.lkey, client.at(8), 8);
      qp.wrComplete();
      const cs = await pollOk(client.cq);
      expect(cs.opcode).toBe(WcOpcode.COMP_SWAP);
      expect(new DataView(client.region.buffer).getBigUint64(8, true)).toBe(int8b(3));
      expect(u64(server)).toBe(BigInt(i));
    }
  });
});

describe('ibv_wr_atomic_write and ibv_wr_flush over ODP memory evicted every iteration', () => {
  test('wrAtomicWrite then wrFlush in one batch, 100 iterations: the word lands whole, the flush succeeds, faults in wc.odp', async () => {
    const { client, server } = createPlayers({
      access: ODP_ACCESS | Access.FLUSH_GLOBAL,
      rc: { qpAccessFlags: Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.FLUSH_GLOBAL },
      sendOpsFlags: QpExSendOps.WITH_ATOMIC_WRITE | QpExSendOps.WITH_FLUSH,
    });
    const qp = ex(client);
    for (let i = 0; i < 100; i++) {
      client.region.evict();
      server.region.evict();
      const v = BigInt.asUintN(64, 0x0bad_cafe_0000_0001n * BigInt(i + 1));
      setU64(client, v); // the CPU's write makes the source word resident again
      qp.wrStart();
      qp.wrFlags = SendFlags.SIGNALED;
      qp.wrId = 2 * i;
      const word = Buffer.alloc(8);
      word.writeBigUInt64LE(v);
      // As ibv_wr_atomic_write: the 8 bytes are the call's argument, no SGE.
      qp.wrAtomicWrite(server.mr.rkey, server.at(0), word);
      qp.wrId = 2 * i + 1;
      qp.wrFlush(server.mr.rkey, server.at(0), 2 * P, FlushType.GLOBAL, FlushLevel.RANGE);
      qp.wrComplete();
      const w = await pollOk(client.cq);
      expect([w.wrId, w.opcode, w.byteLen]).toEqual([BigInt(2 * i), WcOpcode.ATOMIC_WRITE, 8]);
      expect(w.odp!.faults).toEqual({ source: 0, destination: 1 });
      const f = await pollOk(client.cq);
      expect([f.wrId, f.opcode]).toEqual([BigInt(2 * i + 1), WcOpcode.FLUSH]);
      // The word's page is back; the next page of the range was still evicted.
      expect(f.odp!.faults).toEqual({ source: 0, destination: 1 });
      expect(u64(server)).toBe(v);
    }
  });
});

describe('batches, wrId and wrFlags', () => {
  test('wrId and wrFlags are taken when the operation is called; unsignaled WRs complete silently', async () => {
    const { client, server } = createPlayers({ sendOpsFlags: QpExSendOps.WITH_RDMA_WRITE });
    const qp = ex(client);
    qp.wrStart();
    qp.wrId = 1n;
    qp.wrFlags = 0;
    qp.wrRdmaWrite(server.mr.rkey, server.at(0));
    qp.wrSetSge(client.mr.lkey, client.at(0), 8);
    qp.wrId = 2n;
    qp.wrFlags = SendFlags.SIGNALED;
    qp.wrRdmaWrite(server.mr.rkey, server.at(8));
    qp.wrSetSge(client.mr.lkey, client.at(8), 8);
    qp.wrId = 3n; // after the last operation: names nothing
    qp.wrComplete();
    expect((await pollOk(client.cq)).wrId).toBe(2n);
    await sleep(50);
    expect(client.cq.poll(4)).toEqual([]);
  });

  test('wrAbort posts nothing; a batch with a bad WR is refused whole, naming it, and closed', async () => {
    const { client, server } = createPlayers({ sendOpsFlags: QpExSendOps.WITH_RDMA_WRITE });
    const qp = ex(client);
    client.fill(0x11, 0, 8);
    qp.wrStart();
    qp.wrFlags = SendFlags.SIGNALED;
    qp.wrRdmaWrite(server.mr.rkey, server.at(0));
    qp.wrSetSge(client.mr.lkey, client.at(0), 8);
    qp.wrAbort();
    expect(qp.wrOpen).toBe(false);
    qp.wrStart();
    qp.wrFlags = SendFlags.SIGNALED;
    qp.wrRdmaWrite(server.mr.rkey, server.at(0));
    qp.wrSetSge(client.mr.lkey, client.at(0), 8);
    qp.wrRdmaWrite(-1, server.at(0));
    qp.wrSetSge(client.mr.lkey, client.at(0), 8);
    const e = thrown(() => qp.wrComplete()) as Error & { code?: string; badWr?: number; field?: string };
    expect([e.code, e.badWr, e.field]).toEqual(['EINVAL', 1, 'rdma.rkey']);
    expect(qp.wrOpen).toBe(false);
    await expect(next(client.cq, 100)).rejects.toMatchObject({ code: 'ETIMEDOUT' });
    allBytes(server.bytes(0, 8), 0);
  });
});

describe('refused: operations outside sendOpsFlags, calls out of order, flags not offered', () => {
  test('EOPNOTSUPP for an operation the QP was not created for; EINVAL outside a batch', () => {
    const { client, server } = createPlayers({ sendOpsFlags: QpExSendOps.WITH_SEND });
    const qp = ex(client);
    expect(thrown(() => qp.wrSend()).message).toMatch(/wrStart\(\)/);
    expect(thrown(() => qp.wrSetSge(client.mr.lkey, client.at(0), 8)).code).toBe('EINVAL');
    expect(thrown(() => qp.wrComplete()).code).toBe('EINVAL');
    qp.wrStart();
    expect(thrown(() => qp.wrStart()).code).toBe('EINVAL');
    expect(thrown(() => qp.wrSetSge(client.mr.lkey, client.at(0), 8)).message).toMatch(/an operation/);
    const e = thrown(() => qp.wrRdmaWrite(server.mr.rkey, server.at(0)));
    expect(e.code).toBe('EOPNOTSUPP');
    expect(e.syscall).toBe('ibv_wr_rdma_write');
    expect(e.message).toMatch(/WITH_RDMA_WRITE/);
    expect(thrown(() => qp.wrAtomicFetchAdd(server.mr.rkey, server.at(0), 1n)).code).toBe('EOPNOTSUPP');
    qp.wrAbort();
  });

  test('createQpEx: sendOpsFlags missing, empty or not offered (memory windows) is refused; nothing is left behind', () => {
    const { client } = createPlayers({ connect: false });
    const init = { sendCq: client.cq, recvCq: client.cq };
    expect(thrown(() => client.ctx.createQpEx(client.pd, init as never)).code).toBe('EINVAL');
    expect(thrown(() => client.ctx.createQpEx(client.pd, { ...init, sendOpsFlags: 0 })).code).toBe('EINVAL');
    for (const f of [QpExSendOps.WITH_BIND_MW, QpExSendOps.WITH_LOCAL_INV, QpExSendOps.WITH_SEND_WITH_INV]) {
      const e = thrown(() => client.ctx.createQpEx(client.pd, { ...init, sendOpsFlags: QpExSendOps.WITH_SEND | f }));
      expect(e.code).toBe('EOPNOTSUPP');
    }
    expect(thrown(() => client.ctx.createQpEx(client.pd, { ...init, sendOpsFlags: QpExSendOps.WITH_BIND_MW })).message).toMatch(/WITH_BIND_MW/);
    // The refused QPs hold nothing: the PD's users are its MR and the one QP createPlayers made.
    client.qp.destroy();
    client.mr.dereg();
    client.pd.dealloc();
    expect(client.pd.closed).toBe(true);
  });
});

describe('ibv_wr_atomic_write takes its 8 bytes as an argument (issue 35)', () => {
  test('a line-by-line port (no SGE) writes exactly the argument; a wrong-sized argument is EINVAL', async () => {
    const { client, server } = createPlayers({ sendOpsFlags: QpExSendOps.WITH_ATOMIC_WRITE });
    const qp = client.qp as QueuePairEx;
    server.fill(0x33, 0, 64);
    for (let i = 0; i < 20; i++) {
      const word = Buffer.from([1, 2, 3, 4, 5, 6, 7, i]);
      qp.wrStart();
      qp.wrFlags = SendFlags.SIGNALED;
      qp.wrId = i;
      qp.wrAtomicWrite(server.mr.rkey, server.at(8), word);
      word.fill(0); // copied at the call, as libibverbs copies atomic_wr into the WQE
      qp.wrComplete();
      const wc = await pollOk(client.cq);
      expect([wc.opcode, wc.byteLen]).toEqual([WcOpcode.ATOMIC_WRITE, 8]);
      expect([...server.bytes(8, 8)]).toEqual([1, 2, 3, 4, 5, 6, 7, i]);
    }
    expect(server.bytes(0, 8).every((b) => b === 0x33) && server.bytes(16, 48).every((b) => b === 0x33)).toBe(true);
    qp.wrStart();
    expect(thrown(() => qp.wrAtomicWrite(server.mr.rkey, server.at(8), new Uint8Array(4))).code).toBe('EINVAL');
    qp.wrAbort();
  });
});
