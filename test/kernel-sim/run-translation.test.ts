// The SMMU translates a run of blocks with one call (translateBlocks): the region is found and
// the page table read once, but the outcome (which block faults, at which page) and every
// counter (translations, walks, pages walked, IOTLB hits and misses) are those of translate()
// block by block, on the same real memory.
import { describe, expect, test } from 'vitest';
import { Smmu } from '../../kernel-sim/index.js';
import { P, useEnv } from './helpers.js';

const env = useEnv();
const B = 2 * P; // a block of two pages

function twoSmmus(region: ReturnType<typeof env.region>) {
  return [0, 1].map((node) => {
    const smmu = new Smmu({ node });
    const { sid } = smmu.attach({ pid: process.pid, pd: 7 });
    smmu.map(sid, region);
    return { smmu, sid };
  });
}

describe('translating a run of blocks at once', () => {
  test('resident, then cached, then with a page evicted mid-run: the same outcome and counters as block by block', () => {
    const blocks = 16;
    const r = env.region(blocks * B);
    r.populate();
    const [one, run] = twoSmmus(r) as [{ smmu: Smmu; sid: number }, { smmu: Smmu; sid: number }];
    const walked: number[] = [];
    const compare = (length: number) => {
      const per: number[] = [];
      let fault: unknown;
      for (let off = 0; off < length; off += B) {
        const tr = one.smmu.translate(one.sid, r.address + BigInt(off), Math.min(B, length - off), 'write');
        if (!tr.ok) {
          fault = tr;
          break;
        }
        expect(tr.offset).toBe(off);
        per.push(tr.hit ? 0 : tr.walked);
      }
      const got = run.smmu.translateBlocks(run.sid, r.address, length, B, 'write', walked);
      expect(walked).toEqual(per);
      expect(got.fault).toEqual(fault);
      expect(got.region).toBe(r);
      expect(run.smmu.counters()).toEqual(one.smmu.counters());
      return { per, fault };
    };
    // Cold: every block walks its two pages.
    expect(compare(blocks * B).per).toEqual(Array(blocks).fill(2));
    // Cached: every block hits.
    expect(compare(blocks * B).per).toEqual(Array(blocks).fill(0));
    // A page of block 5 evicted: blocks 0-4 hit, block 5 faults at that page; nothing after it is translated.
    r.evict(5 * B + P, P);
    const { per, fault } = compare(blocks * B - 100);
    expect(per).toEqual([0, 0, 0, 0, 0]);
    expect(fault).toMatchObject({ ok: false, recoverable: true, addr: r.address + BigInt(5 * B + P) });
  });

  test('a run that leaves the region: translated block by block, the block that leaves it an address-size fault', () => {
    const r = env.region(4 * B);
    r.populate();
    const [, run] = twoSmmus(r) as [unknown, { smmu: Smmu; sid: number }];
    const walked: number[] = [];
    const got = run.smmu.translateBlocks(run.sid, r.address + BigInt(2 * B), 3 * B, B, 'read', walked);
    expect(walked).toEqual([2, 2]);
    expect(got.fault).toMatchObject({ ok: false, recoverable: false, addr: r.address + BigInt(4 * B) });
    expect(run.smmu.counters().translations).toBe(3);
  });
});
