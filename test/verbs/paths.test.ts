// Paths of the verbs layer that only ran with one SGE, one piece, one waiter or a fast RNR
// timer: several SGEs on both sides, receives and reads that need LOCAL_WRITE, zero-length
// and failed WRs' byte counts, RNR timing, per-MR options at registration, and advise_mr on
// ranges that do not start on a page.
import { afterEach, describe, expect, test } from 'vitest';
import { Access, AdviseMrAdvice, AdviseMrFlags, SendFlags, Userfaultfd, WcStatus, WrOpcode, type SendWr } from '../../lib/index.js';
import { closeAll, createPlayers, next, ODP_ACCESS, P, pollOk, region, sleep, track, type Player } from './helpers.js';

afterEach(closeAll);

async function run(p: Player, wr: Omit<SendWr, 'wrId' | 'sendFlags'>) {
  p.qp.postSend({ wrId: 1, sendFlags: SendFlags.SIGNALED, ...wr });
  return next(p.cq);
}

describe('several SGEs', () => {
  test('an RDMA WRITE of two SGEs lands them back to back at the remote address; a READ of two SGEs fills them in order', async () => {
    const { client, server } = createPlayers({ cap: { maxSendSge: 2 } });
    client.fill(0x31, 0, 300);
    client.fill(0x32, 4 * P, 700);
    server.fill(0x00, 0, 2000);
    const wc = await run(client, {
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [client.sge(0, 300), client.sge(4 * P, 700)],
      rdma: { remoteAddr: server.at(100), rkey: server.mr.rkey },
    });
    expect(wc).toMatchObject({ status: WcStatus.SUCCESS, byteLen: 1000 });
    expect(wc.odp!.modelUs).toBeGreaterThan(0);
    expect(wc.odp!.modelUs).toBeLessThan(100);
    expect(server.bytes(100, 300).every((b) => b === 0x31)).toBe(true);
    expect(server.bytes(400, 700).every((b) => b === 0x32)).toBe(true);
    expect(server.bytes(1100, 100).every((b) => b === 0)).toBe(true);
    server.fill(0x41, 2 * P, 200);
    server.fill(0x42, 2 * P + 200, 300);
    const rd = await run(client, {
      opcode: WrOpcode.RDMA_READ,
      sgList: [client.sge(8 * P, 200), client.sge(12 * P, 300)],
      rdma: { remoteAddr: server.at(2 * P), rkey: server.mr.rkey },
    });
    expect(rd).toMatchObject({ status: WcStatus.SUCCESS, byteLen: 500 });
    expect(client.bytes(8 * P, 200).every((b) => b === 0x41)).toBe(true);
    expect(client.bytes(12 * P, 300).every((b) => b === 0x42)).toBe(true);
  });

  test('a SEND of two SGEs scattered over three receive SGEs of other sizes', async () => {
    const { client, server } = createPlayers({ cap: { maxSendSge: 3, maxRecvSge: 3 } });
    client.fill(0x51, 0, 300);
    client.fill(0x52, P, 700);
    server.fill(0, 0, 4 * P);
    server.qp.postRecv({ wrId: 4, sgList: [server.sge(0, 500), server.sge(P, 200), server.sge(2 * P, 1000)] });
    expect((await run(client, { opcode: WrOpcode.SEND, sgList: [client.sge(0, 300), client.sge(P, 700)] })).status).toBe(WcStatus.SUCCESS);
    const r = await pollOk(server.cq);
    expect(r).toMatchObject({ wrId: 4n, byteLen: 1000, wcFlags: 0 });
    expect(r.immData).toBeUndefined();
    const got = Buffer.concat([server.bytes(0, 500), server.bytes(P, 200), server.bytes(2 * P, 300)]);
    const want = Buffer.concat([Buffer.alloc(300, 0x51), Buffer.alloc(700, 0x52)]);
    expect(got.equals(want)).toBe(true);
    expect(server.bytes(2 * P + 300, 700).every((b) => b === 0)).toBe(true);
  });

  test('an atomic with two 8-byte SGEs: LOC_LEN_ERR', async () => {
    const { client, server } = createPlayers({ cap: { maxSendSge: 2 } });
    const wc = await run(client, {
      opcode: WrOpcode.ATOMIC_FETCH_AND_ADD,
      sgList: [client.sge(0, 8), client.sge(8, 8)],
      atomic: { remoteAddr: server.at(0), rkey: server.mr.rkey, compareAdd: 1n },
    });
    expect(wc.status).toBe(WcStatus.LOC_LEN_ERR);
  });
});

