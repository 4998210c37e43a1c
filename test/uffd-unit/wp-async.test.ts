// UFFD_FEATURE_WP_ASYNC with the PAGEMAP_SCAN ioctl (Linux 6.7; the kernel's pagemap_ioctl
// selftest): the kernel resolves write-protect faults itself, with no event, and a scan
// reports the pages written since they were last protected, re-protecting them.
import { describe, expect, it } from 'vitest';
import { mapRegion, PageCategory, touch, UffdFeature } from '../../lib/index.js';
import { closer, codeOf, P } from '../helpers.js';
import { BOTH, open, region } from './matrix.js';

const own = closer();

describe.each(BOTH)('wp-async dirty tracking ($delivery delivery, $memory)', ({ delivery, shared }) => {
  it('writes of native threads and of the JS thread are dirty pages; no fault event; a scan re-arms', async () => {
    const N = 64;
    const uffd = own(open(delivery, undefined, { features: UffdFeature.WP_ASYNC }));
    let faults = 0;
    uffd.on('fault', () => faults++);
    expect(uffd.features.writeProtectAsync).toBe(true);
    const r = own(region(N, shared));
    r.populate();
    uffd.register(r, { missing: false, writeProtect: true });
    uffd.writeProtect(r, 0, N * P, true);
    expect(uffd.dirtyPages(r)).toEqual([]);

    for (const page of [3, 7, 9]) await touch(r, { offset: page * P, length: P, access: 'write', probe: true, fill: page });
    new Uint8Array(r.buffer)[40 * P + 5] = 1; // the JS thread's own write
    expect(uffd.dirtyPages(r)).toEqual([3, 7, 9, 40].map((p) => p * P));
    expect(uffd.dirtyPages(r)).toEqual([]); // re-armed by the scan

    await touch(r, { offset: 7 * P, length: P, access: 'write', probe: true });
    expect(uffd.dirtyPages(r, { rearm: false })).toEqual([7 * P]);
    expect(uffd.dirtyPages(r, { offset: 8 * P, length: 8 * P })).toEqual([]);
    expect(uffd.dirtyPages(r)).toEqual([7 * P]);
    expect(faults).toBe(0);
    expect(new Uint8Array(r.buffer)[9 * P]).toBe(9);
  });

  it('pagemapScan lists present pages and written pages by category', async () => {
    const uffd = own(open(delivery, undefined, { features: UffdFeature.WP_ASYNC }));
    const r = own(region(8, shared));
    uffd.register(r, { missing: false, writeProtect: true });
    r.populate(2 * P, 4 * P);
    expect(r.pagemapScan({ all: PageCategory.PRESENT }).map((x) => [x.offset, x.length])).toEqual([[2 * P, 4 * P]]);
    uffd.writeProtect(r, 0, 8 * P, true);
    await touch(r, { offset: 4 * P, length: P, access: 'write', probe: true });
    expect(r.pagemapScan({ all: PageCategory.WRITTEN | PageCategory.PRESENT }).map((x) => x.offset)).toEqual([4 * P]);
  });
});

describe('wp-async: refused where it cannot work', () => {
  it('dirtyPages without WP_ASYNC, or on a range not registered for write-protect', () => {
    const plain = own(open('event-loop'));
    const r = own(mapRegion(4 * P));
    plain.register(r, { writeProtect: true });
    expect(codeOf(() => plain.dirtyPages(r))).toBe('ERR_PFR_UNSUPPORTED');
    const async = own(open('event-loop', undefined, { features: UffdFeature.WP_ASYNC }));
    const s = own(mapRegion(4 * P));
    async.register(s);
    expect(codeOf(() => async.dirtyPages(s))).toBe('ERR_PFR_NOT_REGISTERED');
    expect(codeOf(() => s.pagemapScan({ writeProtect: true }))).toBe('ERR_INVALID_ARG_VALUE');
  });
});
