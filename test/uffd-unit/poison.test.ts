// Port of "poison": UFFDIO_POISON resolves a fault with a poisoned page, so the access
// fails (SIGBUS) instead of silently reading zeros: what a page that could not be fetched
// must do.
import { describe, expect, it } from 'vitest';
import { touch } from '../../lib/index.js';
import { closer, P, pattern, recording } from '../helpers.js';
import { BOTH, open, pagesOf, region, touchError } from './matrix.js';

const own = closer();

describe.each(BOTH)('poison ($delivery delivery, $memory)', ({ delivery, shared }) => {
  it('odd pages poisoned, even pages copied: the odd accesses fail, the even bytes are right', async () => {
    const N = 16;
    const data = pattern(N, 0x10);
    const poisoned: number[] = [];
    const h = recording((f, u) => {
      if ((f.offset / P) % 2) poisoned.push(u.poison(f.region, f.offset, P));
      else u.copy(f.region, f.offset, data.subarray(f.offset, f.offset + P));
    });
    const uffd = own(open(delivery, h.handler));
    expect(uffd.features.poison).toBe(true);
    const r = own(region(N, shared));
    uffd.register(r);
    const err = (await touchError(r)) as { code?: string; offsets?: number[]; result?: { data?: Buffer } };
    expect(err.code).toBe('ERR_PFR_ACCESS_FAILED');
    const odd = [...Array(N).keys()].filter((i) => i % 2);
    expect(err.offsets).toEqual(odd.map((i) => i * P));
    expect(poisoned).toEqual(Array(odd.length).fill(P));
    expect(pagesOf(h.faults)).toEqual([...Array(N).keys()]);
    for (let i = 0; i < N; i += 2) expect(err.result!.data!.subarray(i * P, (i + 1) * P).equals(data.subarray(i * P, (i + 1) * P))).toBe(true);
    // A poisoned page stays poisoned: a second walk fails on the same pages without new faults.
    const again = (await touchError(r, { probe: true })) as { offsets?: number[] };
    expect(again.offsets).toEqual(odd.map((i) => i * P));
    expect(h.faults).toHaveLength(N);
  });

  it('a missing page that carries a uffd-wp marker is refused (0 bytes) until the marker is dropped', async () => {
    const uffd = own(open(delivery));
    const r = own(region(2, shared));
    uffd.register(r, { writeProtect: true });
    uffd.writeProtect(r, 0, 2 * P, true); // missing pages: uffd-wp markers (WP_UNPOPULATED)
    expect(uffd.poison(r, 0, 2 * P)).toBe(0);
    uffd.writeProtect(r, 0, P, false, { wake: false });
    expect(uffd.poison(r, 0, 2 * P)).toBe(P);
    expect(((await touchError(r, { probe: true, length: P })) as { offsets?: number[] }).offsets).toEqual([0]);
  });

  it('poisoning a page that is there already places nothing', async () => {
    const uffd = own(open(delivery));
    const r = own(region(2, shared));
    uffd.register(r);
    uffd.copy(r, 0, Buffer.alloc(P, 1));
    expect(uffd.poison(r, 0, 2 * P)).toBe(P);
    expect((await touch(r, { length: P })).data![0]).toBe(1);
  });
});