describe('LOCAL_WRITE', () => {
  test('an RDMA READ or an atomic into a local MR without LOCAL_WRITE: LOC_PROT_ERR; a WRITE from it is fine', async () => {
    for (const op of ['read', 'atomic', 'cas', 'write'] as const) {
      const { client, server } = createPlayers();
      const ro = client.ctx.regMr(client.pd, client.region, 0, 4 * P, Access.REMOTE_READ | Access.ON_DEMAND);
      const sge = { addr: client.at(0), length: 8, lkey: ro.lkey };
      const wc =
        op === 'read'
          ? await run(client, { opcode: WrOpcode.RDMA_READ, sgList: [sge], rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey } })
          : op === 'atomic' || op === 'cas'
            ? await run(client, {
                opcode: op === 'cas' ? WrOpcode.ATOMIC_CMP_AND_SWP : WrOpcode.ATOMIC_FETCH_AND_ADD,
                sgList: [sge],
                atomic: { remoteAddr: server.at(0), rkey: server.mr.rkey, compareAdd: 0n, swap: 9n },
              })
            : await run(client, { opcode: WrOpcode.RDMA_WRITE, sgList: [sge], rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey } });
      expect(wc.status, op).toBe(op === 'write' ? WcStatus.SUCCESS : WcStatus.LOC_PROT_ERR);
      closeAll();
    }
  });

  test("a receive on an MR without LOCAL_WRITE: the responder's LOC_PROT_ERR, the requester's REM_OP_ERR, nothing written", async () => {
    const { client, server } = createPlayers();
    const ro = server.ctx.regMr(server.pd, server.region, 0, 4 * P, Access.REMOTE_READ | Access.ON_DEMAND);
    server.fill(0x22, 0, 64);
    client.fill(0x77, 0, 64);
    server.qp.postRecv({ wrId: 3, sgList: [{ addr: server.at(0), length: 64, lkey: ro.lkey }] });
    expect((await run(client, { opcode: WrOpcode.SEND, sgList: [client.sge(0, 64)] })).status).toBe(WcStatus.REM_OP_ERR);
    expect(await next(server.cq)).toMatchObject({ wrId: 3n, status: WcStatus.LOC_PROT_ERR });
    expect(server.bytes(0, 64).every((b) => b === 0x22)).toBe(true);
  });
});

