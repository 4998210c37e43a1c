// The programs' plots as a reader sees them: the Vega-Lite specs (ticks only at sizes measured,
// sizes written 4K / 64K / 1M, a few sizes in numeric order, an axis that reaches the
// completion) and the SVG vega renders from them (the labels really drawn).
import { describe, expect, test } from 'vitest';
import { verdictPlot } from '../cli/apps/runner.js';
import { timelinePlot } from '../cli/commands/destination-fault.js';
import type { TimelineSlice } from '../cli/programs/destination-fault.js';
import { odpVsPinnedPlot, type OdpRow } from '../cli/programs/odp-vs-pinned.js';
import { pingPongPlot, PLOTTED_SIZES, type Run } from '../cli/programs/pingpong.js';
import { renderSvg } from '../cli/programs/support/plot.js';

type Enc = Record<string, { scale?: { domain?: unknown; range?: unknown }; axis?: { values?: unknown }; sort?: unknown; legend?: unknown }>;

// The text of every axis label and legend label vega drew.
function texts(svg: string): string[] {
  return [...svg.matchAll(/<text[^>]*>([^<]*)<\/text>/g)].map((m) => m[1]!);
}

describe('odp-vs-pinned --plot', () => {
  const sizes = [4096, 16384, 65536, 262144, 1048576];
  const rows: OdpRow[] = sizes.flatMap((size) =>
    (['pin', 'touch'] as const).map((policy) => ({ size, policy, iters: 1, modelUs: size / 100, realUs: size / 50 })),
  );

  test('ticks only at the sizes measured, the largest included, written as sizes; the legend says solid and dashed', async () => {
    const spec = odpVsPinnedPlot(rows) as { encoding: Enc; layer: Array<{ encoding?: Enc }> };
    expect(spec.encoding['x']!.axis!.values).toEqual(sizes);
    expect(spec.encoding['x']!.scale!.domain).toEqual([4096, 1048576]);
    expect(spec.layer[0]!.encoding!['strokeDash']!.scale).toEqual({
      domain: ['measured', 'modelled'],
      range: [
        [1, 0],
        [6, 4],
      ],
    });
    const svg = await renderSvg(odpVsPinnedPlot(rows));
    const drawn = texts(svg);
    for (const label of ['4K', '16K', '64K', '256K', '1M']) expect(drawn).toContain(label);
    for (const raw of ['4096', '65536', '1048576', '8K', '2M']) expect(drawn).not.toContain(raw);
    expect(drawn).toEqual(expect.arrayContaining(['measured (solid)', 'modelled (dashed)']));
    // The legend's symbols are strokes, dashed as the lines are.
    const legend = [...svg.matchAll(/role-legend-symbol[^>]*><path ([^>]*)\/>/g)].map((m) => m[1]!).filter((p) => p.includes('stroke-dasharray'));
    expect(legend.map((p) => /stroke="(#[0-9a-f]+)"/.exec(p)?.[1])).toEqual(['#444', '#444']);
    expect(legend.map((p) => /stroke-dasharray="([^"]+)"/.exec(p)?.[1])).toEqual(['1,0', '6,4']);
  });
});

describe('pingpong -a --plot', () => {
  const run = (size: number, evict: boolean): Run => ({
    size,
    iters: 3,
    evict,
    modelUs: [1, 2, 3],
    realUs: [size / 1000 + 1, size / 1000 + 2, size / 1000 + 3],
    seconds: 1,
    faults: { source: 0, destination: 0 },
    pagesMadeResident: 0,
    retransmitted: 0,
    nacks: 0,
    errors: 0,
  });
  const all = Array.from({ length: 23 }, (_, i) => 2 ** (i + 1)); // 2 B … 8M, as -a draws them
  const runs = all.flatMap((s) => [run(s, true), run(s, false)]);

  test('a few sizes, the smallest and the largest among them, in numeric order; solid evicted, dashed resident', async () => {
    const spec = pingPongPlot(runs) as { encoding: Enc; data: { values: Array<{ size: string }> } };
    const sort = spec.encoding['color']!.sort as string[];
    expect(sort).toHaveLength(PLOTTED_SIZES);
    expect(sort[0]).toBe('2');
    expect(sort.at(-1)).toBe('8M');
    expect(new Set(spec.data.values.map((v) => v.size))).toEqual(new Set(sort));
    const svg = await renderSvg(pingPongPlot(runs));
    const drawn = texts(svg);
    // The legend lists them in that order, none cut.
    const legend = [...svg.matchAll(/role-legend-label[^>]*><text[^>]*>([^<]*)<\/text>/g)].map((m) => m[1]!);
    expect(legend.filter((t) => sort.includes(t))).toEqual(sort);
    expect(drawn.some((t) => t.includes('…'))).toBe(false);
    expect(drawn.join(' ')).toContain(`${PLOTTED_SIZES} of 23 sizes drawn`);
  });
});

