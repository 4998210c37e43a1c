// Bad input gets a clear, coded error at once, never a crash, a hang or a lost work request:
// post-time checks of every WR field (as ibv_post_send makes them), Cluster.create options,
// device limits, CQ overrun (as libibverbs: the CQ errs, IBV_EVENT_CQ_ERR, the QP to ERR),
// RNR retries that never end or run out, and keys that stay 32-bit and unique.
import { afterEach, describe, expect, test } from 'vitest';
import {
  Access,
  AsyncEventType,
  Cluster,
  connectQps,
  QpState,
  SendFlags,
  SIZE_MAX,
  WcStatus,
  WrOpcode,
  type AsyncEvent,
  type RecvWr,
  type SendWr,
} from '../../lib/index.js';
import { IdAllocator, KeyAllocator } from '../../lib/verbs/tables.js';
import { report, requireDist, runFixture } from '../child.js';
import { closeAll, createPlayers, MSG, next, sleep, thrown, track } from './helpers.js';

afterEach(closeAll);

type Coded = Error & { code?: string; field?: string; badWr?: number; syscall?: string };

function postErr(fn: () => void): Coded {
  return thrown(fn) as Coded;
}

describe('postSend / postRecv check every field at post time', () => {
  const cases: Array<[string, string, (w: SendWr) => unknown]> = [
    ['wrId 1.5', 'wrId', (w) => ({ ...w, wrId: 1.5 })],
    ['wrId -1', 'wrId', (w) => ({ ...w, wrId: -1 })],
    ['wrId 2^64 as a bigint', 'wrId', (w) => ({ ...w, wrId: 2n ** 64n })],
    ['wrId a string', 'wrId', (w) => ({ ...w, wrId: '7' })],
    ['a WR that is a number', 'wr', () => 5],
    ['an SGE that is a number', 'sgList[0]', (w) => ({ ...w, sgList: [5] })],
    ['opcode a string', 'opcode', (w) => ({ ...w, opcode: 'RDMA_WRITE' })],
    ['opcode 99', 'opcode', (w) => ({ ...w, opcode: 99 })],
    ['sgList not an array', 'sgList', (w) => ({ ...w, sgList: {} })],
    ['an SGE addr as a number', 'sgList[0].addr', (w) => ({ ...w, sgList: [{ ...w.sgList[0]!, addr: 4096 }] })],
    ['an SGE length 1.5', 'sgList[0].length', (w) => ({ ...w, sgList: [{ ...w.sgList[0]!, length: 1.5 }] })],
    ['an lkey -1', 'sgList[0].lkey', (w) => ({ ...w, sgList: [{ ...w.sgList[0]!, lkey: -1 }] })],
    ['an lkey 2^32', 'sgList[0].lkey', (w) => ({ ...w, sgList: [{ ...w.sgList[0]!, lkey: 2 ** 32 }] })],
    ['remoteAddr a number', 'rdma.remoteAddr', (w) => ({ ...w, rdma: { ...w.rdma!, remoteAddr: 4096 } })],
    ['rkey 2^32', 'rdma.rkey', (w) => ({ ...w, rdma: { ...w.rdma!, rkey: 2 ** 32 } })],
    ['rdma missing', 'rdma', (w) => ({ ...w, rdma: undefined })],
    ['rdma a number', 'rdma', (w) => ({ ...w, rdma: 5 })],
    ['atomic a number', 'atomic', (w) => ({ ...w, opcode: WrOpcode.ATOMIC_FETCH_AND_ADD, sgList: [{ ...w.sgList[0]!, length: 8 }], atomic: 5 })],
    ['sendFlags unknown', 'sendFlags', (w) => ({ ...w, sendFlags: 0x100 })],
    ['more SGEs than maxSendSge', 'sgList', (w) => ({ ...w, sgList: [w.sgList[0]!, w.sgList[0]!, w.sgList[0]!] })],
  ];

  test.each(cases)('%s: EINVAL naming %s, nothing posted', async (_what, field, mutate) => {
    const { client, server } = createPlayers();
    const good: SendWr = {
      wrId: 1,
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [client.sge(0, MSG)],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    };
    // The bad WR second in the list: the good one before it must not be posted either.
    const e = postErr(() => client.qp.postSend([good, mutate(good) as SendWr]));
    expect(e.code).toBe('EINVAL');
    expect(e.syscall).toBe('ibv_post_send');
    expect(e.field).toBe(field);
    expect(e.badWr).toBe(1);
    expect(e.message).toContain(field);
    await sleep(20);
    expect(client.cq.poll(4)).toEqual([]);
    // The QP is untouched: the next good WR runs.
    client.qp.postSend({ ...good, wrId: 2 });
    const wc = await next(client.cq);
    expect(wc.wrId).toBe(2n);
    expect(wc.status).toBe(WcStatus.SUCCESS);
  });

  test('postRecv with a bad wrId or lkey throws (it used to vanish without a completion)', async () => {
    const { client, server } = createPlayers();
    const good: RecvWr = { wrId: 5, sgList: [server.sge(0, MSG)] };
    expect(postErr(() => server.qp.postRecv({ ...good, wrId: 1.5 })).field).toBe('wrId');
    expect(postErr(() => server.qp.postRecv([good, 5 as unknown as RecvWr])).field).toBe('wr');
    expect(postErr(() => server.qp.postRecv([good, { ...good, sgList: [{ ...good.sgList[0]!, lkey: -1 }] }])).field).toBe('sgList[0].lkey');
    // Nothing was posted: a SEND finds no receive and, with rnrRetry 0, fails at once.
    client.qp.modify({ qpState: QpState.ERR });
    const { client: c2, server: s2 } = createPlayers({ rc: { rnrRetry: 0 } });
    expect(postErr(() => s2.qp.postRecv({ wrId: 'x' as unknown as number, sgList: [s2.sge(0, MSG)] })).code).toBe('EINVAL');
    c2.qp.postSend({ wrId: 1, opcode: WrOpcode.SEND, sgList: [c2.sge(0, MSG)], sendFlags: SendFlags.SIGNALED });
    expect((await next(c2.cq)).status).toBe(WcStatus.RNR_RETRY_EXC_ERR);
  });

  test('2^32-1 is a valid 32-bit field: immData of 2^32-1 arrives whole, and an rkey of 2^32-1 is posted and refused remotely', async () => {
    const { client, server } = createPlayers();
    server.qp.postRecv({ wrId: 7, sgList: [server.sge(0, MSG)] });
    client.fill(0x5a, 0, MSG);
    client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.SEND_WITH_IMM,
      immData: 0xffff_ffff,
      sgList: [client.sge(0, MSG)],
      sendFlags: SendFlags.SIGNALED,
    });
    expect((await next(client.cq)).status).toBe(WcStatus.SUCCESS);
    expect(await next(server.cq)).toMatchObject({ wrId: 7n, status: WcStatus.SUCCESS, immData: 0xffff_ffff });
    // No MR has that key: the responder's check, not the post's, refuses it.
    client.qp.postSend({
      wrId: 2,
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [client.sge(0, MSG)],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: server.at(0), rkey: 0xffff_ffff },
    });
    expect((await next(client.cq)).status).toBe(WcStatus.REM_ACCESS_ERR);
  });

  // A length the post accepts is then judged by the requester: longer than 2^31 (max_msg_sz)
  // is LOC_LEN_ERR; exactly 2^31 passes that check, and here the MR bounds refuse it.
  test.each([
    ['an SGE of 2^32-1 bytes', 2 ** 32 - 1, WcStatus.LOC_LEN_ERR],
    ['a message of exactly 2^31 bytes', 2 ** 31, WcStatus.LOC_PROT_ERR],
  ])('%s is a valid post; the requester then judges its length', async (_what, length, status) => {
    const { client, server } = createPlayers();
    client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [{ addr: client.at(0), length, lkey: client.mr.lkey }],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    expect((await next(client.cq)).status).toBe(status);
  });

  test('a message longer than 2^31 bytes completes with LOC_LEN_ERR', async () => {
    const { client, server } = createPlayers({ cap: { maxSendSge: 2 } });
    const big = { addr: client.at(0), length: 2 ** 31, lkey: client.mr.lkey };
    client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [big, { ...big, length: 1 }],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    const wc = await next(client.cq);
    expect(wc.status).toBe(WcStatus.LOC_LEN_ERR);
  });
});

