// `pagefault-rdma destination-fault`: one RDMA write into evicted remote memory, every step.
import { Option } from 'commander';
import { PAGE_SIZE, POLICIES, type PolicyName } from '../../lib/index.js';
import { destinationFault, type TimelineSlice } from '../programs/destination-fault.js';
import { heading, MODEL_LABEL, parsePositiveInt, parseSize } from '../programs/support/format.js';
import { PLOT_CONFIG, type PlotSpec } from '../programs/support/plot.js';
import { defineProgram } from '../program.js';

export default defineProgram<{ size: number; pages?: number; policy: PolicyName; evictSource: boolean }>({
  name: 'destination-fault',
  summary: 'an RDMA write into an evicted remote buffer: the fault, the NACK and the retransmission, step by step',
  plot: 'the fault timeline (each phase of each fault, modelled µs)',
  options(cmd) {
    cmd
      .option('-s, --size <bytes>', 'bytes to write (a multiple of 4K; 4K is the calibrated ≈38 µs case)', parseSize, PAGE_SIZE)
      .option('--pages <n>', 'pages to write (instead of -s)', parsePositiveInt)
      .addOption(new Option('--policy <name>', 'fault library policy of both MRs').choices(POLICIES.filter((p) => p !== 'pin')).default('touch'))
      .option('--evict-source', 'evict the source buffer too (a source fault first)', false)
      .hook('preAction', (c) => {
        if ((c.opts() as { size: number }).size % PAGE_SIZE) c.error(`error: --size must be a multiple of ${PAGE_SIZE}`);
      });
  },
  async run(o, io) {
    const t = performance.now();
    heading("A destination fault, step by step (terminate mode, the thesis's design)");
    const r = await destinationFault({ pages: o.pages ?? o.size / PAGE_SIZE, policy: o.policy, evictSource: o.evictSource, trace: io.trace });
    console.log(`\n(run time ${((performance.now() - t) / 1000).toFixed(2)} s)`);
    return { results: r, plot: timelinePlot(r.timeline, r.modelUs) };
  },
});

/** The plot's width in pixels; a phase is drawn at least MIN_PX wide, however short. */
const WIDTH = 600;
const MIN_PX = 3;

/** The fault timeline (--plot): each phase of each fault on its lane, the axis from the post to the completion. */
export function timelinePlot(slices: readonly TimelineSlice[], completionUs: number): PlotSpec {
  const endUs = Math.max(completionUs, ...slices.map((s) => s.endUs));
  const minUs = (endUs * MIN_PX) / WIDTH;
  const x = { field: 'startUs', type: 'quantitative' as const, title: 'µs from the post (modelled)', scale: { domain: [0, endUs], nice: false } };
  return {
    $schema: 'https://vega.github.io/schema/vega-lite/v6.json',
    title: {
      text: 'A faulting RDMA write: each phase of each fault',
      subtitle: `${MODEL_LABEL}; phases shorter than ${MIN_PX} px drawn ${MIN_PX} px wide`,
    },
    config: { ...PLOT_CONFIG, axisY: { labelLimit: 320 } },
    width: WIDTH,
    layer: [
      {
        data: {
          values: slices.map((s) => ({ ...s, lane: `node ${s.node}: ${s.thread}`, drawnEndUs: Math.max(s.endUs, s.startUs + minUs) })),
        },
        mark: { type: 'bar', height: { band: 0.7 } },
        encoding: {
          y: { field: 'lane', type: 'nominal', title: null, sort: null },
          x,
          x2: { field: 'drawnEndUs' },
          color: { field: 'phase', type: 'nominal', sort: ['detect', 'notify', 'resolve', 'retransmit', 'copy'] },
          tooltip: [{ field: 'phase' }, { field: 'block' }, { field: 'startUs' }, { field: 'endUs' }],
        },
      },
      {
        data: { values: [{ startUs: completionUs, label: `completion ${completionUs.toFixed(1)} µs` }] },
        layer: [
          { mark: { type: 'rule', strokeDash: [4, 3], color: 'black' }, encoding: { x } },
          { mark: { type: 'text', align: 'right', baseline: 'top', dx: -3, y: 2 }, encoding: { x, text: { field: 'label' } } },
        ],
      },
    ],
  };
}
