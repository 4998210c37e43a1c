// Adaptive prefetch on real faults: native threads read a remote-paged region (embedded store)
// in sequential, strided and random order, and the prefetcher must find the stream, read ahead
// along it only, and report what it read ahead and what of it was used.
import { describe, expect, it } from 'vitest';
import { RemotePager, touch } from '../../lib/index.js';
import { P } from '../helpers.js';
import { fillPages, usePagers } from '../fixtures/pager.js';

const pagers = usePagers();

/** A region of `n` pages, page i holding byte i, every page in the store. */
async function stored(n: number, prefetch: number): Promise<RemotePager> {
  const p = await pagers.create({ size: n * P, prefetch });
  fillPages(p, n, 0);
  expect(await p.evict()).toBe(n);
  return p;
}

/** Read the pages in this order, one native thread per access: each returns the page's byte. */
async function readInOrder(p: RemotePager, pages: number[]): Promise<number[]> {
  const out: number[] = [];
  for (const i of pages) out.push((await touch(p.region, { offset: i * P, length: P, probe: true })).checksum);
  return out;
}

describe('adaptive prefetch (embedded store)', () => {
  it('a sequential scan: the window grows, most pages come without a major fault, what was read ahead was used', async () => {
    const N = 512;
    const p = await stored(N, 32);
    const r = await touch(p.region, { probe: true });
    expect(r.checksum).toBe([...Array(N).keys()].reduce((s, i) => s + (i & 0xff), 0));
    const s = p.stats();
    expect(s.majorFaults).toBeLessThan(N / 8); // 32-page windows once the trend is found
    expect(s.majorFaults + s.prefetched).toBe(N);
    expect(s.prefetchUsed).toBeGreaterThan(s.prefetched - 33); // all but the last window, never walked past
    expect(s.prefetchAccuracy).toBeGreaterThan(0.9);
    expect(s.prefetchCoverage).toBeGreaterThan(0.85);
  });

  it('a strided scan (every 3rd page): read ahead along the stride only, the pages read ahead used', async () => {
    const N = 600;
    const p = await stored(N, 16);
    const order = Array.from({ length: N / 3 }, (_, k) => 3 * k);
    expect(await readInOrder(p, order)).toEqual(order.map((i) => i & 0xff));
    const s = p.stats();
    expect(s.prefetched).toBeGreaterThan(N / 3 / 2);
    expect(s.majorFaults + s.prefetched).toBe(N / 3);
    expect(s.prefetchAccuracy).toBeGreaterThan(0.85);
    // Nothing off the stride came in: the pages between stay out.
    const resident = p.region.residency();
    expect(order.filter((i) => resident[i + 1] || resident[i + 2])).toEqual([]);
  });

  it('a random scan: almost nothing read ahead, every page a major fault of its own', async () => {
    const N = 256;
    const p = await stored(N, 32);
    let seed = 7;
    const order = [...Array(N).keys()];
    for (let i = N - 1; i > 0; i--) {
      seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
      const j = (seed >>> 8) % (i + 1);
      [order[i], order[j]] = [order[j]!, order[i]!];
    }
    expect(await readInOrder(p, order)).toEqual(order.map((i) => i & 0xff));
    const s = p.stats();
    expect(s.prefetched).toBeLessThan(N / 20);
    expect(s.majorFaults).toBeGreaterThan(N - N / 20);
  });

  it('prefetch 0 reads nothing ahead of a sequential scan', async () => {
    const p = await stored(64, 0);
    await touch(p.region, { probe: true });
    expect(p.stats()).toMatchObject({ majorFaults: 64, prefetched: 0, prefetchUsed: 0, prefetchAccuracy: 0, prefetchCoverage: 0 });
  });
});
