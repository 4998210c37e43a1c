// `pagefault-rdma overcommit`: register several times the machine's RAM, ODP and pinned.
import { InvalidArgumentError, Option } from 'commander';
import { overcommit } from '../programs/overcommit.js';
import { heading, parsePositiveInt } from '../programs/support/format.js';
import { defineProgram } from '../program.js';

interface Options {
  ratio: number;
  writes: number;
  side: 'both' | 'odp' | 'pinned';
  memlock: number;
}

export default defineProgram<Options>({
  name: 'overcommit',
  summary: 'register several times the RAM: ODP succeeds and stays sparse, pinning fails at its limit',
  description:
    'Register --ratio times the RAM as ODP MRs and run a sparse RDMA WRITE workload over them (registration time, ' +
    'completions, resident memory); then the same registered pinned, in a child whose RLIMIT_MEMLOCK is --memlock ' +
    'KiB and which lacks CAP_IPC_LOCK: it fails at registration with the error naming the limit.',
  options(cmd) {
    cmd
      .option('--ratio <x>', 'registered memory as a multiple of the RAM', parseRatio, 4)
      .option('-n, --writes <n>', 'RDMA WRITEs of one page, spread over the registered memory', parsePositiveInt, 64)
      .option('--memlock <KiB>', "RLIMIT_MEMLOCK of the pinned side's child (ulimit -l)", parsePositiveInt, 8192)
      .addOption(
        new Option('--side <which>', 'run both sides, or one (pinned runs in this process)').choices(['both', 'odp', 'pinned']).default('both'),
      );
  },
  async run(o, io) {
    heading(`Overcommit: ${o.ratio}× the RAM registered, ODP and pinned`);
    return { results: await overcommit({ ratio: o.ratio, writes: o.writes, side: o.side, memlockKiB: o.memlock, trace: io.trace }) };
  },
});

function parseRatio(value: string): number {
  const n = Number(value);
  if (!Number.isFinite(n) || n <= 0 || n > 64) throw new InvalidArgumentError('expected a multiple of the RAM between 0 and 64');
  return n;
}
