// The calibrated cost model against the published PART figures (NOCS'20 / TPDS'22): a
// one-page transfer with a minor fault at the destination ≈ 38 µs, and a 1 MB transfer
// whose every page faults, resolved by Touch-Ahead on the first fault, ≈ 2.6× the
// fault-free one. Modelled time depends only on what happened (faults, pages, methods),
// never on how long the real software path took; the real time is reported beside it.
import { describe, expect, test } from 'vitest';
import { DEFAULT_COSTS, DmaStatus, MODEL_LABEL, type DmaCompletion, type ResolveMethod } from '../../kernel-sim/index.js';
import { bytesOf, FaultLibrary, fill, P, post, proc, sleep, useEnv, within, type Policy } from './helpers.js';

const env = useEnv();

interface Run {
  c: DmaCompletion;
  notes: number;
}

/** One transfer of `pages` pages into a destination that is resident or not at all. */
async function run(pages: number, o: { fault: boolean; policy?: Policy; method?: ResolveMethod; holdMs?: number; length?: number }): Promise<Run> {
  const sys = env.system({ nodes: 2 });
  const src = env.region(pages * P);
  const dst = env.region(pages * P);
  const data = fill(src, 7);
  if (!o.fault) dst.populate();
  proc(sys.node(0), 100, 7, [src]);
  const b = proc(sys.node(1), 200, 7, [dst]);
  const opts: ConstructorParameters<typeof FaultLibrary>[1] = { regions: [dst], policy: o.policy ?? 'touch' };
  if (o.method) opts.method = o.method;
  if (o.holdMs) opts.hold = () => sleep(o.holdMs!);
  const lib = env.track(new FaultLibrary(b.socket, opts));
  const length = o.length ?? pages * P;
  const c = await within('transfer', post(sys.node(0), src, dst, { length }), 20_000);
  expect(c.status).toBe(DmaStatus.SUCCESS);
  expect(bytesOf(dst, 0, length).equals(data.subarray(0, length))).toBe(true);
  return { c, notes: lib.faults.length };
}

const within10 = (value: number, target: number) => {
  expect(value).toBeGreaterThanOrEqual(target * 0.9);
  expect(value).toBeLessThanOrEqual(target * 1.1);
};

