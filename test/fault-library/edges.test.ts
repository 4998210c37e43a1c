// The fault library's choices at their edges, seen through real faulting writes: which
// registration a fault belongs to (the newest covering one), clipping a span to it, changing
// a policy with and without new options, listeners coming and going, bad arguments, and the
// modelled length of each phase of a fault.
import { afterEach, describe, expect, test } from 'vitest';
import { SendFlags, WrOpcode, type ResolvedFault } from '../../lib/index.js';
import { closeAll, createPlayers, P, pollOk, region, thrown, type Players } from '../verbs/helpers.js';

afterEach(closeAll);

/** The client writes `pages` pages (0x6b) into the server's evicted buffer; the completion. */
async function write(p: Players, pages: number) {
  p.client.fill(0x6b, 0, pages * P);
  p.server.region.evict();
  p.client.qp.postSend({
    wrId: 1,
    opcode: WrOpcode.RDMA_WRITE,
    sendFlags: SendFlags.SIGNALED,
    sgList: [p.client.sge(0, pages * P)],
    rdma: { remoteAddr: p.server.at(0), rkey: p.server.mr.rkey },
  });
  const wc = await pollOk(p.client.cq);
  expect(p.server.bytes(0, pages * P).every((b) => b === 0x6b)).toBe(true);
  return wc;
}

describe('which registration a fault belongs to', () => {
  test('the newest registration covering the fault wins; its span is clipped to it; unregistering falls back', async () => {
    const p = createPlayers({ size: 8 * P, policy: 'touch-ahead' });
    const lib = p.server.ctx.faultLibrary;
    const resolved: ResolvedFault[] = [];
    lib.onResolve((f) => resolved.push(f));
    // Pages 0..3 one at a time, on top of the MR's Touch-Ahead for the whole buffer.
    const inner = lib.register(p.server.region, 0, 4 * P, 'touch');
    expect([inner.offset, inner.length, inner.policy]).toEqual([0, 4 * P, 'touch']);
    const wc = await write(p, 8);
    // Four single pages, then Touch-Ahead from page 4 (the rest of the transfer).
    expect(wc.odp!.faults.destination).toBe(5);
    expect(resolved.map((f) => [f.policy, f.bytes / P])).toEqual([
      ['touch', 1],
      ['touch', 1],
      ['touch', 1],
      ['touch', 1],
      ['touch-ahead', 4],
    ]);
    expect(inner.stats.snapshot().faults.destination).toBe(4);
    expect(p.server.mr.registration!.stats.snapshot().faults.destination).toBe(1);

    // A Touch-Ahead registration of pages 0..1 only: its span stops at its end.
    lib.unregister(inner);
    lib.unregister(inner); // no-op
    const head = lib.register(p.server.region, 0, 2 * P, 'touch-ahead');
    resolved.length = 0;
    const wc2 = await write(p, 8);
    expect(resolved.map((f) => [f.policy, f.bytes / P])).toEqual([
      ['touch-ahead', 2],
      ['touch-ahead', 6],
    ]);
    expect(wc2.odp!.faults.destination).toBe(2);
    expect(head.stats.snapshot().pagesMadeResident).toBe(2);

    lib.unregister(head);
    resolved.length = 0;
    expect((await write(p, 8)).odp!.faults.destination).toBe(1);
    expect(resolved.map((f) => f.bytes / P)).toEqual([8]);
  });

  test('a registration that starts inside the buffer and ends mid-page: its span runs to the end of that page', async () => {
    const p = createPlayers({ size: 8 * P, policy: 'touch' });
    const lib = p.server.ctx.faultLibrary;
    const resolved: ResolvedFault[] = [];
    lib.onResolve((f) => resolved.push(f));
    lib.register(p.server.region, 2 * P, 2 * P + 10, 'touch-ahead');
    const wc = await write(p, 8);
    // Pages 0, 1 one by one; page 2 Touch-Ahead through page 4 (where the registration ends); then one by one.
    expect(resolved.map((f) => [f.policy, f.bytes / P])).toEqual([
      ['touch', 1],
      ['touch', 1],
      ['touch-ahead', 3],
      ['touch', 1],
      ['touch', 1],
      ['touch', 1],
    ]);
    expect(wc.odp!.faults.destination).toBe(6);
  });

  test('THP memory: a fault in the second huge page makes that whole huge page resident, not the first', async () => {
    const H = 2 * 1024 * 1024;
    const p = createPlayers({ size: 2 * H, hugePages: true, policy: 'touch' });
    const resolved: ResolvedFault[] = [];
    p.server.ctx.faultLibrary.onResolve((f) => resolved.push(f));
    p.client.fill(0x6b, 0, 16 * P);
    p.server.region.evict();
    p.client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_WRITE,
      sendFlags: SendFlags.SIGNALED,
      sgList: [p.client.sge(0, 16 * P)],
      rdma: { remoteAddr: p.server.at(H + 64 * P), rkey: p.server.mr.rkey },
    });
    const wc = await pollOk(p.client.cq);
    expect(wc.odp!.faults.destination).toBe(1);
    expect(resolved.map((f) => f.bytes)).toEqual([H]);
    expect(p.server.region.residentPages(H, H)).toBe(H / P);
    expect(p.server.region.residentPages(0, H)).toBe(0);
    expect(p.server.bytes(H + 64 * P, 16 * P).every((b) => b === 0x6b)).toBe(true);
  });

  test('a registration on a closed region is skipped', async () => {
    const p = createPlayers({ size: 4 * P, policy: 'touch-ahead' });
    const lib = p.server.ctx.faultLibrary;
    const other = region(4 * P);
    lib.register(other, 0, 4 * P, 'touch');
    other.close();
    expect((await write(p, 4)).odp!.faults.destination).toBe(1);
  });
});

