// Port of the copy paths of uffd-unit-tests.c and uffd-common.c (copy_page, and its retry
// that expects EEXIST): UFFDIO_COPY places the bytes, says how many it placed, and a
// write-protected copy followed at once by a write is never a lost fault.
import { describe, expect, it } from 'vitest';
import { touch } from '../../lib/index.js';
import { closer, P, pattern, recording, until } from '../helpers.js';
import { BOTH, DELIVERIES, open, pagesOf, region } from './matrix.js';

const own = closer();

describe.each(BOTH)('copy and retry ($delivery delivery, $memory)', ({ delivery, shared }) => {
  it('each fault resolved by a copy; the retry of the same copy finds the page there and places 0 bytes', async () => {
    const N = 32;
    const data = pattern(N, 3);
    const retries: number[] = [];
    const h = recording((f, u) => {
      const page = data.subarray(f.offset, f.offset + P);
      expect(u.copy(f.region, f.offset, page)).toBe(P);
      retries.push(u.copy(f.region, f.offset, page)); // test_uffdio_copy_eexist: the retry must see EEXIST
    });
    const uffd = own(open(delivery, h.handler));
    const r = own(region(N, shared));
    uffd.register(r);
    const res = await touch(r);
    expect(pagesOf(h.faults)).toEqual([...Array(N).keys()]);
    expect(retries).toEqual(Array(N).fill(0));
    expect(res.data!.equals(data)).toBe(true);
    expect(uffd.stats()).toMatchObject({ forwarded: N, timeouts: 0, handlerErrors: 0 });
  });

  it('bytes placed, not bytes asked for: one page present of three gives 8192', () => {
    const uffd = own(open(delivery));
    const r = own(region(3, shared));
    uffd.register(r);
    const data = pattern(3, 9);
    expect(uffd.copy(r, P, data.subarray(P, 2 * P))).toBe(P);
    expect(uffd.copy(r, P, data.subarray(P, 2 * P))).toBe(0);
    expect(uffd.copy(r, 0, data)).toBe(2 * P);
    expect(Buffer.from(r.buffer).equals(data)).toBe(true);
  });
});

describe.each(DELIVERIES)('copy with write-protect, then the write at once (%s delivery)', (delivery) => {
  it('a native toucher writing 4096 pages finishes: every WP fault that follows a WP copy reaches the handler', async () => {
    const N = 4096;
    let missing = 0,
      wp = 0;
    const uffd = own(
      open(delivery, (f, u) => {
        if (f.kind === 'write-protect') {
          wp++;
          u.writeProtect(f.region, f.offset, P, false);
        } else {
          missing++;
          u.copy(f.region, f.offset, Buffer.alloc(P, 0x11), { writeProtect: true });
        }
      }),
    );
    const r = own(region(N, false));
    uffd.register(r, { writeProtect: true });
    const res = await Promise.race([
      touch(r, { access: 'write', probe: true, fill: 0x5a }),
      new Promise<never>((_, reject) =>
        setTimeout(() => reject(new Error(`toucher stuck: pending ${uffd.pending}, ${JSON.stringify(uffd.stats())}`)), 20_000).unref(),
      ),
    ]);
    expect(res.pages).toBe(N);
    expect(missing).toBe(N);
    expect(wp).toBe(N);
    const bytes = new Uint8Array(r.buffer);
    for (let i = 0; i < N; i++) {
      expect(bytes[i * P]).toBe(0x5a);
      expect(bytes[i * P + 1]).toBe(0x11);
    }
    expect(uffd.stats()).toMatchObject({ duplicates: 0, timeouts: 0 });
    expect(uffd.pending).toBe(0);
  });
});

describe.each(DELIVERIES)('the native default resolution racing another one (%s delivery)', (delivery) => {
  it('a copy without wake leaves the fault tracked; the watchdog default meets EEXIST, counts it as success and wakes the thread onto the copied bytes', async () => {
    const errors: { code: string }[] = [];
    const uffd = own(open(delivery, (f, u) => void u.copy(f.region, f.offset, Buffer.alloc(P, 0x3c), { wake: false })));
    uffd.on('error', (e) => errors.push(e));
    uffd.setTimeout(100);
    const r = own(region(1, false));
    uffd.register(r);
    const res = await touch(r);
    expect(res.data!.every((b) => b === 0x3c)).toBe(true); // not the zero page of the default
    expect(uffd.stats()).toMatchObject({ forwarded: 1, timeouts: 1 });
    await until('the timeout report', () => errors.length > 0); // it may arrive after the woken thread's walk ends
    expect(errors.map((e) => e.code)).toEqual(['ERR_PFR_HANDLER_TIMEOUT']);
    expect(uffd.pending).toBe(0);
  });
});