describe('calibration (modelled time)', () => {
  test('one page with a minor fault at the destination, touch one page: 38 µs ± 10%', async () => {
    const faulting = await run(1, { fault: true, policy: 'touch', method: 'touch' });
    const clean = await run(1, { fault: false });
    expect(faulting.c.faults).toEqual({ source: 0, destination: 1 });
    expect(faulting.notes).toBe(1);
    within10(faulting.c.model.us, 38);
    expect(clean.c.faults.destination).toBe(0);
    expect(clean.c.model.us).toBeLessThan(faulting.c.model.us / 5);
    expect(faulting.c.model.label).toBe(MODEL_LABEL);
    // Both are reported: the modelled hardware time and the measured software time.
    expect(faulting.c.real.us).toBeGreaterThan(0);
    expect(faulting.c.real.faultUs).toHaveLength(1);
    console.log(
      `[calibration] 1 page, destination minor fault: model ${faulting.c.model.us.toFixed(2)} µs (target 38), fault-free ${clean.c.model.us.toFixed(2)} µs; ` +
        `real ${faulting.c.real.us.toFixed(0)} µs, fault path ${faulting.c.real.faultUs[0]!.toFixed(0)} µs`,
    );
  });

  test('1 MB, every destination page faulting, Touch-Ahead (gup) on the first fault: 2.6× fault-free ± 10%', async () => {
    const pages = 256;
    const clean = await run(pages, { fault: false });
    const ahead = await run(pages, { fault: true, policy: 'ahead', method: 'gup' });
    const touch = await run(pages, { fault: true, policy: 'touch', method: 'touch' });
    expect(clean.c.faults.destination).toBe(0);
    expect(ahead.c.faults.destination).toBe(1);
    expect(ahead.c.retransmittedBlocks).toBe(1);
    expect(touch.c.faults.destination).toBe(pages);
    const ratio = ahead.c.model.us / clean.c.model.us;
    within10(ratio, 2.6);
    // Touch-Ahead is what makes it cheap: one page per fault is far worse.
    const touchRatio = touch.c.model.us / clean.c.model.us;
    expect(touchRatio).toBeGreaterThan(2 * ratio);
    console.log(
      `[calibration] 1 MB: fault-free ${clean.c.model.us.toFixed(1)} µs, touch-ahead ${ahead.c.model.us.toFixed(1)} µs (×${ratio.toFixed(3)}, target 2.6), ` +
        `touch per page ${touch.c.model.us.toFixed(1)} µs (×${touchRatio.toFixed(2)}); real ${clean.c.real.us.toFixed(0)} / ${ahead.c.real.us.toFixed(0)} / ${touch.c.real.us.toFixed(0)} µs`,
    );
  });

  test('a fault-free 64-byte transfer: under 1 µs one way (the ExaNeSt inter-node latency)', async () => {
    const r = await run(1, { fault: false, length: 64 });
    // The completion waits for the ACK's trip back; the one-way latency leaves it out.
    const oneWay = r.c.model.us - DEFAULT_COSTS.linkLatencyUs;
    expect(oneWay).toBeGreaterThan(0);
    expect(oneWay).toBeLessThan(1);
    console.log(`[calibration] 64 B fault-free: completion ${r.c.model.us.toFixed(3)} µs, one way ${oneWay.toFixed(3)} µs`);
  });

  test('4 MB pinned for the transfer (pin + unpin every page) vs the same transfer on resident memory: 1.46× ± 10%', async () => {
    const pages = 1024;
    const r = await run(pages, { fault: false });
    expect(r.c.faults).toEqual({ source: 0, destination: 0 });
    const pinned = r.c.model.us + pages * DEFAULT_COSTS.pinPageUs;
    within10(pinned / r.c.model.us, 1.46);
    console.log(
      `[calibration] 4 MB: resident ${r.c.model.us.toFixed(1)} µs, pinned ${pinned.toFixed(1)} µs (×${(pinned / r.c.model.us).toFixed(3)}, target 1.46)`,
    );
  });
});

describe('modelled time is a model', () => {
  test('the same transfer models to the same time, however slow the real fault path is', async () => {
    const quick = await run(4, { fault: true });
    const slow = await run(4, { fault: true, holdMs: 40 });
    expect(slow.c.model.us).toBeCloseTo(quick.c.model.us, 9);
    expect(slow.c.real.us - quick.c.real.us).toBeGreaterThan(4 * 30_000);
    expect(Math.min(...slow.c.real.faultUs)).toBeGreaterThan(30_000);
  });

  test('each fault adds the fault path of the cost model; the method prices the resolution', async () => {
    const c = DEFAULT_COSTS;
    const clean = await run(1, { fault: false });
    const touch = await run(1, { fault: true, method: 'touch' });
    const gup = await run(1, { fault: true, method: 'gup' });
    // Resolving one page by touch vs by get_user_pages differs by exactly their costs.
    expect(gup.c.model.us - touch.c.model.us).toBeCloseTo(c.gupCallUs + c.gupPageUs - c.touchPageUs, 9);
    // The fault path costs at least the record, IRQ, driver, netlink, wake-up and request.
    expect(touch.c.model.us - clean.c.model.us).toBeGreaterThan(c.eventRecordUs + c.irqUs + c.driverUs + c.netlinkUs + c.wakeupUs + c.requestUs);
  });

  test('costs are parameters: doubling the netlink delivery cost adds it once per fault', async () => {
    const pages = 4;
    const base = await run(pages, { fault: true });
    const sys = env.system({ nodes: 2, costs: { netlinkUs: DEFAULT_COSTS.netlinkUs * 2 } });
    const src = env.region(pages * P);
    const dst = env.region(pages * P);
    fill(src);
    proc(sys.node(0), 100, 7, [src]);
    const b = proc(sys.node(1), 200, 7, [dst]);
    env.track(new FaultLibrary(b.socket, { regions: [dst] }));
    const c = await within('transfer', post(sys.node(0), src, dst));
    expect(c.faults.destination).toBe(pages);
    expect(c.model.us - base.c.model.us).toBeCloseTo(pages * DEFAULT_COSTS.netlinkUs, 6);
  });
});
