// Port of "wp-unpopulated": with UFFD_FEATURE_WP_UNPOPULATED, write-protecting pages that
// were never touched protects them anyway: the first write is a write-protect fault (not a
// missing one), and reads see zeros without any fault.
import { describe, expect, it } from 'vitest';
import { touch } from '../../lib/index.js';
import { closer, P, recording } from '../helpers.js';
import { ANON, open, pagesOf, region } from './matrix.js';

const own = closer();

describe.each(ANON)('wp-unpopulated ($delivery delivery)', ({ delivery }) => {
  it('writes to protected never-touched pages are write-protect faults; reads fault nothing', async () => {
    const N = 16;
    const h = recording((f, u) => u.writeProtect(f.region, f.offset, P, false));
    const uffd = own(open(delivery, h.handler));
    expect(uffd.features.writeProtectUnpopulated).toBe(true);
    const r = own(region(N, false));
    uffd.register(r, { missing: false, writeProtect: true });
    uffd.writeProtect(r, 0, N * P, true);

    const read = await touch(r, { probe: true });
    expect(read.checksum).toBe(0);
    expect(h.faults).toHaveLength(0);

    await touch(r, { access: 'write', probe: true, fill: 0x77 });
    expect(pagesOf(h.faults, 'write-protect')).toEqual([...Array(N).keys()]);
    expect(h.faults.every((f) => f.write && f.kind === 'write-protect')).toBe(true);
    const bytes = new Uint8Array(r.buffer);
    for (let i = 0; i < N; i++) expect(bytes[i * P]).toBe(0x77);
  });
});
