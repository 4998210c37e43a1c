// `pagefault-rdma bench-faults` (npm run bench:faults): the TypeScript fault round trip
// against a C handler. Needs a C compiler (cc) and taskset (util-linux).
import { Option } from 'commander';
import { benchFaults, intList, placementList, type BenchFaultsOptions } from '../../bench/faults.js';
import { heading, parsePositiveInt } from '../programs/support/format.js';
import { defineProgram } from '../program.js';

type Options = Omit<BenchFaultsOptions, 'trace' | 'json'>;

export default defineProgram<Options>({
  name: 'bench-faults',
  summary: 'benchmark: the userfaultfd fault round trip, TypeScript handler against a C handler (needs cc)',
  description:
    'The userfaultfd fault round trip through the TypeScript handler against a C handler doing the same work, ' +
    'side by side. Writes its JSON to bench/results/faults.json in a checkout (not tracked), else to a temporary ' +
    'folder, or to --json FILE. Needs a C compiler (cc) and taskset.',
  options(cmd) {
    cmd
      .option('--pages <n>', 'pages per round (4 KiB each)', parsePositiveInt, 16384)
      .option('--rounds <n>', 'measured rounds per handler and touch-ahead size (after one warm-up round)', parsePositiveInt, 7)
      .addOption(new Option('--pages-per-fault <list>', 'touch-ahead sizes, comma-separated').argParser(intList).default([1, 16, 256], '1,16,256'))
      .addOption(
        new Option('--placements <list>', '"free" and/or CPU numbers (every thread on that CPU), comma-separated')
          .argParser(placementList)
          .default(placementList('free,0'), 'free,0'),
      )
      .option('--no-relay', 'skip the C reference that crosses the same thread hop as the library')
      .option('--breakdown', 'also run instrumented rounds and print where the time of one fault goes', false);
  },
  async run(o, io) {
    heading('Benchmark: userfaultfd fault round trip, TypeScript vs C');
    // With --json the CLI writes the document there; without, the benchmark writes its default file.
    const { pages, rounds, pagesPerFault, placements, relay, breakdown } = o;
    const opts: BenchFaultsOptions = { pages, rounds, pagesPerFault, placements, relay, breakdown, json: o.json ? false : undefined };
    if (io.trace) opts.trace = io.trace;
    return { results: await benchFaults(opts) };
  },
});
