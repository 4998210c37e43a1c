// Memory regions: the residency the kernel reports is the residency we caused.
import { describe, expect, it } from 'vitest';
import { HUGE_PAGE_SIZE, mapRegion, touch } from '../lib/index.js';
import { closer, codeOf, P } from './helpers.js';

const own = closer();

describe('mapRegion', () => {
  it('maps page-aligned memory exposed as an ArrayBuffer over the mapping itself', () => {
    const r = own(mapRegion(8 * P));
    expect(r.size).toBe(8 * P);
    expect(r.pageSize).toBe(P);
    expect(typeof r.address).toBe('bigint');
    expect(r.address % BigInt(P)).toBe(0n);
    expect(r.buffer.byteLength).toBe(8 * P);
    // Nothing touched yet: the kernel has no page for any of it.
    expect(Array.from(r.residency())).toEqual([0, 0, 0, 0, 0, 0, 0, 0]);
    // A write through the ArrayBuffer is a write to the mapping: the touched page becomes resident.
    new Uint8Array(r.buffer)[3 * P + 5] = 0x5a;
    expect(Array.from(r.residency())).toEqual([0, 0, 0, 1, 0, 0, 0, 0]);
  });

  it('with hugePages, maps 2 MiB-aligned memory and reports a 2 MiB granule', () => {
    const r = own(mapRegion(HUGE_PAGE_SIZE, { hugePages: true }));
    expect(r.address % BigInt(HUGE_PAGE_SIZE)).toBe(0n);
    expect(r.granule).toBe(HUGE_PAGE_SIZE);
    expect(own(mapRegion(P)).granule).toBe(P);
  });
});

describe('residency, populate, evict', () => {
  it('residency() agrees with the pages a native thread touched', async () => {
    const r = own(mapRegion(16 * P));
    await touch(r, { offset: 4 * P, length: 3 * P, probe: true });
    await touch(r, { offset: 10 * P, length: P, access: 'write', probe: true });
    const res = Array.from(r.residency());
    expect(res.map((v, i) => (v ? i : -1)).filter((i) => i >= 0)).toEqual([4, 5, 6, 10]);
    expect(r.residentPages()).toBe(4);
    expect(Array.from(r.residency(4 * P, 2 * P))).toEqual([1, 1]);
  });

  it('populate() makes a range resident without touching it, for read and for write', () => {
    const r = own(mapRegion(8 * P));
    r.populate(0, 2 * P);
    r.populate(4 * P, 2 * P, { write: false });
    expect(Array.from(r.residency())).toEqual([1, 1, 0, 0, 1, 1, 0, 0]);
    expect(Array.from(r.mapped())).toEqual([1, 1, 0, 0, 1, 1, 0, 0]);
  });

  it('evict() drops anonymous pages: not resident, and their contents are gone', () => {
    const r = own(mapRegion(4 * P));
    const view = new Uint8Array(r.buffer);
    view.fill(0x77);
    expect(r.residentPages()).toBe(4);
    r.evict(P, 2 * P);
    expect(Array.from(r.residency())).toEqual([1, 0, 0, 1]);
    expect(view[P]).toBe(0);
    expect(view[3 * P - 1]).toBe(0);
    expect(view[0]).toBe(0x77);
    expect(view[3 * P]).toBe(0x77);
  });

  it('evict() on memfd memory punches a hole: the data leaves the page cache', () => {
    const r = own(mapRegion(2 * P, { shared: true }));
    new Uint8Array(r.buffer).fill(0x33);
    r.evict(0, P);
    expect(Array.from(r.residency())).toEqual([0, 1]);
    expect(new Uint8Array(r.buffer)[10]).toBe(0);
    expect(new Uint8Array(r.buffer)[P + 10]).toBe(0x33);
  });

  it('unmapPages() on memfd memory unmaps the pages but keeps them in the page cache', () => {
    const r = own(mapRegion(2 * P, { shared: true }));
    new Uint8Array(r.buffer).fill(0x44);
    r.unmapPages();
    expect(Array.from(r.mapped())).toEqual([0, 0]);
    expect(Array.from(r.residency())).toEqual([1, 1]);
    // A write maps just its own page (reads would map cached neighbours too: fault-around).
    const view = new Uint8Array(r.buffer);
    view[P + 1] = 0x45;
    expect(Array.from(r.mapped())).toEqual([0, 1]);
    expect(view[P]).toBe(0x44);
    expect(view[P + 1]).toBe(0x45);
  });
});

describe('alias', () => {
  it('is a second view of the same memfd pages at another address', () => {
    const r = own(mapRegion(2 * P, { shared: true }));
    const a = own(r.alias());
    expect(a.address).not.toBe(r.address);
    expect(a.aliasOf).toBe(r);
    new Uint8Array(a.buffer)[P + 7] = 0x99;
    expect(new Uint8Array(r.buffer)[P + 7]).toBe(0x99);
    // Writing through the alias filled the page cache; the first view has not mapped it.
    expect(Array.from(r.mapped())).toEqual([0, 1]);
  });

  it('is refused for anonymous private memory', () => {
    const r = own(mapRegion(P));
    expect(codeOf(() => r.alias())).toBe('ERR_INVALID_ARG_VALUE');
  });
});

describe('pin', () => {
  it('pin() makes the range resident; a pinned anonymous page cannot be evicted until unpin()', () => {
    const r = own(mapRegion(4 * P));
    r.pin(0, 2 * P);
    expect(Array.from(r.residency())).toEqual([1, 1, 0, 0]);
    let err: (Error & { code?: string; syscall?: string }) | undefined;
    try {
      r.evict(0, P);
    } catch (e) {
      err = e as Error;
    }
    expect(err?.code).toBe('EINVAL');
    expect(err?.syscall).toBe('madvise(MADV_DONTNEED)');
    expect(err?.message).toMatch(/unpin\(\) first/);
    r.unpin(0, 2 * P);
    r.evict(0, P);
    expect(Array.from(r.residency())).toEqual([0, 1, 0, 0]);
  });
});

describe('close', () => {
  it('is idempotent, detaches the ArrayBuffer before munmap, and every method then throws ERR_PFR_CLOSED', async () => {
    const r = mapRegion(2 * P);
    const buffer = r.buffer;
    new Uint8Array(buffer).fill(1);
    r.close();
    r.close();
    expect(r.closed).toBe(true);
    expect(buffer.byteLength).toBe(0);
    expect(() => new Uint8Array(buffer)).toThrow(TypeError);
    expect(codeOf(() => r.buffer)).toBe('ERR_PFR_CLOSED');
    expect(codeOf(() => r.residency())).toBe('ERR_PFR_CLOSED');
    expect(codeOf(() => r.populate())).toBe('ERR_PFR_CLOSED');
    expect(codeOf(() => r.evict())).toBe('ERR_PFR_CLOSED');
    expect(codeOf(() => r.pin())).toBe('ERR_PFR_CLOSED');
    await expect(touch(r)).rejects.toMatchObject({ code: 'ERR_PFR_CLOSED' });
  });

  it('[Symbol.dispose] closes', () => {
    const r = mapRegion(P);
    r[Symbol.dispose]();
    expect(r.closed).toBe(true);
  });
});