describe('spans in whole pages', () => {
  test('a write starting mid-page: Touch-Ahead resolves and counts whole pages, through the last one it touches', async () => {
    const p = createPlayers({ size: 8 * P, policy: 'touch-ahead' });
    const resolved: ResolvedFault[] = [];
    p.server.ctx.faultLibrary.onResolve((f) => resolved.push(f));
    p.client.fill(0x6b, 0, 2 * P);
    p.server.region.evict();
    p.client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_WRITE,
      sendFlags: SendFlags.SIGNALED,
      sgList: [p.client.sge(0, 2 * P)],
      rdma: { remoteAddr: p.server.at(100), rkey: p.server.mr.rkey },
    });
    const wc = await pollOk(p.client.cq);
    // Bytes 100 .. 2P+100 lie on pages 0, 1 and 2: one fault makes exactly those resident.
    expect(wc.odp!.faults.destination).toBe(1);
    expect(resolved.map((f) => [f.bytes, f.pagesMadeResident])).toEqual([[3 * P, 3]]);
    expect(p.server.ctx.faultLibrary.stats().pagesMadeResident).toBe(3);
    expect([...p.server.region.residency()]).toEqual([1, 1, 1, 0, 0, 0, 0, 0]);
    expect(p.server.bytes(100, 2 * P).every((b) => b === 0x6b)).toBe(true);
  });
});

describe('policies and options', () => {
  test('setPolicy without options keeps the old ones (a cap), with options replaces them', async () => {
    const p = createPlayers({ size: 16 * P, policy: 'touch-ahead' });
    const lib = p.server.ctx.faultLibrary;
    const reg = p.server.mr.registration!;
    lib.setPolicy(reg, 'touch-ahead', { cap: 4 * P });
    expect((await write(p, 16)).odp!.faults.destination).toBe(4);
    lib.setPolicy(reg, 'touch');
    lib.setPolicy(reg, 'touch-ahead');
    expect(reg.options).toEqual({ cap: 4 * P });
    expect((await write(p, 16)).odp!.faults.destination).toBe(4);
    lib.setPolicy(reg, 'touch-ahead', {});
    expect((await write(p, 16)).odp!.faults.destination).toBe(1);
  });

  test('a Touch-Ahead cap under a page still resolves one whole page; prefetch resolves its window', async () => {
    const p = createPlayers({ size: 8 * P, policy: 'touch-ahead' });
    const lib = p.server.ctx.faultLibrary;
    const reg = p.server.mr.registration!;
    lib.setPolicy(reg, 'touch-ahead', { cap: 100 });
    expect((await write(p, 4)).odp!.faults.destination).toBe(4);
    lib.setPolicy(reg, 'prefetch', { minWindowPages: 2, maxWindowPages: 2 });
    const resolved: ResolvedFault[] = [];
    lib.onResolve((f) => resolved.push(f));
    expect((await write(p, 8)).odp!.faults.destination).toBe(4);
    expect(resolved.map((f) => [f.policy, f.bytes / P])).toEqual(Array.from({ length: 4 }, () => ['prefetch', 2]));
  });

  test('bad policies and caps are refused at register and setPolicy; a closed library refuses both', () => {
    const p = createPlayers({ size: 4 * P });
    const lib = p.server.ctx.faultLibrary;
    const e = thrown(() => lib.register(p.server.region, 0, 4 * P, 'lazy' as never));
    expect(e.message).toMatch(/policy must be one of touch, touch-ahead, prefetch, pin, prefault, got lazy/);
    expect(() => lib.register(p.server.region, 0, 4 * P, 'touch-ahead', { cap: 0 })).toThrow(/cap/);
    const reg = lib.register(p.server.region, 0, 4 * P, 'touch');
    expect(() => lib.setPolicy(reg, 'touch-ahead', { cap: 1.5 })).toThrow(/cap/);
    expect(() => lib.setPolicy(reg, 'nope' as never)).toThrow(/policy must be one of/);
    expect(reg.prefetcher).toBeUndefined();
    lib.setPolicy(reg, 'prefetch', { minWindowPages: 2, maxWindowPages: 8 });
    expect([reg.prefetcher!.min, reg.prefetcher!.max]).toEqual([2, 8]);
    lib.close();
    lib.close();
    expect(lib.closed).toBe(true);
    expect(thrown(() => lib.register(p.server.region, 0, P, 'touch')).code).toBe('ERR_PFR_CLOSED');
    expect(thrown(() => lib.setPolicy(reg, 'touch')).code).toBe('ERR_PFR_CLOSED');
  });

  test('an onResolve listener stops hearing once removed; the others go on', async () => {
    const p = createPlayers({ size: 4 * P, policy: 'touch' });
    const a: number[] = [];
    const b: number[] = [];
    const offA = p.server.ctx.faultLibrary.onResolve((f) => a.push(f.block));
    p.server.ctx.faultLibrary.onResolve((f) => b.push(f.block));
    await write(p, 2);
    offA();
    await write(p, 2);
    expect(a).toEqual([0, 1]);
    expect(b).toEqual([0, 1, 0, 1]);
  });
});

