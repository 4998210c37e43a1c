// Bad input and lost messages: every case ends in a completion with its documented status
// and counter, never an exception, a hang or a crash. No stream translates another
// stream's memory.
import { describe, expect, test } from 'vitest';
import { decodeFault, DmaStatus, type DmaCompletion, type DmaDescriptor, IommuPageResponseCode, type NlMessage } from '../../kernel-sim/index.js';
import { answerFault, bytesOf, FaultLibrary, type FaultNote, fill, layerCounts, P, post, proc, until, useEnv, within } from './helpers.js';

const env = useEnv();

describe('lost notifications', () => {
  test('event queue overflow: lost records are counted and those transfers end by the retry timer', async () => {
    const n = 4;
    const sys = env.system({ nodes: 2, eventQueueDepth: 1, faultTimeoutMs: 30 });
    const srcs = Array.from({ length: n }, () => env.region(P));
    const dsts = Array.from({ length: n }, () => env.region(P));
    const datas = srcs.map((s, i) => fill(s, 0x10 * (i + 1)));
    proc(sys.node(0), 100, 7, srcs);
    const b = proc(sys.node(1), 200, 7, dsts);
    const lib = env.track(new FaultLibrary(b.socket, { regions: dsts }));
    // One scheduling pass issues a block of each channel: n faults in one burst, before the IRQ.
    const cs = await within('transfers', Promise.all(srcs.map((s, i) => post(sys.node(0), s, dsts[i]!, { channel: i }))), 5000);

    const s = sys.node(1).smmu.counters();
    expect(s.eventQueueOverflows).toBe(n - 1);
    // Every fault is either recorded or counted as lost, never silent.
    expect(s.faults.F_TRANSLATION).toBe(s.eventsRecorded + s.eventQueueOverflows);
    const l = layerCounts(sys, 1);
    expect(l.driverRecords).toBe(l.recorded);
    expect(l.notified).toBe(l.recorded);
    expect(lib.faults).toHaveLength(l.recorded);
    // Each transfer whose record was lost heard nothing, retried on its timer and faulted again.
    expect(sys.node(0).pldma.counters().retryTimeouts).toBe(s.eventQueueOverflows);
    expect(s.faults.F_TRANSLATION).toBe(n + s.eventQueueOverflows);
    for (const [i, c] of cs.entries()) {
      expect([DmaStatus.SUCCESS, DmaStatus.RETRY_EXCEEDED]).toContain(c.status);
      if (c.status === DmaStatus.SUCCESS) expect(bytesOf(dsts[i]!).equals(datas[i]!)).toBe(true);
    }
    expect(cs.filter((c) => c.status === DmaStatus.SUCCESS)).toHaveLength(n);
  });

  test('event queue overflow with nobody resolving: RETRY_EXCEEDED for all, no hang', async () => {
    const n = 3;
    const sys = env.system({ nodes: 2, eventQueueDepth: 1, faultTimeoutMs: 10, retryLimit: 2 });
    const srcs = Array.from({ length: n }, () => env.region(P));
    const dsts = Array.from({ length: n }, () => env.region(P));
    srcs.forEach((s) => fill(s));
    proc(sys.node(0), 100, 7, srcs);
    proc(sys.node(1), 200, 7, dsts); // bound socket, no library: messages queue up unread
    const cs = await within('transfers', Promise.all(srcs.map((s, i) => post(sys.node(0), s, dsts[i]!, { channel: i }))), 5000);
    expect(cs.map((c) => c.statusName)).toEqual(Array(n).fill('RETRY_EXCEEDED'));
    for (const c of cs) expect(c.faults.destination).toBe(3);
    const s = sys.node(1).smmu.counters();
    expect(s.eventQueueOverflows).toBeGreaterThanOrEqual(n - 1);
    expect(s.faults.F_TRANSLATION).toBe(3 * n);
    expect(s.faults.F_TRANSLATION).toBe(s.eventsRecorded + s.eventQueueOverflows);
    expect(sys.node(0).pldma.counters().retryTimeouts).toBe(2 * n);
    expect(sys.node(0).pldma.active).toBe(0);
  });

  test('no socket bound: the notification is dropped (driver and netlink count it), the retry limit ends it', async () => {
    const sys = env.system({ nodes: 2, retryLimit: 2, faultTimeoutMs: 10 });
    const src = env.region(P);
    const dst = env.region(P);
    fill(src);
    proc(sys.node(0), 100, 7, [src]);
    const b = proc(sys.node(1), 200, 7, [dst]);
    b.socket.close();
    const c = await within('transfer', post(sys.node(0), src, dst));
    expect(c.status).toBe(DmaStatus.RETRY_EXCEEDED);
    expect(c.reason).toMatch(/retry limit 2/);
    expect(c.faults.destination).toBe(3);
    expect(c.retransmittedBlocks).toBe(2);
    expect(c.bytes).toBe(0);
    expect(sys.node(1).driver.counters()).toMatchObject({ records: 3, notified: 0, dropped: 3, responses: 0 });
    expect(sys.node(1).netlink.counters()).toMatchObject({ sent: 3, delivered: 0, dropped: 3, noListener: 3 });
    expect(sys.node(0).pldma.counters().retryTimeouts).toBe(2);
    expect(sys.node(1).driver.pending).toBe(0);
    expect(dst.residentPages()).toBe(0);
  });

  test('a dropped notification, pages made resident meanwhile: the retry timer retransmits and it completes', async () => {
    const sys = env.system({ nodes: 2, faultTimeoutMs: 20 });
    const src = env.region(2 * P);
    const dst = env.region(2 * P);
    const data = fill(src);
    proc(sys.node(0), 100, 7, [src]);
    const b = proc(sys.node(1), 200, 7, [dst]);
    b.socket.close();
    const pc = post(sys.node(0), src, dst);
    await until('the dropped notification', () => sys.node(1).driver.counters().dropped === 1);
    dst.populate();
    const c = await within('transfer', pc);
    expect(c.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dst).equals(data)).toBe(true);
    expect(c.faults.destination).toBe(1);
    expect(c.retransmittedBlocks).toBe(1);
    expect(sys.node(0).pldma.counters().retryTimeouts).toBe(1);
    expect(sys.node(1).netlink.counters().noListener).toBe(1);
  });

  test('socket queue full: later notifications are dropped and counted; the retry timer recovers them', async () => {
    const n = 3;
    const sys = env.system({ nodes: 2, netlinkQueue: 1, faultTimeoutMs: 30 });
    const srcs = Array.from({ length: n }, () => env.region(P));
    const dsts = Array.from({ length: n }, () => env.region(P));
    const datas = srcs.map((s, i) => fill(s, 0x20 * (i + 1)));
    proc(sys.node(0), 100, 7, srcs);
    const b = proc(sys.node(1), 200, 7, dsts);
    const ps = srcs.map((s, i) => post(sys.node(0), s, dsts[i]!, { channel: i }));
    await until('the burst to reach the driver', () => sys.node(1).driver.counters().records === n);
    expect(sys.node(1).driver.counters()).toMatchObject({ notified: 1, dropped: n - 1 });
    expect(sys.node(1).netlink.counters()).toMatchObject({ delivered: 1, dropped: n - 1, noListener: 0 });
    expect(b.socket.dropped).toBe(n - 1);

    // Now the process reads its socket (recv) and resolves what it hears.
    const heard: NlMessage[] = [];
    const loop = (async () => {
      for (;;) {
        const m = await b.socket.recv();
        if (!m) return;
        const n = decodeFault(m);
        if (!n) continue;
        heard.push(m);
        const va = n.va;
        const r = dsts.find((d) => va >= d.address && va < d.address + BigInt(d.size))!;
        r.populate(Number(va - r.address), P);
        answerFault(b.socket, { sid: n.sid, va, stall: false, stag: 0 } as FaultNote, IommuPageResponseCode.SUCCESS, P);
      }
    })();
    const cs = await within('transfers', Promise.all(ps), 5000);
    b.socket.close();
    await within('recv loop', loop);
    cs.forEach((c, i) => {
      expect(c.status).toBe(DmaStatus.SUCCESS);
      expect(bytesOf(dsts[i]!).equals(datas[i]!)).toBe(true);
    });
    expect(heard).toHaveLength(n);
    expect(sys.node(0).pldma.counters().retryTimeouts).toBe(n - 1);
    expect(sys.node(1).netlink.counters()).toMatchObject({ delivered: n, dropped: n - 1 });
  });
});

