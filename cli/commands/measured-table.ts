// `pagefault-rdma measured-table`: odp-vs-pinned's measured column, three times, against the thesis's orderings.
import { measuredTable } from '../programs/measured-table.js';
import { heading, parsePositiveInt, parseSize } from '../programs/support/format.js';
import { PAGE_SIZE } from '../../lib/index.js';
import { defineProgram } from '../program.js';

interface Options {
  runs: number;
  minSize: number;
  maxSize: number;
  iters: number;
  smallIters: number;
}

export default defineProgram<Options>({
  name: 'measured-table',
  summary: "odp-vs-pinned's measured column, run several times, checked against the thesis's orderings",
  description:
    'Measure odp-vs-pinned (pin, touch, touch-ahead; every power of two up to --max-size) --runs times and report ' +
    'whether touch-ahead beats touch at every size of two pages or more and stays within 1.5× of pinned ' +
    '(registration included) at --max-size, measured and modelled; where they differ, which of this ' +
    "machine's costs (populate, mlock, copy, the engine's per-write overhead and its spread, measured in that run) make them differ.",
  options(cmd) {
    cmd
      .option('-r, --runs <n>', 'how many times to measure the table', parsePositiveInt, 3)
      .option('--min-size <bytes>', 'smallest write', parseSize, PAGE_SIZE)
      .option('--max-size <bytes>', 'largest write, where the 1.5× claim is checked', parseSize, 4 * 2 ** 20)
      .option(
        '-n, --iters <n>',
        'writes per size and policy, the policies taking turns (median reported; a multiple of 6 balances their order)',
        parsePositiveInt,
        12,
      )
      .option('--small-iters <n>', 'the same for the sizes up to 64K, where writes are cheap and noise is near a fault', parsePositiveInt, 24);
    cmd.hook('preAction', (c) => {
      const o = c.opts() as Options;
      if (o.minSize % PAGE_SIZE || o.maxSize % PAGE_SIZE || o.maxSize < o.minSize)
        c.error(`error: sizes must be multiples of ${PAGE_SIZE} and --min-size no larger than --max-size`);
    });
  },
  async run(o, io) {
    heading("The measured table against the thesis's orderings");
    const results = await measuredTable({
      runs: o.runs,
      minSize: o.minSize,
      maxSize: o.maxSize,
      iters: o.iters,
      smallIters: o.smallIters,
      claimSize: o.maxSize,
      trace: io.trace,
    });
    return { results };
  },
});
