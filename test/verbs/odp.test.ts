// rdma-core's tests/test_odp.py, ported: RC traffic with ODP, mixed ODP and pinned MRs, RDMA
// READ and WRITE, atomics, implicit ODP, sync and async prefetch (and NO_FAULT), huge pages.
// Faults are forced the way that suite forces them: fresh mappings, and MADV_DONTNEED
// (region.evict()) on both MRs every iteration. Besides the data and the completion status
// rdma-core checks, every test checks the fault counts the pages imply.
import { readFileSync } from 'node:fs';
import { afterEach, describe, expect, test } from 'vitest';
import { Access, AdviseMrAdvice, AdviseMrFlags, HUGE_PAGE_SIZE, SendFlags, SIZE_MAX, WcOpcode, WcStatus, WrOpcode } from '../../lib/index.js';
import {
  allBytes,
  atomicTraffic,
  closeAll,
  createPlayers,
  delta,
  int8b,
  MSG,
  next,
  ODP_ACCESS,
  P,
  pollOk,
  rdmaTraffic,
  region,
  setU64,
  traffic,
  u64,
  within,
} from './helpers.js';

afterEach(closeAll);

const ITERS = 20;

describe('RC SEND/RECV traffic with ODP (test_odp_rc_traffic)', () => {
  test('ping-pong on fresh mappings evicted every iteration: all success, peer patterns, one destination fault per iteration', async () => {
    const { client, server } = createPlayers();
    const c0 = client.ctx.faultLibrary.stats();
    const s0 = server.ctx.faultLibrary.stats();
    const faults = await traffic(client, server, { iters: ITERS });
    expect(faults).toHaveLength(ITERS);
    // Each side sends from and receives into the same 1 KiB (one page). After the eviction
    // the client writes 'c' (its page is resident again), so only the server's receive
    // buffer faults; the server's reply lands on the client's freshly written page.
    for (const f of faults) {
      expect(f.clientSend).toEqual({ source: 0, destination: 1 });
      expect(f.serverSend).toEqual({ source: 0, destination: 0 });
    }
    expect(delta(server.ctx.faultLibrary.stats(), s0)).toEqual({ source: 0, destination: ITERS, pages: ITERS, retransmitted: ITERS, unresolved: 0 });
    expect(delta(client.ctx.faultLibrary.stats(), c0)).toEqual({ source: 0, destination: 0, pages: 0, retransmitted: 0, unresolved: 0 });
  });

  test("policy 'touch', separate 4-page receive buffers: exactly one fault per evicted page touched, on both sides", async () => {
    const { client, server } = createPlayers({ policy: 'touch' });
    const msg = 4 * P;
    const faults = await traffic(client, server, { iters: 10, msg, recvOffset: 8 * P });
    for (const f of faults) {
      expect(f.clientSend).toEqual({ source: 0, destination: 4 });
      expect(f.serverSend).toEqual({ source: 0, destination: 4 });
    }
    for (const p of [client, server]) {
      const st = p.ctx.faultLibrary.stats();
      expect(st.faults.destination).toBe(40);
      expect(st.faults.source).toBe(0);
      expect(st.pagesMadeResident).toBe(40);
      expect(st.faults.byKind).toEqual({ 'F_TRANSLATION/write': 40 });
    }
  });

  test('without eviction only the first touch of the fresh mapping faults', async () => {
    const { client, server } = createPlayers();
    const faults = await traffic(client, server, { iters: 10, evict: false });
    expect(faults[0]!.clientSend.destination).toBe(1); // the server's never-touched buffer
    for (const f of faults.slice(1)) {
      expect(f.clientSend).toEqual({ source: 0, destination: 0 });
      expect(f.serverSend).toEqual({ source: 0, destination: 0 });
    }
    expect(server.ctx.faultLibrary.stats().faults.destination).toBe(1);
  });

  test('an evicted send buffer faults at the source and delivers what the memory holds (zeros)', async () => {
    const { client, server } = createPlayers({ policy: 'touch' });
    client.fill(0x63, 0, 4 * P);
    server.fill(0xee, 0, 4 * P);
    client.region.evict(); // the bytes are gone: MADV_DONTNEED on anonymous memory
    server.qp.postRecv({ wrId: 1, sgList: [server.sge(0, 4 * P)] });
    client.qp.postSend({ wrId: 1, opcode: WrOpcode.SEND, sgList: [client.sge(0, 4 * P)], sendFlags: SendFlags.SIGNALED });
    const wc = await pollOk(client.cq);
    await pollOk(server.cq);
    expect(wc.odp!.faults).toEqual({ source: 4, destination: 0 });
    expect(client.ctx.faultLibrary.stats().faults).toMatchObject({ source: 4, destination: 0, byKind: { 'F_TRANSLATION/read': 4 } });
    allBytes(server.bytes(0, 4 * P), 0);
  });
});