describe('what a completion counts', () => {
  test('a zero-length RDMA WRITE succeeds with byteLen 0 and moves nothing', async () => {
    const { client, server } = createPlayers();
    server.fill(0x22, 0, 64);
    const wc = await run(client, {
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [{ addr: client.at(0), length: 0, lkey: client.mr.lkey }],
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    expect(wc).toMatchObject({ status: WcStatus.SUCCESS, byteLen: 0 });
    expect(server.bytes(0, 64).every((b) => b === 0x22)).toBe(true);
  });

  test('a plain RDMA WRITE consumes no receive: a later SEND finds it', async () => {
    const { client, server } = createPlayers();
    server.qp.postRecv({ wrId: 8, sgList: [server.sge(2 * P, 64)] });
    expect(
      (await run(client, { opcode: WrOpcode.RDMA_WRITE, sgList: [client.sge(0, 64)], rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey } }))
        .status,
    ).toBe(WcStatus.SUCCESS);
    await sleep(5);
    expect(server.cq.length).toBe(0);
    expect((await run(client, { opcode: WrOpcode.SEND, sgList: [client.sge(0, 64)] })).status).toBe(WcStatus.SUCCESS);
    expect((await next(server.cq)).wrId).toBe(8n);
  });

  test('a WR that fails after moving data reports byteLen 0', async () => {
    const { client, server } = createPlayers({ rc: { rnrRetry: 0 } });
    client.fill(0x51, 0, 4 * P);
    server.region.evict();
    const wc = await run(client, {
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [client.sge(0, 4 * P)],
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    expect(wc).toMatchObject({ status: WcStatus.RNR_RETRY_EXC_ERR, byteLen: 0 });
  });

  test('source faults past the retry limit: RETRY_EXC_ERR (not RNR); a source fault nobody can resolve: LOC_PROT_ERR', async () => {
    const a = createPlayers({ cluster: { retryLimit: 0 }, policy: 'touch' });
    a.client.region.evict();
    expect(
      (
        await run(a.client, {
          opcode: WrOpcode.RDMA_WRITE,
          sgList: [a.client.sge(0, 2 * P)],
          rdma: { remoteAddr: a.server.at(0), rkey: a.server.mr.rkey },
        })
      ).status,
    ).toBe(WcStatus.RETRY_EXC_ERR);
    closeAll();
    const b = createPlayers({ policy: 'touch' });
    b.client.region.evict();
    const uffd = track(Userfaultfd.open({ userModeOnly: true }));
    uffd.register(b.client.region);
    const wc = await run(b.client, {
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [b.client.sge(0, 2 * P)],
      rdma: { remoteAddr: b.server.at(0), rkey: b.server.mr.rkey },
    });
    uffd.unregister(b.client.region);
    expect(wc.status).toBe(WcStatus.LOC_PROT_ERR);
  });
});

describe('timing and options', () => {
  test('rnrRetry 1 with min_rnr_timer 0 (655.36 ms) waits one RNR timer, then gives up', async () => {
    const { client } = createPlayers({ rc: { rnrRetry: 1, minRnrTimer: 0 } });
    const t0 = performance.now();
    const wc = await run(client, { opcode: WrOpcode.SEND, sgList: [client.sge(0, 8)] });
    const ms = performance.now() - t0;
    expect(wc.status).toBe(WcStatus.RNR_RETRY_EXC_ERR);
    expect(ms).toBeGreaterThanOrEqual(640);
    expect(ms).toBeLessThan(1250);
  });

  test('connectQps passes every given attribute on', () => {
    const { client, server } = createPlayers({ rc: { minRnrTimer: 3, timeout: 9, retryCnt: 2, rnrRetry: 4 } });
    for (const q of [client.qp, server.qp]) expect(q.query()).toMatchObject({ minRnrTimer: 3, timeout: 9, retryCnt: 2, rnrRetry: 4 });
  });

  test("regMr with policyOptions: the cap is the MR's from the start", async () => {
    const { client, server } = createPlayers({ size: 16 * P });
    server.mr.dereg();
    const mr = server.ctx.regMr(server.pd, server.region, 0, 16 * P, ODP_ACCESS, { policy: 'touch-ahead', policyOptions: { cap: 4 * P } });
    client.fill(0x5c, 0, 16 * P);
    server.region.evict();
    const wc = await run(client, { opcode: WrOpcode.RDMA_WRITE, sgList: [client.sge(0, 16 * P)], rdma: { remoteAddr: mr.addr, rkey: mr.rkey } });
    expect(wc.odp!.faults.destination).toBe(4);
  });

  test('advise_mr on a range that starts mid-page makes exactly the pages it touches resident', async () => {
    const { client } = createPlayers({ size: 16 * P });
    client.region.evict();
    await client.ctx.adviseMr(client.pd, AdviseMrAdvice.PREFETCH_WRITE, AdviseMrFlags.FLUSH, [client.sge(P + 100, P)]);
    expect([...client.region.residency(0, 4 * P)]).toEqual([0, 1, 1, 0]);
    client.region.evict();
    await client.ctx.adviseMr(client.pd, AdviseMrAdvice.PREFETCH, AdviseMrFlags.FLUSH, [client.sge(15 * P + 8, 100)]);
    expect([...client.region.residency(14 * P, 2 * P)]).toEqual([0, 1]);
  });

  test('an async advise_mr is best effort: an MR deregistered or a region closed before it runs is skipped, the promise resolves', async () => {
    const { client } = createPlayers({ size: 8 * P });
    client.region.evict();
    const kept = client.ctx.regMr(client.pd, client.region, 0, 4 * P, ODP_ACCESS);
    const gone = client.ctx.regMr(client.pd, client.region, 4 * P, 4 * P, ODP_ACCESS);
    const p = client.ctx.adviseMr(client.pd, AdviseMrAdvice.PREFETCH_WRITE, 0, [
      { addr: kept.addr, length: 4 * P, lkey: kept.lkey },
      { addr: gone.addr, length: 4 * P, lkey: gone.lkey },
    ]);
    gone.dereg();
    await expect(p).resolves.toBeUndefined();
    expect([...client.region.residency(0, 8 * P)]).toEqual([1, 1, 1, 1, 0, 0, 0, 0]);
    const r = region(4 * P);
    const mr = client.ctx.regMr(client.pd, r, 0, 4 * P, ODP_ACCESS);
    const q = client.ctx.adviseMr(client.pd, AdviseMrAdvice.PREFETCH_WRITE, 0, [{ addr: r.address, length: P, lkey: mr.lkey }]);
    r.close();
    await expect(q).resolves.toBeUndefined();
  });

  test('two waiters on one CQ each get their own completion, in order', async () => {
    const { client, server } = createPlayers();
    const a = client.cq.next({ timeoutMs: 3000 });
    const b = client.cq.next({ timeoutMs: 3000 });
    for (const id of [1, 2])
      client.qp.postSend({
        wrId: id,
        opcode: WrOpcode.RDMA_WRITE,
        sendFlags: SendFlags.SIGNALED,
        sgList: [client.sge(0, 8)],
        rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
      });
    expect([(await a).wrId, (await b).wrId]).toEqual([1n, 2n]);
  });
});
