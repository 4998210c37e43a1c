// ibv_query_qp, the MR's attributes and its ODP counters as `rdma statistic mr` prints them
// (struct ib_odp_counters: page faults, invalidations, prefetch), ibv_reg_mr_ex, and
// Access.HUGETLB on hugetlbfs memory. Traffic is rdma-core's: 100 × 1 KiB with both buffers
// evicted (MADV_DONTNEED) before every iteration.
import { afterAll, afterEach, beforeAll, describe, expect, test } from 'vitest';
import {
  Access,
  AdviseMrAdvice,
  AdviseMrFlags,
  connectQps,
  formatMrStatistics,
  HUGE_PAGE_SIZE,
  mapRegion,
  QP_DEFAULTS,
  QpAttrMask,
  QpState,
  QpType,
  SendFlags,
  SIZE_MAX,
  WcOpcode,
  WrOpcode,
} from '../../lib/index.js';
import { freeHugePages, reserveHugePages } from '../helpers.js';
import { allBytes, closeAll, createPlayers, MSG, ODP_ACCESS, P, pollOk, rdmaTraffic, region, thrown, track } from './helpers.js';

afterEach(closeAll);

describe('ibv_query_qp', () => {
  test('every attribute after connectQps, the current PSNs, and only the masked ones with attrMask', async () => {
    const { client, server } = createPlayers({ connect: false });
    expect(client.ctx.queryQp(client.qp)).toMatchObject({ qpState: QpState.RESET, qpType: QpType.RC, sqSigAll: false, destQpNum: -1 });
    for (const [a, b] of [
      [client, server],
      [server, client],
    ] as const) {
      a.qp.modify({ qpState: QpState.INIT, portNum: 1, qpAccessFlags: ODP_ACCESS & 0xf });
      a.qp.modify({ qpState: QpState.RTR, destQpNum: b.qp.qpNum, destNode: b.ctx.node, pathMtu: 2048, rqPsn: 100, maxDestRdAtomic: 4 });
      a.qp.modify({ qpState: QpState.RTS, sqPsn: 100, maxRdAtomic: 4 });
    }
    const q = client.ctx.queryQp(client.qp);
    expect(q).toEqual({
      qpState: QpState.RTS,
      curQpState: QpState.RTS,
      qpType: QpType.RC,
      sqSigAll: false,
      sqDraining: false,
      qpAccessFlags: ODP_ACCESS & 0xf,
      pkeyIndex: 0,
      portNum: 1,
      destNode: 1,
      pathMtu: 2048,
      timeout: QP_DEFAULTS.timeout,
      retryCnt: QP_DEFAULTS.retryCnt,
      rnrRetry: QP_DEFAULTS.rnrRetry,
      rqPsn: 100,
      maxRdAtomic: 4,
      minRnrTimer: QP_DEFAULTS.minRnrTimer,
      sqPsn: 100,
      maxDestRdAtomic: 4,
      cap: { maxSendWr: 1000, maxRecvWr: 1000, maxSendSge: 2, maxRecvSge: 2 },
      destQpNum: server.qp.qpNum,
    });
    // Three messages later: the client's next PSN is the server's expected one.
    for (let i = 0; i < 3; i++) {
      client.qp.postSend({
        wrId: i,
        opcode: WrOpcode.RDMA_WRITE,
        sgList: [client.sge(0, MSG)],
        sendFlags: SendFlags.SIGNALED,
        rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
      });
      await pollOk(client.cq);
    }
    expect(client.qp.query(QpAttrMask.SQ_PSN).sqPsn).toBe(103);
    expect(server.qp.query(QpAttrMask.RQ_PSN).rqPsn).toBe(103);
    expect(client.qp.query(QpAttrMask.STATE | QpAttrMask.DEST_QPN | QpAttrMask.PATH_MTU)).toEqual({
      qpState: QpState.RTS,
      qpType: QpType.RC,
      sqSigAll: false,
      destQpNum: server.qp.qpNum,
      pathMtu: 2048,
    });
  });

  test('bad masks, foreign QPs, a path MTU that is no ibv_mtu and a second port are EINVAL', () => {
    const { client, server } = createPlayers({ connect: false });
    expect(thrown(() => client.ctx.queryQp(client.qp, 1 << 25)).code).toBe('EINVAL');
    expect(thrown(() => client.ctx.queryQp(server.qp)).message).toMatch(/created by this context/);
    client.qp.modify({ qpState: QpState.INIT, portNum: 1 });
    const mtu = thrown(() => client.qp.modify({ qpState: QpState.RTR, destQpNum: server.qp.qpNum, destNode: 1, pathMtu: 1500 }));
    expect([mtu.code, mtu.message]).toEqual(['EINVAL', expect.stringMatching(/256, 512, 1024, 2048 or 4096/)]);
    expect(thrown(() => client.qp.modify({ qpState: QpState.INIT, portNum: 2 })).code).toBe('EINVAL');
    client.qp.destroy();
    expect(thrown(() => client.qp.query()).code).toBe('ERR_PFR_CLOSED');
  });
});

