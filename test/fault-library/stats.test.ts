// The fault library's counters at their edges: pages that were already resident are not
// "made resident", and a fault the library really could not resolve is counted unresolved
// (and ends the work request with an error instead of a hang).
import { afterEach, describe, expect, test } from 'vitest';
import { IommuPageResponseCode } from '../../kernel-sim/index.js';
import { SendFlags, Userfaultfd, WcStatus, WrOpcode, type ResolvedFault } from '../../lib/index.js';
import { closeAll, createPlayers, next, P, pollOk, track } from '../verbs/helpers.js';

afterEach(closeAll);

describe('pagesMadeResident', () => {
  test('counts only the pages that became resident, not those of the span that already were', async () => {
    const pages = 8;
    const { client, server } = createPlayers({ size: pages * P, policy: 'touch-ahead' });
    client.fill(0x3c, 0, pages * P);
    // Pages 0..2 resident, 3..4 evicted, 5..7 resident: one fault at page 3, whose
    // Touch-Ahead span (the rest of the transfer, pages 3..7) holds 2 missing pages.
    server.region.populate();
    server.region.evict(3 * P, 2 * P);
    expect(server.region.residentPages()).toBe(pages - 2);
    const resolved: ResolvedFault[] = [];
    server.ctx.faultLibrary.onResolve((f) => resolved.push(f));
    client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_WRITE,
      sendFlags: SendFlags.SIGNALED,
      sgList: [client.sge(0, pages * P)],
      rdma: { remoteAddr: server.mr.addr, rkey: server.mr.rkey },
    });
    const wc = await pollOk(client.cq);
    expect(wc.odp!.faults).toEqual({ source: 0, destination: 1 });
    expect(resolved).toHaveLength(1);
    expect(resolved[0]!.bytes).toBe(5 * P); // the span asked for …
    expect(resolved[0]!.pagesMadeResident).toBe(2); // … and what really changed
    const s = server.ctx.faultLibrary.stats();
    expect([s.notifications, s.resolveCalls, s.pagesMadeResident, s.unresolved]).toEqual([1, 1, 2, 0]);
    expect(server.mr.registration!.stats.snapshot().pagesMadeResident).toBe(2);
    expect(server.region.residentPages()).toBe(pages);
    expect(server.bytes(0, pages * P).every((b) => b === 0x3c)).toBe(true);
  });
});

describe('real time', () => {
  test("a fault's measured resolve time is the same number in its report and in the histogram, in µs", async () => {
    const pages = 256;
    const { client, server } = createPlayers({ size: pages * P, policy: 'touch-ahead' });
    client.fill(0x3c, 0, pages * P);
    server.region.evict();
    const resolved: ResolvedFault[] = [];
    server.ctx.faultLibrary.onResolve((f) => resolved.push(f));
    const t0 = performance.now();
    client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_WRITE,
      sendFlags: SendFlags.SIGNALED,
      sgList: [client.sge(0, pages * P)],
      rdma: { remoteAddr: server.mr.addr, rkey: server.mr.rkey },
    });
    await pollOk(client.cq);
    const wallUs = (performance.now() - t0) * 1000;
    expect(resolved).toHaveLength(1);
    // Making 256 pages resident takes well over 50 µs here (1.5 µs a page), and less than the whole write.
    expect(resolved[0]!.realUs).toBeGreaterThan(50);
    expect(resolved[0]!.realUs).toBeLessThan(wallUs);
    expect(resolved[0]!.receivedAt).toBeGreaterThanOrEqual(t0);
    const h = server.ctx.faultLibrary.stats().phases.real.resolve;
    expect(h.count).toBe(1);
    expect(h.max).toBeCloseTo(resolved[0]!.realUs, 6);
  });
});

describe('unresolved', () => {
  test('a fault the library cannot resolve (user-mode-only userfaultfd: populate gets EFAULT) is counted, and the WR ends REM_ACCESS_ERR', async () => {
    const { client, server } = createPlayers({ size: 4 * P, policy: 'touch' });
    client.fill(0x5e, 0, 4 * P);
    server.region.evict();
    // With UFFD_USER_MODE_ONLY the kernel's own access (MADV_POPULATE_WRITE, the library's
    // get_user_pages) to a missing registered page fails with EFAULT: a real failure to resolve.
    const uffd = track(Userfaultfd.open({ userModeOnly: true }));
    uffd.register(server.region);
    const resolved: ResolvedFault[] = [];
    server.ctx.faultLibrary.onResolve((f) => resolved.push(f));
    client.qp.postSend({
      wrId: 1,
      opcode: WrOpcode.RDMA_WRITE,
      sendFlags: SendFlags.SIGNALED,
      sgList: [client.sge(0, 4 * P)],
      rdma: { remoteAddr: server.mr.addr, rkey: server.mr.rkey },
    });
    const wc = await next(client.cq);
    uffd.unregister(server.region);
    expect(wc.status).toBe(WcStatus.REM_ACCESS_ERR);
    expect(wc.odp!.faults.destination).toBe(1);
    expect(resolved).toHaveLength(1);
    expect(resolved[0]!.pagesMadeResident).toBe(0);
    expect(resolved[0]!.status).toBe(IommuPageResponseCode.FAILURE);
    const s = server.ctx.faultLibrary.stats();
    expect(s.unresolved).toBe(1);
    expect([s.notifications, s.resolveCalls, s.pagesMadeResident]).toEqual([1, 0, 0]);
    expect(server.mr.registration!.stats.snapshot().unresolved).toBe(1);
    expect(server.region.residentPages()).toBe(0);
  });
});
