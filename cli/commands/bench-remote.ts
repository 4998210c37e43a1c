// `pagefault-rdma bench-remote` (npm run bench:remote): remote paging's major fault, the
// TypeScript DM-Handler against a C program with hiredis, over a Redis Cluster, and adaptive
// prefetch on a sequential and a random scan. Needs redis-server, a C compiler and libhiredis-dev.
import { benchRemote } from '../../bench/remote.js';
import { heading, parsePositiveInt } from '../programs/support/format.js';
import { defineProgram } from '../program.js';

interface Options {
  pages: number;
  rounds: number;
  prefetch: number;
}

export default defineProgram<Options>({
  name: 'bench-remote',
  summary: 'benchmark: remote paging major fault, TypeScript vs C + hiredis; prefetch (needs redis-server, cc, libhiredis-dev)',
  description:
    'The major fault of remote paging (fault -> Redis GET -> UFFDIO_COPY) through the TypeScript DM-Handler against a C ' +
    "program doing the same with hiredis on the same server, the embedded store, the project's own memory server (pagefault-rdma memory-server, started for the run), one server and a 3-master Redis Cluster on " +
    'loopback TCP (and 4 faulting threads against 1), and a sequential and a random scan with and without adaptive prefetch ' +
    '(accuracy and coverage); side by side, interleaved. JSON to bench/results/remote.json (not tracked), a temporary folder, ' +
    "or --json. Needs Debian's redis-server (with redis-cli for the cluster) and libhiredis-dev, and a C compiler.",
  noTrace:
    "remote paging's faults are served by the DM-Handler (userfaultfd, in its own thread), not by a fault library, and it keeps " +
    'no per-fault trace; the benchmark prints its latency percentiles',
  options(cmd) {
    cmd
      .option('--pages <n>', 'pages per round (4 KiB each)', parsePositiveInt, 2048)
      .option('--rounds <n>', 'measured rounds per case (after one warm-up round)', parsePositiveInt, 5)
      .option('--prefetch <n>', 'largest adaptive prefetch window of the prefetch cases, in pages', parsePositiveInt, 31);
  },
  async run(o) {
    heading('Benchmark: remote paging major fault, TypeScript vs C');
    return { results: await benchRemote({ pages: o.pages, rounds: o.rounds, prefetch: o.prefetch, json: o.json ? false : undefined }) };
  },
});
