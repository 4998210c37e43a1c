// Fault statistics travel with the fault: the notice brings issue, detection and
// notification times, the kernel's ACK of the answer brings the modelled resolve and, once
// the block went out again, the retransmission. No fault library listens to the system's
// tracer for them (the tracer is for observation only).
import { expect, test } from 'vitest';
import { DmaStatus, NlCmd } from '../../kernel-sim/index.js';
import { FaultLibrary, PAGE_SIZE as P } from '../../lib/index.js';
import { twoNode } from '../fixtures/two-node.js';
import { useEnv } from '../kernel-sim/helpers.js';

const env = useEnv();

/** `pages` of a filled source on node 0 written into as many untouched pages on node 1, whose fault library answers by touch. */
function rig(pages: number, trace: boolean) {
  const { sys, src, dst, b } = twoNode(env, { pages, fill: 9 });
  const lib = env.track(new FaultLibrary({ system: sys, node: 1, pid: 200, socket: b.socket, defaultPolicy: 'touch', trace }));
  return { src, dst, sys, lib };
}

test('a fault library without a trace counts every phase of every fault, and nobody listens to the tracer', async () => {
  const { src, dst, sys, lib } = rig(4, false);
  expect(sys.tracer.active).toBe(false);
  const c = await sys.node(0).post({ channel: 0, srcVa: src.address, dstNode: 1, dstVa: dst.address, length: 4 * P, pd: 7 });
  expect(c.status).toBe(DmaStatus.SUCCESS);
  expect(c.faults).toEqual({ source: 0, destination: 4 });
  await new Promise((r) => setImmediate(r));
  const s = lib.stats();
  expect(s.retransmittedBlocks).toBe(4);
  for (const phase of ['detect', 'notify', 'resolve', 'retransmit'] as const) {
    expect(s.phases.model[phase].count).toBe(4);
    expect(s.phases.real[phase].count).toBe(4);
  }
  // The modelled phases are the cost model's: the same for every page.
  expect(s.phases.model.notify.min).toBeCloseTo(s.phases.model.notify.max, 9);
  expect(s.phases.model.resolve.min).toBeCloseTo(s.phases.model.resolve.max, 9);
  expect(sys.tracer.active).toBe(false);
});

test('the measured phases are the time that really passed: 5 ms held on the wire, at the fault notice, after the answer', async () => {
  const HOLD_MS = 5;
  const hold = () => {
    const until = performance.now() + HOLD_MS;
    while (performance.now() < until);
  };
  const { src, dst, sys, lib } = rig(2, true);
  // Each write is held on the wire after it was issued, before the destination sees it; each
  // fault notice after it was stamped sent, before the library has it; each answer after the
  // library resolved, before the kernel has it (so before the block goes out again).
  const deliver = sys.fabric.deliver.bind(sys.fabric);
  sys.fabric.deliver = (p) => {
    if (p.type === 'write') hold();
    deliver(p);
  };
  const stop = sys.node(1).netlink.monitor((m, to) => {
    if ((to === 200 && m.cmd === NlCmd.FAULT) || (to === undefined && m.cmd === NlCmd.RESOLVED)) hold();
  });
  const c = await sys.node(0).post({ channel: 0, srcVa: src.address, dstNode: 1, dstVa: dst.address, length: 2 * P, pd: 7 });
  stop();
  expect(c.status).toBe(DmaStatus.SUCCESS);
  expect(c.faults).toEqual({ source: 0, destination: 2 });
  const { real } = lib.stats().phases;
  expect([real.detect.count, real.notify.count, real.retransmit.count]).toEqual([2, 2, 2]);
  // In µs: at least the hold, and less than the whole transfer took.
  for (const phase of [real.detect, real.notify, real.retransmit]) expect(phase.min).toBeGreaterThanOrEqual(HOLD_MS * 1000);
  expect(real.detect.max + real.notify.max + real.retransmit.max).toBeLessThan(c.real.us);
});