describe('Cluster.create checks its options up front', () => {
  test.each<[string, Record<string, unknown>, string]>([
    ['blockSize 0', { blockSize: 0 }, 'blockSize'],
    ['blockSize -4096', { blockSize: -4096 }, 'blockSize'],
    ['blockSize NaN', { blockSize: NaN }, 'blockSize'],
    ['blockSize not a page multiple', { blockSize: 5000 }, 'blockSize'],
    ['channels 0', { channels: 0 }, 'channels'],
    ['engineThreads 0', { engineThreads: 0 }, 'engineThreads'],
    ['engineThreads 1.5', { engineThreads: 1.5 }, 'engineThreads'],
    ['engineThreads a string', { engineThreads: '2' }, 'engineThreads'],
    ['nodes 0', { nodes: 0 }, 'nodes'],
    ['an unknown defaultPolicy', { defaultPolicy: 'magic' }, 'defaultPolicy'],
  ])('%s: a coded error naming it', (_what, options, name) => {
    const e = thrown(() => track(Cluster.create(options as never))) as Coded;
    expect(e.code).toMatch(/^ERR_/);
    expect(e.message).toContain(name);
  });
});

describe('device limits and completion queues', () => {
  test('queryDevice().maxQp is enforced: the next createQp is ENOMEM', () => {
    const cluster = track(Cluster.create({ nodes: 1 }));
    const ctx = cluster.openDevice(0);
    const { maxQp } = ctx.queryDevice();
    const pd = ctx.allocPd();
    const cq = ctx.createCq(1);
    const qps = Array.from({ length: maxQp }, () => ctx.createQp(pd, { sendCq: cq, recvCq: cq, cap: { maxSendWr: 1, maxRecvWr: 1 } }));
    const e = thrown(() => ctx.createQp(pd, { sendCq: cq, recvCq: cq })) as Coded;
    expect([e.code, e.syscall]).toEqual(['ENOMEM', 'ibv_create_qp']);
    expect(e.message).toContain('maxQp');
    // A destroyed QP gives its room back.
    qps[7]!.destroy();
    expect(ctx.createQp(pd, { sendCq: cq, recvCq: cq }).qpNum).toBeGreaterThan(0);
    expect(thrown(() => ctx.createCq(ctx.queryDevice().maxCqe + 1)).code).toBe('ERR_OUT_OF_RANGE');
  });

  test('a CQ that overflows goes to error, raises IBV_EVENT_CQ_ERR and takes the QP to ERR', async () => {
    const { client, server } = createPlayers({ connect: false });
    const small = client.ctx.createCq(2);
    const qp = client.ctx.createQp(client.pd, { sendCq: small, recvCq: small });
    connectQps(qp, server.qp);
    const events: AsyncEvent[] = [];
    client.ctx.onAsyncEvent((e) => events.push(e));
    // A listener that unsubscribed hears nothing.
    const unheard: AsyncEvent[] = [];
    const off = client.ctx.onAsyncEvent((e) => unheard.push(e));
    off();
    for (let i = 1; i <= 4; i++)
      qp.postSend({
        wrId: i,
        opcode: WrOpcode.RDMA_WRITE,
        sgList: [client.sge(0, MSG)],
        sendFlags: SendFlags.SIGNALED,
        rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
      });
    const t0 = Date.now();
    while (!events.length && Date.now() - t0 < 5000) await sleep(2);
    expect(events.map((e) => [e.eventType, e.name])).toEqual([[AsyncEventType.CQ_ERR, 'IBV_EVENT_CQ_ERR']]);
    expect(events[0]!.cq).toBe(small);
    expect(small.error).toBe(true);
    expect(qp.state).toBe(QpState.ERR);
    expect(small.poll(8).map((w) => w.wrId)).toEqual([1n, 2n]);
    // WR 3 found the CQ full; WR 4, flushed by the QP's move to ERR, found it in error.
    const t1 = Date.now();
    while (small.overruns < 2 && Date.now() - t1 < 5000) await sleep(2);
    expect(small.overruns).toBe(2);
    expect(client.ctx.pollAsyncEvents()).toHaveLength(1);
    expect(unheard).toEqual([]);
  });
});

