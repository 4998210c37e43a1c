// Port of "minor": pages in the page cache but not mapped here fault as minor faults;
// UFFDIO_CONTINUE maps them, returns the bytes it mapped, and the bytes are the cache's.
import { describe, expect, it } from 'vitest';
import { touch } from '../../lib/index.js';
import { closer, P, pattern, recording } from '../helpers.js';
import { open, pagesOf, region, SHMEM } from './matrix.js';

const own = closer();

describe.each(SHMEM)('minor ($delivery delivery, $memory)', ({ delivery }) => {
  it('N pages written through a second view fault as N minor faults; CONTINUE maps the cached bytes', async () => {
    const N = 32;
    const data = pattern(N, 0x40);
    const mapped: number[] = [];
    const h = recording((f, u) => void mapped.push(u.continue(f.region, f.offset, P)));
    const uffd = own(open(delivery, h.handler));
    const r = own(region(N, true));
    const view = own(r.alias());
    Buffer.from(view.buffer).set(data); // the page cache holds the data; r's page table does not
    uffd.register(r, { missing: false, minor: true });
    const res = await touch(r);
    expect(pagesOf(h.faults, 'minor')).toEqual([...Array(N).keys()]);
    expect(mapped).toEqual(Array(N).fill(P));
    expect(res.data!.equals(data)).toBe(true);
    expect(uffd.continue(r, 0, N * P)).toBe(0); // all mapped now: nothing left to continue
  });
});
