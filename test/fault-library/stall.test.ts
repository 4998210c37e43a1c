// The fault library with stall-mode memory: the engine's copy thread is blocked in a genuine
// userfaultfd fault, the library places the pages without waking it (UFFDIO_ZEROPAGE) and
// CMD_RESUME replays the access; without a userfaultfd it cannot, and says so.
import { describe, expect, test } from 'vitest';
import { DEFAULT_COSTS, DmaStatus } from '../../kernel-sim/index.js';
import { FaultLibrary, type ResolvedFault } from '../../lib/index.js';
import { bytesOf, P, post, stallRig, useEnv, within } from '../kernel-sim/helpers.js';

const env = useEnv();

describe('stalled faults', () => {
  test('resolved with UFFDIO_ZEROPAGE and resumed: right bytes, counted as stalled writes', async () => {
    const pages = 3;
    const { sys, uffd, src, dst, data, b } = stallRig(env, pages);
    const lib = env.track(new FaultLibrary({ system: sys, node: 1, pid: b.pid, socket: b.socket, uffd, defaultPolicy: 'touch' }));
    const resolved: ResolvedFault[] = [];
    lib.onResolve((f) => resolved.push(f));
    const c = await within('stalled transfer', post(sys.node(0), src, dst));
    uffd.unregister(dst);
    expect(c.status).toBe(DmaStatus.SUCCESS);
    expect(c.faults).toEqual({ source: 0, destination: pages });
    expect(bytesOf(dst).equals(data)).toBe(true);
    expect(resolved.map((f) => [f.stall, f.side, f.write, f.bytes, f.pagesMadeResident])).toEqual(
      Array.from({ length: pages }, () => [true, 'destination', true, P, 1]),
    );
    const s = lib.stats();
    expect(s.faults.byKind).toEqual({ 'F_TRANSLATION/write/stall': pages });
    expect([s.notifications, s.resolveCalls, s.pagesMadeResident, s.unresolved]).toEqual([pages, pages, pages, 0]);
    // Answered with METHOD uffd: modelled as a gup-like call for one page, between the
    // library's wake-up and the response it sends.
    const c0 = DEFAULT_COSTS;
    const resolve = s.phases.model.resolve;
    expect(resolve.count).toBe(pages);
    expect(resolve.min).toBeCloseTo(c0.wakeupUs + c0.gupCallUs + c0.gupPageUs + c0.requestUs, 9);
    expect(resolve.max).toBeCloseTo(resolve.min, 9);
  });

  test('without a userfaultfd the library cannot place the page: FAILURE, counted unresolved, the access aborted', async () => {
    const { sys, uffd, src, dst, b } = stallRig(env, 1);
    const lib = env.track(new FaultLibrary({ system: sys, node: 1, pid: b.pid, socket: b.socket, trace: false }));
    const c = await within('stalled transfer', post(sys.node(0), src, dst));
    uffd.unregister(dst);
    expect(c.status).toBe(DmaStatus.ABORTED);
    expect(lib.stats()).toMatchObject({ notifications: 1, resolveCalls: 0, pagesMadeResident: 0, unresolved: 1 });
    // Asked for no trace: it kept none.
    expect(lib.trace.events).toHaveLength(0);
  });
});
