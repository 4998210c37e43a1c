// The SMMU translates a run of blocks with one call (translateBlocks): the region is found and
// the page table read once, but the outcome (which block faults, at which page) and every
// counter (translations, walks, pages walked, IOTLB hits and misses) are those of translate()
// block by block, on the same real memory.
import { describe, expect, test } from 'vitest';
import { DmaStatus, Smmu } from '../../kernel-sim/index.js';
import { bytesOf, FaultLibrary, fill, P, post, proc, useEnv, within } from './helpers.js';

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

  test('a run that leaves the region: only its first block is translated; asked again, the block that leaves it is an address-size fault', () => {
    const r = env.region(4 * B);
    r.populate();
    const [, run] = twoSmmus(r) as [unknown, { smmu: Smmu; sid: number }];
    const walked: number[] = [];
    const got = run.smmu.translateBlocks(run.sid, r.address + BigInt(2 * B), 3 * B, B, 'read', walked);
    expect(walked).toEqual([2]);
    expect(got).toMatchObject({ region: r, offset: 2 * B, fault: undefined });
    expect(run.smmu.translateBlocks(run.sid, r.address + BigInt(3 * B), 2 * B, B, 'read', walked).fault).toBeUndefined();
    expect(walked).toEqual([2]);
    const out = run.smmu.translateBlocks(run.sid, r.address + BigInt(4 * B), B, B, 'read', walked);
    expect(walked).toEqual([]);
    expect(out.fault).toMatchObject({ ok: false, recoverable: false, addr: r.address + BigInt(4 * B) });
    expect(run.smmu.counters().translations).toBe(3);
  });

  test('a transfer whose source faults mid-run translates each block once per attempt, as block by block', async () => {
    const pages = 8;
    const sys = env.system({ nodes: 2 });
    const src = env.region(pages * P);
    const dst = env.region(pages * P);
    const data = fill(src, 0x31);
    dst.populate();
    src.evict(5 * P, P);
    const a = proc(sys.node(0), 100, 7, [src]);
    proc(sys.node(1), 200, 7, [dst]);
    env.track(
      new FaultLibrary(a.socket, {
        regions: [src],
        policy: 'touch',
        resolve: (r, off, len) => new Uint8Array(r.buffer, off, len).set(data.subarray(off, off + len)),
      }),
    );
    const c = await within('transfer', post(sys.node(0), src, dst));
    expect(c.status).toBe(DmaStatus.SUCCESS);
    expect(bytesOf(dst).equals(data)).toBe(true);
    expect(c.faults.source).toBe(1);
    // Blocks 0-5 (5 faults), then 5-7 again after the fault: 9 translations, 1 fault recorded.
    const k = sys.node(0).smmu.counters();
    expect(k.translations).toBe(9);
    expect(k.faults).toEqual({ F_TRANSLATION: 1 });
  });
});
