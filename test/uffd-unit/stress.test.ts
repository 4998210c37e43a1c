// A bounded port of uffd-stress ("bounce"): several native threads fault on a registered
// region at once, on overlapping ranges (the same page faulted by two threads: duplicates
// and EEXIST races), the handler fills each page from the other region, sometimes
// write-protected (then the writes fault again), sometimes twice (the retry sees EEXIST);
// then the regions swap roles. Every byte is verified after every round.
import { describe, expect, it } from 'vitest';
import { touch, type Region } from '../../lib/index.js';
import { closer, P } from '../helpers.js';
import { BOTH, open, region } from './matrix.js';

const own = closer();
const N = 512; // pages per region
const THREADS = 4;
const ROUNDS = 16;

/** Deterministic per-page contents for a round: every 8-byte word stamped with round and page. */
function stamp(r: Region, round: number): void {
  const words = new BigUint64Array(r.buffer);
  for (let p = 0; p < N; p++) {
    const v = (BigInt(round) << 32n) | BigInt(p);
    words.fill(v, (p * P) / 8, ((p + 1) * P) / 8);
  }
}

describe.each(BOTH)('uffd-stress bounce ($delivery delivery, $memory)', ({ delivery, shared }) => {
  it(`${ROUNDS} rounds × ${THREADS} touchers over ${N} pages: every byte verified, no fault lost`, async () => {
    const regions = [own(region(N, shared)), own(region(N, shared))] as const;
    let src: Region = regions[0];
    let wpRound = false;
    let missing = 0,
      wp = 0,
      retries = 0;
    const uffd = own(
      open(delivery, (f, u) => {
        if (f.kind === 'write-protect') {
          wp++;
          u.writeProtect(f.region, f.offset, P, false);
          return;
        }
        missing++;
        const page = Buffer.from(src.buffer, f.offset, P);
        u.copy(f.region, f.offset, page, { writeProtect: wpRound });
        if (f.offset % (8 * P) === 0) retries += u.copy(f.region, f.offset, page) === 0 ? 1 : 0; // the retry must find EEXIST
      }),
    );
    stamp(src, 0);
    for (let round = 0; round < ROUNDS; round++) {
      const dst = regions[(round + 1) % 2];
      wpRound = round % 2 === 1;
      uffd.register(dst, { writeProtect: wpRound });
      dst.evict();
      const slice = N / 2;
      const walks = Array.from({ length: THREADS }, (_, t) => {
        const offset = ((t * N) / (2 * THREADS)) * P; // overlapping halves: pages faulted by 2 threads at once
        return wpRound
          ? touch(dst, { offset, length: slice * P, access: 'write', probe: true, fill: 0xf0 + t })
          : touch(dst, { offset, length: slice * P, probe: true });
      });
      await Promise.all(walks);
      // Every page reached: those no thread walked were never faulted in.
      const reached = (THREADS - 1) * (N / (2 * THREADS)) + slice;
      const got = new BigUint64Array(dst.buffer);
      const want = new BigUint64Array(src.buffer);
      for (let p = 0; p < reached; p++) {
        const base = (p * P) / 8;
        // In write rounds the first byte of the page is a toucher's; the other bytes are the copy's.
        if (!wpRound) expect(got[base]).toBe(want[base]);
        for (const w of [1, 255, 511]) if (got[base + w] !== want[base + w]) expect.fail(`round ${round} page ${p} word ${w}`);
      }
      expect(dst.residentPages(0, reached * P)).toBe(reached);
      expect(dst.residentPages(reached * P, (N - reached) * P)).toBe(0);
      expect(uffd.pending).toBe(0);
      uffd.unregister(dst);
      stamp(dst, round + 1); // the next round's source
      src = dst;
    }
    const s = uffd.stats();
    expect(s.timeouts).toBe(0);
    expect(s.handlerErrors).toBe(0);
    expect(retries).toBeGreaterThan(0);
    expect(wp).toBeGreaterThan(0);
    // Each page of each round was faulted at least once, and no more often than the threads that walked it.
    expect(missing).toBeGreaterThanOrEqual(ROUNDS * ((THREADS - 1) * (N / (2 * THREADS)) + N / 2));
    expect(s.forwarded).toBe(missing + wp);
  });
});
