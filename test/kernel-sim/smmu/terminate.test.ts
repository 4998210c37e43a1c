// Terminate mode, the thesis's design: a non-resident page is a translation fault at the
// SMMU, the access aborts, the driver tells the owner's fault library over netlink, the
// library makes the page(s) resident and answers, and the block is retransmitted (after a
// NACK when the fault was at the destination). Every count checked here is implied by the
// real residency of the pages before the transfer.
import { describe, expect, test } from 'vitest';
import {
  DmaStatus,
  type DriverFault,
  IommuPageResponseCode,
  IOMMU_FAULT_PERM_READ,
  IOMMU_FAULT_PERM_WRITE,
  EvtId,
} from '../../../kernel-sim/index.js';
import {
  answerFault,
  bytesOf,
  deferred,
  sleep,
  FaultLibrary,
  fill,
  layerCounts,
  P,
  pattern,
  post,
  proc,
  residentPages,
  until,
  useEnv,
  within,
  type Policy,
} from '../helpers.js';
import { twoNode } from '../../fixtures/two-node.js';

const env = useEnv();

describe('destination faults', () => {
  test.each<[Policy, number]>([
    ['touch', 8],
    ['ahead', 1],
  ])('non-resident destination, %s resolution: right bytes, %i fault(s), as many notifications and retransmissions', async (policy, expected) => {
    const pages = 8;
    const { sys, src, dst, data, b } = twoNode(env, { pages });
    expect(dst.residentPages()).toBe(0);
    const lib = env.track(new FaultLibrary(b.socket, { regions: [dst], policy }));
    const c = await within('transfer', post(sys.node(0), src, dst));

    expect(c.status).toBe(DmaStatus.SUCCESS);
    expect(c.bytes).toBe(pages * P);
    expect(bytesOf(dst).equals(data)).toBe(true);
    expect(c.blocks).toBe(pages);
    expect(c.faults).toEqual({ source: 0, destination: expected });
    expect(c.nacks).toBe(expected);
    expect(c.retransmittedBlocks).toBe(expected);
    expect(c.real.faultUs).toHaveLength(expected);

    // The library heard one notification per fault, each for the next non-resident page.
    expect(lib.faults.map((f) => f.offset)).toEqual(Array.from({ length: expected }, (_, i) => i * P));
    expect(lib.answered).toBe(expected);
    expect(lib.pagesResolved).toBe(pages);
    for (const f of lib.faults) {
      expect(f.write).toBe(true);
      expect(f.side).toBe('destination');
      expect(f.node).toBe(1);
      expect(f.transfer).toBe(c.tid);
      expect(f.channel).toBe(0);
      expect(f.hint).toBe(pages * P - f.offset);
    }

    // Every layer saw the same faults: SMMU → event queue → driver → netlink.
    expect(sys.node(1).smmu.counters().faults).toEqual({ F_TRANSLATION: expected });
    expect(layerCounts(sys, 1)).toEqual({
      smmuFaults: expected,
      recorded: expected,
      overflows: 0,
      driverRecords: expected,
      notified: expected,
      driverDropped: 0,
      nlDelivered: expected,
      nlDropped: 0,
    });
    expect(sys.node(1).driver.counters().responses).toBe(expected);
    expect(sys.node(1).driver.pending).toBe(0);
    // The source node had nothing to report.
    expect(layerCounts(sys, 0).smmuFaults).toBe(0);
    expect(sys.node(0).netlink.counters().sent).toBe(0);
    const p0 = sys.node(0).pldma.counters();
    const p1 = sys.node(1).pldma.counters();
    expect(p0.nacksReceived).toBe(expected);
    expect(p1.nacksSent).toBe(expected);
    expect(p1.faults.destination).toBe(expected);
    expect(p0.retransmittedBlocks).toBe(expected);
    expect(p0.blocksIssued).toBe(pages + expected);
    expect(p0.blocksAcked).toBe(pages);
    expect(p0.retryTimeouts).toBe(0);
  });

  test('fault-free transfer into a resident destination: no fault, no notification, no retransmission', async () => {
    const { sys, src, dst, data, b } = twoNode(env, { pages: 8, dstResident: true });
    const lib = env.track(new FaultLibrary(b.socket, { regions: [dst] }));
    const c = await within('transfer', post(sys.node(0), src, dst));
    expect(c.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dst).equals(data)).toBe(true);
    expect(c.faults).toEqual({ source: 0, destination: 0 });
    expect(c.retransmittedBlocks).toBe(0);
    expect(lib.faults).toHaveLength(0);
    expect(sys.node(1).netlink.counters().sent).toBe(0);
  });

  test.each<[Policy, number]>([
    ['touch', 4],
    ['ahead', 1],
  ])('every other destination page evicted, %s: faults only at the evicted pages (%i)', async (policy, expected) => {
    const pages = 8;
    const { sys, src, dst, data, b } = twoNode(env, { pages, dstResident: true });
    new Uint8Array(dst.buffer).fill(0xee);
    for (let i = 1; i < pages; i += 2) dst.evict(i * P, P);
    expect(residentPages(dst)).toEqual([0, 2, 4, 6]);
    const lib = env.track(new FaultLibrary(b.socket, { regions: [dst], policy }));
    const c = await within('transfer', post(sys.node(0), src, dst));

    expect(c.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dst).equals(data)).toBe(true);
    expect(c.faults.destination).toBe(expected);
    expect(c.retransmittedBlocks).toBe(expected);
    expect(lib.faults[0]!.offset).toBe(P);
    if (policy === 'touch') expect(lib.faults.map((f) => f.offset / P)).toEqual([1, 3, 5, 7]);
    expect(layerCounts(sys, 1).notified).toBe(expected);
  });

  test.each<[Policy, boolean, number]>([
    ['touch', false, 16],
    ['ahead', false, 1],
    ['touch', true, 8],
  ])('block of 4 pages, %s, every other page evicted %s: %i faults, one per non-resident page', async (policy, partial, expected) => {
    const pages = 16;
    const { sys, src, dst, data, b } = twoNode(env, { pages, blockSize: 4 * P, dstResident: partial });
    if (partial) for (let i = 1; i < pages; i += 2) dst.evict(i * P, P);
    const lib = env.track(new FaultLibrary(b.socket, { regions: [dst], policy }));
    const c = await within('transfer', post(sys.node(0), src, dst));

    expect(c.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dst).equals(data)).toBe(true);
    expect(c.blocks).toBe(4);
    expect(c.faults.destination).toBe(expected);
    // A block is sent again after each of its faults.
    expect(c.retransmittedBlocks).toBe(expected);
    expect(lib.faults).toHaveLength(expected);
    expect(layerCounts(sys, 1).notified).toBe(expected);
    expect(sys.node(0).pldma.counters().blocksIssued).toBe(4 + expected);
    if (policy === 'touch') {
      const step = partial ? 2 : 1;
      expect(lib.faults.map((f) => f.offset / P)).toEqual(Array.from({ length: expected }, (_, i) => (partial ? 1 : 0) + i * step));
    }
  });
});