describe("receive completions carry the transfer's odp field", () => {
  test('a SEND into an evicted receive buffer: the RECV completion reports the destination faults', async () => {
    const { client, server } = createPlayers({ policy: 'touch' });
    client.fill(0x63, 0, 2 * P);
    server.region.evict();
    server.qp.postRecv({ wrId: 7, sgList: [server.sge(0, 2 * P)] });
    client.qp.postSend({ wrId: 1, opcode: WrOpcode.SEND, sgList: [client.sge(0, 2 * P)], sendFlags: SendFlags.SIGNALED });
    const sent = await pollOk(client.cq);
    const recv = await pollOk(server.cq);
    expect(recv.opcode).toBe(WcOpcode.RECV);
    // What the receiver saw of the message (no word from the sender after its last packet).
    expect(recv.odp!.faults).toEqual({ source: 0, destination: 2 });
    expect(recv.odp!.retransmittedBlocks).toBe(2);
    expect(sent.odp!.faults).toEqual(recv.odp!.faults);
    expect(recv.odp!.modelUs).toBeGreaterThan(0);
    expect(recv.odp!.modelUs).toBeLessThanOrEqual(sent.odp!.modelUs);
    allBytes(server.bytes(0, 2 * P), 0x63);
  });

  test('RDMA WRITE_WITH_IMM: the RECV_RDMA_WITH_IMM completion has the odp field too', async () => {
    const { client, server } = createPlayers({ policy: 'touch' });
    server.region.evict();
    server.qp.postRecv({ wrId: 3, sgList: [] });
    client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_WRITE_WITH_IMM,
      immData: 5,
      sgList: [client.sge(0, P)],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    await pollOk(client.cq);
    const recv = await pollOk(server.cq);
    expect(recv.opcode).toBe(WcOpcode.RECV_RDMA_WITH_IMM);
    expect(recv.odp!.faults.destination).toBe(1);
  });
});

describe('mixed ODP and pinned MRs in one WR (test_odp_rc_mixed_mr)', () => {
  test('two SGEs per SEND and RECV, one per MR: both halves arrive; only the ODP half faults', async () => {
    const { client, server } = createPlayers({ mixed: true });
    for (const p of [client, server]) {
      expect(p.mr.onDemand).toBe(true);
      expect(p.pinned!.mr.onDemand).toBe(false);
      expect(p.pinned!.mr.pinned).toBe(true);
      expect(p.pinned!.mr.policy).toBe('pin');
      // Pinned: resident from registration on, and MADV_DONTNEED refuses mlocked pages.
      expect(p.pinned!.region.residentPages()).toBe(p.pinned!.region.size / P);
      expect(() => p.pinned!.region.evict()).toThrow(expect.objectContaining({ code: 'EINVAL' }));
    }
    const faults = await traffic(client, server, { iters: 10, mixed: true });
    for (const f of faults) expect(f.clientSend).toEqual({ source: 0, destination: 1 });
    expect(server.ctx.faultLibrary.stats().faults.destination).toBe(10);
    expect(server.pinned!.region.residentPages()).toBe(server.pinned!.region.size / P);
  });
});

