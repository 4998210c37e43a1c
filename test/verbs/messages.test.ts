// Every verb that refuses its input says why, in words a user can act on: the exact message
// (and code) of each refusal, so that a message lost or garbled is a failing test.
import { afterEach, expect, test } from 'vitest';
import { DEFAULT_COSTS, Fabric } from '../../kernel-sim/index.js';
import { Access, AdviseMrAdvice, Cluster, QpState, WrOpcode, type QpCap } from '../../lib/index.js';
import { closeAll, createPlayers, ODP_ACCESS, P, PINNED_ACCESS, region, thrown, track } from './helpers.js';

afterEach(closeAll);

const NAN = Number.NaN;

test('queue pairs: create, modify, post', () => {
  const { client, server } = createPlayers({ connect: false, cap: { maxSendWr: 2, maxRecvWr: 2, maxSendSge: 1, maxRecvSge: 1 } });
  const { ctx, pd, cq, qp } = client;
  const create = (init: unknown) => thrown(() => ctx.createQp(pd, init as never));
  expect(create(null).message).toBe('createQp: init must be an object');
  expect(create({ type: 'UC', sendCq: cq, recvCq: cq })).toMatchObject({
    code: 'EOPNOTSUPP',
    message: 'ibv_create_qp: QP type UC: RC, UD, XRC_SEND and XRC_RECV queue pairs are modelled (no UC)',
  });
  expect(create({ sendCq: cq })).toMatchObject({ code: 'ERR_INVALID_ARG_VALUE', message: 'createQp: sendCq and recvCq are required' });
  expect(create({ recvCq: cq }).message).toBe('createQp: sendCq and recvCq are required');
  for (const [k, v, range] of [
    ['maxSendWr', 0, '1..65536'],
    ['maxRecvWr', 0, '1..65536'],
    ['maxSendSge', 0, '1..16'],
    ['maxRecvSge', 0, '1..16'],
  ] as const)
    expect(create({ sendCq: cq, recvCq: cq, cap: { [k]: v } as Partial<QpCap> }).message).toBe(
      `ibv_create_qp: cap.${k} must be an integer in ${range}, got ${v}`,
    );
  expect(thrown(() => server.ctx.createQp(pd, { sendCq: cq, recvCq: cq }))).toMatchObject({
    code: 'EINVAL',
    message: 'ibv_create_qp: the protection domain belongs to another context',
  });

  expect(thrown(() => qp.modify(null as never)).message).toBe('modify: attr must be an object');
  expect(thrown(() => qp.modify({ qpState: 42 as QpState })).message).toBe('ibv_modify_qp: unknown state 42');
  expect(thrown(() => qp.modify({ qpState: QpState.RTS })).message).toBe('ibv_modify_qp: cannot go from RESET to RTS (RESET → INIT → RTR → RTS)');
  expect(thrown(() => qp.modify({ qpState: QpState.INIT, qpAccessFlags: 1024 })).message).toBe('qpAccessFlags must be between 0 and 1023, got 1024');
  qp.modify({ qpState: QpState.INIT, qpAccessFlags: Access.LOCAL_WRITE });
  expect(thrown(() => qp.postRecv({ wrId: 1, sgList: [client.sge(0, 8), client.sge(8, 8)] })).message).toBe(
    'ibv_post_recv: wr[0].sgList holds 2 SGEs; the QP allows at most 1 (cap.max*Sge)',
  );
  expect(thrown(() => qp.postRecv(null as never)).message).toBe('ibv_post_recv: wr[0].wr must be an object');
  expect(
    thrown(() =>
      qp.postRecv([
        { wrId: 0, sgList: [] },
        { wrId: -2, sgList: [] },
      ]),
    ).message,
  ).toBe('ibv_post_recv: wr[1].wrId must be an integer in 0..2^64-1 (a number or a bigint), got -2');
  qp.postRecv([
    { wrId: 1, sgList: [] },
    { wrId: 2, sgList: [] },
  ]);
  expect(thrown(() => qp.postRecv({ wrId: 3, sgList: [] })).message).toBe('ibv_post_recv: the receive queue holds at most 2 WRs');
  expect(thrown(() => qp.modify({ qpState: QpState.RTR })).message).toBe(
    'ibv_modify_qp: RTR needs destQpNum and destNode (the remote QP and its node)',
  );
  expect(thrown(() => qp.modify({ qpState: QpState.RTR, destQpNum: server.qp.qpNum })).code).toBe('EINVAL');
  expect(thrown(() => qp.modify({ qpState: QpState.RTR, destNode: 1 })).code).toBe('EINVAL');
  const rtr = { qpState: QpState.RTR, destQpNum: server.qp.qpNum, destNode: 1 };
  expect(thrown(() => qp.modify({ ...rtr, destNode: 2 })).message).toBe('ibv_modify_qp: destNode 2 is not on the fabric');
  expect(thrown(() => qp.modify({ ...rtr, destQpNum: 1.5 })).message).toBe('destQpNum must be an integer, got 1.5');
  expect(thrown(() => qp.modify({ ...rtr, minRnrTimer: 32 })).message).toBe('minRnrTimer must be between 0 and 31, got 32');
  qp.modify(rtr);
  expect(thrown(() => qp.postSend({ wrId: 1, opcode: WrOpcode.SEND, sgList: [] })).message).toBe(
    'ibv_post_send: the QP is in RTR; move it to RTS first',
  );
  expect(thrown(() => qp.modify({ qpState: QpState.RTS, timeout: 32 })).message).toBe('timeout must be between 0 and 31, got 32');
  expect(thrown(() => qp.modify({ qpState: QpState.RTS, retryCnt: 8 })).message).toBe('retryCnt must be between 0 and 7, got 8');
  expect(thrown(() => qp.modify({ qpState: QpState.RTS, rnrRetry: 8 })).message).toBe('rnrRetry must be between 0 and 7, got 8');
  qp.modify({ qpState: QpState.RTS });

  const post = (wr: unknown) => thrown(() => qp.postSend(wr as never)).message;
  expect(post(null)).toBe('ibv_post_send: wr[0].wr must be an object');
  expect(post({ wrId: 1, opcode: 99, sgList: [] })).toBe('ibv_post_send: wr[0].opcode must be a WrOpcode member, got 99');
  expect(post({ wrId: 1, opcode: WrOpcode.SEND, sgList: [client.sge(0, 8), client.sge(8, 8)] })).toBe(
    'ibv_post_send: wr[0].sgList holds 2 SGEs; the QP allows at most 1 (cap.max*Sge)',
  );
  expect(post({ wrId: 1, opcode: WrOpcode.SEND })).toBe('ibv_post_send: wr[0].sgList must be an array of SGEs');
  for (const op of [WrOpcode.RDMA_WRITE, WrOpcode.RDMA_WRITE_WITH_IMM, WrOpcode.RDMA_READ])
    expect(post({ wrId: 1, opcode: op, sgList: [] })).toBe('ibv_post_send: wr[0].rdma RDMA operations need wr.rdma = { remoteAddr, rkey }');
  for (const op of [WrOpcode.ATOMIC_CMP_AND_SWP, WrOpcode.ATOMIC_FETCH_AND_ADD])
    expect(post({ wrId: 1, opcode: op, sgList: [] })).toBe(
      'ibv_post_send: wr[0].atomic atomics need wr.atomic = { remoteAddr, rkey, compareAdd, swap? }',
    );
  const sgeCases: Array<[unknown, string]> = [
    [null, 'wr[0].sgList[0] must be { addr: bigint, length, lkey }'],
    [{ addr: 1, length: 1, lkey: 1 }, 'wr[0].sgList[0].addr must be a bigint in 0..2^64-1'],
    [{ addr: 2n ** 64n, length: 1, lkey: 1 }, 'wr[0].sgList[0].addr must be a bigint in 0..2^64-1'],
    [{ addr: 1n, length: -1, lkey: 1 }, 'wr[0].sgList[0].length must be an integer in 0..2^32-1, got -1'],
    [{ addr: 1n, length: 1.5, lkey: 1 }, 'wr[0].sgList[0].length must be an integer in 0..2^32-1, got 1.5'],
    [{ addr: 1n, length: 2 ** 32, lkey: 1 }, 'wr[0].sgList[0].length must be an integer in 0..2^32-1, got 4294967296'],
    [{ addr: 1n, length: 1, lkey: NAN }, 'wr[0].sgList[0].lkey must be a 32-bit unsigned integer, got NaN'],
    [{ addr: 1n, length: 1, lkey: 2 ** 32 }, 'wr[0].sgList[0].lkey must be a 32-bit unsigned integer, got 4294967296'],
  ];
  for (const [sge, message] of sgeCases) expect(post({ wrId: 1, opcode: WrOpcode.SEND, sgList: [sge] })).toBe(`ibv_post_send: ${message}`);
  // The other fields, each with the value that breaks it; the bad WR second in the list.
  const rdma = { remoteAddr: server.at(0), rkey: server.mr.rkey };
  const ok = { wrId: 1, opcode: WrOpcode.RDMA_WRITE, sgList: [], rdma };
  const fieldCases: Array<[unknown, string]> = [
    [{ ...ok, wrId: -1 }, 'wrId must be an integer in 0..2^64-1 (a number or a bigint), got -1'],
    [{ ...ok, wrId: 2n ** 64n }, 'wrId must be an integer in 0..2^64-1 (a number or a bigint), got 18446744073709551616n'],
    [{ ...ok, wrId: 1.5 }, 'wrId must be an integer in 0..2^64-1 (a number or a bigint), got 1.5'],
    [{ ...ok, sendFlags: 0x10 }, 'sendFlags must be SendFlags bits, got 16'],
    [{ ...ok, sendFlags: -1 }, 'sendFlags must be SendFlags bits, got -1'],
    [{ ...ok, immData: 2 ** 32 }, 'immData must be a 32-bit unsigned integer, got 4294967296'],
    [{ ...ok, rdma: { ...rdma, remoteAddr: 1 } }, 'rdma.remoteAddr must be a bigint in 0..2^64-1'],
    [{ ...ok, rdma: { ...rdma, rkey: -1 } }, 'rdma.rkey must be a 32-bit unsigned integer, got -1'],
  ];
  const atomic = { remoteAddr: server.at(0), rkey: server.mr.rkey, compareAdd: 1n, swap: 2n };
  const cas = { wrId: 1, opcode: WrOpcode.ATOMIC_CMP_AND_SWP, sgList: [], atomic };
  fieldCases.push(
    [{ ...cas, atomic: { ...atomic, remoteAddr: -1n } }, 'atomic.remoteAddr must be a bigint in 0..2^64-1'],
    [{ ...cas, atomic: { ...atomic, rkey: 1.5 } }, 'atomic.rkey must be a 32-bit unsigned integer, got 1.5'],
    [{ ...cas, atomic: { ...atomic, compareAdd: 1 } }, 'atomic.compareAdd must be a bigint'],
    [{ ...cas, atomic: { ...atomic, swap: 2 } }, 'atomic.swap must be a bigint'],
  );
  for (const [wr, message] of fieldCases) {
    const e = thrown(() => qp.postSend([{ wrId: 0, opcode: WrOpcode.SEND, sgList: [] }, wr as never])) as Error & { field?: string; badWr?: number };
    expect(e.message).toBe(`ibv_post_send: wr[1].${message}`);
    expect(e.badWr).toBe(1);
  }
  // A zero-length SGE is allowed.
  qp.postSend({
    wrId: 7,
    opcode: WrOpcode.RDMA_WRITE,
    sgList: [{ addr: client.at(0), length: 0, lkey: client.mr.lkey }],
    rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
  });
  const sends = Array.from({ length: 3 }, (_, i) => ({ wrId: i, opcode: WrOpcode.SEND, sgList: [] }));
  expect(post(sends)).toBe('ibv_post_send: the send queue holds at most 2 WRs');

  qp.destroy();
  expect(thrown(() => qp.postSend(sends[0]!))).toMatchObject({ code: 'ERR_PFR_CLOSED', message: 'QueuePair is closed; create a new one' });
  expect(thrown(() => qp.modify({ qpState: QpState.RESET })).message).toBe('QueuePair is closed; create a new one');
});