describe('source faults', () => {
  test.each<[Policy, number]>([
    ['touch', 4],
    ['ahead', 1],
  ])('evicted source pages brought back by the library (%s): right bytes, %i read fault(s)', async (policy, expected) => {
    const pages = 8;
    const sys = env.system({ nodes: 2 });
    const src = env.region(pages * P);
    const dst = env.region(pages * P);
    const data = fill(src, 0x21);
    dst.populate();
    // Evicting anonymous memory drops its contents: the library must provide them again
    // (as a pager would, from swap or a remote server). A page left at zero would show.
    for (let i = 1; i < pages; i += 2) src.evict(i * P, P);
    expect(bytesOf(src, P, P).every((x) => x === 0)).toBe(true);
    for (let i = 1; i < pages; i += 2) src.evict(i * P, P); // the read above faulted it back in
    expect(residentPages(src)).toEqual([0, 2, 4, 6]);
    const a = proc(sys.node(0), 100, 7, [src]);
    proc(sys.node(1), 200, 7, [dst]);
    const records: DriverFault[] = [];
    sys.node(0).driver.onFault((f) => records.push(f));
    const lib = env.track(
      new FaultLibrary(a.socket, {
        regions: [src],
        policy,
        resolve: (r, off, len) => new Uint8Array(r.buffer, off, len).set(data.subarray(off, off + len)),
      }),
    );
    const c = await within('transfer', post(sys.node(0), src, dst));

    expect(c.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dst).equals(data)).toBe(true);
    expect(c.faults).toEqual({ source: expected, destination: 0 });
    expect(c.nacks).toBe(0);
    expect(c.retransmittedBlocks).toBe(expected);
    expect(lib.faults[0]!.offset).toBe(P);
    for (const f of lib.faults) {
      expect(f.write).toBe(false);
      expect(f.side).toBe('source');
      expect(f.node).toBe(0);
      expect(f.hint).toBe(pages * P - f.offset);
    }
    expect(records).toHaveLength(expected);
    for (const r of records) {
      expect(r.record.id).toBe(EvtId.F_TRANSLATION);
      expect(r.record.rnw).toBe(true);
      expect(r.pageRequest.perm).toBe(IOMMU_FAULT_PERM_READ);
      expect(r.pid).toBe(100);
    }
    expect(layerCounts(sys, 0)).toMatchObject({ smmuFaults: expected, recorded: expected, notified: expected, nlDelivered: expected });
    expect(layerCounts(sys, 1).smmuFaults).toBe(0);
    expect(sys.node(1).netlink.counters().sent).toBe(0);
  });

  test('never-touched source pages: populate() gives zeros, and zeros arrive', async () => {
    const pages = 4;
    const sys = env.system({ nodes: 2 });
    const src = env.region(pages * P);
    const dst = env.region(pages * P);
    new Uint8Array(dst.buffer).fill(0xee);
    const a = proc(sys.node(0), 100, 7, [src]);
    proc(sys.node(1), 200, 7, [dst]);
    const lib = env.track(new FaultLibrary(a.socket, { regions: [src] }));
    const c = await within('transfer', post(sys.node(0), src, dst));
    expect(c.status).toBe(DmaStatus.SUCCESS);
    expect(c.faults).toEqual({ source: pages, destination: 0 });
    expect(lib.faults).toHaveLength(pages);
    expect(src.residentPages()).toBe(pages);
    expect(bytesOf(dst).every((x) => x === 0)).toBe(true);
  });

  test('faults at both ends of one transfer: each node notifies its own process', async () => {
    const pages = 8;
    const sys = env.system({ nodes: 2 });
    const src = env.region(pages * P);
    const dst = env.region(pages * P);
    const data = fill(src, 0x40);
    for (let i = 1; i < pages; i += 2) src.evict(i * P, P);
    const a = proc(sys.node(0), 100, 7, [src]);
    const b = proc(sys.node(1), 200, 7, [dst]);
    const srcLib = env.track(
      new FaultLibrary(a.socket, { regions: [src], resolve: (r, off, len) => new Uint8Array(r.buffer, off, len).set(data.subarray(off, off + len)) }),
    );
    const dstLib = env.track(new FaultLibrary(b.socket, { regions: [dst] }));
    const c = await within('transfer', post(sys.node(0), src, dst));

    expect(c.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dst).equals(data)).toBe(true);
    expect(c.faults).toEqual({ source: pages / 2, destination: pages });
    // Each block is sent once more per fault it met, at either end.
    expect(c.retransmittedBlocks).toBe(pages / 2 + pages);
    expect(c.nacks).toBe(pages);
    expect(srcLib.faults.map((f) => f.offset / P)).toEqual([1, 3, 5, 7]);
    expect(dstLib.faults.map((f) => f.offset / P)).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
    expect(srcLib.faults.every((f) => f.side === 'source' && !f.write)).toBe(true);
    expect(dstLib.faults.every((f) => f.side === 'destination' && f.write)).toBe(true);
    expect(layerCounts(sys, 0).notified).toBe(pages / 2);
    expect(layerCounts(sys, 1).notified).toBe(pages);
  });

  test('loopback on one node: source and destination faults of the same process', async () => {
    const pages = 4;
    const sys = env.system({ nodes: 1 });
    const src = env.region(pages * P);
    const dst = env.region(pages * P);
    const data = fill(src, 0x60);
    src.evict(2 * P, P);
    const a = proc(sys.node(0), 100, 7, [src, dst]);
    const lib = env.track(
      new FaultLibrary(a.socket, {
        regions: [src, dst],
        resolve: (r, off, len) => (r === src ? new Uint8Array(r.buffer, off, len).set(data.subarray(off, off + len)) : r.populate(off, len)),
      }),
    );
    const c = await within('transfer', post(sys.node(0), src, dst, { dstNode: 0 }));
    expect(c.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dst).equals(data)).toBe(true);
    expect(c.faults).toEqual({ source: 1, destination: pages });
    expect(lib.faults.filter((f) => f.side === 'source')).toHaveLength(1);
    expect(lib.faults.filter((f) => f.side === 'destination')).toHaveLength(pages);
  });
});

