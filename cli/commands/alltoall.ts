// `pagefault-rdma alltoall`: every rank of a job RDMA-writes a block into every other rank's
// ODP buffer (cli/programs/alltoall.ts). One process of a job: start it with `pagefault-rdma run
// -n N -- alltoall` or `mpiexec -n N npx pagefault-rdma alltoall`. Rank 0 prints the job's
// table and writes --json; a failure of any rank fails every rank.
import { Option } from 'commander';
import { DEFAULT_BIND, DEFAULT_RENDEZVOUS, LIBFABRIC_PROVIDERS, latencyStats, POLICIES } from '../../lib/index.js';
import { runAlltoall, type AlltoallOptions } from '../programs/alltoall.js';
import { ALL_SIZES } from '../programs/fabric-peer.js';
import { LATENCY_COLUMNS, latencyCells, parsePositiveInt, print, Table, us } from '../programs/support/format.js';
import { parseMessageSize } from '../fabric-programs.js';
import { defineProgram } from '../program.js';

interface Options extends Omit<AlltoallOptions, 'blocks' | 'timeoutMs'> {
  size: number;
  all: boolean;
  timeout: number;
}

export default defineProgram<Options>({
  name: 'alltoall',
  summary: "all-to-all RDMA WRITEs between the ranks of a job (run -n N, or mpiexec -n N), into every rank's evicted ODP buffer",
  options(cmd) {
    cmd
      .option('-s, --size <bytes>', 'bytes each rank writes to each other rank per iteration (4096, 64K, 1M)', parseMessageSize, 64 * 1024)
      .option('-a, --all', 'every size from 2 to 2^23 bytes, -n iterations each, a row each (perftest -a)', false)
      .option('-n, --iters <n>', 'iterations (per size)', parsePositiveInt, 10)
      .addOption(
        new Option('--policy <name>', 'fault library policy of the buffers').choices(POLICIES.filter((p) => p !== 'pin')).default('touch-ahead'),
      )
      .option('--no-evict', 'keep the buffers resident (no faults): the fault-free baseline')
      .option('--rendezvous <host:port>', `rank 0's rendezvous, the same for every rank (default $PFR_RENDEZVOUS, else ${DEFAULT_RENDEZVOUS})`)
      .option('--bind <addr>', "the address this rank's transport listens on (0.0.0.0: every interface, advertised by host name)", DEFAULT_BIND)
      .addOption(new Option('--provider <name>', 'libfabric provider').choices([...LIBFABRIC_PROVIDERS]).default('tcp'))
      .option('--timeout <seconds>', 'how long the ranks wait for each other (to arrive, at each barrier)', parsePositiveInt, 30);
  },
  async run(o, io) {
    const r = await runAlltoall({
      ...(io.trace ? { trace: io.trace } : {}),
      blocks: o.all ? [...ALL_SIZES] : [o.size],
      iters: o.iters,
      policy: o.policy,
      evict: o.evict,
      bind: o.bind,
      timeoutMs: o.timeout * 1000,
      onConnected: (job) => {
        if (job.rank === 0) print(`job of ${job.size} ranks connected all-to-all (${job.launcher}, libfabric ${job.transport.provider})`);
      },
      ...(o.rendezvous !== undefined ? { rendezvous: o.rendezvous } : {}),
      ...(o.provider !== undefined ? { provider: o.provider } : {}),
    });
    const failed = r.ranks.filter((x) => x.error || x.mismatches);
    for (const x of failed) console.error(`alltoall: rank ${x.rank}: ${x.error ?? `${x.mismatches} bytes differ from what the other ranks wrote`}`);
    if (failed.length) process.exitCode = 1;
    // An iteration lasts as long as its slowest rank's writes.
    const rows = r.blocks.map((bytes, k) => {
      const slowest = (r.ranks[0]!.iterUs[k] ?? []).map((_, i) => Math.max(...r.ranks.map((x) => x.iterUs[k]?.[i] ?? 0)));
      return { bytes, iterations: slowest.length, ...latencyStats(slowest) };
    });
    if (r.rank === 0) {
      print(
        `all-to-all: ${r.size} ranks (${r.launcher}), each writing to each other rank; buffers ${o.evict ? 'evicted before every iteration' : 'resident'}`,
      );
      print("an iteration's time: its slowest rank's writes, from posting the first to the last completion");
      // Both tables fit 76 columns: 80 with run's `[rank] ` prefix.
      const t = new Table([{ header: '#bytes', width: 6 }, { header: '#iters', width: 6 }, ...LATENCY_COLUMNS], { gap: 1 });
      t.header();
      for (const row of rows) t.row([String(row.bytes), String(row.iterations), ...latencyCells(row)]);
      const ranks = new Table(
        [
          { header: 'rank', width: 4 },
          { header: 'faults src', width: 6 },
          { header: 'faults dst', width: 6 },
          { header: 'NACKs', width: 6 },
          { header: 'retx blocks', width: 6 },
          { header: 'bytes verified', width: 8 },
          { header: 'differ', width: 6 },
          { header: 'CPU/xfer', width: 9 },
          { header: 'of it in writes', width: 9 },
        ],
        { gap: 1 },
      );
      ranks.header();
      for (const x of r.ranks)
        ranks.row([
          String(x.rank),
          String(x.faults.source),
          String(x.faults.destination),
          String(x.nacks),
          String(x.retransmitted),
          String(x.bytesVerified),
          String(x.mismatches),
          x.transfers ? us(x.cpuUs / x.transfers) : '-',
          x.transfers ? us(x.writeCpuUs / x.transfers) : '-',
        ]);
      const last = rows.at(-1);
      if (last?.iterations) print(`per transfer (${last.bytes} bytes, typical): ${us(last.typical / (r.size - 1))} usec`);
    }
    // --trace FILE: a file per rank, named by rank (FILE.rank0.json …), each its fault library's events.
    return { results: { ...r, rows }, writes: r.rank === 0, traceFile: o.trace !== undefined ? rankFile(o.trace, r.rank) : undefined };
  },
});

/** FILE with the rank before its extension: trace.json -> trace.rank2.json. */
export function rankFile(file: string, rank: number): string {
  const m = /^(.*?)(\.[^./]*)?$/.exec(file)!;
  return `${m[1]}.rank${rank}${m[2] ?? ''}`;
}