describe('queryMr and the per-MR ODP counters (rdma statistic mr)', () => {
  test('100 RDMA WRITEs with both MRs evicted every iteration: page_faults and page_invalidations count the pages, per MR', async () => {
    const { client, server } = createPlayers({ policy: 'touch' });
    await rdmaTraffic(client, server, WrOpcode.RDMA_WRITE, { iters: 50 }); // 100 writes, 50 each way
    // Every write's target page was evicted: one page fault per write on the target's MR. Each
    // eviction after the first unmapped the page the last transfer or fill had mapped.
    for (const p of [client, server]) {
      const odp = p.ctx.queryMr(p.mr).odp!;
      expect(odp.faults).toBe(50);
      expect(odp.faultsHandled).toBe(50);
      expect(odp.prefetch).toBe(0);
      expect(odp.invalidations).toBe(odp.invalidationsHandled);
      expect(odp.invalidations).toBe(99);
    }
    const rows = server.ctx.statisticMr();
    expect(rows).toEqual([
      { dev: 'pfr1', mrn: server.mr.lkey, faults: 50, faultsHandled: 50, invalidations: 99, invalidationsHandled: 99, prefetch: 0 },
    ]);
    expect(formatMrStatistics(rows)).toBe(
      `dev pfr1 mrn ${server.mr.lkey} page_faults 50 page_faults_handled 50 page_invalidations 99 page_invalidations_handled 99 page_prefetch 0`,
    );
  });

  test('touch-ahead: one fault handled maps the whole transfer (page_faults 8, page_faults_handled 1); an eviction of 8 resident pages is one invalidation of 8', async () => {
    const { client, server } = createPlayers();
    server.region.evict();
    client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [client.sge(0, 8 * P)],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    const wc = await pollOk(client.cq);
    expect(wc.odp!.faults.destination).toBe(1);
    expect(server.mr.odpStats).toMatchObject({ faults: 8, faultsHandled: 1, invalidations: 0 });
    server.region.evict(4 * P, 12 * P); // 4 of the 8 mapped pages, and 8 that were not
    expect(server.mr.odpStats).toMatchObject({ invalidations: 4, invalidationsHandled: 1 });
    server.region.evict(); // the other 4
    expect(server.mr.odpStats).toMatchObject({ invalidations: 8, invalidationsHandled: 2 });
    server.region.evict(); // nothing mapped: nothing counted
    expect(server.mr.odpStats).toMatchObject({ invalidations: 8, invalidationsHandled: 2 });
  });

  test('adviseMr counts page_prefetch: PREFETCH maps every page, NO_FAULT only the resident ones', async () => {
    const { client } = createPlayers();
    client.region.evict();
    await client.ctx.adviseMr(client.pd, AdviseMrAdvice.PREFETCH_WRITE, AdviseMrFlags.FLUSH, [client.sge(0, 4 * P)]);
    expect(client.mr.odpStats.prefetch).toBe(4);
    client.region.evict(2 * P, 2 * P);
    await client.ctx.adviseMr(client.pd, AdviseMrAdvice.PREFETCH_NO_FAULT, AdviseMrFlags.FLUSH, [client.sge(0, 4 * P)]);
    expect(client.mr.odpStats.prefetch).toBe(6);
    expect(client.region.residentPages(0, 4 * P)).toBe(2);
    expect(client.mr.odpStats.faults).toBe(0);
  });

  test('queryMr: the ibv_mr fields; a pinned MR has no ODP counters and no statistic row; implicit ODP counts its faults and invalidations', async () => {
    const { client, server } = createPlayers({ implicit: true });
    const pinnedRegion = region(4 * P);
    const pinned = client.ctx.regMr(client.pd, pinnedRegion, P, 2 * P, Access.LOCAL_WRITE);
    expect(client.ctx.queryMr(pinned)).toEqual({
      addr: pinnedRegion.address + BigInt(P),
      length: BigInt(2 * P),
      iova: pinnedRegion.address + BigInt(P),
      lkey: pinned.lkey,
      rkey: pinned.rkey,
      access: Access.LOCAL_WRITE,
      onDemand: false,
      implicit: false,
      pinned: true,
      odp: undefined,
    });
    expect(client.ctx.queryMr(client.mr)).toMatchObject({ addr: 0n, length: SIZE_MAX, implicit: true, onDemand: true });
    expect(client.ctx.statisticMr().map((r) => r.mrn)).toEqual([client.mr.lkey]);
    server.region.evict();
    client.fill(0x5a, 0, MSG);
    client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [client.sge(0, MSG)],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    await pollOk(client.cq);
    allBytes(server.bytes(0, MSG), 0x5a);
    expect(server.mr.odpStats.faultsHandled).toBe(1);
    expect(server.mr.odpStats.faults).toBeGreaterThanOrEqual(1);
    // The implicit MR watches the regions it reached: evicting the written page is an invalidation.
    server.region.evict();
    expect(server.mr.odpStats).toMatchObject({ invalidations: 1, invalidationsHandled: 1 });
    expect(thrown(() => server.ctx.queryMr(client.mr)).code).toBe('EINVAL');
    pinned.dereg();
    expect(thrown(() => client.ctx.queryMr(pinned)).message).toMatch(/deregistered/);
  });
});

