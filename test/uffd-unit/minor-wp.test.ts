// Port of "minor-wp": CONTINUE with UFFDIO_CONTINUE_MODE_WP maps the page write-protected,
// so the write that follows is a write-protect fault.
import { describe, expect, it } from 'vitest';
import { touch } from '../../lib/index.js';
import { closer, codeOf, P, pattern, recording } from '../helpers.js';
import { open, pagesOf, region, SHMEM } from './matrix.js';

const own = closer();

describe.each(SHMEM)('minor-wp ($delivery delivery, $memory)', ({ delivery }) => {
  it('continue({ writeProtect: true }) protects every page: 256 writes give 256 write-protect faults', async () => {
    const N = 256;
    const uffd = own(open(delivery));
    const r = own(region(N, true));
    const view = own(r.alias());
    Buffer.from(view.buffer).set(pattern(N, 1));
    uffd.register(r, { missing: false, minor: true, writeProtect: true });
    expect(uffd.continue(r, 0, N * P, { writeProtect: true })).toBe(N * P);

    const h = recording((f, u) => u.writeProtect(f.region, f.offset, P, false));
    uffd.onFault(h.handler);
    await touch(r, { access: 'write', probe: true, fill: 0xee });
    expect(pagesOf(h.faults, 'write-protect')).toEqual([...Array(N).keys()]);
    expect(new Uint8Array(view.buffer)[(N - 1) * P]).toBe(0xee); // the write went through to the cache
  });

  it('a minor fault resolved write-protected, then the write: minor then write-protect, per page', async () => {
    const N = 8;
    const h = recording((f, u) => {
      if (f.kind === 'minor') u.continue(f.region, f.offset, P, { writeProtect: true });
      else u.writeProtect(f.region, f.offset, P, false);
    });
    const uffd = own(open(delivery, h.handler));
    const r = own(region(N, true));
    const view = own(r.alias());
    Buffer.from(view.buffer).set(pattern(N, 1));
    uffd.register(r, { missing: false, minor: true, writeProtect: true });
    await touch(r, { access: 'write', fill: 0x31 });
    expect(pagesOf(h.faults, 'minor')).toEqual([...Array(N).keys()]);
    expect(pagesOf(h.faults, 'write-protect')).toEqual([...Array(N).keys()]);
    expect(Buffer.from(view.buffer).every((b) => b === 0x31)).toBe(true);
  });

  it('continue({ writeProtect: true }) on a range not registered for write-protect is refused, not ignored', () => {
    const uffd = own(open(delivery));
    const r = own(region(2, true));
    uffd.register(r, { missing: false, minor: true });
    expect(codeOf(() => uffd.continue(r, 0, P, { writeProtect: true }))).toBe('ERR_PFR_NOT_REGISTERED');
  });
});
