// Off-by-one edges of the verbs layer, each next to the case just inside it: an MR's own
// bounds (on MRs that do not cover their whole region, so the SMMU's region check cannot
// stand in for the MR's), a SEND one byte larger than the receive, and rnr_retry 7 (infinite)
// through far more than 7 RNR NAKs.
import { afterEach, describe, expect, test } from 'vitest';
import { QpState, SendFlags, WcOpcode, WcStatus, WrOpcode, type MemoryRegion, type SendWr, type WorkCompletion } from '../../lib/index.js';
import { closeAll, createPlayers, next, ODP_ACCESS, P, type Player } from './helpers.js';

afterEach(closeAll);

/** Post `wr` (signaled) on `p` and return its completion. */
async function run(p: Player, wr: Omit<SendWr, 'wrId' | 'sendFlags'>): Promise<WorkCompletion> {
  p.qp.postSend({ wrId: 1, sendFlags: SendFlags.SIGNALED, ...wr });
  return next(p.cq);
}

/** A second MR on `p`'s region covering pages 1..2 of its 4 (the region goes on both sides). */
function partialMr(p: Player): MemoryRegion {
  return p.ctx.regMr(p.pd, p.region, P, 2 * P, ODP_ACCESS);
}

const N = 512;

describe("an MR's own bounds, to the byte", () => {
  test.each([
    ['RDMA_WRITE', WrOpcode.RDMA_WRITE],
    ['RDMA_READ', WrOpcode.RDMA_READ],
  ])('%s ending one byte past a partial remote MR: REM_ACCESS_ERR, nothing moved; ending exactly at its end: success', async (_, opcode) => {
    const past = createPlayers({ size: 4 * P });
    const mr = partialMr(past.server);
    const end = mr.addr + BigInt(mr.length);
    past.server.fill(0x22, 0, 4 * P);
    past.client.fill(0x77, 0, 4 * P);
    const wc = await run(past.client, { opcode, sgList: [past.client.sge(0, N)], rdma: { remoteAddr: end - BigInt(N) + 1n, rkey: mr.rkey } });
    expect(wc.status).toBe(WcStatus.REM_ACCESS_ERR);
    expect(past.server.bytes(0, 4 * P).every((b) => b === 0x22)).toBe(true);
    expect(past.client.bytes(0, N).every((b) => b === 0x77)).toBe(true);
    closeAll();

    const at = createPlayers({ size: 4 * P });
    const mr2 = partialMr(at.server);
    at.server.fill(0x22, 0, 4 * P);
    at.client.fill(0x77, 0, 4 * P);
    const off = 3 * P - N; // region offset of the last N bytes of the MR
    const ok = await run(at.client, {
      opcode,
      sgList: [at.client.sge(0, N)],
      rdma: { remoteAddr: mr2.addr + BigInt(mr2.length - N), rkey: mr2.rkey },
    });
    expect(ok.status).toBe(WcStatus.SUCCESS);
    if (opcode === WrOpcode.RDMA_WRITE) {
      expect(at.server.bytes(off, N).every((b) => b === 0x77)).toBe(true);
      expect(at.server.bytes(3 * P, P).every((b) => b === 0x22)).toBe(true); // past the MR: untouched
    } else {
      expect(at.client.bytes(0, N).every((b) => b === 0x22)).toBe(true);
    }
  });

  test('a remote range starting one byte before a partial MR: REM_ACCESS_ERR; at its start: success', async () => {
    const a = createPlayers({ size: 4 * P });
    const mr = partialMr(a.server);
    a.server.fill(0x22, 0, 4 * P);
    a.client.fill(0x77, 0, N);
    expect(
      (await run(a.client, { opcode: WrOpcode.RDMA_WRITE, sgList: [a.client.sge(0, N)], rdma: { remoteAddr: mr.addr - 1n, rkey: mr.rkey } })).status,
    ).toBe(WcStatus.REM_ACCESS_ERR);
    expect(a.server.bytes(0, 4 * P).every((b) => b === 0x22)).toBe(true);
    closeAll();
    const b = createPlayers({ size: 4 * P });
    const mr2 = partialMr(b.server);
    b.client.fill(0x77, 0, N);
    expect(
      (await run(b.client, { opcode: WrOpcode.RDMA_WRITE, sgList: [b.client.sge(0, N)], rdma: { remoteAddr: mr2.addr, rkey: mr2.rkey } })).status,
    ).toBe(WcStatus.SUCCESS);
    expect(b.server.bytes(P, N).every((x) => x === 0x77)).toBe(true);
  });

  test('a local SGE ending one byte past a partial local MR: LOC_PROT_ERR, nothing moved; ending exactly at its end: success', async () => {
    const a = createPlayers({ size: 4 * P });
    const mr = partialMr(a.client);
    a.server.fill(0x22, 0, 4 * P);
    a.client.fill(0x77, 0, 4 * P);
    const sge = (extra: number) => ({ addr: mr.addr + BigInt(mr.length - N + extra), length: N, lkey: mr.lkey });
    const wc = await run(a.client, { opcode: WrOpcode.RDMA_WRITE, sgList: [sge(1)], rdma: { remoteAddr: a.server.at(0), rkey: a.server.mr.rkey } });
    expect(wc.status).toBe(WcStatus.LOC_PROT_ERR);
    expect(a.server.bytes(0, 4 * P).every((b) => b === 0x22)).toBe(true);
    closeAll();
    const b = createPlayers({ size: 4 * P });
    const mr2 = partialMr(b.client);
    b.client.fill(0x77, 0, 4 * P);
    const ok = await run(b.client, {
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [{ addr: mr2.addr + BigInt(mr2.length - N), length: N, lkey: mr2.lkey }],
      rdma: { remoteAddr: b.server.at(0), rkey: b.server.mr.rkey },
    });
    expect(ok.status).toBe(WcStatus.SUCCESS);
    expect(b.server.bytes(0, N).every((x) => x === 0x77)).toBe(true);
  });

  test("a receive SGE ending one byte past a partial MR: the responder's LOC_PROT_ERR, the requester's REM_OP_ERR", async () => {
    const { client, server } = createPlayers({ size: 4 * P });
    const mr = partialMr(server);
    server.fill(0x22, 0, 4 * P);
    client.fill(0x77, 0, N);
    server.qp.postRecv({ wrId: 5, sgList: [{ addr: mr.addr + BigInt(mr.length - N + 1), length: N, lkey: mr.lkey }] });
    const wc = await run(client, { opcode: WrOpcode.SEND, sgList: [client.sge(0, N)] });
    expect(wc.status).toBe(WcStatus.REM_OP_ERR);
    expect(await next(server.cq)).toMatchObject({ wrId: 5n, status: WcStatus.LOC_PROT_ERR });
    expect(server.bytes(0, 4 * P).every((b) => b === 0x22)).toBe(true);
  });
});

