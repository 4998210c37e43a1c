// Stall mode (SMMUv3 stall / PCIe PRI): the engine's copy thread takes a genuine
// userfaultfd fault on registered memory and stays blocked in the kernel until the driver
// sends CMD_RESUME: RETRY replays the access, ABORT / TERM / CMD_STALL_TERM end it and
// the transfer completes with ABORTED.
import { describe, expect, test } from 'vitest';
import {
  CMD_RESUME,
  CMD_STALL_TERM,
  DmaStatus,
  EvtId,
  ResumeResp,
  type DriverFault,
  IommuPageResponseCode,
  type SimSystem,
} from '../../../kernel-sim/index.js';
import { bytesOf, deferred, FaultLibrary, fill, P, post, proc, sleep, stallRig, until, useEnv, within, zeroNoWake } from '../helpers.js';

const env = useEnv();

function smmuOf(sys: SimSystem, node: number) {
  return sys.node(node).smmu;
}

describe('stall mode, destination', () => {
  test('the copy thread is blocked in a genuine fault until the resume; RETRY completes with the right bytes', async () => {
    const pages = 4;
    const { sys, uffd, src, dst, data, b, deviceFaults } = stallRig(env, pages);
    const gate = deferred();
    let completed = false;
    let held = 0;
    const lib = env.track(
      new FaultLibrary(b.socket, {
        regions: [dst],
        method: 'uffd',
        resolve: zeroNoWake(uffd),
        hold: () => (held++ === 0 ? gate.promise : undefined),
      }),
    );
    const pc = post(sys.node(0), src, dst).then((c) => ((completed = true), c));

    await until('the first stalled access', () => lib.faults.length === 1);
    // Hold the answer a while: the thread stays blocked, the transfer does not move.
    await sleep(50);
    expect(uffd.pending).toBe(1);
    expect(smmuOf(sys, 1).stalled).toBe(1);
    expect(completed).toBe(false);
    expect(dst.residentPages()).toBe(0);
    expect(deviceFaults).toHaveLength(1);
    expect(sys.node(1).engine.tids).toContain(deviceFaults[0]!.threadId);
    expect(deviceFaults[0]!.write).toBe(true);
    expect(deviceFaults[0]!.region).toBe(dst);
    const note = lib.faults[0]!;
    expect(note.stall).toBe(true);
    expect(note.stag).toBeGreaterThan(0);
    expect(note.side).toBe('destination');
    expect(note.offset).toBe(0);

    gate.resolve();
    const c = await within('transfer', pc);
    expect(c.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dst).equals(data)).toBe(true);
    // One stall per page, each retried in place: no retransmission, no NACK.
    expect(c.faults).toEqual({ source: 0, destination: pages });
    expect(c.retransmittedBlocks).toBe(0);
    expect(c.nacks).toBe(0);
    expect(lib.faults).toHaveLength(pages);
    const s = smmuOf(sys, 1).counters();
    expect(s.stalls).toBe(pages);
    expect(s.resumes).toEqual({ TERM: 0, RETRY: pages, ABORT: 0 });
    expect(s.faults).toEqual({ F_TRANSLATION: pages });
    expect(smmuOf(sys, 1).stalled).toBe(0);
    expect(sys.node(1).driver.counters()).toMatchObject({ notified: pages, responses: pages, resumes: pages });
    expect(uffd.pending).toBe(0);
    expect(deviceFaults.every((f) => sys.node(1).engine.tids.includes(f.threadId))).toBe(true);
  });

  test('the stall record carries STALL and STAG; the page request has grpid = STAG', async () => {
    const { sys, uffd, src, dst, b } = stallRig(env, 1);
    const seen: DriverFault[] = [];
    sys.node(1).driver.onFault((f) => seen.push(f));
    const lib = env.track(new FaultLibrary(b.socket, { regions: [dst], method: 'uffd', resolve: zeroNoWake(uffd) }));
    const c = await within('transfer', post(sys.node(0), src, dst));
    expect(c.status).toBe(DmaStatus.SUCCESS);
    expect(seen).toHaveLength(1);
    expect(seen[0]!.record.stall).toBe(true);
    expect(seen[0]!.record.rnw).toBe(false);
    expect(seen[0]!.record.stag).toBe(lib.faults[0]!.stag);
    expect(seen[0]!.pageRequest.grpid).toBe(lib.faults[0]!.stag);
  });

  test('a RETRY without resolving stalls again; the next answer that resolves completes it', async () => {
    const { sys, uffd, src, dst, data, b } = stallRig(env, 1);
    let n = 0;
    const lib = env.track(
      new FaultLibrary(b.socket, {
        regions: [dst],
        method: 'uffd',
        // First answer: retry without making the page present; the replayed access faults again.
        resolve: (r, off, len) => (n++ === 0 ? undefined : uffd.zeropage(r, off, len, { wake: false })),
      }),
    );
    const c = await within('transfer', post(sys.node(0), src, dst));
    expect(c.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dst).equals(data)).toBe(true);
    expect(lib.faults).toHaveLength(2);
    expect(c.faults.destination).toBe(2);
    expect(smmuOf(sys, 1).counters().resumes.RETRY).toBe(2);
  });

  test('block of 4 pages: each page of the block stalls once', async () => {
    const pages = 8;
    const { sys, uffd, src, dst, data, b } = stallRig(env, pages, { blockSize: 4 * P });
    env.track(new FaultLibrary(b.socket, { regions: [dst], method: 'uffd', resolve: zeroNoWake(uffd) }));
    const c = await within('transfer', post(sys.node(0), src, dst));
    expect(c.status).toBe(DmaStatus.SUCCESS);
    expect(c.blocks).toBe(2);
    expect(c.faults.destination).toBe(pages);
    expect(bytesOf(dst).equals(data)).toBe(true);
  });

  test('touch-ahead in stall mode: the first fault resolves the rest, one stall only', async () => {
    const pages = 8;
    const { sys, uffd, src, dst, data, b } = stallRig(env, pages);
    env.track(new FaultLibrary(b.socket, { regions: [dst], policy: 'ahead', method: 'uffd', resolve: zeroNoWake(uffd) }));
    const c = await within('transfer', post(sys.node(0), src, dst));
    expect(c.status).toBe(DmaStatus.SUCCESS);
    expect(c.faults.destination).toBe(1);
    expect(smmuOf(sys, 1).counters().stalls).toBe(1);
    expect(bytesOf(dst).equals(data)).toBe(true);
  });

  test.each([IommuPageResponseCode.INVALID, IommuPageResponseCode.FAILURE])('answer %i → CMD_RESUME ABORT → DmaStatus.ABORTED', async (status) => {
    const pages = 2;
    const { sys, uffd, src, dst, b } = stallRig(env, pages);
    const lib = env.track(new FaultLibrary(b.socket, { regions: [dst], noResolve: true, status }));
    const c = await within('transfer', post(sys.node(0), src, dst));
    expect(c.status).toBe(DmaStatus.ABORTED);
    expect(c.statusName).toBe('ABORTED');
    expect(c.reason).toMatch(/abort/i);
    expect(c.bytes).toBe(0);
    expect(lib.faults).toHaveLength(1);
    const s = smmuOf(sys, 1).counters();
    expect(s.resumes).toEqual({ TERM: 0, RETRY: 0, ABORT: 1 });
    expect(smmuOf(sys, 1).stalled).toBe(0);
    expect(sys.node(0).pldma.counters().errors).toBe(1);
    expect(uffd.pending).toBe(0);
    // The aborted access was released onto a zero page (memory cannot fail the copy
    // thread's store, so its bytes land but do not count); the next block never went out.
    expect(Array.from(dst.residency())).toEqual([1, 0]);
  });

  test('CMD_STALL_TERM ends every stalled access of the stream', async () => {
    const sys = env.system({ nodes: 2 });
    const uffd = env.uffd();
    const srcs = [env.region(P), env.region(P)];
    const dsts = [env.region(P), env.region(P)];
    srcs.forEach((s, i) => fill(s, 0x50 + i));
    for (const d of dsts) uffd.register(d);
    sys.attachStallSource(uffd);
    proc(sys.node(0), 100, 7, srcs);
    const b = proc(sys.node(1), 200, 7, dsts, 'stall');
    const lib = env.track(new FaultLibrary(b.socket, { regions: dsts, silent: true }));
    const ps = [0, 1].map((i) => post(sys.node(0), srcs[i]!, dsts[i]!, { channel: i }));

    // Both copy threads are blocked, one per transfer.
    await until('two stalls', () => smmuOf(sys, 1).stalled === 2 && lib.faults.length === 2);
    expect(uffd.pending).toBe(2);
    expect(smmuOf(sys, 1).command({ opcode: CMD_STALL_TERM, sid: b.stream.sid + 1000 })).toBe(false);
    expect(smmuOf(sys, 1).stalled).toBe(2);
    expect(smmuOf(sys, 1).command({ opcode: CMD_STALL_TERM, sid: b.stream.sid })).toBe(true);
    const cs = await within('transfers', Promise.all(ps));
    expect(cs.map((c) => c.status)).toEqual([DmaStatus.ABORTED, DmaStatus.ABORTED]);
    expect(smmuOf(sys, 1).stalled).toBe(0);
    expect(smmuOf(sys, 1).counters().stallTerms).toBe(2);
    expect(uffd.pending).toBe(0);
  });

  test('a stalled transfer does not hold up another channel: B completes while A is stalled', async () => {
    const sys = env.system({ nodes: 2 });
    const uffd = env.uffd();
    const srcA = env.region(P);
    const srcB = env.region(2 * P);
    const dstA = env.region(P);
    const dstB = env.region(2 * P);
    const dataA = fill(srcA, 0x11);
    const dataB = fill(srcB, 0x22);
    uffd.register(dstA);
    dstB.populate();
    sys.attachStallSource(uffd);
    proc(sys.node(0), 100, 7, [srcA, srcB]);
    const b = proc(sys.node(1), 200, 7, [dstA, dstB], 'stall');
    const gate = deferred();
    const lib = env.track(new FaultLibrary(b.socket, { regions: [dstA, dstB], method: 'uffd', resolve: zeroNoWake(uffd), hold: () => gate.promise }));
    let aDone = false;
    const pa = post(sys.node(0), srcA, dstA, { channel: 0 }).then((c) => ((aDone = true), c));
    await until('A to stall', () => lib.faults.length === 1);
    const cb = await within('B', post(sys.node(0), srcB, dstB, { channel: 1 }));
    expect(cb.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dstB).equals(dataB)).toBe(true);
    expect(aDone).toBe(false);
    expect(uffd.pending).toBe(1);
    gate.resolve();
    const ca = await within('A', pa);
    expect(ca.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dstA).equals(dataA)).toBe(true);
  });

  test('a stalled access whose notification is dropped (no socket) is terminated: ABORTED, never left stalled', async () => {
    const { sys, uffd, src, dst, b } = stallRig(env, 1);
    b.socket.close();
    const c = await within('transfer', post(sys.node(0), src, dst));
    expect(c.status).toBe(DmaStatus.ABORTED);
    expect(sys.node(1).driver.counters()).toMatchObject({ dropped: 1, notified: 0, resumes: 1 });
    expect(sys.node(1).netlink.counters().noListener).toBe(1);
    expect(smmuOf(sys, 1).counters().resumes).toEqual({ TERM: 1, RETRY: 0, ABORT: 0 });
    expect(smmuOf(sys, 1).stalled).toBe(0);
    expect(uffd.pending).toBe(0);
  });

  test('a stalled access whose record is lost (event queue full) is terminated: ABORTED, counted', async () => {
    const sys = env.system({ nodes: 2, eventQueueDepth: 1 });
    const uffd = env.uffd();
    const src = env.region(P);
    const dst = env.region(P);
    fill(src);
    uffd.register(dst);
    sys.attachStallSource(uffd);
    proc(sys.node(0), 100, 7, [src]);
    const b = proc(sys.node(1), 200, 7, [dst], 'stall');
    const lib = env.track(new FaultLibrary(b.socket, { regions: [dst] }));
    // The 'fault' event runs just before the SMMU sees the fault: fill the one-entry queue
    // with another record there, so the stall's own record has no room.
    uffd.on('fault', () => sys.node(1).smmu.recordFault(b.stream.sid, { id: EvtId.F_ADDR_SIZE, addr: 0n }, 'write'));
    const c = await within('transfer', post(sys.node(0), src, dst));
    expect(c.status).toBe(DmaStatus.ABORTED);
    const s = smmuOf(sys, 1).counters();
    expect(s.eventQueueOverflows).toBe(1);
    expect(s.stalls).toBe(1);
    expect(smmuOf(sys, 1).stalled).toBe(0);
    expect(lib.faults).toHaveLength(0);
    expect(sys.node(1).driver.counters()).toMatchObject({ records: 1, unrecoverable: 1, notified: 0 });
    expect(uffd.pending).toBe(0);
  });

  test("a stall released by the userfaultfd's own handler timeout completes and is not left listed as stalled", async () => {
    const sys = env.system({ nodes: 2 });
    const uffd = env.uffd({ timeoutMs: 30 });
    uffd.on('error', () => {}); // the timeout is reported as an error event; expected here
    const src = env.region(P);
    const dst = env.region(P);
    const data = fill(src);
    uffd.register(dst);
    sys.attachStallSource(uffd);
    proc(sys.node(0), 100, 7, [src]);
    const b = proc(sys.node(1), 200, 7, [dst], 'stall');
    const lib = env.track(new FaultLibrary(b.socket, { regions: [dst], silent: true }));
    const c = await within('transfer', post(sys.node(0), src, dst), 5000);
    // The kernel-side timeout placed a zero page and woke the copy thread, which then wrote.
    expect(c.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dst).equals(data)).toBe(true);
    expect(lib.faults).toHaveLength(1);
    expect(smmuOf(sys, 1).stalled).toBe(0);
    // A late answer finds nothing to resume.
    expect(smmuOf(sys, 1).command({ opcode: CMD_RESUME, sid: b.stream.sid, stag: lib.faults[0]!.stag, resp: ResumeResp.RETRY })).toBe(false);
  });

  test('closing the system while an access is stalled flushes the transfer and leaves nothing blocked', async () => {
    const { sys, uffd, src, dst, b } = stallRig(env, 1);
    const lib = env.track(new FaultLibrary(b.socket, { regions: [dst], silent: true }));
    const pc = post(sys.node(0), src, dst);
    await until('the stall', () => lib.faults.length === 1);
    sys.close();
    const c = await within('transfer', pc);
    expect(c.status).toBe(DmaStatus.FLUSHED);
    uffd.close(); // resolves what is pending: the copy thread finishes
    await sleep(20);
    expect(sys.node(1).engine.inflight).toBe(0);
  });
});