describe('RDMA READ and WRITE with ODP (test_odp_rc_rdma_read / rdma_write)', () => {
  test('RDMA WRITE both directions: the target holds the writer pattern; one destination fault each', async () => {
    const { client, server } = createPlayers();
    const wcs = await rdmaTraffic(client, server, WrOpcode.RDMA_WRITE, { iters: ITERS });
    expect(wcs).toHaveLength(2 * ITERS);
    for (const wc of wcs) expect(wc.odp!.faults).toEqual({ source: 0, destination: 1 });
    expect(client.ctx.faultLibrary.stats().faults.destination).toBe(ITERS);
    expect(server.ctx.faultLibrary.stats().faults.destination).toBe(ITERS);
  });

  test('RDMA READ both directions: the reader holds the peer pattern; its own evicted buffer faults', async () => {
    const { client, server } = createPlayers();
    const wcs = await rdmaTraffic(client, server, WrOpcode.RDMA_READ, { iters: ITERS });
    for (const wc of wcs) expect(wc.odp!.faults).toEqual({ source: 0, destination: 1 });
    // A READ's destination is the reader's own memory: its own library resolved it.
    expect(client.ctx.faultLibrary.stats().faults).toMatchObject({ source: 0, destination: ITERS });
    expect(server.ctx.faultLibrary.stats().faults).toMatchObject({ source: 0, destination: ITERS });
  });

  test('RDMA WRITE_WITH_IMM consumes a receive: RECV_RDMA_WITH_IMM with the immediate and the length', async () => {
    const { client, server } = createPlayers();
    const wcs = await rdmaTraffic(client, server, WrOpcode.RDMA_WRITE_WITH_IMM, { iters: 10 });
    for (const wc of wcs) expect(wc.odp!.faults.destination).toBe(1);
  });

  test('RDMA READ of an evicted remote buffer faults at the responder (source) and returns its zeros', async () => {
    const { client, server } = createPlayers({ policy: 'touch' });
    server.fill(0x73, 0, 8 * P);
    server.region.evict();
    client.fill(0xee, 0, 8 * P);
    client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_READ,
      sgList: [client.sge(0, 8 * P)],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    const wc = await pollOk(client.cq);
    expect(wc.odp!.faults).toEqual({ source: 8, destination: 0 });
    expect(server.ctx.faultLibrary.stats().faults).toMatchObject({ source: 8, destination: 0 });
    allBytes(client.bytes(0, 8 * P), 0);
  });

  test('a multi-page RDMA WRITE with both buffers evicted faults on both sides', async () => {
    const { client, server } = createPlayers({ policy: 'touch' });
    client.region.evict();
    server.fill(0xee, 0, 4 * P);
    server.region.evict();
    client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [client.sge(0, 4 * P)],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    const wc = await pollOk(client.cq);
    expect(wc.odp!.faults).toEqual({ source: 4, destination: 4 });
    expect(client.ctx.faultLibrary.stats().faults).toMatchObject({ source: 4, destination: 0 });
    expect(server.ctx.faultLibrary.stats().faults).toMatchObject({ source: 0, destination: 4 });
    expect(client.region.residentPages(0, 4 * P)).toBe(4);
    expect(server.region.residentPages(0, 4 * P)).toBe(4);
  });
});