describe('SEND one byte larger than the posted receive', () => {
  test('513 bytes into a 512-byte receive: responder LOC_LEN_ERR, requester REM_INV_REQ_ERR, not one byte written', async () => {
    const { client, server } = createPlayers();
    server.fill(0x22, 0, 2 * N);
    client.fill(0x11, 0, N + 1);
    server.qp.postRecv({ wrId: 7, sgList: [server.sge(0, N)] });
    const wc = await run(client, { opcode: WrOpcode.SEND, sgList: [client.sge(0, N + 1)] });
    expect(wc).toMatchObject({ status: WcStatus.REM_INV_REQ_ERR, statusStr: 'remote invalid request error', opcode: WcOpcode.SEND, byteLen: 0 });
    expect(await next(server.cq)).toMatchObject({
      wrId: 7n,
      status: WcStatus.LOC_LEN_ERR,
      statusStr: 'local length error',
      opcode: WcOpcode.RECV,
      byteLen: 0,
    });
    // No truncation: the first 512 bytes did not land either.
    expect(server.bytes(0, 2 * N).every((b) => b === 0x22)).toBe(true);
    expect(server.qp.state).toBe(QpState.ERR);
    expect(client.qp.state).toBe(QpState.ERR);
  });

  test('512 bytes into the same receive: success, byteLen 512', async () => {
    const { client, server } = createPlayers();
    server.fill(0x22, 0, 2 * N);
    client.fill(0x11, 0, N + 1);
    server.qp.postRecv({ wrId: 7, sgList: [server.sge(0, N)] });
    expect((await run(client, { opcode: WrOpcode.SEND, sgList: [client.sge(0, N)] })).status).toBe(WcStatus.SUCCESS);
    expect(await next(server.cq)).toMatchObject({ wrId: 7n, status: WcStatus.SUCCESS, byteLen: N });
    expect(server.bytes(0, N).every((b) => b === 0x11)).toBe(true);
    expect(server.bytes(N, N).every((b) => b === 0x22)).toBe(true);
  });
});

