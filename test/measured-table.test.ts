// The measured table against the thesis's orderings: three real runs of odp-vs-pinned (bytes
// checked in every write), verdicts that follow from the rows, the model's verdicts, each run's
// own populate / mlock / copy / engine costs, and an explanation for every claim whose measured
// verdict differs from the modelled one, computed from that run's figures. Timings are the
// machine's (a loaded 2-core CI box can flip any of them): the test checks the table's
// structure, the residency and fault counts, and that the program judges and explains what it
// measured, never which way the timings fall.
import { describe, expect, it } from 'vitest';
import { explain, judge, measuredTable, type Difference } from '../cli/programs/measured-table.js';
import { williams } from '../cli/programs/odp-vs-pinned.js';
import { median, PAGE_SIZE } from '../lib/index.js';

describe('pagefault-rdma measured-table', () => {
  it('runs the table three times, judges both orderings from the rows, and explains where they differ from the model', async () => {
    const claimSize = 1024 * 1024;
    const iters = 3;
    const smallIters = 5;
    const r = await measuredTable({ runs: 3, maxSize: claimSize, iters, smallIters });
    expect(r.runs).toHaveLength(3);
    expect(r.sizes).toEqual([4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288, 1048576]);
    r.runs.forEach((run, i) => {
      expect(run.rows.map((x) => `${x.size} ${x.policy}`)).toEqual(r.sizes.flatMap((s) => [`${s} pin`, `${s} touch`, `${s} touch-ahead`]));
      expect(run.rows.filter((x) => x.error)).toEqual([]); // every write completed with the source bytes
      const row = (size: number, policy: string) => run.rows.find((x) => x.size === size && x.policy === policy)!;
      for (const size of r.sizes) {
        const pages = size / PAGE_SIZE;
        // pinning faults never, touch once per page, touch-ahead once per write; each makes the evicted destination resident
        expect([row(size, 'pin'), row(size, 'touch'), row(size, 'touch-ahead')].map((x) => x.faults)).toEqual([
          { source: 0, destination: 0 },
          { source: 0, destination: pages },
          { source: 0, destination: 1 },
        ]);
        for (const policy of ['pin', 'touch', 'touch-ahead']) {
          const x = row(size, policy);
          expect(x.madeResident).toBe(pages);
          // as many writes at every size above 64K (the claim size too, never one sample), the row their median
          expect(x.iters).toBe(size <= 65536 ? smallIters : iters);
          expect(x.samplesUs).toHaveLength(x.iters);
          expect(x.realUs).toBe(median(x.samplesUs!));
          expect(x.spreadUs).toBeGreaterThanOrEqual(0);
          expect(x.gc!.writes).toBeLessThanOrEqual(x.iters);
          expect(x.faultPathUs! > 0).toBe(policy !== 'pin'); // the fault library timed its own part
        }
      }
      const slower = r.sizes.filter((s) => s >= 2 * PAGE_SIZE && !(row(s, 'touch-ahead').realUs! < row(s, 'touch').realUs!));
      expect(run.touchAheadFasterThanTouch.failsAt).toEqual(slower);
      expect(run.touchAheadFasterThanTouch.holds).toBe(slower.length === 0);
      expect(run.touchAheadFasterThanTouch.modelHolds).toBe(true); // the model's order: one fault beats one per page
      const ratio = row(claimSize, 'touch-ahead').realUs! / row(claimSize, 'pin').realUs!;
      expect(run.touchAheadWithin1_5xOfPinned.ratio).toBeCloseTo(ratio, 9);
      expect(run.touchAheadWithin1_5xOfPinned.holds).toBe(ratio <= 1.5);
      const best = (p: string) => Math.min(...row(claimSize, p).samplesUs!);
      expect(run.touchAheadWithin1_5xOfPinned.bestRatio).toBeCloseTo(best('touch-ahead') / best('pin'), 9);
      for (const l of run.load) expect(l).toBeGreaterThanOrEqual(0);
      // This run's own costs, measured on real memory and taken from its rows.
      const m = run.machine;
      for (const k of ['populateUsPerPage', 'mlockUsPerPage', 'copyGBps', 'faultTripUs'] as const) expect(m[k]).toBeGreaterThan(0);
      expect(Number.isFinite(m.engineWriteUs)).toBe(true);
      const small = run.rows.filter((x) => x.size <= 65536);
      expect(m.faultTripUs).toBe(median(small.filter((x) => x.faults!.destination === 1).map((x) => x.faultPathUs!)));

      // Every differing verdict of this run is explained, from this run's figures, and nothing else is.
      const said = r.explained.filter((d) => d.run === i + 1);
      const c = run.touchAheadWithin1_5xOfPinned;
      const t = run.touchAheadFasterThanTouch;
      const differ = [...t.failsAt!, ...t.modelFailsAt!].filter((s) => t.failsAt!.includes(s) !== t.modelFailsAt!.includes(s));
      expect(said.map((d) => `${d.claim} ${d.size}`).sort()).toEqual(
        [
          ...(c.holds === c.modelHolds ? [] : [`touchAheadWithin1_5xOfPinned ${claimSize}`]),
          ...differ.map((s) => `touchAheadFasterThanTouch ${s}`),
        ].sort(),
      );
      for (const d of said) consistent(d, run, claimSize);
    });
    expect(r.differences).toEqual(r.explained.map((d) => d.text));
    expect(r.stable.touchAheadFasterThanTouch).toBe(r.runs.every((x) => x.touchAheadFasterThanTouch.holds));
    expect(r.stable.touchAheadWithin1_5xOfPinned).toBe(r.runs.every((x) => x.touchAheadWithin1_5xOfPinned.holds));
    expect(r.machine.populateUsPerPage).toBe(median(r.runs.map((x) => x.machine.populateUsPerPage)));

    // A reversal at 8K the runs above may or may not have met, judged from a run's own rows:
    // touch-ahead 1 µs slower than touch. Within the writes' spread it is put down to the
    // engine's per-write noise; with no spread, the costs do not explain it.
    const base = r.runs[0]!;
    for (const spread of [1e6, 0]) {
      const rows = base.rows.map((x) => ({ ...x }));
      const at = (p: string) => rows.find((x) => x.size === 8192 && x.policy === p)!;
      at('touch-ahead').realUs = at('touch').realUs! + 1;
      at('touch').spreadUs = spread;
      at('touch-ahead').spreadUs = 0;
      const run = judge(rows, claimSize, base.machine, base.load);
      expect(run.touchAheadFasterThanTouch.failsAt).toContain(8192);
      const d = explain(run, 1, claimSize).find((x) => x.claim === 'touchAheadFasterThanTouch' && x.size === 8192)!;
      consistent(d, run, claimSize);
      expect(d.cause).toBe(spread ? 'noise' : 'unexplained');
      expect(d.text).toMatch(spread ? /set by that, not by faults/ : /do not explain it/);
    }
  }, 180_000);
});