describe('stall mode, source', () => {
  test('a stalled source read waits for the library to provide the page (UFFDIO_COPY), then RETRY', async () => {
    const pages = 4;
    const { sys, uffd, src, dst, data, a, b, deviceFaults } = stallRig(env, pages, { stallSide: 'source' });
    const srcLib = env.track(
      new FaultLibrary(a.socket, {
        regions: [src],
        method: 'uffd',
        resolve: (r, off, len) => uffd.copy(r, off, data.subarray(off, off + len), { wake: false }),
      }),
    );
    const dstLib = env.track(new FaultLibrary(b.socket, { regions: [dst] }));
    const c = await within('transfer', post(sys.node(0), src, dst));
    expect(c.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dst).equals(data)).toBe(true);
    expect(c.faults).toEqual({ source: pages, destination: 0 });
    expect(srcLib.faults).toHaveLength(pages);
    expect(srcLib.faults.every((f) => f.side === 'source' && !f.write && f.stall)).toBe(true);
    expect(dstLib.faults).toHaveLength(0);
    expect(deviceFaults.every((f) => !f.write && sys.node(1).engine.tids.includes(f.threadId))).toBe(true);
    expect(smmuOf(sys, 0).counters().resumes.RETRY).toBe(pages);
    expect(smmuOf(sys, 1).counters().stalls).toBe(0);
  });

  test("stalls at both ends of one transfer on one userfaultfd: each node's SMMU claims its own", async () => {
    const pages = 2;
    const sys = env.system({ nodes: 2 });
    const uffd = env.uffd();
    const src = env.region(pages * P);
    const dst = env.region(pages * P);
    const data = fill(src, 0x71);
    src.evict();
    uffd.register(src);
    uffd.register(dst);
    sys.attachStallSource(uffd);
    const a = proc(sys.node(0), 100, 7, [src], 'stall');
    const b = proc(sys.node(1), 200, 7, [dst], 'stall');
    const srcLib = env.track(
      new FaultLibrary(a.socket, {
        regions: [src],
        method: 'uffd',
        resolve: (r, off, len) => uffd.copy(r, off, data.subarray(off, off + len), { wake: false }),
      }),
    );
    const dstLib = env.track(new FaultLibrary(b.socket, { regions: [dst], method: 'uffd', resolve: zeroNoWake(uffd) }));
    const c = await within('transfer', post(sys.node(0), src, dst));
    expect(c.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dst).equals(data)).toBe(true);
    expect(c.faults).toEqual({ source: pages, destination: pages });
    expect(srcLib.faults.map((f) => [f.side, f.offset])).toEqual([
      ['source', 0],
      ['source', P],
    ]);
    expect(dstLib.faults.map((f) => [f.side, f.offset])).toEqual([
      ['destination', 0],
      ['destination', P],
    ]);
    expect(smmuOf(sys, 0).counters().stalls).toBe(pages);
    expect(smmuOf(sys, 1).counters().stalls).toBe(pages);
  });
});
