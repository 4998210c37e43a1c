// The measured table against the thesis's orderings: three real runs of odp-vs-pinned (bytes
// checked in every write), verdicts that follow from the rows, the model's verdicts, this
// machine's own populate / mlock / copy costs, and an explanation for every claim whose
// measured verdict differs from the modelled one. Timings are the machine's: the test checks
// that the program judges and explains them, not what they are.
import { describe, expect, it } from 'vitest';
import { measuredTable } from '../examples/measured-table.js';
import { PAGE_SIZE } from '../lib/index.js';

describe('pagefault-rdma measured-table', () => {
  it('runs the table three times, judges both orderings from the rows, and explains where they differ from the model', async () => {
    const claimSize = 1024 * 1024;
    const r = await measuredTable({ runs: 3, maxSize: claimSize, iters: 1 });
    expect(r.runs).toHaveLength(3);
    expect(r.sizes).toEqual([4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288, 1048576]);
    for (const run of r.runs) {
      expect(run.rows).toHaveLength(r.sizes.length * 3);
      expect(run.rows.filter((x) => x.error)).toEqual([]); // every write completed with the source bytes
      const row = (size: number, policy: string) => run.rows.find((x) => x.size === size && x.policy === policy)!;
      // touch faults once per page, touch-ahead once per write
      for (const size of r.sizes) expect(row(size, 'touch').faults!.destination).toBe(size / PAGE_SIZE);
      const slower = r.sizes.filter((s) => s >= 2 * PAGE_SIZE && !(row(s, 'touch-ahead').realUs! < row(s, 'touch').realUs!));
      expect(run.touchAheadFasterThanTouch.failsAt).toEqual(slower);
      expect(run.touchAheadFasterThanTouch.holds).toBe(slower.length === 0);
      expect(run.touchAheadFasterThanTouch.modelHolds).toBe(true); // the model's order: one fault beats one per page
      const ratio = row(claimSize, 'touch-ahead').realUs! / row(claimSize, 'pin').realUs!;
      expect(run.touchAheadWithin1_5xOfPinned.ratio).toBeCloseTo(ratio, 9);
      expect(run.touchAheadWithin1_5xOfPinned.holds).toBe(ratio <= 1.5);
    }
    expect(r.stable.touchAheadFasterThanTouch).toBe(r.runs.every((x) => x.touchAheadFasterThanTouch.holds));
    expect(r.stable.touchAheadWithin1_5xOfPinned).toBe(r.runs.every((x) => x.touchAheadWithin1_5xOfPinned.holds));
    for (const k of ['populateUsPerPage', 'mlockUsPerPage', 'copyGBps'] as const) expect(r.machine[k]).toBeGreaterThan(0);
    // Every differing verdict is explained from the machine's costs.
    r.runs.forEach((run, i) => {
      const c = run.touchAheadWithin1_5xOfPinned;
      const said = r.differences.filter((d) => d.startsWith(`run ${i + 1}: touch-ahead at 1M`));
      expect(said).toHaveLength(c.holds === c.modelHolds ? 0 : 1);
      for (const d of said) expect(d).toMatch(/populates at [\d.]+ µs\/page, mlocks at [\d.]+ .* copies at [\d.]+ GB\/s/);
      for (const size of run.touchAheadFasterThanTouch.failsAt!)
        expect(r.differences.some((d) => d.startsWith(`run ${i + 1}: at ${size / 1024}K`))).toBe(true);
    });
  }, 120_000);
});