test('memory regions and advise_mr', () => {
  const { client, server } = createPlayers();
  const { ctx, pd } = client;
  const r = region(4 * P);
  const reg = (...a: Parameters<typeof ctx.regMr>) => thrown(() => ctx.regMr(...a));
  expect(reg(server.pd, r, 0, P, ODP_ACCESS).message).toBe('ibv_reg_mr: the protection domain belongs to another context');
  expect(reg(pd, r, 0, P, 0x1000).message).toBe('ibv_reg_mr: unknown access flags 0x1000');
  // rdma-core's enum ibv_access_flags ends at FLUSH_PERSISTENT (1 << 9, with FLUSH_GLOBAL 1 << 8,
  // both since v45; Debian 12's v44 has neither): every bit past it is EINVAL, each on its own,
  // RELAXED_ORDERING (1 << 20, optional in libibverbs) too, as this engine has no ordering to relax.
  for (let bit = 10; bit < 31; bit++) {
    const access = ODP_ACCESS | (1 << bit);
    expect(reg(pd, r, 0, P, access)).toMatchObject({ code: 'EINVAL', message: `ibv_reg_mr: unknown access flags 0x${access.toString(16)}` });
  }
  expect(reg(pd, r, 0, P, Access.REMOTE_WRITE).message).toBe('ibv_reg_mr: REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE too (as in libibverbs)');
  expect(reg(pd, null, 4096, 2n ** 64n - 1n, ODP_ACCESS).message).toBe(
    'ibv_reg_mr: an MR without memory is implicit ODP: pass offset 0 and length SIZE_MAX',
  );
  expect(reg(pd, null, 0, 4096, ODP_ACCESS).message).toBe('ibv_reg_mr: an MR without memory is implicit ODP: pass offset 0 and length SIZE_MAX');
  expect(reg(pd, null, 0, 2n ** 64n - 1n, PINNED_ACCESS).message).toBe('ibv_reg_mr: implicit MRs (address 0, length SIZE_MAX) need Access.ON_DEMAND');
  expect(ctx.regMr(pd, null, 0, Infinity, ODP_ACCESS).implicit).toBe(true);
  expect(reg(pd, r, 0, 4096n, ODP_ACCESS).message).toBe('regMr: length must be a number for an explicit MR');
  expect(reg(pd, r, 0, 8 * P, ODP_ACCESS).message).toMatch(/^regMr: range 0\.\.32768 is outside the region/);
  expect(reg(pd, r, 0, P, ODP_ACCESS | Access.HUGETLB).message).toBe(
    'ibv_reg_mr: Access.HUGETLB needs huge-page memory: a region mapped with { hugetlb: true } (MAP_HUGETLB) or { hugePages: true }',
  );
  expect(reg(pd, 'x' as never, 0, P, ODP_ACCESS).message).toBe('regMr: memory must be a Region, the ArrayBuffer of one, or null (implicit ODP)');
  expect(reg(pd, new ArrayBuffer(P), 0, P, ODP_ACCESS).message).toBe(
    'regMr: this ArrayBuffer is not mapped by mapRegion(); register memory from mapRegion() so its pages can fault',
  );

  const pinned = ctx.regMr(pd, r, 0, P, PINNED_ACCESS);
  const readOnly = ctx.regMr(pd, r, P, P, Access.REMOTE_READ | Access.ON_DEMAND);
  const adv = (advice: number, flags: number, sg: unknown) => thrown(() => ctx.adviseMr(pd, advice, flags, sg as never));
  expect(adv(7, 0, [client.sge(0, 8)])).toMatchObject({ code: 'ENOTSUP', message: 'ibv_advise_mr: unknown advice 7' });
  expect(adv('0' as never, 0, [client.sge(0, 8)]).code).toBe('ENOTSUP');
  expect(adv(AdviseMrAdvice.PREFETCH, 2, [client.sge(0, 8)]).message).toBe('ibv_advise_mr: unknown flags 2');
  expect(adv(AdviseMrAdvice.PREFETCH, 0.5, [client.sge(0, 8)]).message).toBe('ibv_advise_mr: unknown flags 0.5');
  expect(adv(AdviseMrAdvice.PREFETCH, 0, []).message).toBe('ibv_advise_mr: sgList must hold at least one SGE');
  for (const sge of [null, { addr: 0, length: 8, lkey: 1 }, { addr: 0n, length: -1, lkey: 1 }, { addr: 0n, length: 8, lkey: 1.5 }])
    expect(adv(AdviseMrAdvice.PREFETCH, 0, [sge])).toMatchObject({
      code: 'EINVAL',
      message: 'ibv_advise_mr: each SGE needs { addr: bigint, length: integer >= 0, lkey: integer }',
    });
  expect(adv(AdviseMrAdvice.PREFETCH, 0, [{ addr: 0n, length: 8, lkey: 0xabc }]).message).toBe('ibv_advise_mr: no MR with lkey 0xabc on this device');
  // Another node's key names nothing on this device; another process's on it is refused.
  expect(adv(AdviseMrAdvice.PREFETCH, 0, [{ ...server.sge(0, 8) }])).toMatchObject({
    code: 'EFAULT',
    message: `ibv_advise_mr: no MR with lkey 0x${server.mr.lkey.toString(16)} on this device`,
  });
  const neighbour = ctx.cluster.openDevice(ctx.node);
  const theirs = neighbour.regMr(neighbour.allocPd(), region(P), 0, P, ODP_ACCESS);
  expect(adv(AdviseMrAdvice.PREFETCH, 0, [{ addr: theirs.addr, length: 8, lkey: theirs.lkey }])).toMatchObject({
    code: 'EPERM',
    message: 'ibv_advise_mr: the lkey belongs to another process',
  });
  neighbour.close();
  const otherPd = ctx.allocPd();
  const inOtherPd = ctx.regMr(otherPd, r, 2 * P, P, ODP_ACCESS);
  expect(adv(AdviseMrAdvice.PREFETCH, 0, [{ addr: inOtherPd.addr, length: 8, lkey: inOtherPd.lkey }])).toMatchObject({
    code: 'EPERM',
    message: 'ibv_advise_mr: the lkey belongs to another protection domain',
  });
  expect(adv(AdviseMrAdvice.PREFETCH, 0, [{ addr: r.address, length: 8, lkey: pinned.lkey }]).message).toBe(
    'ibv_advise_mr: advise_mr applies to ODP MRs only (Access.ON_DEMAND)',
  );
  expect(adv(AdviseMrAdvice.PREFETCH_WRITE, 0, [{ addr: readOnly.addr, length: 8, lkey: readOnly.lkey }]).message).toBe(
    'ibv_advise_mr: PREFETCH_WRITE needs an MR with LOCAL_WRITE',
  );
  expect(adv(AdviseMrAdvice.PREFETCH, 0, [{ addr: readOnly.addr + BigInt(P), length: 8, lkey: readOnly.lkey }]).message).toBe(
    `ibv_advise_mr: range 0x${(readOnly.addr + BigInt(P)).toString(16)}+8 is outside the MR`,
  );

  const mr = client.mr;
  mr.dereg();
  expect(thrown(() => mr.setPolicy('touch')).message).toBe('MemoryRegion is closed; create a new one');
  expect(thrown(() => pinned.setPolicy('touch')).message).toBe('setPolicy: only explicit ODP MRs have a policy of their own');
});