describe('ibv_reg_mr_ex', () => {
  test('the struct form registers as regMr does; iova equal to the address is accepted; another iova or ZERO_BASED is EOPNOTSUPP', () => {
    const { client } = createPlayers({ connect: false });
    const r = region(8 * P);
    const mr = client.ctx.regMrEx(client.pd, { addr: r, offset: 2 * P, length: 4 * P, iova: r.address + BigInt(2 * P), access: ODP_ACCESS });
    expect([mr.addr, mr.length, mr.onDemand]).toEqual([r.address + BigInt(2 * P), 4 * P, true]);
    const whole = client.ctx.regMrEx(client.pd, { addr: r.buffer, access: Access.LOCAL_WRITE | Access.ON_DEMAND });
    expect(whole.length).toBe(8 * P);
    const implicit = client.ctx.regMrEx(client.pd, { addr: null, access: ODP_ACCESS });
    expect(implicit.implicit).toBe(true);
    const other = thrown(() => client.ctx.regMrEx(client.pd, { addr: r, iova: 0x10000n, access: ODP_ACCESS }));
    expect([other.code, other.syscall]).toEqual(['EOPNOTSUPP', 'ibv_reg_mr_ex']);
    expect(other.message).toMatch(/omit iova/);
    expect(thrown(() => client.ctx.regMrEx(client.pd, { addr: r, access: ODP_ACCESS | Access.ZERO_BASED })).code).toBe('EOPNOTSUPP');
    // regMr too: the flag was accepted and ignored before, so remote addresses were not offsets.
    expect(thrown(() => client.ctx.regMr(client.pd, r, 0, P, ODP_ACCESS | Access.ZERO_BASED)).message).toMatch(/ZERO_BASED is not offered/);
    expect(thrown(() => client.ctx.regMrEx(client.pd, { addr: r, access: 1 << 12 })).code).toBe('EINVAL');
    expect(thrown(() => client.ctx.regMrEx(client.pd, { addr: r, iova: 5 as unknown as bigint, access: ODP_ACCESS })).code).toBe('EINVAL');
  });
});

