// Nothing stays blocked and nothing crashes: failing handlers, silent handlers, and close()
// with faults in flight all end with the faulting thread released and the error reported.
import { beforeAll, describe, expect, it } from 'vitest';
import { mapRegion, touch, Userfaultfd, type PfrError } from '../lib/index.js';
import { report, requireDist, runFixture } from './child.js';
import { closer, codeOf, P, pattern, recording, sleep, until } from './helpers.js';

const own = closer();

function collectErrors(uffd: Userfaultfd): PfrError[] {
  const errors: PfrError[] = [];
  uffd.on('error', (e: PfrError) => errors.push(e));
  return errors;
}

describe('a failing handler', () => {
  it('that throws: the toucher completes on zero pages and each failure is reported', async () => {
    const N = 4;
    const boom = new Error('handler bug');
    const h = recording(() => {
      throw boom;
    });
    const region = own(mapRegion(N * P));
    const uffd = own(Userfaultfd.open({ handler: h.handler }));
    const errors = collectErrors(uffd);
    uffd.register(region);
    const res = await touch(region);
    expect(h.faults).toHaveLength(N);
    expect(res.data!.every((b) => b === 0)).toBe(true);
    expect(errors).toHaveLength(N);
    expect(errors.every((e) => e.code === 'ERR_PFR_HANDLER_FAILED' && e.cause === boom)).toBe(true);
    expect(uffd.stats()).toMatchObject({ handlerErrors: N, handled: 0, timeouts: 0 });
  });

  it('that rejects: the same, reported once the promise rejects', async () => {
    const N = 3;
    const h = recording(async () => {
      await sleep(1);
      throw new RangeError('async handler bug');
    });
    const region = own(mapRegion(N * P));
    const uffd = own(Userfaultfd.open({ handler: h.handler }));
    const errors = collectErrors(uffd);
    uffd.register(region);
    const res = await touch(region);
    expect(res.data!.every((b) => b === 0)).toBe(true);
    await until('all handler errors', () => errors.length === N);
    expect(errors.map((e) => e.code)).toEqual(Array(N).fill('ERR_PFR_HANDLER_FAILED'));
    expect((errors[0]!.cause as Error).message).toBe('async handler bug');
    expect(uffd.stats().handlerErrors).toBe(N);
  });

  it('that never answers: the watchdog resolves each fault after timeoutMs and reports a timeout', async () => {
    const N = 2;
    const h = recording(() => {});
    const region = own(mapRegion(N * P));
    const uffd = own(Userfaultfd.open({ handler: h.handler, timeoutMs: 200 }));
    const errors = collectErrors(uffd);
    uffd.register(region);
    const res = await touch(region);
    expect(h.faults).toHaveLength(N);
    expect(res.data!.every((b) => b === 0)).toBe(true);
    await until('both timeout reports', () => errors.length === N);
    expect(errors.map((e) => e.code)).toEqual(['ERR_PFR_HANDLER_TIMEOUT', 'ERR_PFR_HANDLER_TIMEOUT']);
    expect(errors.map((e) => (e as PfrError & { offset: number }).offset)).toEqual([0, P]);
    expect(uffd.stats()).toMatchObject({ timeouts: N, handlerTimeouts: N });
    expect(uffd.pending).toBe(0);
  });

  it('that never answers a write-protect fault: the watchdog unprotects, the write lands', async () => {
    const region = own(mapRegion(2 * P));
    new Uint8Array(region.buffer).fill(4);
    const h = recording(() => {});
    const uffd = own(Userfaultfd.open({ handler: h.handler, timeoutMs: 200 }));
    const errors = collectErrors(uffd);
    uffd.register(region, { missing: false, writeProtect: true });
    uffd.writeProtect(region, 0, 2 * P, true);
    await touch(region, { access: 'write', probe: true, fill: 9 });
    // One fault per page: a zero page would not have ended a write-protect fault.
    expect(h.faults.map((f) => f.kind)).toEqual(['write-protect', 'write-protect']);
    const view = new Uint8Array(region.buffer);
    expect([view[0], view[1], view[P], view[P + 1]]).toEqual([9, 4, 9, 4]);
    await until('both timeout reports', () => errors.length === 2);
    expect(uffd.stats().timeouts).toBe(2);
  });

  // The guard sleeps with no timeout once idle; when the JS thread reads the fault before the
  // guard's poll() sees it, only the fault being made outstanding can wake the guard to arm
  // the watchdog. Without that, about 1 in 4 of these hung forever on this machine kind.
  it('that never answers, after the guard fell asleep: the watchdog still fires, every time', async () => {
    for (let round = 0; round < 20; round++) {
      const region = mapRegion(P);
      new Uint8Array(region.buffer).fill(4);
      const uffd = Userfaultfd.open({ handler: () => {}, timeoutMs: 40 });
      const errors = collectErrors(uffd);
      try {
        uffd.register(region, { missing: false, writeProtect: true });
        uffd.writeProtect(region, 0, P, true);
        await sleep(70); // five quiet 10 ms ticks: the guard sleeps
        const done = touch(region, { access: 'write', probe: true, fill: 9 }).then(() => 'done');
        const outcome = await Promise.race([done, sleep(3000).then(() => 'hung')]);
        expect(`round ${round}: ${outcome}`).toBe(`round ${round}: done`);
        expect(new Uint8Array(region.buffer)[0]).toBe(9);
        await until('the timeout report', () => errors.length === 1);
        expect(errors.map((e) => e.code)).toEqual(['ERR_PFR_HANDLER_TIMEOUT']);
      } finally {
        uffd.close(); // releases a hung toucher too, so a failure does not leak a thread
        region.close();
      }
    }
  });

  it('that never answers a minor fault: the watchdog continues, the page cache data is read', async () => {
    const region = own(mapRegion(2 * P, { shared: true }));
    new Uint8Array(region.buffer).set(pattern(2, 0x30));
    region.unmapPages();
    const h = recording(() => {});
    const uffd = own(Userfaultfd.open({ handler: h.handler, timeoutMs: 200 }));
    const errors = collectErrors(uffd);
    uffd.register(region, { minor: true, missing: false });
    const res = await touch(region);
    expect(h.faults.map((f) => f.kind)).toEqual(['minor', 'minor']);
    expect(res.data!.equals(pattern(2, 0x30))).toBe(true);
    await until('both timeout reports', () => errors.length === 2);
  });

  it('with no handler at all, faults are resolved with the default (zero page) at once', async () => {
    const region = own(mapRegion(4 * P));
    const uffd = own(Userfaultfd.open());
    uffd.register(region);
    const res = await touch(region);
    expect(res.data!.every((b) => b === 0)).toBe(true);
    expect(uffd.stats()).toMatchObject({ forwarded: 4, timeouts: 0 });
  });
});