describe('atomics on ODP (test_odp_rc_atomic_cmp_and_swp / fetch_and_add)', () => {
  test('CMP_AND_SWP, compare differs: no swap, the requester gets the old value (both directions)', async () => {
    const { client, server } = createPlayers();
    const wcs = await atomicTraffic(client, server, WrOpcode.ATOMIC_CMP_AND_SWP, { iters: 10, senderVal: 2, receiverVal: 1 });
    expect(wcs).toHaveLength(20);
  });

  test('CMP_AND_SWP, compare equal: swapped to 0 (both directions)', async () => {
    const { client, server } = createPlayers();
    await atomicTraffic(client, server, WrOpcode.ATOMIC_CMP_AND_SWP, { iters: 10, senderVal: 1, receiverVal: 1 });
    // The last run was server → client: the client's word was swapped.
    expect(u64(client)).toBe(0n);
  });

  test('FETCH_AND_ADD: 0x0101.. + 0x0202.. = 0x0303.., the requester gets 0x0101..', async () => {
    const { client, server } = createPlayers();
    await atomicTraffic(client, server, WrOpcode.ATOMIC_FETCH_AND_ADD, { iters: 10, senderVal: 2, receiverVal: 1 });
    expect(u64(client)).toBe(0x0303030303030303n);
    expect(u64(server)).toBe(0x0101010101010101n); // the server was the last requester
  });

  test('atomics whose result buffer was evicted: the old value lands on a faulting page', async () => {
    const { client, server } = createPlayers();
    const faa = await atomicTraffic(client, server, WrOpcode.ATOMIC_FETCH_AND_ADD, { iters: 5, senderVal: 2, receiverVal: 1, evictLocal: true });
    for (const wc of faa) expect(wc.odp!.faults).toEqual({ source: 0, destination: 1 });
    const cas = await atomicTraffic(client, server, WrOpcode.ATOMIC_CMP_AND_SWP, { iters: 5, senderVal: 0, receiverVal: 0, evictLocal: true });
    for (const wc of cas) expect(wc.odp!.faults.destination).toBe(1);
  });

  test('FETCH_AND_ADD on a never-touched remote word: old value 0, the word becomes the addend', async () => {
    const { client, server } = createPlayers();
    setU64(client, 0xffn);
    client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.ATOMIC_FETCH_AND_ADD,
      sgList: [client.sge(0, 8)],
      sendFlags: SendFlags.SIGNALED,
      atomic: { remoteAddr: server.at(8 * P), rkey: server.mr.rkey, compareAdd: int8b(2) },
    });
    const wc = await pollOk(client.cq);
    // The remote word is the source of the atomic's answer: its page faults once there (the
    // fault NACK; the request is sent again once it is resident), then the atomic unit reads
    // and writes it with no more faults, and the old value lands on the client's resident page.
    expect(wc.odp!.faults).toEqual({ source: 1, destination: 0 });
    expect(u64(client)).toBe(0n);
    expect(u64(server, 8 * P)).toBe(int8b(2));
  });
});

describe('implicit ODP (test_odp_implicit_rc_traffic)', () => {
  test('one key for the whole address space: regMr(pd, null, 0, SIZE_MAX); traffic on a separate fresh mapping', async () => {
    const { client, server } = createPlayers({ implicit: true });
    for (const p of [client, server]) {
      expect(p.mr.implicit).toBe(true);
      expect(p.mr.addr).toBe(0n);
      expect(p.mr.region).toBeUndefined();
      expect(p.ctx.queryDevice().odpCaps.generalCaps & 2).toBe(2); // IBV_ODP_SUPPORT_IMPLICIT
    }
    const faults = await traffic(client, server, { iters: ITERS });
    for (const f of faults) expect(f.clientSend).toEqual({ source: 0, destination: 1 });
    // No registration covers the memory: the process-wide stats count the faults.
    expect(server.ctx.faultLibrary.stats().faults.destination).toBe(ITERS);
  });

  test("faults under an implicit key are resolved with the context's default policy", async () => {
    const { client, server } = createPlayers({ implicit: true, defaultPolicy: 'touch' });
    const faults = await traffic(client, server, { iters: 5, msg: 4 * P, recvOffset: 8 * P });
    for (const f of faults) expect(f.clientSend).toEqual({ source: 0, destination: 4 });
    expect(server.ctx.faultLibrary.stats().pagesMadeResident).toBe(20);
  });

  test('memory mapped after the registration is reachable through the same key', async () => {
    const { client, server } = createPlayers({ implicit: true });
    const later = region(4 * P);
    new Uint8Array(later.buffer).fill(0x4c);
    client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [{ addr: later.address, length: 4 * P, lkey: client.mr.lkey }],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    const wc = await pollOk(client.cq);
    expect(wc.odp!.faults).toEqual({ source: 0, destination: 1 });
    allBytes(server.bytes(0, 4 * P), 0x4c);
  });

  test.each([
    ['sync', AdviseMrFlags.FLUSH],
    ['async', 0],
  ])('implicit ODP with %s PREFETCH_WRITE (test_odp_implicit_sync/async_prefetch_rc_traffic)', async (_, flags) => {
    const { client, server } = createPlayers({ implicit: true, defaultPolicy: 'touch' });
    await traffic(client, server, { iters: 10, prefetch: { advice: AdviseMrAdvice.PREFETCH_WRITE, flags } });
    // The prefetch through the implicit key had its effect: on an evicted buffer it makes
    // the pages resident (at the call with FLUSH, on a later turn without), and the write
    // from it then takes no source fault where it would take one per page.
    const write = async () => {
      client.qp.postSend({
        wrId: 99,
        opcode: WrOpcode.RDMA_WRITE,
        sgList: [client.sge(0, 8 * P)],
        sendFlags: SendFlags.SIGNALED,
        rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
      });
      return (await pollOk(client.cq)).odp!.faults.source;
    };
    client.region.evict();
    expect(await write()).toBe(8);
    client.region.evict();
    const p = client.ctx.adviseMr(client.pd, AdviseMrAdvice.PREFETCH_WRITE, flags, [client.sge(0, 8 * P)]);
    expect(client.region.residentPages(0, 8 * P)).toBe(flags ? 8 : 0);
    await within('advise_mr', p);
    expect(client.region.residentPages(0, 8 * P)).toBe(8);
    expect(await write()).toBe(0);
  });
});

