// Pictures of the programs' results: a Vega-Lite spec compiled and rendered to SVG by vega in
// Node (no browser, no canvas: vega's SVG renderer writes the marks as text).
import { writeFileSync } from 'node:fs';
import type { TopLevelSpec } from 'vega-lite';

export type PlotSpec = TopLevelSpec;

/** Render a Vega-Lite spec to an SVG document. */
export async function renderSvg(spec: PlotSpec): Promise<string> {
  // Loaded here, not at the top: vega and vega-lite were a third of every program's start
  // (the CLI loads this file for --plot), and only a run that draws needs them.
  const [vega, { compile }] = await Promise.all([import('vega'), import('vega-lite')]);
  const view = new vega.View(vega.parse(compile(spec).spec), { renderer: 'none' });
  try {
    return await view.toSVG();
  } finally {
    view.finalize();
  }
}

/** Render `spec` and write it to `file`. */
export async function writePlot(file: string, spec: PlotSpec): Promise<void> {
  writeFileSync(file, await renderSvg(spec));
}

/** The look every plot shares: white background, readable fonts. */
/**
 * Okabe and Ito's colour-blind-safe palette (blue, vermillion, bluish green, reddish purple,
 * orange, sky blue, black, yellow: yellow last, it is faint on white). Every plot also tells its
 * series apart by shape or dash, not by colour alone.
 */
export const OKABE_ITO = ['#0072B2', '#D55E00', '#009E73', '#CC79A7', '#E69F00', '#56B4E9', '#000000', '#F0E442'] as const;

/** Shapes for the series a plot's points tell apart (in order). */
export const SHAPES = ['circle', 'square', 'triangle-up', 'diamond', 'cross', 'triangle-down', 'triangle-left', 'triangle-right'] as const;

export const PLOT_CONFIG = {
  background: 'white',
  font: 'sans-serif',
  axis: { labelFontSize: 11, titleFontSize: 12 },
  range: { category: [...OKABE_ITO] as string[] },
};

/** A legend for lines told apart by their dash: long strokes, wide enough to see the dashes. */
export const DASH_LEGEND = { symbolType: 'stroke', symbolStrokeColor: '#444', symbolStrokeWidth: 2.5, symbolSize: 900 } as const;

/** A Vega expression that writes an axis value in bytes as sizeName() does: 4K, 64K, 1M. */
export const SIZE_LABEL_EXPR =
  "datum.value >= 1073741824 && datum.value % 1073741824 === 0 ? datum.value / 1073741824 + 'G' : " +
  "datum.value >= 1048576 && datum.value % 1048576 === 0 ? datum.value / 1048576 + 'M' : " +
  "datum.value >= 1024 && datum.value % 1024 === 0 ? datum.value / 1024 + 'K' : datum.value";
