// `pagefault-rdma odp-pitfalls`: ODP's pitfalls under the mlx5-odp preset, explained.
import { odpPitfalls, pitfallsPlot, pitfallsReport } from '../programs/odp-pitfalls.js';
import { heading, parsePositiveInt } from '../programs/support/format.js';
import { defineProgram } from '../program.js';

interface Options {
  writes: number;
  retryCnt: number;
}

export default defineProgram<Options>({
  name: 'odp-pitfalls',
  summary: "ODP's pitfalls with the mlx5-odp preset: the min_rnr_timer sweep (cliff, knee) and the timeout path",
  plot: 'modelled µs per receive-side fault against the min_rnr_timer code',
  engine: false,
  noTrace: 'it runs 33 clusters; trace one with pingpong --hardware mlx5-odp --trace',
  options(cmd) {
    cmd.option('--writes <n>', 'writes into evicted memory per min_rnr_timer code', parsePositiveInt, 2).option(
      '--retry-cnt <n>',
      'the QP retry_cnt for the timeout path (0..7)',
      (v) => {
        const n = Number(v);
        if (!Number.isInteger(n) || n < 0 || n > 7) throw new Error(`--retry-cnt must be an integer in 0..7, got ${v}`);
        return n;
      },
      7,
    );
  },
  async run(o) {
    const t = performance.now();
    heading("ODP's pitfalls (hardware preset mlx5-odp)");
    const r = await odpPitfalls({ writes: o.writes, retryCnt: o.retryCnt });
    console.log(pitfallsReport(r));
    console.log(`\n(run time ${((performance.now() - t) / 1000).toFixed(1)} s)`);
    return {
      results: { preset: 'mlx5-odp', ...r, timeouts: r.timeouts.map((x) => ({ ...x, pathUs: Number.isFinite(x.pathUs) ? x.pathUs : null })) },
      plot: pitfallsPlot(r),
    };
  },
});
