// Port of "zeropage": UFFDIO_ZEROPAGE resolves missing faults with zeros and says how many
// bytes it mapped; pages already there are skipped (EEXIST), not counted.
import { describe, expect, it } from 'vitest';
import { touch } from '../../lib/index.js';
import { closer, codeOf, P, recording } from '../helpers.js';
import { BOTH, open, pagesOf, region } from './matrix.js';

const own = closer();

describe.each(BOTH)('zeropage ($delivery delivery, $memory)', ({ delivery, shared }) => {
  it('resolves every missing fault with zeros and returns the bytes it mapped', async () => {
    const placed: number[] = [];
    const h = recording((f, u) => void placed.push(u.zeropage(f.region, f.offset, P)));
    const uffd = own(open(delivery, h.handler));
    const r = own(region(16, shared));
    uffd.register(r);
    const res = await touch(r);
    expect(pagesOf(h.faults)).toEqual([...Array(16).keys()]);
    expect(placed).toEqual(Array(16).fill(P));
    expect(res.data!.every((b) => b === 0)).toBe(true);
    expect(r.residentPages()).toBe(16);
  });

  it('pages already there are skipped: the bytes returned are only those it mapped', () => {
    const uffd = own(open(delivery));
    const r = own(region(8, shared));
    uffd.register(r);
    expect(uffd.zeropage(r, 2 * P, 2 * P)).toBe(2 * P);
    expect(uffd.zeropage(r, 2 * P, P)).toBe(0);
    expect(uffd.zeropage(r, 0, 8 * P)).toBe(6 * P);
    expect(r.residentPages()).toBe(8);
  });

  it('on a range not registered here the error says to register first', () => {
    const uffd = own(open(delivery));
    const r = own(region(2, shared));
    expect(codeOf(() => uffd.zeropage(r, 0, P))).toBe('ERR_PFR_NOT_REGISTERED');
  });
});