/** An explanation's figures are the run's, its cause follows from them, and its text says them. */
function consistent(d: Difference, run: Awaited<ReturnType<typeof measuredTable>>['runs'][number], claimSize: number): void {
  const m = run.machine;
  const f = (x: number): string => x.toFixed(2);
  expect(d.figures.populateUsPerPage).toBe(m.populateUsPerPage);
  if (d.claim === 'touchAheadWithin1_5xOfPinned') {
    const c = run.touchAheadWithin1_5xOfPinned;
    expect(d.figures).toMatchObject({ ratio: c.ratio, modelRatio: c.modelRatio, mlockUsPerPage: m.mlockUsPerPage, copyGBps: m.copyGBps });
    const pages = claimSize / PAGE_SIZE;
    const copyUs = claimSize / (m.copyGBps * 1000);
    expect(d.figures.estimate).toBeCloseTo((m.populateUsPerPage * pages + copyUs) / (m.mlockUsPerPage * pages + copyUs), 9);
    expect(d.cause).toBe(d.figures.estimate! <= 1.5 === c.holds ? 'costs' : 'unexplained');
    for (const x of [c.ratio!, m.populateUsPerPage, m.mlockUsPerPage, m.copyGBps, d.figures.estimate!]) expect(d.text).toContain(f(x));
    expect(d.text).toMatch(/populates at [\d.]+ µs\/page, mlocks at [\d.]+ .* copies at [\d.]+ GB\/s/);
  } else {
    const row = (p: string) => run.rows.find((x) => x.size === d.size && x.policy === p)!;
    const saved = row('touch').faults!.destination - row('touch-ahead').faults!.destination;
    expect(d.figures).toMatchObject({
      touchUs: row('touch').realUs,
      touchAheadUs: row('touch-ahead').realUs,
      faultsSaved: saved,
      faultTripUs: m.faultTripUs,
      spreadUs: Math.max(row('touch').spreadUs!, row('touch-ahead').spreadUs!),
    });
    expect(d.figures.savingUs).toBeCloseTo(saved * (m.faultTripUs - m.populateUsPerPage), 9);
    expect(d.cause).toBe(d.figures.savingUs! < d.figures.spreadUs! ? 'noise' : 'unexplained');
    for (const x of [row('touch').realUs!, row('touch-ahead').realUs!, m.faultTripUs, d.figures.savingUs!, d.figures.spreadUs!])
      expect(d.text).toContain(f(x));
  }
}

describe('odp-vs-pinned: the order the policies take turns in', () => {
  it('each round is an order of all policies, and each policy follows each other equally often (Williams design)', () => {
    for (const n of [2, 3, 4, 5]) {
      const rounds = n % 2 ? 2 * n : n;
      const follows = new Map<string, number>();
      for (let r = 0; r < rounds; r++) {
        const row = williams(n, r);
        expect([...row].sort()).toEqual([...Array(n).keys()]);
        for (let k = 1; k < n; k++) follows.set(`${row[k - 1]}>${row[k]}`, (follows.get(`${row[k - 1]}>${row[k]}`) ?? 0) + 1);
      }
      expect(follows.size).toBe(n * (n - 1)); // every ordered pair of different policies
      expect(new Set(follows.values()).size).toBe(1); // as often as every other
    }
  });
});