describe('eviction invalidates cached translations', () => {
  test('evict() between two transfers: the IOTLB is invalidated and the next transfer faults again', async () => {
    const pages = 4;
    const { sys, src, dst, b } = twoNode(env, { pages });
    const lib = env.track(new FaultLibrary(b.socket, { regions: [dst] }));
    const smmu = sys.node(1).smmu;

    const c1 = await within('first transfer', post(sys.node(0), src, dst));
    expect(c1.status).toBe(DmaStatus.SUCCESS);
    expect(c1.faults.destination).toBe(pages);
    const after1 = smmu.counters();
    expect(after1.iotlbInvalidations).toBe(0);

    // Resident and cached: the second transfer hits the IOTLB and does not fault.
    const c2 = await within('second transfer', post(sys.node(0), src, dst));
    expect(c2.faults.destination).toBe(0);
    const after2 = smmu.counters();
    expect(after2.iotlbHits - after1.iotlbHits).toBe(pages);
    expect(after2.walks).toBe(after1.walks);

    dst.evict();
    expect(dst.residentPages()).toBe(0);
    expect(smmu.counters().iotlbInvalidations).toBe(pages);

    const data = fill(src, 0x90);
    const c3 = await within('third transfer', post(sys.node(0), src, dst));
    expect(c3.status).toBe(DmaStatus.SUCCESS);
    expect(c3.faults.destination).toBe(pages);
    expect(c3.retransmittedBlocks).toBe(pages);
    expect(bytesOf(dst).equals(data)).toBe(true);
    expect(lib.faults).toHaveLength(2 * pages);
    expect(smmu.counters().faults.F_TRANSLATION).toBe(2 * pages);
  });

  test('evicting part of the source invalidates only those pages on the source SMMU', async () => {
    const pages = 4;
    const { sys, src, dst, data, a } = twoNode(env, { pages, dstResident: true });
    const lib = env.track(
      new FaultLibrary(a.socket, { regions: [src], resolve: (r, off, len) => new Uint8Array(r.buffer, off, len).set(data.subarray(off, off + len)) }),
    );
    const c1 = await within('first transfer', post(sys.node(0), src, dst));
    expect(c1.faults).toEqual({ source: 0, destination: 0 });
    src.evict(P, 2 * P);
    expect(sys.node(0).smmu.counters().iotlbInvalidations).toBe(2);
    new Uint8Array(dst.buffer).fill(0);
    const c2 = await within('second transfer', post(sys.node(0), src, dst));
    expect(c2.status).toBe(DmaStatus.SUCCESS);
    expect(c2.faults).toEqual({ source: 2, destination: 0 });
    expect(lib.faults.map((f) => f.offset / P)).toEqual([1, 2]);
    expect(bytesOf(dst).equals(data)).toBe(true);
  });

  test("a stale IOTLB entry (no MMU notifier) is caught by the copy thread's walk: a fault, not zeros", async () => {
    const pages = 4;
    const { sys, src, dst, data, b } = twoNode(env, { pages, dstResident: true });
    const lib = env.track(new FaultLibrary(b.socket, { regions: [dst] }));
    const smmu = sys.node(1).smmu;
    const c1 = await within('first transfer', post(sys.node(0), src, dst));
    expect(c1.faults.destination).toBe(0);
    // Take the SMMU off the region's notifier list: the IOTLB keeps its now stale entries.
    dst.unobserve(smmu);
    dst.evict(P, 2 * P);
    expect(smmu.counters().iotlbInvalidations).toBe(0);
    const hits = smmu.counters().iotlbHits;
    const c2 = await within('second transfer', post(sys.node(0), src, dst));
    expect(c2.status).toBe(DmaStatus.SUCCESS);
    expect(smmu.counters().iotlbHits - hits).toBeGreaterThanOrEqual(2);
    expect(c2.faults.destination).toBe(2);
    expect(c2.nacks).toBe(2);
    expect(c2.retransmittedBlocks).toBe(2);
    expect(lib.faults.map((f) => f.offset / P)).toEqual([1, 2]);
    expect(smmu.counters().iotlbInvalidations).toBe(2);
    expect(bytesOf(dst).equals(data)).toBe(true);
    dst.observe(smmu);
  });
});

