// EDM's DM-Handler with the embedded store: the main JS thread reads and writes a region
// larger than its resident limit and always sees its own bytes; pages are fetched, evicted,
// written back or dropped clean as the counters say.
import { spawnSync } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { RemotePager, touch, type RemotePagerOptions } from '../../lib/index.js';
import { codeOf, P, until } from '../helpers.js';
import { usePagers } from '../fixtures/pager.js';
import { misnestedSpans } from '../trace-format.js';

const pagers = usePagers();
const pager = (o: RemotePagerOptions): Promise<RemotePager> => pagers.create(o);

/** The byte page `i` holds at word `w` in generation `g`. */
const mark = (i: number, w: number, g: number): number => (i * 31 + w * 7 + g * 101) & 0xff;

describe.each(['wp-async', 'wp-sync'] as const)('DM-Handler, embedded store (%s)', (dirtyTracking) => {
  it('the main thread writes 4096 pages past a 512-page limit and reads every one back byte for byte', async () => {
    const N = 4096;
    const p = await pager({ size: N * P, residentLimit: 512 * P, dirtyTracking });
    expect(p.tracking).toBe(dirtyTracking);
    const b = new Uint8Array(p.region.buffer);
    for (let i = 0; i < N; i++) for (const w of [0, 1000, 4095]) b[i * P + w] = mark(i, w, 1);
    const afterWrite = p.stats();
    expect(afterWrite.evicted).toBeGreaterThan(N - 512);
    expect(afterWrite.writtenBack).toBe(afterWrite.evicted); // every page was written: all dirty
    expect(afterWrite.majorFaults).toBe(0); // nothing stored yet: zero pages
    expect(afterWrite.resident).toBeLessThanOrEqual(512);

    let bad = 0;
    for (let i = 0; i < N; i++) for (const w of [0, 1000, 4095, 2]) if (b[i * P + w] !== (w === 2 ? 0 : mark(i, w, 1))) bad++;
    expect(bad).toBe(0);
    const s = p.stats();
    expect(s.majorFaults).toBeGreaterThan(N - 600); // read back from the store
    expect(s.pagesFetched).toBe(s.majorFaults);
    // The read-back phase dirtied nothing: what it evicted went without a write.
    expect(s.droppedClean).toBeGreaterThan(N - 1200);
    expect(s.writtenBack - afterWrite.writtenBack).toBeLessThanOrEqual(512);
    expect(s.errors).toBe(0);
  });

  it('a native thread writing while pages are evicted under it loses no write', async () => {
    const N = 1024;
    const p = await pager({ size: N * P, residentLimit: 64 * P, evictBatch: 8, dirtyTracking });
    for (let round = 1; round <= 3; round++) {
      await Promise.all([
        touch(p.region, { access: 'write', fill: round, length: (N / 2) * P }),
        touch(p.region, { access: 'write', fill: round + 100, offset: (N / 2) * P, length: (N / 2) * P }),
        p.evict(0, N * P),
      ]);
      const back = await touch(p.region);
      expect(back.data!.subarray(0, (N / 2) * P).every((x) => x === round)).toBe(true);
      expect(back.data!.subarray((N / 2) * P).every((x) => x === round + 100)).toBe(true);
    }
    expect(p.stats().errors).toBe(0);
  });
});

