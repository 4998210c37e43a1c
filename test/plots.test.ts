// The programs' plots as a reader sees them: the Vega-Lite specs (ticks only at sizes measured,
// sizes written 4K / 64K / 1M, a few sizes in numeric order, an axis that reaches the
// completion) and the SVG vega renders from them (the labels really drawn).
import { describe, expect, test } from 'vitest';
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
