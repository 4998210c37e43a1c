// Port of "move" (UFFDIO_MOVE, Linux 6.8): pages of one anonymous range become another's
// without a copy: the source loses them.
import { describe, expect, it } from 'vitest';
import { mapRegion, touch } from '../../lib/index.js';
import { closer, codeOf, P, pattern, recording } from '../helpers.js';
import { ANON, open, pagesOf } from './matrix.js';

const own = closer();

describe.each(ANON)('move ($delivery delivery)', ({ delivery }) => {
  it('each fault resolved by moving the page in from a staging region; the staging pages are gone', async () => {
    const N = 32;
    const data = pattern(N, 0x21);
    const staging = own(mapRegion(N * P));
    Buffer.from(staging.buffer).set(data);
    const moved: number[] = [];
    const h = recording((f, u) => void moved.push(u.move(f.region, f.offset, staging, f.offset, P)));
    const uffd = own(open(delivery, h.handler));
    const r = own(mapRegion(N * P));
    uffd.register(r);
    const res = await touch(r);
    expect(pagesOf(h.faults)).toEqual([...Array(N).keys()]);
    expect(moved).toEqual(Array(N).fill(P));
    expect(res.data!.equals(data)).toBe(true);
    expect(staging.residentPages()).toBe(0); // moved, not copied
  });

  it('a page taken out of a registered region leaves it missing: the next access faults again', async () => {
    const uffd = own(open(delivery));
    const r = own(mapRegion(4 * P));
    const out = own(mapRegion(4 * P));
    uffd.register(r);
    uffd.register(out);
    const data = pattern(4, 0x50);
    uffd.copy(r, 0, data);
    expect(uffd.move(out, 0, r, P, 2 * P)).toBe(2 * P);
    expect(Array.from(r.residency())).toEqual([1, 0, 0, 1]);
    expect(
      Buffer.from(out.buffer)
        .subarray(0, 2 * P)
        .equals(data.subarray(P, 3 * P)),
    ).toBe(true);
    const h = recording((f, u) => u.zeropage(f.region, f.offset, P));
    uffd.onFault(h.handler);
    await touch(r, { probe: true });
    expect(pagesOf(h.faults)).toEqual([1, 2]);
  });

  it('destination pages there already are skipped; a source hole is ENOENT unless allowed', () => {
    const uffd = own(open(delivery));
    const src = own(mapRegion(4 * P));
    const r = own(mapRegion(4 * P));
    uffd.register(r);
    Buffer.from(src.buffer).set(pattern(4, 1));
    uffd.copy(r, 0, Buffer.alloc(P, 9));
    expect(uffd.move(r, 0, src, 0, 2 * P)).toBe(P);
    expect(new Uint8Array(r.buffer)[0]).toBe(9);
    expect(new Uint8Array(r.buffer)[P]).toBe(2);
    src.evict(2 * P, P);
    expect(codeOf(() => uffd.move(r, 2 * P, src, 2 * P, P))).toBe('ENOENT');
    expect(uffd.move(r, 2 * P, src, 2 * P, 2 * P, { allowSourceHoles: true })).toBe(P);
  });

  it('shared memory and overlapping ranges are refused before the syscall', () => {
    const uffd = own(open(delivery));
    const r = own(mapRegion(4 * P));
    const shm = own(mapRegion(4 * P, { shared: true }));
    uffd.register(r);
    expect(codeOf(() => uffd.move(r, 0, shm, 0, P))).toBe('ERR_INVALID_ARG_VALUE');
    expect(codeOf(() => uffd.move(r, 0, r, P, 2 * P))).toBe('ERR_INVALID_ARG_VALUE');
  });
});