describe('DM-Handler behaviour', () => {
  it('after a fork (child_process), eviction still takes every page and loses none', async () => {
    const p = await pager({ size: 64 * P });
    const b = new Uint8Array(p.region.buffer);
    for (let i = 0; i < 64; i++) b[i * P] = i + 1;
    // fork() leaves every resident page shared copy-on-write, which UFFDIO_MOVE refuses (EBUSY).
    expect(spawnSync('true').status).toBe(0);
    expect(await p.evict()).toBe(64);
    expect(p.region.residentPages()).toBe(0);
    for (let i = 0; i < 64; i++) expect(b[i * P]).toBe(i + 1);
    expect(p.stats().errors).toBe(0);
  });

  it('a page never stored reads as zeros (a minor fault); a fault of a page on its way in is coalesced', async () => {
    const p = await pager({ size: 64 * P });
    const [a, b] = await Promise.all([touch(p.region, { probe: true }), touch(p.region, { probe: true })]);
    expect(a.checksum + b.checksum).toBe(0);
    const s = p.stats();
    expect(s.majorFaults).toBe(0);
    expect(s.resident).toBe(64);
    // Never stored, or coalesced with the other walker's. (A late event of a page already
    // placed may still be counting when the walks end: the counters settle at once after.)
    await until('every fault counted minor', () => p.stats().minorFaults === p.stats().faults, 2000);
  });

  it('prefetch reads the window ahead in the same store request: a sequential scan takes one major fault per window once it has grown', async () => {
    const N = 256,
      W = 15;
    const p = await pager({ size: N * P, prefetch: W });
    const b = new Uint8Array(p.region.buffer);
    for (let i = 0; i < N; i++) b[i * P] = i & 0xff;
    expect(await p.evict()).toBe(N);
    const r = await touch(p.region, { probe: true });
    expect(r.checksum).toBe([...Array(N).keys()].reduce((x, i) => x + (i & 0xff), 0));
    const s = p.stats();
    // Three faults find the trend, then windows of 1, 2, 4, 8 and 15 pages: a few faults more than N / (W + 1).
    expect(s.majorFaults).toBeGreaterThanOrEqual(N / (W + 1));
    expect(s.majorFaults).toBeLessThanOrEqual(N / (W + 1) + 6);
    expect(s.prefetched).toBe(N - s.majorFaults);
    expect(s.pagesFetched).toBe(N);
  });

  it('traceEvents: each fault a span of the thread that took it, receipt to resolution; each worker its own track of batches and steps', async () => {
    const N = 128;
    const p = await pager({ size: N * P, residentLimit: 32 * P, evictBatch: 8, traceEvents: 100_000 });
    const b = new Uint8Array(p.region.buffer);
    for (let i = 0; i < N; i++) b[i * P] = i + 1; // the main thread: first touches, evictions, write-backs
    await p.flush();
    expect(await p.evict()).toBeGreaterThan(0);
    // Two native threads read every page back at once: major faults, some coalesced with the other's.
    const [x, y] = await Promise.all([touch(p.region, { probe: true }), touch(p.region, { probe: true })]);
    expect(x.checksum).toBe(y.checksum);
    await until('every fault counted', () => p.stats().faults === p.stats().majorFaults + p.stats().minorFaults, 2000);
    const { events, dropped } = await p.trace();
    expect(dropped).toBe(0);
    const faults = events.filter((e) => e.name === 'fault');
    expect(faults.length).toBe(p.stats().faults);
    const threads = new Set(faults.map((e) => e.tid));
    expect(threads.has(process.pid)).toBe(true); // the main JS thread's own first touches
    expect(threads.size).toBeGreaterThanOrEqual(3); // and each walker's
    const kinds = new Set(faults.map((e) => e.args['kind']));
    expect(kinds.has('major')).toBe(true);
    expect(kinds.has('first touch: zero page')).toBe(true);
    for (const f of faults) expect(f.dur).toBeGreaterThanOrEqual(0);
    // A fetch resolved each major fault: it is named, and the fault ends by the batch's end.
    const fetches = new Map(events.filter((e) => e.name === 'fetch').map((e) => [e.args['batch'], e]));
    for (const f of faults.filter((e) => e.args['kind'] === 'major')) {
      const batch = fetches.get(f.args['batch']!);
      expect(batch, `batch ${String(f.args['batch'])}`).toBeDefined();
      expect(f.ts + f.dur).toBeLessThanOrEqual(batch!.ts + batch!.dur + 1);
    }
    const tracks = new Set(events.filter((e) => e.tid === 0).map((e) => e.track));
    expect([...tracks].sort()).toEqual(expect.arrayContaining(['evict 0', 'fill 0', 'flush']));
    expect(events.filter((e) => e.name === 'write-back' && e.track === 'flush').length).toBe(1);
    // Every track's spans nest: the steps inside their batch, a thread's faults one after another.
    const ids = new Map<string, number>();
    const asChrome = events.map((e) => ({ ...e, pid: 0, tid: e.tid || -(ids.get(e.track!) ?? ids.set(e.track!, ids.size + 1).get(e.track!)!) }));
    expect(misnestedSpans({ traceEvents: asChrome })).toEqual([]);
  });

  it('flush() writes dirty pages back without evicting; an evicted clean page needs no write', async () => {
    const p = await pager({ size: 32 * P });
    const b = new Uint8Array(p.region.buffer);
    b.fill(7, 0, 8 * P);
    expect(await p.flush()).toBe(8);
    expect(await p.flush()).toBe(0); // clean now
    expect(await p.evict(0, 8 * P)).toBe(8);
    expect(p.stats()).toMatchObject({ writtenBack: 8, droppedClean: 8 });
    expect(b[3 * P]).toBe(7);
  });

  it('a UMap page of two system pages is fetched and evicted as one', async () => {
    const p = await pager({ size: 64 * P, pageSize: 2 * P, residentLimit: 8 * 2 * P });
    const b = new Uint8Array(p.region.buffer);
    for (let i = 0; i < 64; i++) b[i * P] = i + 1;
    for (let i = 0; i < 64; i++) expect(b[i * P]).toBe(i + 1);
    const s = p.stats();
    expect(s.faults).toBeGreaterThanOrEqual(32);
    expect(s.evicted).toBeGreaterThan(0);
  });

  it('bad options are refused before anything is mapped', async () => {
    await expect(RemotePager.create({ size: 10 * P, pageSize: P + 1 })).rejects.toMatchObject({ code: 'ERR_INVALID_ARG_VALUE' });
    await expect(RemotePager.create({ size: 10 * P, highWatermark: 0.5, lowWatermark: 0.6 })).rejects.toMatchObject({ code: 'ERR_OUT_OF_RANGE' });
    await expect(RemotePager.create({ size: 10 * P, store: 'memcached' as never })).rejects.toMatchObject({ code: 'ERR_INVALID_ARG_TYPE' });
    const p = await pager({ size: 4 * P, pageSize: 2 * P });
    expect(codeOf(() => void p.evict(P, P))).toBe('ERR_INVALID_ARG_VALUE');
  });
});
