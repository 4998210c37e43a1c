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
export const PLOT_CONFIG = { background: 'white', font: 'sans-serif', axis: { labelFontSize: 11, titleFontSize: 12 } } as const;

/** A Vega expression that writes an axis value in bytes as sizeName() does: 4K, 64K, 1M. */
export const SIZE_LABEL_EXPR =
  "datum.value >= 1073741824 && datum.value % 1073741824 === 0 ? datum.value / 1073741824 + 'G' : " +
  "datum.value >= 1048576 && datum.value % 1048576 === 0 ? datum.value / 1048576 + 'M' : " +
  "datum.value >= 1024 && datum.value % 1024 === 0 ? datum.value / 1024 + 'K' : datum.value";