describe('RNR', () => {
  test('a program that ends with a SEND on infinite RNR retry still exits', async () => {
    requireDist();
    const r = await runFixture('rnr-forever.mjs', [], { timeoutMs: 10_000 });
    expect(r.signal).toBeNull();
    expect(r.code, r.stderr).toBe(0);
    expect(report<{ posted: boolean }>(r).posted).toBe(true);
  });

  test('after the requester runs out of RNR retries, the responder sees nothing: a later receive stays posted', async () => {
    const { client, server } = createPlayers({ rc: { rnrRetry: 1, minRnrTimer: 1 } });
    client.qp.postSend({ wrId: 1, opcode: WrOpcode.SEND, sgList: [client.sge(0, MSG)], sendFlags: SendFlags.SIGNALED });
    expect((await next(client.cq)).status).toBe(WcStatus.RNR_RETRY_EXC_ERR);
    server.qp.postRecv({ wrId: 9, sgList: [server.sge(0, MSG)] });
    await sleep(20);
    expect(server.cq.poll(4)).toEqual([]);
    expect(server.qp.state).toBe(QpState.RTS);
  });
});

describe('keys', () => {
  test('the key allocator stays 32-bit and never hands out a live key, across the wrap', () => {
    const keys = new KeyAllocator(0xffff_ff00, 0x101);
    const live = new Set<number>();
    for (let i = 0; i < 100_000; i++) {
      const k = keys.alloc();
      expect(k >>> 0).toBe(k);
      expect(k).not.toBe(0);
      expect(live.has(k)).toBe(false);
      live.add(k);
      if (i % 3) {
        keys.free(k);
        live.delete(k);
      }
    }
  });

  test('key 0 is never handed out, even where the walk starts', () => {
    const keys = new KeyAllocator(0, 0x101);
    expect([keys.alloc(), keys.alloc()]).toEqual([0x101, 0x202]);
  });

  test('small ids run out with ENOMEM naming the verb, and a freed one is handed out again only after a full wrap', () => {
    const ids = new IdAllocator(5, 7);
    expect([ids.alloc('ibv_alloc_pd'), ids.alloc('ibv_alloc_pd'), ids.alloc('ibv_alloc_pd')]).toEqual([5, 6, 7]);
    const e = thrown(() => ids.alloc('ibv_alloc_pd')) as Coded;
    expect([e.code, e.syscall]).toEqual(['ENOMEM', 'ibv_alloc_pd']);
    expect(e.message).toContain('no free id left');
    ids.free(6);
    expect(ids.alloc('ibv_alloc_pd')).toBe(6);
    ids.free(5);
    ids.free(7);
    expect([ids.alloc('x'), ids.alloc('x')]).toEqual([7, 5]);
  });

  test('registrations come and go: every lkey/rkey is a u32 and unique among the live ones', () => {
    const cluster = track(Cluster.create({ nodes: 1 }));
    const ctx = cluster.openDevice(0);
    const pd = ctx.allocPd();
    const live = new Map<number, unknown>();
    for (let i = 0; i < 50_000; i++) {
      const mr = ctx.regMr(pd, null, 0, SIZE_MAX, Access.LOCAL_WRITE | Access.ON_DEMAND);
      expect(mr.lkey >>> 0).toBe(mr.lkey);
      expect(live.has(mr.lkey)).toBe(false);
      if (i % 2) mr.dereg();
      else live.set(mr.lkey, mr);
    }
  });
});