describe('prefetch with ibv_advise_mr (test_odp_*_prefetch_rc_traffic)', () => {
  const cases: Array<[string, AdviseMrAdvice, number]> = [
    ['PREFETCH sync', AdviseMrAdvice.PREFETCH, AdviseMrFlags.FLUSH],
    ['PREFETCH_WRITE sync', AdviseMrAdvice.PREFETCH_WRITE, AdviseMrFlags.FLUSH],
    ['PREFETCH async', AdviseMrAdvice.PREFETCH, 0],
    ['PREFETCH_WRITE async', AdviseMrAdvice.PREFETCH_WRITE, 0],
    ['PREFETCH_NO_FAULT sync', AdviseMrAdvice.PREFETCH_NO_FAULT, AdviseMrFlags.FLUSH],
    ['PREFETCH_NO_FAULT async', AdviseMrAdvice.PREFETCH_NO_FAULT, 0],
  ];
  test.each(cases)('traffic with %s of the send SGE: all success and peer patterns', async (_, advice, flags) => {
    const { client, server } = createPlayers();
    const faults = await traffic(client, server, { iters: 10, prefetch: { advice, flags } });
    // The sender's buffer was just written by its CPU, so it never faults; the receive
    // buffer is left to fault, as in rdma-core.
    for (const f of faults) {
      expect(f.clientSend.source).toBe(0);
      expect(f.clientSend.destination).toBe(1);
    }
  });

  /** Write 8 evicted pages client → server and report the source faults. */
  async function writeEvicted(prefetch?: (p: ReturnType<typeof createPlayers>['client']) => Promise<void>) {
    const { client, server } = createPlayers({ policy: 'touch' });
    client.region.evict();
    if (prefetch) await prefetch(client);
    client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [client.sge(0, 8 * P)],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
    });
    const wc = await pollOk(client.cq);
    return { wc, client, server };
  }

  test('control: writing from an evicted buffer takes one source fault per page', async () => {
    const { wc, client } = await writeEvicted();
    expect(wc.odp!.faults.source).toBe(8);
    expect(client.ctx.faultLibrary.stats().faults.source).toBe(8);
  });

  test.each([
    ['PREFETCH', AdviseMrAdvice.PREFETCH],
    ['PREFETCH_WRITE', AdviseMrAdvice.PREFETCH_WRITE],
  ])('after a sync %s of the evicted send buffer the transfer takes no source fault', async (_, advice) => {
    const { wc, client } = await writeEvicted(async (c) => {
      const p = c.ctx.adviseMr(c.pd, advice, AdviseMrFlags.FLUSH, [c.sge(0, 8 * P)]);
      // FLUSH: done when the call returns.
      expect(c.region.residentPages(0, 8 * P)).toBe(8);
      await p;
    });
    expect(wc.odp!.faults.source).toBe(0);
    expect(client.ctx.faultLibrary.stats().faults.source).toBe(0);
  });

  test('async PREFETCH_WRITE works on a later turn; once it settled the transfer takes no source fault', async () => {
    const { wc } = await writeEvicted(async (c) => {
      const p = c.ctx.adviseMr(c.pd, AdviseMrAdvice.PREFETCH_WRITE, 0, [c.sge(0, 8 * P)]);
      expect(c.region.residentPages(0, 8 * P)).toBe(0); // not yet: asynchronous
      await within('async advise_mr', p);
      expect(c.region.residentPages(0, 8 * P)).toBe(8);
    });
    expect(wc.odp!.faults.source).toBe(0);
  });

  test('PREFETCH_NO_FAULT never makes pages resident: on an evicted buffer the transfer still faults', async () => {
    const { wc } = await writeEvicted(async (c) => {
      await c.ctx.adviseMr(c.pd, AdviseMrAdvice.PREFETCH_NO_FAULT, AdviseMrFlags.FLUSH, [c.sge(0, 8 * P)]);
      expect(c.region.residentPages(0, 8 * P)).toBe(0);
    });
    expect(wc.odp!.faults.source).toBe(8);
  });

  test('PREFETCH_NO_FAULT after the CPU wrote the buffer posts its translations: the transfer walks no page table at the source', async () => {
    const run = async (noFault: boolean) => {
      const { cluster, client, server } = createPlayers();
      client.fill(0x5a, 0, 8 * P);
      if (noFault) await client.ctx.adviseMr(client.pd, AdviseMrAdvice.PREFETCH_NO_FAULT, AdviseMrFlags.FLUSH, [client.sge(0, 8 * P)]);
      const smmu = cluster.system.node(0).smmu;
      const before = smmu.counters();
      client.qp.postSend({
        wrId: 1,
        opcode: WrOpcode.RDMA_WRITE,
        sgList: [client.sge(0, 8 * P)],
        sendFlags: SendFlags.SIGNALED,
        rdma: { remoteAddr: server.at(0), rkey: server.mr.rkey },
      });
      const wc = await pollOk(client.cq);
      allBytes(server.bytes(0, 8 * P), 0x5a);
      return { wc, walks: smmu.counters().walks - before.walks };
    };
    const without = await run(false);
    const withNoFault = await run(true);
    expect(without.wc.odp!.faults.source).toBe(0);
    expect(withNoFault.wc.odp!.faults.source).toBe(0);
    expect(without.walks).toBe(8); // one per block: nothing was cached
    expect(withNoFault.walks).toBe(0);
  });

  test('advise errors: non-ODP MR → EINVAL, foreign PD → EPERM, range outside → EFAULT, and the rest of the man page', () => {
    const { client, server } = createPlayers({ mixed: true });
    const { ctx, pd } = client;
    const code = (fn: () => unknown) => {
      try {
        fn();
      } catch (e) {
        expect((e as { syscall?: string }).syscall).toBe('ibv_advise_mr');
        return (e as { code?: string }).code;
      }
      return 'no error';
    };
    const PF = AdviseMrAdvice.PREFETCH;
    const F = AdviseMrFlags.FLUSH;
    // A pinned (non-ODP) MR.
    expect(code(() => ctx.adviseMr(pd, PF, F, [{ addr: client.pinned!.region.address, length: 64, lkey: client.pinned!.mr.lkey }]))).toBe('EINVAL');
    // An MR of another protection domain of the same context.
    const pd2 = ctx.allocPd();
    const other = ctx.regMr(pd2, region(4 * P), 0, 4 * P, ODP_ACCESS);
    expect(code(() => ctx.adviseMr(pd, PF, F, [{ addr: other.addr, length: 64, lkey: other.lkey }]))).toBe('EPERM');
    // The server's MR is another node's: its key names nothing on this device.
    expect(code(() => ctx.adviseMr(pd, PF, F, [server.sge(0, 64)]))).toBe('EFAULT');
    // Outside the MR: past its end, before its start.
    expect(code(() => ctx.adviseMr(pd, PF, F, [client.sge(client.region.size - 8, 64)]))).toBe('EFAULT');
    expect(code(() => ctx.adviseMr(pd, PF, F, [{ addr: client.at(0) - 4096n, length: 64, lkey: client.mr.lkey }]))).toBe('EFAULT');
    // No such lkey.
    expect(code(() => ctx.adviseMr(pd, PF, F, [{ addr: client.at(0), length: 64, lkey: 0x7ffffff }]))).toBe('EFAULT');
    // PREFETCH_WRITE needs a writable MR.
    const ro = ctx.regMr(pd, region(4 * P), 0, 4 * P, Access.REMOTE_READ | Access.ON_DEMAND);
    expect(code(() => ctx.adviseMr(pd, AdviseMrAdvice.PREFETCH_WRITE, F, [{ addr: ro.addr, length: 64, lkey: ro.lkey }]))).toBe('EPERM');
    expect(code(() => ctx.adviseMr(pd, PF, F, [{ addr: ro.addr, length: 64, lkey: ro.lkey }]))).toBe('no error');
    // A deregistered lkey is no one's: no such MR, not another process's.
    const gone = ro.lkey;
    ro.dereg();
    expect(code(() => ctx.adviseMr(pd, PF, F, [{ addr: client.at(0), length: 64, lkey: gone }]))).toBe('EFAULT');
    // Bad flags, empty list, unknown advice.
    expect(code(() => ctx.adviseMr(pd, PF, 2, [client.sge()]))).toBe('EINVAL');
    expect(code(() => ctx.adviseMr(pd, PF, F, []))).toBe('EINVAL');
    expect(code(() => ctx.adviseMr(pd, 7 as AdviseMrAdvice, F, [client.sge()]))).toBe('ENOTSUP');
    // A failed advise made nothing resident.
    expect(client.region.residentPages()).toBe(0);
  });
});