describe('the fault library cannot help', () => {
  test.each(['destination', 'source'] as const)(
    'retry limit: a library that answers SUCCESS without resolving (%s) → RETRY_EXCEEDED',
    async (side) => {
      const sys = env.system({ nodes: 2, retryLimit: 2 });
      const src = env.region(P);
      const dst = env.region(P);
      if (side === 'destination') fill(src);
      else dst.populate();
      const a = proc(sys.node(0), 100, 7, [src]);
      const b = proc(sys.node(1), 200, 7, [dst]);
      const lib = env.track(new FaultLibrary(side === 'source' ? a.socket : b.socket, { regions: [side === 'source' ? src : dst], noResolve: true }));
      const c = await within('transfer', post(sys.node(0), src, dst));
      expect(c.status).toBe(DmaStatus.RETRY_EXCEEDED);
      expect(c.faults[side]).toBe(3);
      expect(c.retransmittedBlocks).toBe(2);
      expect(lib.faults).toHaveLength(3);
      expect(layerCounts(sys, side === 'source' ? 0 : 1).notified).toBe(3);
      expect(sys.node(0).pldma.counters().errors).toBe(1);
      expect(sys.node(0).pldma.counters().retryTimeouts).toBe(0);
    },
  );

  test('a per-descriptor retry limit of 0 ends at the first fault', async () => {
    const sys = env.system({ nodes: 2 });
    const src = env.region(P);
    const dst = env.region(P);
    fill(src);
    proc(sys.node(0), 100, 7, [src]);
    const b = proc(sys.node(1), 200, 7, [dst]);
    env.track(new FaultLibrary(b.socket, { regions: [dst] }));
    const c = await within('transfer', post(sys.node(0), src, dst, { retryLimit: 0 }));
    expect(c.status).toBe(DmaStatus.RETRY_EXCEEDED);
    expect(c.faults.destination).toBe(1);
    expect(c.retransmittedBlocks).toBe(0);
  });

  test.each(['destination', 'source'] as const)('the library answers INVALID (%s) → FAULT_UNRESOLVED', async (side) => {
    const sys = env.system({ nodes: 2 });
    const src = env.region(P);
    const dst = env.region(P);
    if (side === 'destination') fill(src);
    else dst.populate();
    const a = proc(sys.node(0), 100, 7, [src]);
    const b = proc(sys.node(1), 200, 7, [dst]);
    env.track(
      new FaultLibrary(side === 'source' ? a.socket : b.socket, {
        regions: [side === 'source' ? src : dst],
        noResolve: true,
        status: IommuPageResponseCode.INVALID,
      }),
    );
    const c = await within('transfer', post(sys.node(0), src, dst));
    expect(c.status).toBe(DmaStatus.FAULT_UNRESOLVED);
    expect(c.faults[side]).toBe(1);
    expect(c.retransmittedBlocks).toBe(0);
  });
});

