// Small parts of the verbs API checked value by value: the IB min_rnr_timer table, the
// access-flag check, the errno-style verb errors, the device attributes, and what an MR
// reports about itself (its policy, its modelled pinning cost, its key after dereg).
import { afterEach, describe, expect, test } from 'vitest';
import { Access, PAGE_SIZE, rnrTimerMs, SIZE_MAX } from '../../lib/index.js';
import { knownAccess } from '../../lib/verbs/constants.js';
import { verbsError } from '../../lib/verbs/errors.js';
import { closeAll, createPlayers, ODP_ACCESS, P, PINNED_ACCESS, region } from './helpers.js';

afterEach(closeAll);

test('rnrTimerMs follows the IB spec table (code 0 is the longest, 655.36 ms) and masks the code to 5 bits', () => {
  expect([0, 1, 2, 12, 13, 30, 31].map(rnrTimerMs)).toEqual([655.36, 0.01, 0.02, 0.64, 0.96, 327.68, 491.52]);
  expect(rnrTimerMs(32)).toBe(655.36);
  expect(rnrTimerMs(33)).toBe(0.01);
});

test('knownAccess: every libibverbs flag alone and together; negatives, fractions and unknown bits are not', () => {
  for (const f of [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 0x3ff]) expect(knownAccess(f)).toBe(true);
  for (const f of [-1, 0.5, 0x400, 0x1000, NaN]) expect(knownAccess(f)).toBe(false);
});

test('verbsError: code, negative errno, the verb as syscall, the message prefixed by the verb', () => {
  const e = verbsError('ibv_reg_mr', 'EINVAL', 'bad flags') as Error & { code: string; errno: number; syscall: string };
  expect(e).toBeInstanceOf(Error);
  expect(e.message).toBe('ibv_reg_mr: bad flags');
  expect(e.code).toBe('EINVAL');
  expect(e.errno).toBe(-22);
  expect(e.syscall).toBe('ibv_reg_mr');
});

test('queryDevice: the name and node of the context, its limits, no UC ODP, UD SEND|RECV|SRQ_RECV', () => {
  const { server } = createPlayers();
  expect(server.ctx.queryDevice()).toEqual({
    name: 'pfr1',
    node: 1,
    maxQp: 65536,
    maxCqe: 4194304,
    maxMr: 1048576,
    maxSge: 16,
    maxMrSize: SIZE_MAX,
    pageSizeCap: PAGE_SIZE,
    odpCaps: { generalCaps: 3, rcOdpCaps: 255, ucOdpCaps: 0, udOdpCaps: 1 | 2 | 32, xrcOdpCaps: 255 & ~2 },
  });
  server.ctx.close();
  expect(() => server.ctx.queryDevice()).toThrow(/closed/);
});

describe('what an MR says about itself', () => {
  test('a pinned MR prices its pinning per page it spans; an ODP MR prices none', () => {
    const { client } = createPlayers();
    const r = region(8 * P);
    const costs = client.ctx.cluster.system.costs;
    // From page 1 to 10 bytes into page 3: pages 1..3.
    const mr = client.ctx.regMr(client.pd, r, P, 2 * P + 10, PINNED_ACCESS);
    expect(mr.pinned).toBe(true);
    expect(mr.policy).toBe('pin');
    expect(mr.modelPinUs).toBeCloseTo(3 * costs.pinPageUs, 9);
    expect(mr.addr).toBe(r.address + BigInt(P));
    expect([mr.offset, mr.length, mr.implicit, mr.onDemand]).toEqual([P, 2 * P + 10, false, false]);
    const odp = client.ctx.regMr(client.pd, r, 0, 8 * P, ODP_ACCESS);
    expect(odp.modelPinUs).toBe(0);
    expect(odp.onDemand).toBe(true);
    expect(odp.policy).toBe(client.ctx.faultLibrary.defaultPolicy);
    mr.dereg();
    expect(mr.closed).toBe(true);
    expect(mr.pinned).toBe(false);
    expect(mr.modelPinUs).toBe(0);
  });

  test('an implicit MR: address 0, the SIZE_MAX length as the largest safe integer, the context default policy', () => {
    const { client } = createPlayers({ implicit: true, defaultPolicy: 'touch' });
    expect(client.mr.implicit).toBe(true);
    expect(client.mr.addr).toBe(0n);
    expect(client.mr.length).toBe(Number.MAX_SAFE_INTEGER);
    expect(client.mr.registration).toBeUndefined();
    expect(client.mr.policy).toBe('touch');
    expect(client.mr.modelPinUs).toBe(0);
    expect(client.mr.access & Access.ON_DEMAND).toBe(Access.ON_DEMAND);
  });

  test('a deregistered MR resolves nothing; dereg is idempotent', () => {
    const { client } = createPlayers();
    const mr = client.mr;
    expect(mr.resolve(client.at(0), 64)).toEqual({ region: client.region, offset: 0 });
    mr.dereg();
    mr.dereg();
    expect(mr.resolve(client.at(0), 64)).toBeUndefined();
    expect(() => mr.setPolicy('touch')).toThrow(/closed/);
  });
});

test('Symbol.dispose closes each verbs object like its close/destroy/dereg', () => {
  const { cluster, client } = createPlayers();
  const cq = client.ctx.createCq(4);
  const qp = client.ctx.createQp(client.pd, { sendCq: cq, recvCq: cq });
  const mr = client.ctx.regMr(client.pd, client.region, 0, P, ODP_ACCESS);
  qp[Symbol.dispose]();
  expect(() => qp.postRecv({ wrId: 1, sgList: [] })).toThrow(/closed/);
  mr[Symbol.dispose]();
  expect(mr.closed).toBe(true);
  cq[Symbol.dispose]();
  expect(cq.closed).toBe(true);
  client.ctx[Symbol.dispose]();
  expect(client.ctx.closed).toBe(true);
  cluster[Symbol.dispose]();
  expect(cluster.closed).toBe(true);
});
