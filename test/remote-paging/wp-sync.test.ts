// Dirty tracking by write-protect faults ('wp-sync'): a page is clean only while it is
// write-protected, so that its next write faults and marks it dirty. Two paths clear or keep
// that state outside the eviction itself: a page the store refused (put back, still dirty)
// and flush() (written, clean, so protected again). Got wrong, a write is lost at the next
// eviction with no error; the checksum taken at eviction must not be what saves it.
import { afterEach, expect, it } from 'vitest';
import { PageCategory, RemotePager, touch, type RemotePagerOptions } from '../../lib/index.js';
import { startRedis } from '../../cli/programs/support/redis-server.js';
import { P } from '../helpers.js';
import { fillPages } from '../fixtures/pager.js';

const open: Array<{ close(): Promise<unknown> }> = [];
afterEach(async () => {
  for (const r of open.splice(0).reverse()) await r.close();
});
async function pager(o: Omit<RemotePagerOptions, 'dirtyTracking'>): Promise<RemotePager> {
  const p = await RemotePager.create({ ...o, dirtyTracking: 'wp-sync' });
  open.push(p);
  return p;
}

const fill = fillPages;

/** Pages whose bytes are not all (seed + i), read from a native thread (it faults them back in). */
async function wrongPages(p: RemotePager, pages: number, seed: number): Promise<number[]> {
  const data = (await touch(p.region)).data!;
  const bad: number[] = [];
  for (let i = 0; i < pages; i++) if (!data.subarray(i * P, (i + 1) * P).every((x) => x === ((seed + i) & 0xff))) bad.push(i);
  return bad;
}

it('pages put back when the store was full stay dirty: once it has room, every page reads back right', async () => {
  const small = await startRedis({ maxmemory: '2mb' });
  open.push({ close: () => small.dispose() });
  const N = 512; // about half fit in 2 MB
  const p = await pager({ size: N * P, prefetch: 31, store: { redis: { socket: small.socket, prefix: 'full' } } });
  p.on('error', () => undefined); // the refusals: asserted through evict()
  fill(p, N, 5);
  await expect(p.evict()).rejects.toMatchObject({ code: 'ERR_PFR_STORE_FULL' });
  const putBack = p.stats().resident;
  expect(putBack).toBeGreaterThan(0);
  expect(putBack).toBeLessThan(N); // some pages went to the store, the rest were refused
  await (await small.client()).configSet('maxmemory', '0'); // room again
  await p.evict();
  expect(p.stats().resident).toBe(0);
  expect(await wrongPages(p, N, 5)).toEqual([]);
});

it('flush() write-protects what it wrote: a write after it faults, and the next eviction keeps it', async () => {
  const N = 16;
  const p = await pager({ size: N * P });
  fill(p, N, 1);
  const written = () => p.region.pagemapScan({ all: PageCategory.PRESENT | PageCategory.WRITTEN }).reduce((n, r) => n + r.length / P, 0);
  expect(written()).toBe(N); // the first writes unprotected them
  expect(await p.flush()).toBe(N);
  expect(written()).toBe(0); // clean again, so protected again
  fill(p, N, 101);
  expect(written()).toBe(N);
  expect(await p.evict()).toBe(N);
  expect(p.stats()).toMatchObject({ writtenBack: 2 * N, droppedClean: 0 });
  expect(await wrongPages(p, N, 101)).toEqual([]);
});