describe('destination-fault --plot', () => {
  const slices: TimelineSlice[] = [
    { node: 1, thread: 'SMMU', phase: 'detect', startUs: 2.5, endUs: 2.7, block: 0 },
    { node: 1, thread: 'fault library', phase: 'resolve', startUs: 17, endUs: 80, block: 0 },
    { node: 0, thread: 'copy engine', phase: 'copy', startUs: 85, endUs: 90, block: 0 },
  ];

  test('the axis reaches the completion; a sub-pixel phase gets a visible width; no thread id on a lane', async () => {
    const spec = timelinePlot(slices, 119) as { layer: Array<{ encoding?: Enc; data: { values: Array<Record<string, number | string>> } }> };
    const bars = spec.layer[0]!;
    expect(bars.encoding!['x']!.scale!.domain).toEqual([0, 119]);
    const detect = bars.data.values.find((v) => v['phase'] === 'detect')!;
    expect(Number(detect['drawnEndUs']) - Number(detect['startUs'])).toBeGreaterThanOrEqual((119 * 3) / 600 - 1e-9);
    expect(detect['endUs']).toBe(2.7); // the tooltip keeps the true end
    expect(bars.data.values.map((v) => v['lane'])).toEqual(['node 1: SMMU', 'node 1: fault library', 'node 0: copy engine']);
    const drawn = texts(await renderSvg(timelinePlot(slices, 119)));
    expect(drawn).toContain('completion 119.0 µs');
    expect(drawn.some((t) => /thread \d+/.test(t))).toBe(false);
  });
});

describe('plots read without colour, each on a scale that fits', () => {
  const OKABE = ['#0072B2', '#D55E00', '#009E73', '#CC79A7', '#E69F00', '#56B4E9', '#000000', '#F0E442'];
  const sizes = [4096, 65536, 1048576];
  const rows: OdpRow[] = sizes.flatMap((size) =>
    (['pin', 'touch', 'touch-ahead', 'prefetch'] as const).map((policy) => ({ size, policy, iters: 1, modelUs: size / 100, realUs: size / 50 })),
  );
  type Spec = { config: { range: { category: string[] } }; encoding: Enc; layer: Array<{ encoding?: Enc; mark: unknown }> };

  test('odp-vs-pinned: the Okabe-Ito palette, a shape per policy, long dash glyphs; vega draws the shapes', async () => {
    const spec = odpVsPinnedPlot(rows) as unknown as Spec;
    expect(spec.config.range.category).toEqual(OKABE);
    const points = spec.layer.find((l) => l.encoding?.['shape'])!;
    expect(points.encoding!['shape']).toMatchObject({
      field: 'policy',
      scale: { range: expect.arrayContaining(['circle', 'square', 'triangle-up', 'diamond']) },
    });
    expect(spec.layer[0]!.encoding!['strokeDash']!.legend).toMatchObject({ symbolType: 'stroke', symbolSize: 900 });
    const svg = await renderSvg(odpVsPinnedPlot(rows));
    // Four policies, four different symbol paths in the legend (shapes, not only colours).
    const glyphs = new Set([...svg.matchAll(/role-legend-symbol[^>]*><path [^>]*d="([^"]+)"/g)].map((m) => m[1]!));
    expect(glyphs.size).toBeGreaterThanOrEqual(4);
    for (const c of OKABE.slice(0, 4)) expect(svg.toLowerCase()).toContain(c.toLowerCase());
  });

  test('pingpong: the x axis spans the data (no decade past it), its title with its unit; sizes by shape too', () => {
    const run = (size: number, us: number[]): Run => ({
      size,
      iters: us.length,
      evict: true,
      modelUs: us,
      realUs: us,
      seconds: 1,
      faults: { source: 0, destination: 0 },
      pagesMadeResident: 0,
      retransmitted: 0,
      nacks: 0,
      errors: 0,
    });
    const us = Array.from({ length: 20 }, (_, i) => 120 + i * 10); // 120 … 310 µs
    const spec = pingPongPlot([
      run(4096, us),
      run(
        65536,
        us.map((u) => u * 3),
      ),
    ]) as unknown as Spec;
    expect(spec.encoding['x']!.scale).toMatchObject({ type: 'log', domain: [120, 930], nice: false });
    expect((spec.encoding['x'] as { title?: string }).title).toMatch(/\[µs\]/);
    expect(spec.config.range.category).toEqual(OKABE);
    const points = spec.layer.find((l) => l.encoding?.['shape'])!;
    expect(points.encoding!['shape']).toMatchObject({ field: 'size' });
  });

  test("app's verdict: the ratio on a log scale spanning the runs and 1, medians as ticks", () => {
    const spec = verdictPlot({
      app: 'halo',
      ranks: 2,
      where: 'nodes in one process',
      steps: 3,
      evictEachStep: false,
      trials: [],
      verified: true,
      verdicts: [
        { policy: 'touch-ahead', ratios: [1.02, 0.98], slowdown: 1 },
        { policy: 'remote', ratios: [14, 15], slowdown: 14.5 },
      ] as unknown as Parameters<typeof verdictPlot>[0]['verdicts'],
    }) as unknown as { layer: Array<{ mark: { type: string }; encoding: Enc }> };
    const y = spec.layer[0]!.encoding['y'] as { scale: { type: string; domain: [number, number] } };
    expect(y.scale.type).toBe('log');
    expect(y.scale.domain[0]).toBeLessThan(0.98);
    expect(y.scale.domain[1]).toBeGreaterThan(15);
    expect(spec.layer[0]!.mark.type).toBe('tick');
  });
});