describe('channels and processes', () => {
  test('while transfer A waits on a fault, transfer B on another channel completes first', async () => {
    const pages = 4;
    const sys = env.system({ nodes: 2 });
    const srcA = env.region(pages * P);
    const srcB = env.region(pages * P);
    const dstA = env.region(pages * P);
    const dstB = env.region(pages * P);
    const dataA = fill(srcA, 0x10);
    const dataB = fill(srcB, 0x80);
    dstB.populate();
    proc(sys.node(0), 100, 7, [srcA, srcB]);
    const b = proc(sys.node(1), 200, 7, [dstA, dstB]);
    const release = deferred();
    const lib = env.track(new FaultLibrary(b.socket, { regions: [dstA, dstB], policy: 'ahead', hold: () => release.promise }));

    let aDone = false;
    const pa = post(sys.node(0), srcA, dstA, { channel: 3 }).then((c) => ((aDone = true), c));
    await until('A to fault', () => lib.faults.length === 1);
    const cb = await within('B', post(sys.node(0), srcB, dstB, { channel: 9 }));
    expect(cb.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dstB).equals(dataB)).toBe(true);
    expect(aDone).toBe(false);
    expect(sys.node(0).pldma.active).toBe(1);
    expect(sys.node(1).driver.pending).toBe(1);

    release.resolve();
    const ca = await within('A', pa);
    expect(ca.status).toBe(DmaStatus.SUCCESS);
    expect(ca.faults.destination).toBe(1);
    expect(bytesOf(dstA).equals(dataA)).toBe(true);
    expect(ca.model.endUs).toBeGreaterThan(cb.model.endUs);
  });

  test('many channels fault at once; each transfer completes with its own bytes', async () => {
    const n = 6;
    const sys = env.system({ nodes: 2 });
    const srcs = Array.from({ length: n }, () => env.region(2 * P));
    const dsts = Array.from({ length: n }, () => env.region(2 * P));
    const datas = srcs.map((s, i) => fill(s, 16 * i + 1));
    proc(sys.node(0), 100, 7, srcs);
    const b = proc(sys.node(1), 200, 7, dsts);
    const lib = env.track(new FaultLibrary(b.socket, { regions: dsts }));
    const cs = await within('transfers', Promise.all(srcs.map((s, i) => post(sys.node(0), s, dsts[i]!, { channel: i }))));
    cs.forEach((c, i) => {
      expect(c.status).toBe(DmaStatus.SUCCESS);
      expect(c.faults.destination).toBe(2);
      expect(bytesOf(dsts[i]!).equals(datas[i]!)).toBe(true);
    });
    expect(lib.faults).toHaveLength(2 * n);
    expect(new Set(lib.faults.map((f) => f.channel))).toEqual(new Set(Array.from({ length: n }, (_, i) => i)));
  });

  test.each(['destination', 'source'] as const)(
    'two transfers faulting on the same %s page: one resolution serves both, no retry timer',
    async (side) => {
      // A long retry timer: a transfer left waiting for it would time the test out.
      const sys = env.system({ nodes: 2, faultTimeoutMs: 60_000 });
      const shared = env.region(P);
      const others = [env.region(P), env.region(P)];
      const data = side === 'source' ? fill(shared, 0x55) : others.map((o, i) => fill(o, 0x66 + i))[0]!;
      if (side === 'source') {
        shared.evict();
        others.forEach((o) => o.populate());
      }
      const a = proc(sys.node(0), 100, 7, side === 'source' ? [shared] : others);
      const b = proc(sys.node(1), 200, 7, side === 'source' ? others : [shared]);
      const lib = env.track(
        new FaultLibrary(side === 'source' ? a.socket : b.socket, {
          regions: [shared],
          resolve: (r, off, len) =>
            side === 'source' ? new Uint8Array(r.buffer, off, len).set(data.subarray(off, off + len)) : r.populate(off, len),
        }),
      );
      const cs = await within(
        'both transfers',
        Promise.all(
          [0, 1].map((i) =>
            side === 'source' ? post(sys.node(0), shared, others[i]!, { channel: i }) : post(sys.node(0), others[i]!, shared, { channel: i }),
          ),
        ),
        5000,
      );
      for (const c of cs) {
        expect(c.status).toBe(DmaStatus.SUCCESS);
        expect(c.faults[side]).toBe(1);
        expect(c.retransmittedBlocks).toBe(1);
      }
      // Two faults, two notifications, and the first answer released both transfers.
      expect(lib.faults).toHaveLength(2);
      expect(sys.node(0).pldma.counters().retryTimeouts).toBe(0);
      if (side === 'source') others.forEach((o) => expect(bytesOf(o).equals(data)).toBe(true));
      else expect(others.some((o) => bytesOf(o).equals(bytesOf(shared)))).toBe(true); // one of the two writes, whole
    },
  );

  test("a process hears only its own faults and cannot answer another process's", async () => {
    const sys = env.system({ nodes: 2 });
    const src = env.region(P);
    const dst = env.region(P);
    const data = fill(src, 0x33);
    proc(sys.node(0), 100, 7, [src]);
    const owner = proc(sys.node(1), 200, 7, [dst]);
    const other = proc(sys.node(1), 201, 8, []);
    const release = deferred();
    const ownerLib = env.track(new FaultLibrary(owner.socket, { regions: [dst], hold: () => release.promise }));
    const otherLib = env.track(new FaultLibrary(other.socket, { regions: [dst] }));

    let done = false;
    const pc = post(sys.node(0), src, dst).then((c) => ((done = true), c));
    await until('the owner to hear the fault', () => ownerLib.faults.length === 1);
    expect(otherLib.faults).toHaveLength(0);
    expect(other.socket.received).toBe(0);

    // The other process makes the page resident and answers for it: ignored.
    dst.populate();
    answerFault(other.socket, ownerLib.faults[0]!, IommuPageResponseCode.SUCCESS, P);
    await sleep(30);
    expect(sys.node(1).driver.counters().responses).toBe(0);
    expect(sys.node(1).driver.pending).toBe(1);
    expect(done).toBe(false);

    release.resolve();
    const c = await within('transfer', pc);
    expect(c.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dst).equals(data)).toBe(true);
    expect(sys.node(1).driver.counters().responses).toBe(1);
    expect(ownerLib.answered).toBe(1);
  });

  test('the write-fault record says RnW = 0 and the page request asks for WRITE', async () => {
    const { sys, src, dst, b } = twoNode(env, { pages: 1 });
    env.track(new FaultLibrary(b.socket, { regions: [dst] }));
    const seen: DriverFault[] = [];
    sys.node(1).driver.onFault((f) => seen.push(f));
    const c = await within('transfer', post(sys.node(0), src, dst));
    expect(c.status).toBe(DmaStatus.SUCCESS);
    expect(seen).toHaveLength(1);
    const f = seen[0]!;
    expect(f.name).toBe('F_TRANSLATION');
    expect(f.record.rnw).toBe(false);
    expect(f.record.stall).toBe(false);
    expect(f.record.addr).toBe(dst.address);
    expect(f.record.sid).toBe(b.stream.sid);
    expect(f.pageRequest.perm).toBe(IOMMU_FAULT_PERM_WRITE);
    expect(f.pageRequest.length).toBe(P);
    expect(f.pid).toBe(200);
    expect(f.seq).toBeGreaterThan(0);
    expect(pattern(1, 1).equals(bytesOf(dst))).toBe(true);
  });
});

