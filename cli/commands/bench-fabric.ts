// `pagefault-rdma bench-fabric` (npm run bench:fabric): the libfabric transport against fi_pingpong.
import { benchFabric } from '../../bench/fabric.js';
import { heading, parsePositiveInt, parseSize } from '../programs/support/format.js';
import { BENCH_NO_TRACE, defineProgram } from '../program.js';

interface Options {
  small: number;
  large: number;
  iters: number;
  rounds: number;
}

export default defineProgram<Options>({
  name: 'bench-fabric',
  summary: "benchmark: two processes over libfabric tcp against fi_pingpong (needs libfabric-dev and Debian's libfabric-bin)",
  noTrace: BENCH_NO_TRACE,
  options(cmd) {
    cmd
      .option('--small <bytes>', 'latency message size', parseSize, 64)
      .option('--large <bytes>', 'bandwidth message size', parseSize, 1024 * 1024)
      // 10000: a Node process runs its first thousands of messages unoptimised (V8 tiers its
      // code up as it runs); at 1000 the median was that warm-up's, 2 to 4 times the steady state.
      .option('-n, --iters <n>', 'latency iterations (bandwidth: a tenth)', parsePositiveInt, 10_000)
      .option('-r, --rounds <n>', 'interleaved rounds; the medians are reported', parsePositiveInt, 3);
  },
  async run(o) {
    heading('Benchmark: libfabric transport vs fi_pingpong (tcp, loopback)');
    return { results: await benchFabric({ small: o.small, large: o.large, iters: o.iters, rounds: o.rounds, json: o.json ? false : undefined }) };
  },
});