const thpMode = (): string => {
  try {
    return /\[(\w+)\]/.exec(readFileSync('/sys/kernel/mm/transparent_hugepage/enabled', 'utf8'))?.[1] ?? 'unknown';
  } catch {
    return 'unavailable';
  }
};

/** AnonHugePages (kB) of the mapping containing `addr`, from /proc/self/smaps. */
function anonHugeKb(addr: bigint): number | undefined {
  const lines = readFileSync('/proc/self/smaps', 'utf8').split('\n');
  let inside = false;
  for (const l of lines) {
    const m = /^([0-9a-f]+)-([0-9a-f]+) /.exec(l);
    if (m) inside = addr >= BigInt('0x' + m[1]) && addr < BigInt('0x' + m[2]);
    else if (inside && l.startsWith('AnonHugePages:')) return Number(/(\d+)/.exec(l)![1]);
  }
  return undefined;
}

describe(`huge pages (test_odp_rc_huge_traffic / huge_user_addr_traffic; THP ${thpMode()})`, () => {
  test('Access.HUGETLB on a 2 MiB hugePages mapping: traffic evicted every iteration, each fault resolves 2 MiB', async () => {
    const { client, server } = createPlayers({ hugePages: true });
    expect(client.region.hugePages).toBe(true);
    expect(client.region.granule).toBe(HUGE_PAGE_SIZE);
    expect(client.mr.access & Access.HUGETLB).toBe(Access.HUGETLB);
    const s0 = server.ctx.faultLibrary.stats();
    const faults = await traffic(client, server, { iters: 10 });
    for (const f of faults) expect(f.clientSend).toEqual({ source: 0, destination: 1 });
    const d = delta(server.ctx.faultLibrary.stats(), s0);
    expect(d.destination).toBe(10);
    // Whatever THP does, the library resolved in 2 MiB units: 512 pages per fault, and the
    // region is wholly resident after the last one.
    expect(d.pages % 512).toBe(0);
    expect(d.pages).toBe(512 * 10);
    expect(server.region.residentPages()).toBe(512);
    const mode = thpMode();
    const huge = anonHugeKb(server.region.address);
    if (mode === 'never') expect(huge ?? 0).toBe(0);
    else expect(huge === undefined || huge === 0 || huge === 2048).toBe(true);
  });

  test("with policy 'touch' a 2 MiB write into an evicted huge region takes one fault (512 on 4 KiB pages)", async () => {
    const huge = createPlayers({ hugePages: true, policy: 'touch' });
    huge.client.fill(0x48, 0, HUGE_PAGE_SIZE);
    huge.server.region.evict();
    huge.client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [huge.client.sge(0, HUGE_PAGE_SIZE)],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: huge.server.at(0), rkey: huge.server.mr.rkey },
    });
    const wc = await pollOk(huge.client.cq);
    expect(wc.odp!.faults).toEqual({ source: 0, destination: 1 });
    expect(huge.server.ctx.faultLibrary.stats().pagesMadeResident).toBe(512);
    allBytes(huge.server.bytes(0, HUGE_PAGE_SIZE), 0x48);

    // The same on 4 KiB pages: one fault per page (only the first 64 pages, to stay fast).
    const small = createPlayers({ policy: 'touch', size: 64 * P });
    small.client.fill(0x48, 0, 64 * P);
    small.client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_WRITE,
      sgList: [small.client.sge(0, 64 * P)],
      sendFlags: SendFlags.SIGNALED,
      rdma: { remoteAddr: small.server.at(0), rkey: small.server.mr.rkey },
    });
    expect((await pollOk(small.client.cq)).odp!.faults.destination).toBe(64);
  });

  test('huge traffic without forced faults (test_odp_rc_huge_traffic): only the first touch faults', async () => {
    const { client, server } = createPlayers({ hugePages: true });
    const faults = await traffic(client, server, { iters: 10, evict: false });
    expect(faults[0]!.clientSend.destination).toBe(1);
    for (const f of faults.slice(1)) expect(f.clientSend.destination + f.serverSend.destination).toBe(0);
  });
});