describe('minor faults (shared memory)', () => {
  test('a destination page in the page cache but not mapped faults (minor), resolves without losing its neighbours', async () => {
    const pages = 4;
    const sys = env.system({ nodes: 2 });
    const src = env.region(pages * P);
    const dst = env.region(pages * P, { shared: true });
    const data = fill(src, 1);
    dst.populate();
    dst.unmapPages(0, 2 * P); // page-table entries gone, page cache kept
    expect(dst.residentPages()).toBe(pages); // mincore: still in memory
    expect([...dst.mapped()]).toEqual([0, 0, 1, 1]); // but not mapped here
    proc(sys.node(0), 100, 7, [src]);
    const b = proc(sys.node(1), 200, 7, [dst]);
    const lib = env.track(new FaultLibrary(b.socket, { regions: [dst], policy: 'touch' }));
    const c = await within('transfer', post(sys.node(0), src, dst));
    expect(c.status).toBe(DmaStatus.SUCCESS);
    expect(c.faults).toEqual({ source: 0, destination: 2 });
    expect(lib.faults.map((f) => f.offset)).toEqual([0, P]);
    expect(bytesOf(dst).equals(data)).toBe(true);
    expect([...dst.mapped()]).toEqual([1, 1, 1, 1]);
  });
});

describe('watching the path', () => {
  test('netlink monitor sees each notification and answer; the trace has one irq per record', async () => {
    const { sys, src, dst, b } = twoNode(env, { pages: 3 });
    const seen: string[] = [];
    const stop = sys.node(1).netlink.monitor((m, to) => seen.push(`${to === undefined ? 'from' : 'to'} ${m.portId || to} cmd ${m.cmd}`));
    const kinds: string[] = [];
    const untrace = sys.tracer.on((e) => kinds.push(e.kind));
    env.track(new FaultLibrary(b.socket, { regions: [dst], policy: 'touch' }));
    const c = await within('transfer', post(sys.node(0), src, dst));
    stop();
    untrace();
    expect(c.status).toBe(DmaStatus.SUCCESS);
    expect(seen).toEqual(Array.from({ length: 3 }, () => ['to 200 cmd 1', 'from 200 cmd 2']).flat());
    expect(kinds.filter((k) => k === 'irq')).toHaveLength(3);
    expect(kinds.filter((k) => k === 'fault')).toHaveLength(3);
    expect(kinds.filter((k) => k === 'retransmit')).toHaveLength(3);
  });
});