describe('what a resolved fault reports', () => {
  test('a source fault: side, node, va, read, its transfer, block and channel; counted by kind', async () => {
    const p = createPlayers({ size: 4 * P, policy: 'touch' });
    p.client.fill(0x12, 0, 4 * P);
    p.server.region.populate();
    const resolved: ResolvedFault[] = [];
    p.client.ctx.faultLibrary.onResolve((f) => resolved.push(f));
    p.client.region.evict(2 * P, P);
    p.client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_WRITE,
      sendFlags: SendFlags.SIGNALED,
      sgList: [p.client.sge(0, 4 * P)],
      rdma: { remoteAddr: p.server.at(0), rkey: p.server.mr.rkey },
    });
    await pollOk(p.client.cq);
    expect(resolved).toHaveLength(1);
    expect(resolved[0]).toMatchObject({
      side: 'source',
      node: 0,
      va: p.client.at(2 * P),
      write: false,
      stall: false,
      region: p.client.region,
      policy: 'touch',
      bytes: P,
      pagesMadeResident: 1,
      srcNode: 0,
      block: 2,
    });
    expect(resolved[0]!.channel).toBe(p.client.qp.qpNum % 1024);
    expect(resolved[0]!.realUs).toBeGreaterThanOrEqual(0);
    expect(p.client.ctx.faultLibrary.stats().faults.byKind).toEqual({ 'F_TRANSLATION/read': 1 });
    // Its phases were tied to the engine's trace (by transfer, block and side): one sample each.
    const { model } = p.client.ctx.faultLibrary.stats().phases;
    expect([model.detect.count, model.notify.count, model.resolve.count, model.retransmit.count]).toEqual([1, 1, 1, 1]);
    expect(model.resolve.mean).toBeCloseTo(
      p.cluster.system.costs.wakeupUs + p.cluster.system.costs.touchPageUs + p.cluster.system.costs.requestUs,
      9,
    );
  });

  test('the modelled phases of a destination fault: each as long as the cost model says', async () => {
    const p = createPlayers({ size: 4 * P, policy: 'touch' });
    const c = p.cluster.system.costs;
    await write(p, 1);
    const { model } = p.server.ctx.faultLibrary.stats().phases;
    // Detect: the block's schedule, source walk, issue, payload and link, and the destination walk.
    expect(model.detect.mean).toBeCloseTo(c.scheduleUs + c.walkUs + c.blockUs + P / c.linkBytesPerUs + c.linkLatencyUs + c.walkUs, 9);
    // Notify: the event record, the IRQ, the driver and netlink.
    expect(model.notify.mean).toBeCloseTo(c.eventRecordUs + c.irqUs + c.driverUs + c.netlinkUs, 9);
    expect(model.resolve.mean).toBeCloseTo(c.wakeupUs + c.touchPageUs + c.requestUs, 9);
    // Retransmit: the RESOLVED answer's trip back to the source.
    expect(model.retransmit.mean).toBeCloseTo(c.linkLatencyUs, 9);
    for (const ph of ['detect', 'notify', 'resolve', 'retransmit'] as const) expect(model[ph].count).toBe(1);
  });
});