describe('query and capabilities', () => {
  test('queryDevice reports RC ODP SEND|RECV|WRITE|READ|ATOMIC|SRQ_RECV|FLUSH|ATOMIC_WRITE and implicit ODP, like ibv_query_device_ex', () => {
    const { client } = createPlayers();
    const attr = client.ctx.queryDevice();
    expect(attr.odpCaps.generalCaps).toBe(1 | 2);
    expect(attr.odpCaps.rcOdpCaps).toBe(1 | 2 | 4 | 8 | 16 | 32 | 64 | 128);
    expect(attr.maxMrSize).toBe(SIZE_MAX);
    expect(attr.node).toBe(0);
  });

  test('a SEND_WITH_IMM delivers the immediate with WITH_IMM set', async () => {
    const { client, server } = createPlayers();
    client.fill(0x21);
    server.qp.postRecv({ wrId: 9, sgList: [server.sge(0, MSG)] });
    client.qp.postSend({ wrId: 1, opcode: WrOpcode.SEND_WITH_IMM, immData: 0xdeadbeef, sgList: [client.sge(0, MSG)], sendFlags: SendFlags.SIGNALED });
    await pollOk(client.cq);
    const r = await pollOk(server.cq);
    expect(r).toMatchObject({
      wrId: 9n,
      status: WcStatus.SUCCESS,
      opcode: WcOpcode.RECV,
      byteLen: MSG,
      immData: 0xdeadbeef,
      wcFlags: 2,
      srcQp: client.qp.qpNum,
      qpNum: server.qp.qpNum,
    });
    allBytes(server.bytes(), 0x21);
  });
});

describe('implicit ODP stays inside its process', () => {
  test("an implicit rkey reaches its own process's memory, not memory another process registered", async () => {
    const { client, server } = createPlayers({ implicit: true });
    // The client registers a region of its own explicitly: it belongs to the client's process.
    const mine = region(4 * P);
    const mineMr = client.ctx.regMr(client.pd, mine, 0, mine.size, ODP_ACCESS);
    client.fill(0x11, 0, P);
    // Through the server's implicit key, aim at the client's region: the server's process
    // does not own it, so the responder refuses.
    client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_WRITE,
      sendFlags: SendFlags.SIGNALED,
      sgList: [client.sge(0, 64)],
      rdma: { remoteAddr: mine.address, rkey: server.mr.rkey },
    });
    const wc = await next(client.cq);
    expect(wc.status).toBe(WcStatus.REM_ACCESS_ERR);
    expect(Buffer.from(mine.buffer, 0, 64).every((b) => b === 0)).toBe(true);
    mineMr.dereg();
  });
});
