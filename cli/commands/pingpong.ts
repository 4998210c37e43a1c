// `pagefault-rdma pingpong`: RC ping-pong like ibv_rc_pingpong, on ODP buffers.
import { Option } from 'commander';
import { POLICIES, type PolicyName } from '../../lib/index.js';
import { pingPong, pingPongPlot, runSummary } from '../programs/pingpong.js';
import { allSizes, heading, parsePositiveInt, parseSize } from '../programs/support/format.js';
import { defineProgram } from '../program.js';

interface Options {
  size: number;
  all: boolean;
  maxSize: number;
  iters: number;
  policy: PolicyName;
  baseline: boolean;
}

export default defineProgram<Options>({
  name: 'pingpong',
  summary: 'RC ping-pong like ibv_rc_pingpong, with ODP buffers evicted before every message',
  plot: 'the distribution of the one-way latency of each run',
  options(cmd) {
    cmd
      .option('-s, --size <bytes>', 'message size (4096, 64K, 1M)', parseSize, 4096)
      .option('-a, --all', 'every power of two from 2 B to --max-size (perftest -a)', false)
      .option('--max-size <bytes>', 'largest size with -a', parseSize, 2 ** 23)
      .option('-n, --iters <n>', 'round trips', parsePositiveInt, 1000)
      .addOption(
        new Option('--policy <name>', 'fault library policy of both buffers').choices(POLICIES.filter((p) => p !== 'pin')).default('touch-ahead'),
      )
      .option('--no-baseline', 'skip the run with resident buffers');
  },
  async run(o, io) {
    const t = performance.now();
    heading('RC ping-pong with on-demand paging (like ibv_rc_pingpong)');
    const runs = await pingPong({
      sizes: o.all ? allSizes(2, o.maxSize) : [o.size],
      iters: o.iters,
      policy: o.policy,
      baseline: o.baseline,
      trace: io.trace,
    });
    console.log(`\n(run time ${((performance.now() - t) / 1000).toFixed(1)} s)`);
    return { results: runs.map(runSummary), plot: pingPongPlot(runs) };
  },
});