describe('rnrRetry 7 is infinite', () => {
  // One 32-page block into an evicted receive buffer resolved a page at a time: each try of
  // the block faults at its next missing page, so the block is NACKed 32 times.
  const PAGES = 32;
  const big = (rnrRetry: number) => createPlayers({ size: PAGES * P, policy: 'touch', rc: { rnrRetry }, cluster: { blockSize: PAGES * P } });

  test('a SEND whose one block is NACKed 32 times by the destination still succeeds', async () => {
    const { client, server } = big(7);
    client.fill(0x4d, 0, PAGES * P);
    server.region.evict();
    server.qp.postRecv({ wrId: 3, sgList: [server.sge(0, PAGES * P)] });
    const wc = await run(client, { opcode: WrOpcode.SEND, sgList: [client.sge(0, PAGES * P)] });
    expect(wc.status).toBe(WcStatus.SUCCESS);
    expect(wc.odp!.faults.destination).toBe(PAGES);
    expect(wc.odp!.retransmittedBlocks).toBe(PAGES);
    expect(await next(server.cq)).toMatchObject({ wrId: 3n, status: WcStatus.SUCCESS, byteLen: PAGES * P });
    expect(server.bytes(0, PAGES * P).every((b) => b === 0x4d)).toBe(true);
  });

  test('the same SEND with rnrRetry 6 gives up after 7 NACKs of that block: RNR_RETRY_EXC_ERR', async () => {
    const { client, server } = big(6);
    client.fill(0x4d, 0, PAGES * P);
    server.region.evict();
    server.qp.postRecv({ wrId: 3, sgList: [server.sge(0, PAGES * P)] });
    const wc = await run(client, { opcode: WrOpcode.SEND, sgList: [client.sge(0, PAGES * P)] });
    expect(wc.status).toBe(WcStatus.RNR_RETRY_EXC_ERR);
    expect(wc.odp!.faults.destination).toBe(7);
  });

  // A READ's bytes are moved by the responder into the requester's sink: the requester's
  // rnrRetry governs the NACKs of its own memory there too.
  const read = async (rnrRetry: number) => {
    const { client, server } = big(rnrRetry);
    server.fill(0x4e, 0, PAGES * P);
    client.region.evict();
    const wc = await run(client, {
      opcode: WrOpcode.RDMA_READ,
      sgList: [client.sge(0, PAGES * P)],
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    return { wc, client };
  };

  test("an RDMA READ whose one block is NACKed 32 times by the requester's own sink still succeeds", async () => {
    const { wc, client } = await read(7);
    expect(wc).toMatchObject({ status: WcStatus.SUCCESS, byteLen: PAGES * P });
    expect(wc.odp!.faults.destination).toBe(PAGES);
    expect(client.bytes(0, PAGES * P).every((b) => b === 0x4e)).toBe(true);
  });

  test('the same READ with rnrRetry 6 gives up after 7 NACKs: RNR_RETRY_EXC_ERR, byteLen 0', async () => {
    const { wc } = await read(6);
    expect(wc).toMatchObject({ status: WcStatus.RNR_RETRY_EXC_ERR, byteLen: 0 });
    expect(wc.odp!.faults.destination).toBe(7);
  });
});
