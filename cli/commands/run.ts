// `pagefault-rdma run -n N -- PROGRAM [ARGS]`: a job of N processes on this host (cli/launcher.ts),
// the way `mpiexec -n N` starts one, for a user without MPI.
import { InvalidArgumentError } from 'commander';
import { MAX_JOB_SIZE } from '../../lib/job/rendezvous.js';
import { parsePositiveInt, printErr } from '../programs/support/format.js';
import { launch } from '../launcher.js';
import { defineProgram } from '../program.js';

interface Options {
  np: number;
  timeout: number;
  rendezvous?: string;
  pin: boolean;
}

function parseRanks(value: string): number {
  const n = parsePositiveInt(value);
  if (n > MAX_JOB_SIZE) throw new InvalidArgumentError(`at most ${MAX_JOB_SIZE} ranks (one node each)`);
  return n;
}

export default defineProgram<Options>({
  name: 'run',
  summary: 'run a job of N processes of a program on this host, like mpiexec -n N (e.g. run -n 4 -- alltoall)',
  description:
    "Start N copies of `pagefault-rdma PROGRAM ARGS`, each told its rank, the job size and rank 0's rendezvous " +
    '(PFR_RANK, PFR_SIZE, PFR_RENDEZVOUS); their output is prefixed by rank. One rank failing, Ctrl-C or the timeout ' +
    'stops the others; the exit status is non-zero then. --trace FILE goes to every rank (alltoall: FILE.rankN.json). ' +
    'Example: run -n 4 -- alltoall -s 64K',
  engine: false,
  options(cmd) {
    // The program's options are its own, not run's: run -n 4 alltoall -n 20 works too (commander
    // allows that only with the top level's options before the program's name, all it has).
    cmd.parent?.enablePositionalOptions();
    cmd
      .requiredOption('-n, --np <n>', 'processes (ranks)', parseRanks)
      .option('--timeout <seconds>', "the whole job's limit", parsePositiveInt, 600)
      .option('--rendezvous <host:port>', "rank 0's rendezvous (default: 127.0.0.1 and a free port)")
      .option('--pin', "pin each rank to one CPU (rank modulo the CPUs allowed, as mpiexec's -bind-to core; needs util-linux's taskset)", false)
      .argument('<program...>', 'the program and its arguments (after -- or not)')
      .passThroughOptions();
  },
  async run(o, io) {
    // run --trace FILE: the launcher moves no data; each rank's program gets --trace FILE (alltoall
    // writes FILE.rankN.json) and run writes no file of its own.
    const forward =
      o.trace !== undefined && !(o.args ?? []).includes('--trace')
        ? ['--trace', o.trace, ...(o.given?.includes('traceEvents') ? ['--trace-events', String(o.traceEvents)] : [])]
        : [];
    io.trace = undefined;
    const args = [...(o.args ?? []), ...forward];
    const r = await launch({
      np: o.np,
      args,
      timeoutMs: o.timeout * 1000,
      pin: o.pin,
      ...(o.rendezvous !== undefined ? { rendezvous: o.rendezvous } : {}),
    });
    if (r.failure !== undefined) {
      printErr(`run: the job failed: ${r.failure}`);
      const how = r.ranks.map((x) => `rank ${x.rank} ${x.signal ? `killed by ${x.signal}` : `exited ${String(x.code)}`}`);
      printErr(`run: ${how.join(', ')}`);
      process.exitCode = 1;
    }
    return { results: r };
  },
});