// hugetlbfs memory needs the pool reserved (as the kernel's run_vmtests.sh does, as root); the
// test gives the pool back afterwards.
const WANT = 4;
let pool: { release(): void } | undefined;
let noHuge = '';
beforeAll(() => {
  try {
    pool = reserveHugePages(WANT);
    if (freeHugePages() < WANT) noHuge = `only ${freeHugePages()} free 2 MiB pages after raising vm.nr_hugepages`;
  } catch (e) {
    noHuge = `vm.nr_hugepages cannot be raised here (${(e as Error).message}); run as root`;
  }
});
afterAll(() => pool?.release());

describe('Access.HUGETLB on hugetlbfs memory (MAP_HUGETLB)', () => {
  test('regMrEx with HUGETLB on hugetlb regions; 100 × 1 KiB SEND ping-pong evicted every iteration: each fault maps one 2 MiB page', async (ctx) => {
    if (noHuge) ctx.skip(noHuge);
    const { client, server } = createPlayers({ connect: false });
    const huge = [track(mapRegion(HUGE_PAGE_SIZE, { hugetlb: true })), track(mapRegion(HUGE_PAGE_SIZE, { hugetlb: true }))];
    const mrs = [client, server].map((p, i) =>
      p.ctx.regMrEx(p.pd, { addr: huge[i]!, access: ODP_ACCESS | Access.HUGETLB, options: { policy: 'touch' } }),
    );
    expect(mrs[0]!.access & Access.HUGETLB).toBe(Access.HUGETLB);
    connectQps(client.qp, server.qp);
    const sge = (i: number, off: number) => ({ addr: huge[i]!.address + BigInt(off), length: MSG, lkey: mrs[i]!.lkey });
    const players = [client, server];
    for (let it = 0; it < 100; it++) {
      huge[0]!.evict();
      huge[1]!.evict();
      for (const [from, to, byte] of [
        [0, 1, 0x63],
        [1, 0, 0x73],
      ] as const) {
        players[to]!.qp.postRecv({ wrId: it, sgList: [sge(to, 4096)] });
        new Uint8Array(huge[from]!.buffer, 0, MSG).fill(byte);
        players[from]!.qp.postSend({ wrId: it, opcode: WrOpcode.SEND, sgList: [sge(from, 0)], sendFlags: SendFlags.SIGNALED });
        const s = await pollOk(players[from]!.cq);
        const r = await pollOk(players[to]!.cq);
        expect([s.opcode, r.opcode, r.byteLen]).toEqual([WcOpcode.SEND, WcOpcode.RECV, MSG]);
        allBytes(Buffer.from(huge[to]!.buffer, 4096, MSG), byte);
        // The sender's huge page was made resident by its fill; the receiver's, in the first
        // direction, was evicted: one fault of one 2 MiB page.
        expect(s.odp!.faults).toEqual(from === 0 ? { source: 0, destination: 1 } : { source: 0, destination: 0 });
      }
    }
    // page_faults counts 2 MiB pages, as the MR's page size is.
    expect(server.ctx.queryMr(mrs[1]!).odp).toMatchObject({ faults: 100, faultsHandled: 100, invalidations: 99, invalidationsHandled: 99 });
  });

  test('HUGETLB on memory without huge pages is EINVAL naming both ways to get them', () => {
    const { client } = createPlayers({ connect: false });
    const e = thrown(() => client.ctx.regMrEx(client.pd, { addr: region(4 * P), access: ODP_ACCESS | Access.HUGETLB }));
    expect(e.code).toBe('EINVAL');
    expect(e.message).toMatch(/\{ hugetlb: true \}.*\{ hugePages: true \}/);
  });
});