describe('close() with faults in flight', () => {
  it('Userfaultfd.close(): the blocked toucher is released, later use throws ERR_PFR_CLOSED', async () => {
    const N = 4;
    const h = recording(() => {}); // holds every fault
    const region = own(mapRegion(N * P));
    const uffd = Userfaultfd.open({ handler: h.handler });
    uffd.register(region);
    const toucher = touch(region);
    const fault = await h.first;
    expect(uffd.pending).toBe(1);

    uffd.close();
    const res = await toucher;
    expect(res.pages).toBe(N);
    expect(res.data!.every((b) => b === 0)).toBe(true);
    expect(h.faults).toHaveLength(1); // the rest were no longer registered: ordinary faults
    expect(uffd.closed).toBe(true);
    uffd.close(); // idempotent
    // A late answer from the handler, and every other use, gets a clear error.
    expect(codeOf(() => uffd.copy(region, fault.offset, Buffer.alloc(P)))).toBe('ERR_PFR_CLOSED');
    expect(codeOf(() => uffd.zeropage(region, 0, P))).toBe('ERR_PFR_CLOSED');
    expect(codeOf(() => uffd.register(region))).toBe('ERR_PFR_CLOSED');
    expect(codeOf(() => uffd.unregister(region))).toBe('ERR_PFR_CLOSED');
    expect(codeOf(() => uffd.onFault(() => {}))).toBe('ERR_PFR_CLOSED');
    expect(codeOf(() => uffd.stats())).toBe('ERR_PFR_CLOSED');
    expect(codeOf(() => uffd.pending)).toBe('ERR_PFR_CLOSED');
    // The region outlives the uffd and is an ordinary mapping again.
    new Uint8Array(region.buffer)[5] = 1;
    expect(region.residentPages()).toBe(N);
  });

  it('Region.close(): the toucher is released, the buffer is detached, the uffd keeps working', async () => {
    const h = recording(async (f, u) => {
      await sleep(20);
      u.copy(f.region, f.offset, Buffer.alloc(P, 1));
    });
    const region = mapRegion(4 * P);
    const uffd = own(Userfaultfd.open({ handler: h.handler }));
    const errors = collectErrors(uffd);
    uffd.register(region);
    const buffer = region.buffer;
    const toucher = touch(region);
    await h.first;

    region.close();
    expect(buffer.byteLength).toBe(0);
    expect(uffd.isRegistered(region)).toBe(false);
    const res = await toucher; // unregistering woke it; it kept the memory mapped until done
    expect(res.pages).toBe(4);
    expect(res.data!.every((b) => b === 0)).toBe(true);
    expect(codeOf(() => region.buffer)).toBe('ERR_PFR_CLOSED');
    await expect(touch(region)).rejects.toMatchObject({ code: 'ERR_PFR_CLOSED' });
    // The handler's late copy into the closed region is reported, not thrown into the void.
    await until('the late copy report', () => errors.length === 1);
    expect(errors[0]!.code).toBe('ERR_PFR_HANDLER_FAILED');
    expect((errors[0]!.cause as PfrError).code).toBe('ERR_PFR_CLOSED');

    const other = own(mapRegion(2 * P));
    uffd.register(other);
    const again = await touch(other);
    expect(again.data!.every((b) => b === 1)).toBe(true);
  });

  it('unregister() releases a blocked thread without waiting for the watchdog', async () => {
    const h = recording(() => {});
    const region = own(mapRegion(2 * P));
    const uffd = own(Userfaultfd.open({ handler: h.handler }));
    uffd.register(region);
    const toucher = touch(region);
    await h.first;
    uffd.unregister(region);
    const res = await toucher;
    expect(res.data!.every((b) => b === 0)).toBe(true);
    expect(uffd.stats().timeouts).toBe(0);
    expect(uffd.pending).toBe(0);
  });

  it('[Symbol.dispose] closes the uffd', () => {
    const uffd = Userfaultfd.open();
    uffd[Symbol.dispose]();
    expect(uffd.closed).toBe(true);
  });
});

describe('process end with a fault in flight (child processes)', () => {
  beforeAll(requireDist);

  it('process.exit() from the handler while the toucher is blocked exits at once', async () => {
    const r = await runFixture('in-flight.mjs', ['exit']);
    expect(r.signal).toBeNull();
    expect(r.code).toBe(7);
  });

  it('a script that ends with a fault unanswered finishes once the watchdog resolves it', async () => {
    const r = await runFixture('in-flight.mjs', ['return']);
    expect(r.code, r.stderr).toBe(0);
    expect(report(r)).toEqual({ pages: 2, zeros: true, timeouts: 2 });
  });
});