test('cluster, context, CQ, PD', async () => {
  expect(thrown(() => Cluster.create(5 as never)).message).toBe('Cluster.create: options must be an object');
  // The system's own option checks, said as Cluster.create's.
  expect(thrown(() => Cluster.create({ blockSize: 5000 }))).toMatchObject({
    code: 'ERR_OUT_OF_RANGE',
    message: 'Cluster.create: blockSize must be a multiple of the page size (4096), got 5000',
  });
  expect(thrown(() => Cluster.create({ nodes: 0 })).message).toBe('Cluster.create: nodes must be an integer in 1..1024, got 0');
  const policies = 'touch, touch-ahead, prefetch, pin, prefault';
  expect(thrown(() => Cluster.create({ defaultPolicy: 'magic' as never }))).toMatchObject({
    code: 'ERR_INVALID_ARG_VALUE',
    message: `Cluster.create: defaultPolicy must be one of ${policies}, got magic`,
  });
  const cluster = track(Cluster.create());
  expect(thrown(() => cluster.openDevice(2)).message).toBe('openDevice: node must be between 0 and 1, got 2');
  expect(thrown(() => cluster.openDevice(0, 7 as never)).message).toBe('openDevice: options must be an object');
  expect(thrown(() => cluster.openDevice(0, { defaultPolicy: 'magic' as never }))).toMatchObject({
    code: 'ERR_INVALID_ARG_VALUE',
    message: `openDevice: defaultPolicy must be one of ${policies}, got magic`,
  });
  // A transport between processes hosts some nodes elsewhere: no device opens there.
  class HalfHere extends Fabric {
    isLocal(node: number): boolean {
      return node === 0;
    }
  }
  const split = track(Cluster.create({ transport: new HalfHere(DEFAULT_COSTS) }));
  expect(split.openDevice(0).node).toBe(0);
  expect(thrown(() => split.openDevice(1))).toMatchObject({
    code: 'ERR_INVALID_ARG_VALUE',
    message: "openDevice: node 1 is hosted by the transport's peer process, not this one",
  });
  const ctx = cluster.openDevice(1);
  expect(ctx.node).toBe(1);
  expect(thrown(() => ctx.createCq(0)).message).toBe('createCq: depth must be between 1 and 4194304, got 0');
  const cq = ctx.createCq(4);
  expect(thrown(() => cq.poll(0)).message).toBe('pollCq: n must be between 1 and 9007199254740991, got 0');
  expect(thrown(() => cq.next({ timeoutMs: 0 })).message).toBe('next: timeoutMs must be between 1 and 9007199254740991, got 0');
  const pd = ctx.allocPd();
  pd.dealloc();
  pd.dealloc();
  expect(pd.closed).toBe(true);
  expect(thrown(() => ctx.createQp(pd, { sendCq: cq, recvCq: cq })).message).toBe('ProtectionDomain is closed; create a new one');
  const waiting = cq.next({ timeoutMs: 5000 });
  ctx.close();
  await expect(waiting).rejects.toThrow('CompletionQueue is closed; create a new one');
  expect(thrown(() => cq.poll()).message).toBe('CompletionQueue is closed; create a new one');
  expect(thrown(() => ctx.allocPd()).message).toBe('Context is closed; create a new one');
  cluster.close();
  cluster.close();
  expect(cluster.closed).toBe(true);
  expect(thrown(() => cluster.openDevice(0)).message).toBe('Cluster is closed; create a new one');
});

test('protection domain handles run out after 65 535 (ExaNet PDIDs): ENOMEM; a freed one is handed out again', () => {
  const cluster = track(Cluster.create({ nodes: 1 }));
  const ctx = cluster.openDevice(0);
  const pds = [];
  let e: Error & { code?: string };
  for (;;) {
    try {
      pds.push(ctx.allocPd());
    } catch (err) {
      e = err as Error & { code?: string };
      break;
    }
  }
  expect(pds).toHaveLength(65_535);
  expect(e).toMatchObject({ code: 'ENOMEM', message: 'ibv_alloc_pd: no free id left' });
  const freed = pds[1000]!.handle;
  pds[1000]!.dealloc();
  expect(ctx.allocPd().handle).toBe(freed);
  expect(thrown(() => ctx.allocPd()).code).toBe('ENOMEM');
});