describe('bad descriptors', () => {
  function rig() {
    const sys = env.system({ nodes: 2 });
    const src = env.region(4 * P);
    const dst = env.region(8 * P);
    const data = fill(src, 0x41);
    new Uint8Array(dst.buffer).fill(0xee);
    const a = proc(sys.node(0), 100, 7, [src]);
    const b = proc(sys.node(1), 200, 7, [dst]);
    return { sys, src, dst, data, a, b };
  }

  async function settle(p: Promise<DmaCompletion>): Promise<DmaCompletion> {
    return within('completion', p, 5000);
  }

  test.each<[string, Partial<DmaDescriptor>, DmaStatus]>([
    ['no channel at all', { channel: undefined as never }, DmaStatus.BAD_CHANNEL],
    ['channel -1', { channel: -1 }, DmaStatus.BAD_CHANNEL],
    ['channel 1024', { channel: 1024 }, DmaStatus.BAD_CHANNEL],
    ['channel 1.5', { channel: 1.5 }, DmaStatus.BAD_CHANNEL],
    ['channel "0"', { channel: '0' as never }, DmaStatus.BAD_CHANNEL],
    ['length 0', { length: 0 }, DmaStatus.BAD_LENGTH],
    ['length -4096', { length: -P }, DmaStatus.BAD_LENGTH],
    ['length NaN', { length: Number.NaN }, DmaStatus.BAD_LENGTH],
    ['length 2^60', { length: 2 ** 60 }, DmaStatus.BAD_LENGTH],
    ['node 5', { dstNode: 5 }, DmaStatus.BAD_NODE],
    ['node -1', { dstNode: -1 }, DmaStatus.BAD_NODE],
    ['source VA as a number', { srcVa: 4096 as never }, DmaStatus.SRC_ADDR_ERR],
    ['negative source VA', { srcVa: -1n }, DmaStatus.SRC_ADDR_ERR],
    ['negative destination VA', { dstVa: -1n }, DmaStatus.DST_ADDR_ERR],
    ['destination VA as a number', { dstVa: 4096 as never }, DmaStatus.DST_ADDR_ERR],
    ['protection domain without a stream at the source', { pd: 9 }, DmaStatus.PD_ERR],
  ])('%s → its status, counted, nothing translated or copied', async (_, d, status) => {
    const { sys, src, dst } = rig();
    const c = await settle(post(sys.node(0), src, dst, d));
    expect(c.status).toBe(status);
    expect(c.statusName).toBe(DmaStatus[status]);
    expect(c.reason).toBeTruthy();
    expect(c.bytes).toBe(0);
    expect(sys.node(0).pldma.counters()).toMatchObject({ posted: 1, errors: 1, completed: 0, blocksIssued: 0 });
    expect(sys.node(0).smmu.counters().translations).toBe(0);
    expect(bytesOf(dst).every((x) => x === 0xee)).toBe(true);
  });

  test('protection domain with no stream at the destination → PD_ERR (also through dstPd)', async () => {
    const { sys, src, dst } = rig();
    proc(sys.node(0), 101, 8, [src]); // the source is fine for pd 8: only the destination lacks a stream
    const c1 = await settle(post(sys.node(0), src, dst, { pd: 8 }));
    expect(c1.status).toBe(DmaStatus.PD_ERR);
    expect(c1.reason).toMatch(/node 1 has no stream for protection domain 8/);
    const c2 = await settle(post(sys.node(0), src, dst, { dstPd: 12 }));
    expect(c2.status).toBe(DmaStatus.PD_ERR);
    expect(sys.node(1).smmu.counters().translations).toBe(0);
    expect(bytesOf(dst).every((x) => x === 0xee)).toBe(true);
  });

  test('read-only destination → DST_PERM_ERR, a permission fault counted, not notified', async () => {
    const sys = env.system({ nodes: 2 });
    const src = env.region(P);
    const dst = env.region(P);
    fill(src);
    new Uint8Array(dst.buffer).fill(0xee);
    proc(sys.node(0), 100, 7, [src]);
    const b = proc(sys.node(1), 200, 7);
    sys.node(1).map(b.stream, dst, { write: false });
    const lib = env.track(new FaultLibrary(b.socket, { regions: [dst] }));
    const c = await within('transfer', post(sys.node(0), src, dst));
    expect(c.status).toBe(DmaStatus.DST_PERM_ERR);
    expect(c.faults).toEqual({ source: 0, destination: 0 });
    expect(sys.node(1).smmu.counters().faults).toEqual({ F_PERMISSION: 1 });
    expect(sys.node(1).driver.counters()).toMatchObject({ records: 1, unrecoverable: 1, notified: 0 });
    expect(lib.faults).toHaveLength(0);
    expect(bytesOf(dst).every((x) => x === 0xee)).toBe(true);
  });

  test('read-only destination that is not even resident: the permission check comes first', async () => {
    const sys = env.system({ nodes: 2 });
    const src = env.region(P);
    const dst = env.region(P);
    fill(src);
    proc(sys.node(0), 100, 7, [src]);
    const b = proc(sys.node(1), 200, 7);
    sys.node(1).map(b.stream, dst, { write: false });
    const c = await within('transfer', post(sys.node(0), src, dst));
    expect(c.status).toBe(DmaStatus.DST_PERM_ERR);
    expect(sys.node(1).smmu.counters().faults).toEqual({ F_PERMISSION: 1 });
    expect(dst.residentPages()).toBe(0);
  });

  test('source mapped without read permission → SRC_PERM_ERR', async () => {
    const sys = env.system({ nodes: 2 });
    const src = env.region(P);
    const dst = env.region(P);
    fill(src);
    const a = proc(sys.node(0), 100, 7);
    sys.node(0).map(a.stream, src, { read: false });
    proc(sys.node(1), 200, 7, [dst]);
    const c = await within('transfer', post(sys.node(0), src, dst));
    expect(c.status).toBe(DmaStatus.SRC_PERM_ERR);
    expect(sys.node(0).smmu.counters().faults).toEqual({ F_PERMISSION: 1 });
    expect(sys.node(0).driver.counters()).toMatchObject({ unrecoverable: 1, notified: 0 });
  });

  test('destination address in no region → DST_ADDR_ERR (F_ADDR_SIZE, unrecoverable)', async () => {
    const { sys, src, dst } = rig();
    const c = await settle(post(sys.node(0), src, dst, { dstVa: dst.address + BigInt(dst.size), length: P }));
    expect(c.status).toBe(DmaStatus.DST_ADDR_ERR);
    expect(sys.node(1).smmu.counters().faults).toEqual({ F_ADDR_SIZE: 1 });
    expect(sys.node(1).driver.counters()).toMatchObject({ unrecoverable: 1, notified: 0 });
  });

  test('source address in no region → SRC_ADDR_ERR', async () => {
    const { sys, src, dst } = rig();
    const c = await settle(post(sys.node(0), src, dst, { srcVa: 0x1000n, length: P }));
    expect(c.status).toBe(DmaStatus.SRC_ADDR_ERR);
    expect(sys.node(0).smmu.counters().faults).toEqual({ F_ADDR_SIZE: 1 });
    expect(sys.node(0).driver.counters()).toMatchObject({ unrecoverable: 1 });
    expect(bytesOf(dst).every((x) => x === 0xee)).toBe(true);
  });

  test('a length past the source region ends with SRC_ADDR_ERR after the blocks inside it', async () => {
    const { sys, src, dst, data } = rig();
    dst.populate();
    const c = await settle(post(sys.node(0), src, dst, { length: 6 * P }));
    expect(c.status).toBe(DmaStatus.SRC_ADDR_ERR);
    expect(c.bytes).toBe(4 * P);
    expect(bytesOf(dst, 0, 4 * P).equals(data)).toBe(true);
    expect(bytesOf(dst, 4 * P).every((x) => x === 0xee)).toBe(true);
  });

  test('a block straddling the end of the destination region → DST_ADDR_ERR, nothing of it written', async () => {
    const sys = env.system({ nodes: 2, blockSize: 4 * P });
    const src = env.region(8 * P);
    const dst = env.region(6 * P);
    const data = fill(src);
    new Uint8Array(dst.buffer).fill(0xee);
    proc(sys.node(0), 100, 7, [src]);
    proc(sys.node(1), 200, 7, [dst]);
    const c = await within('transfer', post(sys.node(0), src, dst, { length: 8 * P }));
    expect(c.status).toBe(DmaStatus.DST_ADDR_ERR);
    expect(c.bytes).toBe(4 * P);
    expect(bytesOf(dst, 0, 4 * P).equals(data.subarray(0, 4 * P))).toBe(true);
    expect(bytesOf(dst, 4 * P).every((x) => x === 0xee)).toBe(true);
  });

  test('a short last block that ends where both regions end is translated for its own bytes only: SUCCESS', async () => {
    // 10 pages in blocks of 4: the last block is 2 pages, and nothing of either region lies
    // past it. A destination fault at block 0 makes the runs after it short, so the last
    // block goes in a run of its own, starting inside the transfer.
    const sys = env.system({ nodes: 2, blockSize: 4 * P });
    const src = env.region(10 * P);
    const dst = env.region(10 * P);
    const data = fill(src);
    dst.populate();
    dst.evict(0, P);
    proc(sys.node(0), 100, 7, [src]);
    const b = proc(sys.node(1), 200, 7, [dst]);
    env.track(new FaultLibrary(b.socket, { regions: [dst] }));
    const c = await within('transfer', post(sys.node(0), src, dst, { length: 10 * P }));
    expect([c.status, c.bytes, c.blocks]).toEqual([DmaStatus.SUCCESS, 10 * P, 3]);
    expect(c.faults).toEqual({ source: 0, destination: 1 });
    expect(bytesOf(dst).equals(data)).toBe(true);
  });

  test('a region closed after mapping is no longer translated: DST_ADDR_ERR, no crash', async () => {
    const { sys, src, dst } = rig();
    dst.close();
    const c = await settle(post(sys.node(0), src, dst));
    expect(c.status).toBe(DmaStatus.DST_ADDR_ERR);
  });

  test('posting to a closed system → FLUSHED', async () => {
    const { sys, src, dst } = rig();
    sys.close();
    const c = await settle(post(sys.node(0), src, dst));
    expect(c.status).toBe(DmaStatus.FLUSHED);
  });
});

describe('stream isolation', () => {
  function rig() {
    const sys = env.system({ nodes: 2 });
    const srcA = env.region(P);
    const srcB = env.region(P);
    const dstA = env.region(P);
    const dstB = env.region(P);
    const dataA = fill(srcA, 0xa0);
    fill(srcB, 0xb0);
    new Uint8Array(dstA.buffer).fill(0xee);
    new Uint8Array(dstB.buffer).fill(0xee);
    proc(sys.node(0), 100, 7, [srcA]);
    proc(sys.node(0), 101, 8, [srcB]);
    proc(sys.node(1), 200, 7, [dstA]);
    proc(sys.node(1), 201, 8, [dstB]);
    return { sys, srcA, srcB, dstA, dstB, dataA };
  }

  test('a write into memory of another stream → DST_ADDR_ERR, the memory untouched', async () => {
    const { sys, srcA, dstA, dstB } = rig();
    const c = await within('transfer', post(sys.node(0), srcA, dstB, { pd: 7 }));
    expect(c.status).toBe(DmaStatus.DST_ADDR_ERR);
    expect(bytesOf(dstB).every((x) => x === 0xee)).toBe(true);
    // Through dstPd too: stream 8 at the destination does not map dstA.
    const c2 = await within('transfer', post(sys.node(0), srcA, dstA, { pd: 7, dstPd: 8 }));
    expect(c2.status).toBe(DmaStatus.DST_ADDR_ERR);
    expect(bytesOf(dstA).every((x) => x === 0xee)).toBe(true);
    expect(sys.node(1).smmu.counters().faults).toEqual({ F_ADDR_SIZE: 2 });
  });

  test("a read of another stream's memory → SRC_ADDR_ERR", async () => {
    const { sys, srcA, dstB } = rig();
    const c = await within('transfer', post(sys.node(0), srcA, dstB, { pd: 8 }));
    expect(c.status).toBe(DmaStatus.SRC_ADDR_ERR);
    expect(bytesOf(dstB).every((x) => x === 0xee)).toBe(true);
  });

  test('the destination stream named by dstPd, which maps the region, is allowed', async () => {
    const { sys, srcA, dstB, dataA } = rig();
    const c = await within('transfer', post(sys.node(0), srcA, dstB, { pd: 7, dstPd: 8 }));
    expect(c.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dstB).equals(dataA)).toBe(true);
  });
});
